package main

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gradient.dev/gradient/wire"
)

// gradient runs the command with stdin and returns its exit code, stdout
// and stderr.
func gradient(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestGoldenVectors(t *testing.T) {
	cases := []struct {
		side, frame string
		versions    []uint16
		want        string // a fragment of the JSON
	}{
		{"client", "15016a017102022f61022f6201020001ac0201", []uint16{30, 31, 32, 33},
			`{"CacheQuery":{"job_id":"j","query_id":"q","paths":["/a","/b"],"mode":"Pull","nar_sizes":[null,300],"external":true}}`},
		{"client", "050000c03f800101000000c00000", []uint16{30, 31, 32},
			`{"WorkerMetrics":{"cpu_usage_pct":1.5,"ram_free_mb":128,"disk_speed_mbps":-2,`},
		{"client", "050000c03f800101000000c0000000", []uint16{33}, `"build_peak_ram_mb":null}}`},
		{"client", "050000c03f800101000000c000000101036162638004", []uint16{33}, `"build_peak_ram_mb":[["abc",512]]}}`},
		{"client", "00000000000000027731", []uint16{31, 32, 33},
			`{"InitConnection":{"capabilities":{"core":false,"federate":false,"fetch":false,"eval":false,"build":false,"cache":false},"id":"w1"}}`},
	}
	for _, c := range cases {
		for _, v := range c.versions {
			ver := fmt.Sprint(v)
			code, out, errOut := gradient(t, c.frame+"\n", "wire", "decode", "--side", c.side, "--version", ver)
			if code != 0 || errOut != "" {
				t.Fatalf("decode %s at %d: exit %d, stderr %q", c.frame, v, code, errOut)
			}
			if !strings.Contains(out, c.want) || strings.Count(out, "\n") != 1 {
				t.Errorf("decode %s at %d: got %q, want it to contain %s", c.frame, v, out, c.want)
			}
			code, back, errOut := gradient(t, out, "wire", "encode", "--side", c.side, "--version", ver)
			if code != 0 || back != c.frame+"\n" {
				t.Errorf("encode at %d: exit %d, got %q want %q (stderr %q)", v, code, back, c.frame, errOut)
			}
		}
	}
}

// TestDecodeEncodeRoundTrip pushes frames of every variant of both message
// enums through decode | encode at every version that has the variant.
func TestDecodeEncodeRoundTrip(t *testing.T) {
	for _, side := range []string{"client", "server"} {
		enum := reflect.TypeFor[wire.ClientMessage]()
		if side == "server" {
			enum = reflect.TypeFor[wire.ServerMessage]()
		}
		info, _ := wire.Enum(enum)
		for ver := wire.OldestVersion; ver <= wire.NewestVersion; ver++ {
			var frames []string
			for _, vi := range info.Variants {
				if !vi.PresentAt(ver) {
					continue
				}
				for seed := range 12 {
					m := reflect.New(vi.Type.Elem())
					f := filler{ver: ver, seed: seed}
					f.fill(m.Elem(), 0)
					var frame []byte
					var err error
					if side == "client" {
						frame, err = wire.AppendClientMessage(nil, m.Interface().(wire.ClientMessage), ver)
					} else {
						frame, err = wire.AppendServerMessage(nil, m.Interface().(wire.ServerMessage), ver)
					}
					if err != nil {
						t.Fatalf("%s %s v%d: %v", side, vi.Name, ver, err)
					}
					frames = append(frames, hex.EncodeToString(frame))
				}
			}
			in := strings.Join(frames, "\n") + "\n"
			v := fmt.Sprint(ver)
			code, js, errOut := gradient(t, in, "wire", "decode", "--side", side, "--version", v)
			if code != 0 || errOut != "" {
				t.Fatalf("%s v%d decode: exit %d, stderr %s", side, ver, code, errOut)
			}
			code, back, errOut := gradient(t, js, "wire", "encode", "--side", side, "--version", v)
			if code != 0 || errOut != "" {
				t.Fatalf("%s v%d encode: exit %d, stderr %s", side, ver, code, errOut)
			}
			if back != in {
				got := strings.Split(back, "\n")
				for i, f := range frames {
					if i >= len(got) || got[i] != f {
						t.Fatalf("%s v%d frame %d changed:\n in  %s\n out %s", side, ver, i, f, got[min(i, len(got)-1)])
					}
				}
				t.Fatalf("%s v%d: output differs", side, ver)
			}
		}
	}
}

// filler builds deterministic values that differ by seed: every enum
// variant present at ver is reached across seeds, options alternate
// between nil and set, and integers hit their extremes.
type filler struct {
	ver  uint16
	seed int
	n    int // values filled so far, to vary siblings
}

func (f *filler) fill(v reflect.Value, depth int) {
	f.n++
	k := f.seed + f.n
	t := v.Type()
	if info, ok := wire.Enum(t); ok {
		var present []wire.VariantInfo
		for _, vi := range info.Variants {
			if vi.PresentAt(f.ver) {
				present = append(present, vi)
			}
		}
		vi := present[(f.seed+depth)%len(present)]
		if info.Unit {
			v.SetUint(vi.Value)
			return
		}
		if vi.Type.Kind() == reflect.Pointer {
			p := reflect.New(vi.Type.Elem())
			f.fill(p.Elem(), depth+1)
			v.Set(p)
		} else {
			x := reflect.New(vi.Type).Elem()
			f.fill(x, depth+1)
			v.Set(x)
		}
		return
	}
	switch t.Kind() {
	case reflect.Bool:
		v.SetBool(k%2 == 1)
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		vals := []uint64{0, 1, 300, 1<<t.Bits() - 1}
		if t.Bits() == 64 {
			vals[3] = math.MaxUint64
		}
		v.SetUint(vals[k%len(vals)])
	case reflect.Int64:
		v.SetInt([]int64{0, -1, math.MinInt64, math.MaxInt64, 42}[k%5])
	case reflect.Float32:
		bits := []uint32{0x3fc00000, 0x80000000, 0x7fc00001, 0xff800000, 0x00000001}[k%5]
		v.SetFloat(float64(math.Float32frombits(bits)))
	case reflect.String:
		v.SetString([]string{"", "w1", "/nix/store/a-b", "q\"uo\\te\n", "é€😀"}[k%5])
	case reflect.Pointer:
		if k%3 == 0 {
			return
		}
		p := reflect.New(t.Elem())
		f.fill(p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		n := k % 3
		s := reflect.MakeSlice(t, n, n)
		for i := range n {
			f.fill(s.Index(i), depth+1)
		}
		v.Set(s)
	case reflect.Struct:
		for i := range t.NumField() {
			f.fill(v.Field(i), depth+1)
		}
	}
}

func TestDecodeErrorsContinue(t *testing.T) {
	in := "02\n\n15\nzz\n  06  \n1c\n0200\n"
	code, out, errOut := gradient(t, in, "wire", "decode", "--side", "client", "--version", "31")
	if code == 0 {
		t.Errorf("exit 0 despite bad frames")
	}
	if out != "\"ReauthRequest\"\n\"RequestJobList\"\n" {
		t.Errorf("stdout %q", out)
	}
	for _, want := range []string{
		"line 3: frame ended early\n",
		"line 4: invalid hex",
		"line 6: unknown variant 28 of ClientMessage at protocol 31\n",
		"line 7: 1 bytes left after the message\n",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr %q lacks %q", errOut, want)
		}
	}
}

func TestEncodeErrorsContinue(t *testing.T) {
	in := `"ReauthRequest"` + "\n" + `{"Nope":{}}` + "\n" + `"HandoverDone"` + "\n" + `{"WorkerMetrics":` + "\n" + `"Draining"` + "\n"
	code, out, errOut := gradient(t, in, "wire", "encode", "--side", "client", "--version", "33")
	if code == 0 {
		t.Errorf("exit 0 despite bad lines")
	}
	if out != "02\n0c\n" {
		t.Errorf("stdout %q", out)
	}
	for _, want := range []string{
		`line 2: unknown variant "Nope" of ClientMessage`,
		"line 3: HandoverDone was removed in protocol 31, the peer speaks 33",
		"line 4: invalid JSON",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr %q lacks %q", errOut, want)
		}
	}
}

