package wildcard

import (
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	patterns, exclusions, err := Parse([]string{`packages.*.*, checks."a.b".#`, `!packages.x."y.z"`})
	if err != nil {
		t.Fatal(err)
	}
	if len(patterns) != 2 || len(patterns[0].Segments) != 2 || patterns[0].Explicit {
		t.Errorf("patterns %+v", patterns)
	}
	if s := patterns[1].Segments[1]; s.Kind != "name" || s.Name != "a.b" {
		t.Errorf("quoted segment %+v", s)
	}
	if !slices.Equal(exclusions, []string{`packages.x."y.z"`}) {
		t.Errorf("exclusions %v", exclusions)
	}
	if p, _, _ := Parse(nil); len(p) != 1 || p[0].Text != Default {
		t.Errorf("default %+v", p)
	}
	for _, bad := range []string{"foo.*", "packages..x", "!packages.*"} {
		if _, _, err := Parse([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestSplit(t *testing.T) {
	got, err := Split([]string{` packages.*.* ,checks.x86_64-linux.*`, `!packages.x."y.z"`})
	if err != nil || !slices.Equal(got, []string{"packages.*.*", "checks.x86_64-linux.*", `!packages.x."y.z"`}) {
		t.Errorf("Split = %q, %v", got, err)
	}
	for _, bad := range [][]string{
		nil, {""}, {"packages.*,"}, {"packages.*, , checks.*"}, {"foo.*"}, {"packages..x"},
		{`packages."a.b`}, {"!packages.x"}, {"!packages..x"}, {"!"},
	} {
		if got, err := Split(bad); err == nil {
			t.Errorf("Split(%q) = %q, want an error", bad, got)
		}
	}
}
