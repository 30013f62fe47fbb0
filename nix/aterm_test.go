package nix

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
)

// atermExprs are derivations of every kind the worker meets: several
// outputs, input derivations using some of them, an input source, escapes
// in the environment, structured attributes, fixed outputs (flat and
// recursive), floating and impure content-addressed outputs, and a
// deferred output (input-addressed on a floating input).
const atermExprs = `let
  sys = "x86_64-linux";
  mk = name: extra: builtins.derivation ({ inherit name; system = sys; builder = "/bin/sh"; args = [ "-c" "echo x > $out" ]; } // extra);
in rec {
  multi = mk "multi" { outputs = [ "out" "dev" "lib" ]; args = [ "-c" "echo > $out; echo > $dev; echo > $lib" ]; };
  plain = mk "plain-1.2" { args = [ "-c" "echo ${multi.dev} > $out" (builtins.toFile "script.sh" "echo hi") ];
    tricky = "quote \" backslash \\ newline \n tab \t cr \r dollar \${x} unicode é"; };
  structured = mk "structured" { __structuredAttrs = true; requiredSystemFeatures = [ "kvm" ]; timeout = 7;
    nested = { a = [ 1 2 "x\"y" ]; }; args = [ "-c" "echo ${multi.lib} ${multi}" ]; };
  fixedFlat = mk "fixed-flat" { outputHashMode = "flat"; outputHashAlgo = "sha256";
    outputHash = "sha256-LCa0a2j/xo/5m0U8HTBBNBNCLXBkg7+g+YpeiGJm564="; };
  fixedRec = mk "fixed-rec" { outputHashMode = "recursive"; outputHashAlgo = "sha1"; outputHash = "0000000000000000000000000000000000000000"; };
  floating = mk "floating" { __contentAddressed = true; outputHashMode = "recursive"; outputHashAlgo = "sha256"; };
  impure = mk "impure" { __impure = true; };
  deferred = mk "deferred" { args = [ "-c" "echo ${floating} > $out" ]; };
}
`

// The parser reads real .drv files (through the daemon) exactly as
// `nix show-derivation` describes them.
func TestDerivationsMatchShowDerivation(t *testing.T) {
	n := newTestNix(t)
	n.Config = append(n.Config, "extra-experimental-features = ca-derivations impure-derivations")
	ctx := testContext(t)
	file := filepath.Join(t.TempDir(), "drvs.nix")
	if err := os.WriteFile(file, []byte(atermExprs), 0o644); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, attr := range []string{"multi", "plain", "structured", "fixedFlat", "fixedRec", "floating", "impure", "deferred"} {
		out, err := n.output(ctx, "nix-instantiate", file, "-A", attr)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, strings.TrimSpace(string(out)))
	}
	got, err := n.Derivations(ctx, paths...)
	if err != nil {
		t.Fatal(err)
	}
	want, err := n.showDerivations(ctx, paths...)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		w := want[p]
		if w.Name == "" { // 2.8's JSON has no name; structured attrs have no env.name
			w.Name = strings.TrimSuffix(baseName(p)[33:], ".drv")
		}
		if !reflect.DeepEqual(got[p], w) {
			t.Errorf("%s:\nparsed %+v\nnix    %+v", p, got[p], w)
		}
	}
	plain, structured := got[paths[1]], got[paths[2]]
	if plain.Env["tricky"] != "quote \" backslash \\ newline \n tab \t cr \r dollar ${x} unicode é" || len(plain.InputSrcs) != 1 {
		t.Errorf("plain: env %q, sources %v", plain.Env["tricky"], plain.InputSrcs)
	}
	if !limitIs(structured.TimeoutSecs(), 7) || !reflect.DeepEqual(structured.RequiredSystemFeatures(), []string{"kvm"}) ||
		!reflect.DeepEqual(structured.InputDrvs[paths[0]], []string{"lib", "out"}) {
		t.Errorf("structured: timeout %v, features %v, inputs %v", structured.TimeoutSecs(), structured.RequiredSystemFeatures(), structured.InputDrvs)
	}
	if !got[paths[3]].IsFixedOutput() || !got[paths[4]].IsFixedOutput() || got[paths[5]].IsFixedOutput() || got[paths[6]].IsFixedOutput() {
		t.Error("fixed-output flags wrong")
	}

	// A .drv the store lacks, and a path that is not a .drv.
	if _, err := n.Derivations(ctx, "/nix/store/00000000000000000000000000000000-gone.drv"); err == nil || !strings.Contains(err.Error(), "gone.drv") {
		t.Errorf("missing .drv: %v", err)
	}
	if _, err := n.Derivations(ctx, append(slices.Clone(paths), "/nix/store/00000000000000000000000000000000-gone.drv")...); err == nil || !strings.Contains(err.Error(), "gone.drv") {
		t.Errorf("a missing .drv among present ones: %v", err)
	}
	if _, err := n.Derivations(ctx, "/etc/passwd"); err == nil {
		t.Error("read /etc/passwd as a derivation")
	}
	// The store still answers after the failures.
	if _, err := n.Derivations(ctx, paths[0]); err != nil {
		t.Errorf("after the failures: %v", err)
	}
}