func TestNewerThanPeer(t *testing.T) {
	code, _, errOut := gradient(t, `{"ImportRequest":{"job_id":"j"}}`, "wire", "encode", "--side", "client", "--version", "31")
	if code == 0 || !strings.Contains(errOut, "line 1: ImportRequest exists since protocol 32, the peer speaks 31") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"wire", "decode", "--side", "client", "--version", "29"}, "this build speaks 30..=33"},
		{[]string{"wire", "encode", "--side", "server", "--version", "34"}, "this build speaks 30..=33"},
		{[]string{"wire", "schema", "--version", "70000"}, "this build speaks 30..=33"},
		{[]string{"wire", "decode"}, "--side must be client or server"},
		{[]string{"wire", "decode", "--side", "worker"}, "--side must be client or server"},
		{[]string{"wire", "decode", "--side", "client", "--bogus"}, "flag provided but not defined"},
		{[]string{"wire", "decode", "--side", "client", "extra"}, "unexpected argument"},
		{[]string{"wire"}, "missing subcommand"},
		{[]string{"wire", "frobnicate"}, "unknown subcommand"},
		{[]string{"frobnicate"}, "Usage: gradient"},
	}
	for _, c := range cases {
		code, out, errOut := gradient(t, "", c.args...)
		if code != exitUsage || out != "" || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, out, errOut, c.want)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{nil, {"help"}, {"-h"}, {"--help"}} {
		code, out, _ := gradient(t, "", args...)
		if code != 0 || !strings.Contains(out, "wire decode") || !strings.Contains(out, "up") {
			t.Errorf("%v: exit %d, stdout %q", args, code, out)
		}
	}
	if code, _, _ := gradient(t, "", "wire", "decode", "-h"); code != 0 {
		t.Errorf("wire decode -h: exit %d", code)
	}
}

