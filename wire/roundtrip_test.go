package wire

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// valueGen builds random values of wire types by reflection over the
// struct tags and the enum registry, for one protocol version: fields and
// variants that do not exist at that version are left out, so that a value
// must survive encode → decode unchanged.
type valueGen struct {
	r   *rand.Rand
	ver uint16
}

var messageType = map[bool]reflect.Type{
	false: reflect.TypeFor[ClientMessage](),
	true:  reflect.TypeFor[ServerMessage](),
}

func (g *valueGen) fill(v reflect.Value, depth int) {
	t := v.Type()
	if info, ok := Enum(t); ok {
		var present []VariantInfo
		for _, vi := range info.Variants {
			if vi.PresentAt(g.ver) {
				present = append(present, vi)
			}
		}
		vi := present[g.r.IntN(len(present))]
		if info.Unit {
			v.SetUint(vi.Value)
			return
		}
		v.Set(g.variant(vi, depth))
		return
	}
	switch t.Kind() {
	case reflect.Bool:
		v.SetBool(g.r.IntN(2) == 1)
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		x := g.r.Uint64() >> g.r.IntN(64) // small and large values alike
		if t.Bits() < 64 {
			x &= 1<<t.Bits() - 1
		}
		v.SetUint(x)
	case reflect.Int64:
		v.SetInt(int64(g.r.Uint64()) >> g.r.IntN(64))
	case reflect.Float32:
		v.SetFloat(float64(float32(g.r.NormFloat64() * 1e3)))
	case reflect.String:
		v.SetString(g.str())
	case reflect.Pointer:
		if g.r.IntN(3) == 0 {
			return
		}
		p := reflect.New(t.Elem())
		g.fill(p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		n := g.r.IntN(4)
		if depth > 6 {
			n = min(n, 1)
		}
		if n == 0 {
			return // decoding gives nil for an empty sequence
		}
		s := reflect.MakeSlice(t, n, n)
		for i := range n {
			g.fill(s.Index(i), depth+1)
		}
		v.Set(s)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if !g.fieldPresent(f) {
				continue
			}
			g.fill(v.Field(i), depth+1)
		}
	default:
		panic(fmt.Sprintf("no generator for %s", t))
	}
}

func (g *valueGen) variant(vi VariantInfo, depth int) reflect.Value {
	if vi.Type.Kind() == reflect.Pointer {
		p := reflect.New(vi.Type.Elem())
		g.fill(p.Elem(), depth+1)
		return p
	}
	x := reflect.New(vi.Type).Elem()
	g.fill(x, depth+1)
	return x
}

// fieldPresent reports whether a struct field travels at g.ver. Pair's
// fields carry no tag and always travel.
func (g *valueGen) fieldPresent(f reflect.StructField) bool {
	tag, ok := f.Tag.Lookup("wire")
	if !ok {
		return true
	}
	for _, opt := range strings.Split(tag, ",")[1:] {
		if n, ok := strings.CutPrefix(opt, "since="); ok {
			since, _ := strconv.Atoi(n)
			return g.ver >= uint16(since)
		}
	}
	return true
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)) }

func (g *valueGen) str() string {
	alphabet := []string{"a", "Z", "0", "/", "-", "ü", "ß", "→", "🦀", " "}
	n := g.r.IntN(12)
	var b strings.Builder
	for range n {
		b.WriteString(alphabet[g.r.IntN(len(alphabet))])
	}
	return b.String()
}

// message returns a random message of the given top-level variant.
func (g *valueGen) message(vi VariantInfo) Message {
	return g.variant(vi, 0).Interface().(Message)
}

func encodeAny(m Message, server bool, ver uint16) ([]byte, error) {
	if server {
		return AppendServerMessage(nil, m.(ServerMessage), ver)
	}
	return AppendClientMessage(nil, m.(ClientMessage), ver)
}

func decodeAny(frame []byte, server bool, ver uint16) (Message, error) {
	if server {
		return DecodeServerMessage(frame, ver)
	}
	return DecodeClientMessage(frame, ver)
}

// Every variant of both message enums, at every supported version: a random
// value survives encode → decode unchanged, re-encodes to the same bytes, and
// its bytes follow the canonical schema of that version.
func TestRoundTripGeneratedValues(t *testing.T) {
	for ver := OldestVersion; ver <= NewestVersion; ver++ {
		shapes := parseSchemaFile(t, ver)
		for _, server := range []bool{false, true} {
			info, _ := Enum(messageType[server])
			for _, vi := range info.Variants {
				if !vi.PresentAt(ver) {
					continue
				}
				for seed := range uint64(40) {
					g := &valueGen{r: rand.New(rand.NewPCG(seed, uint64(ver))), ver: ver}
					m := g.message(vi)
					frame, err := encodeAny(m, server, ver)
					if err != nil {
						t.Fatalf("v%d %s seed %d: encode: %v", ver, vi.Name, seed, err)
					}
					back, err := decodeAny(frame, server, ver)
					if err != nil {
						t.Fatalf("v%d %s seed %d: decode %x: %v", ver, vi.Name, seed, frame, err)
					}
					if !reflect.DeepEqual(m, back) {
						t.Fatalf("v%d %s seed %d: round trip changed the value\n in: %#v\nout: %#v", ver, vi.Name, seed, m, back)
					}
					again, _ := encodeAny(back, server, ver)
					if !bytes.Equal(frame, again) {
						t.Fatalf("v%d %s: re-encoding differs", ver, vi.Name)
					}
					side := map[bool]string{false: "client", true: "server"}[server]
					if err := shapes[side].match(frame); err != nil {
						t.Fatalf("v%d %s seed %d: frame %x does not follow schema/v%d.txt: %v", ver, vi.Name, seed, frame, ver, err)
					}
					// Every strict prefix of a valid frame is Truncated, never a panic.
					if len(frame) > 1 {
						cut := frame[:g.r.IntN(len(frame)-1)+1]
						if _, err := decodeAny(cut, server, ver); err == nil {
							t.Fatalf("v%d %s: prefix %x decoded", ver, vi.Name, cut)
						}
					}
				}
			}
		}
	}
}

// The schema files are the code's shape, byte for byte, and the folder holds
// exactly one file per supported version.
func TestSchemaFilesMatchCode(t *testing.T) {
	entries, err := os.ReadDir("schema")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	var want []string
	for ver := OldestVersion; ver <= NewestVersion; ver++ {
		want = append(want, fmt.Sprintf("v%d.txt", ver))
		file, err := os.ReadFile(filepath.Join("schema", fmt.Sprintf("v%d.txt", ver)))
		if err != nil {
			t.Fatal(err)
		}
		if got := Schema(ver); got != string(file) {
			t.Errorf("schema/v%d.txt differs from the code:\n%s", ver, lineDiff(string(file), got))
		}
	}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("schema folder holds %v, want %v", names, want)
	}
	// The repository's files are copies of the canonical ones when the
	// specification is checked out beside the project.
	for ver := OldestVersion; ver <= NewestVersion; ver++ {
		canonical, err := os.ReadFile(filepath.Join("..", "..", "shared", "spec", "schema", fmt.Sprintf("v%d.txt", ver)))
		if err != nil {
			t.Skipf("canonical schema not available: %v", err)
		}
		if Schema(ver) != string(canonical) {
			t.Errorf("code differs from the canonical v%d.txt", ver)
		}
	}
}

func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out strings.Builder
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			fmt.Fprintf(&out, "file: %s\ncode: %s\n", x, y)
		}
	}
	return out.String()
}