const atermSample = `Derive([("dev","/nix/store/pvnakv9qd28rd51db59nw054z50xipy4-dep-dev","",""),("out","/nix/store/dgc0pxda9d641nm6csc1qw5kpgddgq5m-dep","","")],` +
	`[("/nix/store/440563xp1gqws0y6kcqcg30aw2v6wwjp-dep.drv",["dev","out"])],["/nix/store/lvz7syi5q8cqhkpw7rng4wk3l500yvx1-script.sh"],` +
	`"x86_64-linux","/bin/sh",["-c","echo \"hi\" \\ \n\t\r"],[("name","dep"),("out","/nix/store/dgc0pxda9d641nm6csc1qw5kpgddgq5m-dep")])`

func TestParseDerivationSample(t *testing.T) {
	d, err := ParseDerivation("/nix/store/qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq-dep-1.0.drv", []byte(atermSample))
	if err != nil {
		t.Fatal(err)
	}
	want := &Derivation{
		Path: "/nix/store/qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq-dep-1.0.drv", Name: "dep-1.0",
		Outputs: map[string]DerivationOutput{
			"dev": {Path: "/nix/store/pvnakv9qd28rd51db59nw054z50xipy4-dep-dev"},
			"out": {Path: "/nix/store/dgc0pxda9d641nm6csc1qw5kpgddgq5m-dep"},
		},
		InputDrvs: map[string][]string{"/nix/store/440563xp1gqws0y6kcqcg30aw2v6wwjp-dep.drv": {"dev", "out"}},
		InputSrcs: []string{"/nix/store/lvz7syi5q8cqhkpw7rng4wk3l500yvx1-script.sh"},
		System:    "x86_64-linux", Builder: "/bin/sh", Args: []string{"-c", "echo \"hi\" \\ \n\t\r"},
		Env: map[string]string{"name": "dep", "out": "/nix/store/dgc0pxda9d641nm6csc1qw5kpgddgq5m-dep"},
	}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("parsed\n%+v\nwant\n%+v", d, want)
	}
	if again, err := ParseDerivation(d.Path, unparseDerivation(d)); err != nil || !reflect.DeepEqual(again, d) {
		t.Errorf("round trip: %v\n%s", err, unparseDerivation(d))
	}
}

// Anything but Nix's own grammar is refused with a message saying where.
func TestParseDerivationRefuses(t *testing.T) {
	good := atermSample
	for name, text := range map[string]string{
		"empty":              "",
		"not a derivation":   "hello",
		"versioned":          `DrvWithVersion("xp-dyn-drv",[])`,
		"truncated":          good[:len(good)-1],
		"trailing bytes":     good + " ",
		"leading space":      " " + good,
		"unknown escape":     strings.Replace(good, `\"hi\"`, `\x`, 1),
		"unterminated":       `Derive([("out`,
		"leading comma":      strings.Replace(good, `[("dev"`, `[,("dev"`, 1),
		"trailing comma":     strings.Replace(good, `["dev","out"]`, `["dev","out",]`, 1),
		"no outputs":         `Derive([],[],[],"x","/bin/sh",[],[])`,
		"duplicate output":   strings.Replace(good, `("dev","/nix/store/pvnakv9qd28rd51db59nw054z50xipy4-dep-dev"`, `("out","/nix/store/pvnakv9qd28rd51db59nw054z50xipy4-dep-dev"`, 1),
		"duplicate env":      strings.Replace(good, `("name","dep")`, `("out","dep")`, 1),
		"relative output":    strings.Replace(good, `"/nix/store/pvnakv9qd28rd51db59nw054z50xipy4-dep-dev"`, `"dep-dev"`, 1),
		"input not a .drv":   strings.Replace(good, `-dep.drv"`, `-dep"`, 1),
		"input no outputs":   strings.Replace(good, `["dev","out"]`, `[]`, 1),
		"source outside":     strings.Replace(good, `"/nix/store/lvz7syi5q8cqhkpw7rng4wk3l500yvx1-script.sh"]`, `"/tmp/x"]`, 1),
		"unknown algorithm":  `Derive([("out","/nix/store/rj4mavypjspwxqjqcy2qfkb9n7m6wxb7-fixed-flat","crc32","00")],[],[],"x","/bin/sh",[],[])`,
		"short hash":         `Derive([("out","/nix/store/rj4mavypjspwxqjqcy2qfkb9n7m6wxb7-fixed-flat","sha256","2c26")],[],[],"x","/bin/sh",[],[])`,
		"upper-case hash":    `Derive([("out","/nix/store/rj4mavypjspwxqjqcy2qfkb9n7m6wxb7-fixed-flat","sha1","ABCDEF0000000000000000000000000000000000")],[],[],"x","/bin/sh",[],[])`,
		"fixed without path": `Derive([("out","","sha1","0000000000000000000000000000000000000000")],[],[],"x","/bin/sh",[],[])`,
		"hash no algorithm":  `Derive([("out","/nix/store/rj4mavypjspwxqjqcy2qfkb9n7m6wxb7-fixed-flat","","00")],[],[],"x","/bin/sh",[],[])`,
	} {
		if _, err := ParseDerivation("/nix/store/qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq-x.drv", []byte(text)); !errors.Is(err, ErrDerivationSyntax) {
			t.Errorf("%s: %v, want a syntax error", name, err)
		}
	}
}

