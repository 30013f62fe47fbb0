package nix

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/nixbase32"
)

// These tests read recorded outputs (testdata/README.md) and need no Nix.

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]Version{
		string(readTestdata(t, "version-2.8.txt")):     {2, 8, 0},
		"nix (Nix) 2.24.10\n":                          {2, 24, 10},
		"nix (Nix) 2.26.0pre20250101_0123abcd\n":       {2, 26, 0},
		"nix (Nix) 2.3\n":                              {2, 3, 0},
		"nix (Lix, like Nix) 2.91.1\nSystem type: x\n": {2, 91, 1},
	} {
		got, err := ParseVersion(in)
		if err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseVersion("nix: command not found"); err == nil {
		t.Error("ParseVersion accepted garbage")
	}
	v := Version{2, 18, 1}
	if !v.AtLeast(2, 18) || !v.AtLeast(2, 8) || v.AtLeast(2, 19) || v.AtLeast(3, 0) || !(Version{3, 0, 0}).AtLeast(2, 30) {
		t.Error("AtLeast is wrong")
	}
}

func TestParseConfig(t *testing.T) {
	for _, name := range []string{"showconfig-2.8.txt", "configshow-2.24.txt"} {
		t.Run(name, func(t *testing.T) {
			s := parseConfig(readTestdata(t, name))
			if s["system"] != "x86_64-linux" || s["sandbox"] != "false" {
				t.Errorf("system %q sandbox %q", s["system"], s["sandbox"])
			}
			if v, ok := s["substituters"]; !ok || v != "" {
				t.Errorf("empty substituters: %q %v", v, ok)
			}
			if features := s["system-features"]; !slices.Contains(strings.Fields(features), "big-parallel") {
				t.Errorf("system-features %q", features)
			}
			if len(strings.Fields(s["extra-platforms"])) != 5 {
				t.Errorf("extra-platforms %q", s["extra-platforms"])
			}
			for name := range s {
				if name == "warning:" || name == "" {
					t.Errorf("bad setting name %q", name)
				}
			}
		})
	}
}

const (
	greetOut  = "/nix/store/b8dwwvjv9ffrgm4vfswii3r8y0xcc2hj-greet"
	greetDrv  = "/nix/store/y1n665l4pcv2b5zzbi4xjafl7hd3sink-greet.drv"
	helloOut  = "/nix/store/hhmh7sq5jnlf31d34xnqvbjmln72pwrx-hello-1.0"
	helloDrv  = "/nix/store/hfd23x120hp2f7nydzf8si34jrpp93pg-hello-1.0.drv"
	srcPath   = "/nix/store/jdxxs7pybfz61dbqm64hmvwr1anryrc7-src.txt"
	nothing   = "/nix/store/00000000000000000000000000000000-nothing"
	fixedDrv  = "/nix/store/fh684lncam25z8qs4mbz4xmxqwfwnav4-fixed.drv"
	fixedOut  = "/nix/store/19fh7wyy68shhsscywmgxdxxfwsyf4jp-fixed"
	greetNix  = "sha256:0vg9xciypc6fr2kjswpd4kp5h7ayvzm55g9h1ih86nm1rcdnl4j6"
	srcNix    = "sha256:0sz2hldrjiknqxsv8kvp8zl00cb871x59ddd1q7pxnjh0xz65sql"
	srcCA     = "fixed:r:" + srcNix
	fixedHash = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"
)

