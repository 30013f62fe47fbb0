// Package wildcard is the syntax of the attribute patterns a project's
// evaluations build (docs/protocol/worker.md §6.2): comma-separated
// patterns of dotted segments, `*` and `#` wildcards, quoted segments and
// `!exclusions`. It is a leaf: the server checks an operator's patterns
// with it without linking the worker's Nix code.
package wildcard

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Roots are the output attributes a pattern may start with.
var Roots = []string{"checks", "packages", "formatter", "legacyPackages", "nixosConfigurations", "devShells", "hydraJobs"}

// Default is what to evaluate when a job names no patterns.
const Default = "packages.x86_64-linux.*"

// Segment is one step of a pattern: a name, "*" or "#".
type Segment struct {
	Kind string `json:"kind"` // "name", "star" or "hash"
	Name string `json:"name,omitempty"`
}

// Pattern is one parsed pattern.
type Pattern struct {
	Text     string // the pattern; for an explicit one its attribute path
	Segments []Segment
	Explicit bool // no wildcard: names exactly one attribute
}

// Parse splits comma-separated patterns into patterns and exclusions
// (exact dotted paths). Without a pattern it returns Default.
func Parse(wildcards []string) (patterns []Pattern, exclusions []string, err error) {
	var texts []string
	for _, w := range wildcards {
		texts = append(texts, splitOutsideQuotes(w, ',')...)
	}
	for _, text := range texts {
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		if strings.Count(text, `"`)%2 != 0 {
			return nil, nil, fmt.Errorf("wildcard: pattern %q has an unterminated quote", text)
		}
		if rest, ok := strings.CutPrefix(text, "!"); ok {
			if strings.ContainsAny(rest, "*#") {
				return nil, nil, fmt.Errorf("wildcard: exclusion %q may not contain wildcards", text)
			}
			segs := splitOutsideQuotes(rest, '.')
			if slices.Contains(segs, "") {
				return nil, nil, fmt.Errorf("wildcard: exclusion %q has an empty segment", text)
			}
			exclusions = append(exclusions, FormatAttr(unquoteAll(segs)))
			continue
		}
		p, err := parsePattern(text)
		if err != nil {
			return nil, nil, err
		}
		patterns = append(patterns, p)
	}
	if len(patterns) == 0 {
		p, _ := parsePattern(Default)
		patterns = append(patterns, p)
	}
	return patterns, exclusions, nil
}

// Split checks comma-separated wildcards and returns their patterns and
// exclusions one per element, trimmed, in order. Unlike an evaluation it
// adds no default: an empty pattern, or wildcards with no pattern besides
// exclusions, are errors.
func Split(wildcards []string) ([]string, error) {
	var out []string
	included := false
	for _, w := range wildcards {
		for _, text := range splitOutsideQuotes(w, ',') {
			text = strings.TrimSpace(text)
			if text == "" {
				return nil, fmt.Errorf("wildcard: empty pattern in %q", w)
			}
			if _, _, err := Parse([]string{text}); err != nil {
				return nil, err
			}
			included = included || !strings.HasPrefix(text, "!")
			out = append(out, text)
		}
	}
	if !included {
		return nil, errors.New("wildcard: no pattern to evaluate (exclusions alone select nothing)")
	}
	return out, nil
}

func parsePattern(text string) (Pattern, error) {
	p := Pattern{Explicit: true}
	var names []string
	for _, raw := range splitOutsideQuotes(text, '.') {
		var s Segment
		switch raw {
		case "*":
			s = Segment{Kind: "star"}
			p.Explicit = false
			if n := len(p.Segments); n > 0 && p.Segments[n-1].Kind == "star" {
				continue // consecutive stars collapse
			}
		case "#":
			s = Segment{Kind: "hash"}
			p.Explicit = false
		case "":
			return Pattern{}, fmt.Errorf("wildcard: pattern %q has an empty segment", text)
		default:
			s = Segment{Kind: "name", Name: unquote(raw)}
			names = append(names, s.Name)
		}
		p.Segments = append(p.Segments, s)
	}
	if first := p.Segments[0]; first.Kind != "name" || !slices.Contains(Roots, first.Name) {
		return Pattern{}, fmt.Errorf("wildcard: pattern %q must start with one of %s", text, strings.Join(Roots, ", "))
	}
	if p.Explicit {
		p.Text = FormatAttr(names)
	} else {
		p.Text = text
	}
	return p, nil
}

// splitOutsideQuotes splits s at sep except inside double quotes, keeping
// the quotes.
func splitOutsideQuotes(s string, sep rune) []string {
	var parts []string
	var cur strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			cur.WriteRune(r)
		case r == sep && !quoted:
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	return append(parts, cur.String())
}

func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

func unquoteAll(segs []string) []string {
	out := make([]string, len(segs))
	for i, s := range segs {
		out[i] = unquote(strings.TrimSpace(s))
	}
	return out
}

// FormatAttr joins an attribute path, quoting segments that contain dots.
func FormatAttr(segs []string) string {
	out := make([]string, len(segs))
	for i, s := range segs {
		if strings.ContainsAny(s, ".\" ") {
			s = `"` + s + `"`
		}
		out[i] = s
	}
	return strings.Join(out, ".")
}