func TestNarRegularFile(t *testing.T) {
	nar := append(narStrings("nix-archive-1", "(", "type", "regular", "contents", "Derive()"), narStrings(")")...)
	if got, err := narRegularFile(nar); err != nil || string(got) != "Derive()" {
		t.Errorf("%q, %v", got, err)
	}
	exe := append(narStrings("nix-archive-1", "(", "type", "regular", "executable", "", "contents", "x"), narStrings(")")...)
	dir := append(narStrings("nix-archive-1", "(", "type", "directory"), narStrings(")")...)
	for name, bad := range map[string][]byte{"executable": exe, "directory": dir, "cut": nar[:len(nar)-1], "longer": append(nar, 0), "empty": nil} {
		if _, err := narRegularFile(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzParseDerivation: no input panics or hangs the parser, and what it
// accepts prints back (as Nix prints it) to text that parses the same.
func FuzzParseDerivation(f *testing.F) {
	f.Add([]byte(atermSample))
	f.Add([]byte(`Derive([("out","","r:sha256","impure")],[],[],"x86_64-linux","/bin/sh",["-c","echo x > $out"],[("a","\\\"")])`))
	f.Add([]byte(`Derive([("out","/nix/store/rj4mavypjspwxqjqcy2qfkb9n7m6wxb7-fixed-flat","sha256","2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae")],[],[],"x","b",[],[])`))
	f.Fuzz(func(t *testing.T, text []byte) {
		d, err := ParseDerivation("/nix/store/qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq-x.drv", text)
		if err != nil {
			if !errors.Is(err, ErrDerivationSyntax) {
				t.Fatalf("error %v is not a syntax error", err)
			}
			return
		}
		again, err := ParseDerivation(d.Path, unparseDerivation(d))
		if err != nil || !reflect.DeepEqual(again, d) {
			t.Fatalf("round trip of %q: %v\n%+v\n%+v", text, err, d, again)
		}
	})
}

// unparseDerivation prints d as Nix writes a .drv (maps in key order).
func unparseDerivation(d *Derivation) []byte {
	var b strings.Builder
	q := func(s string) {
		b.WriteByte('"')
		strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\r", `\r`, "\t", `\t`).WriteString(&b, s)
		b.WriteByte('"')
	}
	list := func(n int, elem func(i int)) {
		b.WriteByte('[')
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			elem(i)
		}
		b.WriteByte(']')
	}
	strs := func(ss []string) { list(len(ss), func(i int) { q(ss[i]) }) }
	keys := func(m any) []string {
		var ks []string
		for _, k := range reflect.ValueOf(m).MapKeys() {
			ks = append(ks, k.String())
		}
		sort.Strings(ks)
		return ks
	}
	b.WriteString("Derive(")
	outs := keys(d.Outputs)
	list(len(outs), func(i int) {
		o := d.Outputs[outs[i]]
		b.WriteByte('(')
		q(outs[i])
		for _, s := range []string{o.Path, o.HashAlgo, o.Hash} {
			b.WriteByte(',')
			q(s)
		}
		b.WriteByte(')')
	})
	b.WriteByte(',')
	ins := keys(d.InputDrvs)
	list(len(ins), func(i int) {
		b.WriteByte('(')
		q(ins[i])
		b.WriteByte(',')
		strs(d.InputDrvs[ins[i]])
		b.WriteByte(')')
	})
	b.WriteByte(',')
	strs(d.InputSrcs)
	b.WriteByte(',')
	q(d.System)
	b.WriteByte(',')
	q(d.Builder)
	b.WriteByte(',')
	strs(d.Args)
	b.WriteByte(',')
	env := keys(d.Env)
	list(len(env), func(i int) {
		b.WriteByte('(')
		q(env[i])
		b.WriteByte(',')
		q(d.Env[env[i]])
		b.WriteByte(')')
	})
	b.WriteByte(')')
	return []byte(b.String())
}