func TestVersionsAndUp(t *testing.T) {
	code, out, _ := gradient(t, "", "wire", "versions")
	if code != 0 || out != wire.Supported.String()+"\n" || out != "30..=33\n" {
		t.Errorf("versions: exit %d, %q", code, out)
	}
	code, _, errOut := gradient(t, "", "up", "-h")
	if code != 0 || !strings.Contains(errOut, "Usage: gradient up") {
		t.Errorf("up -h: exit %d, %q", code, errOut)
	}
}

func TestSchema(t *testing.T) {
	for ver := wire.OldestVersion; ver <= wire.NewestVersion; ver++ {
		code, out, errOut := gradient(t, "", "wire", "schema", "--version", fmt.Sprint(ver))
		if code != 0 || errOut != "" {
			t.Fatalf("schema %d: exit %d, stderr %q", ver, code, errOut)
		}
		want := wire.Schema(ver)
		// Prefer the published schema file when the tree has it.
		b, err := os.ReadFile(filepath.Join("..", "..", "wire", "schema", fmt.Sprintf("v%d.txt", ver)))
		switch {
		case err == nil:
			want = string(b)
		case !errors.Is(err, fs.ErrNotExist):
			t.Fatal(err)
		}
		if out != want {
			t.Errorf("schema %d differs:\n%s", ver, out)
		}
		if !strings.HasPrefix(out, "client\n0:") {
			t.Errorf("schema %d: unexpected start %q", ver, out[:min(len(out), 20)])
		}
	}
}
