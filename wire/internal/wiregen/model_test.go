package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadSource runs the generator's model on a synthetic package.
func loadSource(t *testing.T, src string) (*Model, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte("package x\n"+src), 0o644); err != nil {
		t.Fatal(err)
	}
	return load(dir)
}

func source(enumOpts, extraVariants, types string) string {
	lines := []string{"//wire:enum " + enumOpts, "//wire:variant 0 A *A"}
	if extraVariants != "" {
		lines = append(lines, extraVariants)
	}
	lines = append(lines, "type ClientMessage interface{}", "",
		"//wire:enum", "//wire:variant 0 S *S", "type ServerMessage interface{}", "",
		"type S struct{}", types)
	return strings.Join(lines, "\n") + "\n"
}

// The range rules of docs/protocol/wire.md §2.5, one annotation at a time.
func TestProtoVersions(t *testing.T) {
	cases := []struct {
		name           string
		opts, variants string
		types          string
		oldest, newest int
	}{
		{"plain", "", "", "type A struct{ X string `wire:\"x\"` }", 0, 0},
		{"oldest attribute", "oldest=30", "", "type A struct{ X string `wire:\"x\"` }", 30, 30},
		{"required field raises oldest", "oldest=30", "", "type A struct{ X string `wire:\"x,since=31\"` }", 31, 31},
		{"default field raises only newest", "oldest=30", "", "type A struct{ X string `wire:\"x,since=33,default\"` }", 30, 33},
		{"new variant raises only newest", "oldest=30", "//wire:variant 1 B *B since=32", "type A struct{}\ntype B struct{ Y uint64 `wire:\"y\"` }", 30, 32},
		{"field as new as its variant", "oldest=30", "//wire:variant 1 B *B since=32", "type A struct{}\ntype B struct{ Y uint64 `wire:\"y,since=32\"` }", 30, 32},
		{"removed variant, tag reused", "oldest=30", "//wire:variant 1 H *H until=31\n//wire:variant 1 I *I since=32", "type A struct{}\ntype H struct{}\ntype I struct{}", 30, 32},
	}
	for _, c := range cases {
		m, err := loadSource(t, source(c.opts, c.variants, c.types))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		o, n := m.ProtoVersions()
		if o != c.oldest || n != c.newest {
			t.Errorf("%s: range %d..=%d, want %d..=%d", c.name, o, n, c.oldest, c.newest)
		}
	}
}

func TestAnnotationErrors(t *testing.T) {
	cases := []struct{ name, variants, types, want string }{
		{"default without since", "", "type A struct{ X string `wire:\"x,default\"` }", "default needs since"},
		{"tag out of order", "//wire:variant 2 B *B", "type A struct{}\ntype B struct{}", "append-only"},
		{"older variant after newer", "//wire:variant 1 B *B since=32\n//wire:variant 2 C *C since=31", "type A struct{}\ntype B struct{}\ntype C struct{}", "older than the variant before"},
		{"reused tag without removal", "//wire:variant 0 B *B since=32", "type A struct{}\ntype B struct{}", "append-only"},
		{"missing tag", "", "type A struct{ X string }", "missing wire tag"},
		{"unknown option", "", "type A struct{ X string `wire:\"x,sinse=3\"` }", "unknown wire option"},
		{"two classes", "//wire:variant 1 B *B job cache", "type A struct{}\ntype B struct{}", "two classes"},
	}
	for _, c := range cases {
		_, err := loadSource(t, source("", c.variants, c.types))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// The generated file is what the generator makes of the annotations now.
func TestGeneratedFileIsCurrent(t *testing.T) {
	m, err := load(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	src, err := emit(m)
	if err != nil {
		t.Fatal(err)
	}
	want, err := formatSource(src)
	if err != nil {
		t.Fatal(err)
	}
	have, err := os.ReadFile(filepath.Join("..", "..", "wire_gen.go"))
	if err != nil {
		t.Fatal(err)
	}
	if string(have) != string(want) {
		t.Fatal("wire/wire_gen.go is stale or edited by hand: run go generate ./wire")
	}
}