func TestNarHashNix32Forms(t *testing.T) {
	for _, in := range []string{
		"sha256-FOtifgdQ2n4PDq21VHo4aDEA6Ed3T7R1x3ZGmRuF4ms=",
		srcNix,
		"sha256:14eb627e0750da7e0f0eadb5547a38683100e847774fb475c77646991b85e26b",
		"sha256:FOtifgdQ2n4PDq21VHo4aDEA6Ed3T7R1x3ZGmRuF4ms=",
	} {
		if got, err := (PathInfo{NarHash: in}).NarHashNix32(); err != nil || got != srcNix {
			t.Errorf("NarHashNix32(%q) = %q, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "sha1-AAAA", "sha256-AAAA", "sha256:xyz", "md5:14eb627e0750da7e0f0eadb5547a3868"} {
		if got, err := (PathInfo{NarHash: bad}).NarHashNix32(); err == nil {
			t.Errorf("NarHashNix32(%q) = %q", bad, got)
		}
	}
}

func TestParseDerivationsJSON(t *testing.T) {
	var first map[string]*Derivation
	for _, name := range []string{"showderivation-2.8.json", "derivationshow-2.18.json", "derivationshow-v3.json", "derivationshow-v4.json"} {
		t.Run(name, func(t *testing.T) {
			drvs, err := parseDerivationsJSON(readTestdata(t, name))
			if err != nil {
				t.Fatal(err)
			}
			greet, fixed := drvs[greetDrv], drvs[fixedDrv]
			if len(drvs) != 2 || greet == nil || fixed == nil {
				t.Fatalf("derivations %v", drvs)
			}
			if greet.Path != greetDrv || greet.Name != "greet" || greet.System != "x86_64-linux" || greet.Builder != "/bin/sh" ||
				!slices.Equal(greet.InputDrvs[helloDrv], []string{"out"}) || len(greet.InputDrvs) != 1 || len(greet.InputSrcs) != 0 ||
				greet.OutputPaths()["out"] != greetOut || greet.IsFixedOutput() || len(greet.Args) != 2 {
				t.Errorf("greet %+v", greet)
			}
			if out := fixed.Outputs["out"]; out.Path != fixedOut || out.Hash != fixedHash || out.HashAlgo != "sha256" || !fixed.IsFixedOutput() {
				t.Errorf("fixed output %+v", out)
			}
			if first == nil {
				first = drvs
			} else if !reflect.DeepEqual(drvs, first) {
				t.Errorf("differs from the 2.8 parse:\n%+v\n%+v", drvs[greetDrv], first[greetDrv])
			}
		})
	}
}

func limitIs(got *uint64, want uint64) bool { return got != nil && *got == want }

// An explicit 0 is "no limit", kept apart from an unset attribute (the
// server's default); a malformed or negative value counts as unset.
func TestDerivationLimitsZeroAndUnset(t *testing.T) {
	data := `{
	  "abcdabcdabcdabcdabcdabcdabcdabcd-env.drv": {"name": "env", "outputs": {}, "inputSrcs": [], "inputDrvs": {},
	    "system": "x86_64-linux", "builder": "/bin/sh", "args": [], "env": {"timeout": "0"}},
	  "abcdabcdabcdabcdabcdabcdabcdabcd-bad.drv": {"name": "bad", "outputs": {}, "inputSrcs": [], "inputDrvs": {},
	    "system": "x86_64-linux", "builder": "/bin/sh", "args": [], "env": {"timeout": "soon", "maxSilent": "-3"}},
	  "abcdabcdabcdabcdabcdabcdabcdabcd-json.drv": {"version": 4, "name": "json", "outputs": {},
	    "inputs": {"srcs": [], "drvs": {}}, "system": "x86_64-linux", "builder": "/bin/sh", "args": [], "env": {},
	    "structuredAttrs": {"timeout": 0, "maxSilent": 12}}}`
	drvs, err := parseDerivationsJSON([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	env, bad, structured := drvs["/nix/store/abcdabcdabcdabcdabcdabcdabcdabcd-env.drv"], drvs["/nix/store/abcdabcdabcdabcdabcdabcdabcdabcd-bad.drv"], drvs["/nix/store/abcdabcdabcdabcdabcdabcdabcdabcd-json.drv"]
	if env == nil || bad == nil || structured == nil {
		t.Fatalf("parsed %v", drvs)
	}
	if !limitIs(env.TimeoutSecs(), 0) || env.MaxSilentSecs() != nil {
		t.Errorf("env: timeout %v maxSilent %v, want 0 and unset", env.TimeoutSecs(), env.MaxSilentSecs())
	}
	if bad.TimeoutSecs() != nil || bad.MaxSilentSecs() != nil {
		t.Errorf("malformed: timeout %v maxSilent %v, want unset", bad.TimeoutSecs(), bad.MaxSilentSecs())
	}
	if !limitIs(structured.TimeoutSecs(), 0) || !limitIs(structured.MaxSilentSecs(), 12) {
		t.Errorf("structured: timeout %v maxSilent %v, want 0 and 12", structured.TimeoutSecs(), structured.MaxSilentSecs())
	}
}

func TestParseDerivationStructuredAttrs(t *testing.T) {
	data := `{"abcdabcdabcdabcdabcdabcdabcdabcd-x.drv": {"version": 4, "name": "x",
	  "outputs": {"out": {"method": "nar", "hashAlgo": "sha256"}},
	  "inputs": {"srcs": ["abcdabcdabcdabcdabcdabcdabcdabcd-src"], "drvs": {}},
	  "system": "x86_64-linux", "builder": "/bin/sh", "args": [], "env": {},
	  "structuredAttrs": {"requiredSystemFeatures": ["kvm"], "timeout": 7}}}`
	drvs, err := parseDerivationsJSON([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	d := drvs["/nix/store/abcdabcdabcdabcdabcdabcdabcdabcd-x.drv"]
	if d == nil || !slices.Equal(d.RequiredSystemFeatures(), []string{"kvm"}) || !limitIs(d.TimeoutSecs(), 7) ||
		!slices.Equal(d.InputSrcs, []string{"/nix/store/abcdabcdabcdabcdabcdabcdabcdabcd-src"}) {
		t.Fatalf("%+v", d)
	}
	if out := d.Outputs["out"]; out.Path != "" || out.HashAlgo != "r:sha256" || out.Hash != "" {
		t.Errorf("floating output %+v", out)
	}
}

func TestDaemonImportChecks(t *testing.T) {
	good := NarImport{StorePath: greetOut, NarHash: "sha256-RhJqG8uhWoNgDDC9UurfXh1Y7iTtci2nyM6w6yPr6W0=", NarSize: 168,
		References: []string{helloOut}, Deriver: greetDrv}
	got, err := daemonImport(good)
	if err != nil || got.Path != greetOut || nixbase32.Encode(got.NarHash) != strings.TrimPrefix(greetNix, "sha256:") ||
		got.NarSize != 168 || got.Deriver != greetDrv || !slices.Equal(got.References, []string{helloOut}) {
		t.Errorf("daemonImport = %+v, %v", got, err)
	}
	for _, bad := range []NarImport{
		{StorePath: "/tmp/x", NarHash: greetNix, NarSize: 1},
		{StorePath: greetOut, NarHash: "md5:x", NarSize: 1},
		{StorePath: greetOut, NarHash: greetNix, NarSize: 0},
		{StorePath: greetOut, NarHash: greetNix, NarSize: 1, References: []string{"hello"}},
		{StorePath: greetOut, NarHash: greetNix, NarSize: 1, Deriver: "greet.drv"},
	} {
		if _, err := daemonImport(bad); err == nil {
			t.Errorf("daemonImport(%+v) succeeded", bad)
		}
	}
}
