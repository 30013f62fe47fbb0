package nix

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// walkerExpr walks flake outputs along parsed patterns; see walker.nix.
//
//go:embed walker.nix
var walkerExpr string

// wildcardRoots are the output attributes a pattern may start with.
var wildcardRoots = []string{"checks", "packages", "formatter", "legacyPackages", "nixosConfigurations", "devShells", "hydraJobs"}

// DefaultWildcard is what to evaluate when a job names no patterns.
const DefaultWildcard = "packages.x86_64-linux.*"

// FoundDerivation is a derivation attribute the wildcards matched.
type FoundDerivation struct {
	Attr    string // dotted; segments containing '.' are quoted
	DrvPath string // instantiated in the store
}

// Evaluation is the outcome of matching wildcards against a flake.
type Evaluation struct {
	Derivations []FoundDerivation // sorted by Attr, without exclusions
	// AttrErrors maps attributes that failed to evaluate to Nix's message;
	// the rest of the walk went on.
	AttrErrors map[string]string
	// Unmatched lists "target '<attr>' matched no derivations in the flake"
	// for explicit (wildcard-free) patterns that found nothing.
	Unmatched []string
}

// segment is one step of a pattern: a name, "*" or "#".
type segment struct {
	Kind string `json:"kind"` // "name", "star" or "hash"
	Name string `json:"name,omitempty"`
}

type pattern struct {
	text     string
	segments []segment
	explicit bool
}

// Attributes finds the derivations in flakeRef's outputs matching wildcards
// (comma-separated patterns; `*`, `#`, quoted segments, `!exclusions`; see
// WORKER.md §6.2) and instantiates them.
//
// Nix 2.8's tryEval only catches throw and assert: an attribute failing
// otherwise (abort, type error) aborts the walk and Attributes returns the
// error. The message of a caught failure is recovered by evaluating that
// attribute alone.
func (n *Nix) Attributes(ctx context.Context, flakeRef string, wildcards []string) (*Evaluation, error) {
	patterns, exclusions, err := parseWildcards(wildcards)
	if err != nil {
		return nil, err
	}
	n.logger().Info("nix: evaluating", "flake", flakeRef, "patterns", len(patterns))
	args, err := json.Marshal(map[string]any{"flakeRef": flakeRef, "patterns": segmentsOf(patterns)})
	if err != nil {
		return nil, err
	}
	expr := fmt.Sprintf("(%s) (builtins.fromJSON %s)", walkerExpr, nixString(string(args)))
	var walked []struct {
		Attr    []string `json:"attr"`
		DrvPath string   `json:"drvPath"`
		Failed  bool     `json:"failed"`
	}
	if err := n.outputJSON(ctx, &walked, "nix", "eval", "--json", "--impure", "--expr", expr); err != nil {
		return nil, evalError(err)
	}

	eval := &Evaluation{AttrErrors: map[string]string{}}
	seen := map[string]bool{}
	for _, w := range walked {
		attr := formatAttr(w.Attr)
		if seen[attr] || slices.Contains(exclusions, attr) {
			continue
		}
		seen[attr] = true
		if w.Failed {
			eval.AttrErrors[attr] = n.attrError(ctx, flakeRef, attr)
			continue
		}
		eval.Derivations = append(eval.Derivations, FoundDerivation{Attr: attr, DrvPath: w.DrvPath})
	}
	sort.Slice(eval.Derivations, func(i, j int) bool { return eval.Derivations[i].Attr < eval.Derivations[j].Attr })
	for _, p := range patterns {
		if p.explicit && !seen[p.text] && !slices.Contains(exclusions, p.text) {
			eval.Unmatched = append(eval.Unmatched, fmt.Sprintf("target '%s' matched no derivations in the flake", p.text))
		}
	}
	n.logger().Info("nix: evaluated", "flake", flakeRef, "derivations", len(eval.Derivations), "errors", len(eval.AttrErrors))
	return eval, nil
}

// attrError evaluates one failed attribute alone to get Nix's message.
func (n *Nix) attrError(ctx context.Context, flakeRef, attr string) string {
	_, err := n.Instantiate(ctx, flakeRef, attr)
	if err == nil {
		return "evaluation failed (it succeeded when evaluated alone)"
	}
	return err.Error()
}

// Instantiate evaluates flakeRef#attr and returns its .drv path, writing
// the .drv files into the store.
func (n *Nix) Instantiate(ctx context.Context, flakeRef, attr string) (string, error) {
	out, err := n.output(ctx, "nix", "eval", "--raw", flakeRef+"#"+attr+".drvPath")
	if err != nil {
		return "", evalError(err)
	}
	return strings.TrimSpace(string(out)), nil
}

// evalError shortens an evaluation failure to Nix's error lines.
func evalError(err error) error {
	var cmdErr *CommandError
	if errors.As(err, &cmdErr) {
		return fmt.Errorf("nix: evaluation failed: %s", errorLines(cmdErr.Stderr))
	}
	return err
}

func segmentsOf(patterns []pattern) [][]segment {
	out := make([][]segment, len(patterns))
	for i, p := range patterns {
		out[i] = p.segments
	}
	return out
}

// parseWildcards splits comma-separated patterns into patterns and
// exclusions (exact dotted paths).
func parseWildcards(wildcards []string) (patterns []pattern, exclusions []string, err error) {
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
			return nil, nil, fmt.Errorf("nix: pattern %q has an unterminated quote", text)
		}
		if rest, ok := strings.CutPrefix(text, "!"); ok {
			if strings.ContainsAny(rest, "*#") {
				return nil, nil, fmt.Errorf("nix: exclusion %q may not contain wildcards", text)
			}
			segs := splitOutsideQuotes(rest, '.')
			if slices.Contains(segs, "") {
				return nil, nil, fmt.Errorf("nix: exclusion %q has an empty segment", text)
			}
			exclusions = append(exclusions, formatAttr(unquoteAll(segs)))
			continue
		}
		p, err := parsePattern(text)
		if err != nil {
			return nil, nil, err
		}
		patterns = append(patterns, p)
	}
	if len(patterns) == 0 {
		p, _ := parsePattern(DefaultWildcard)
		patterns = append(patterns, p)
	}
	return patterns, exclusions, nil
}

// SplitWildcards checks comma-separated wildcards against the syntax of
// WORKER.md §6.2 and returns their patterns and exclusions one per
// element, trimmed, in order. Unlike an evaluation it adds no default: an
// empty pattern, or wildcards with no pattern besides exclusions, are
// errors.
func SplitWildcards(wildcards []string) ([]string, error) {
	var out []string
	included := false
	for _, w := range wildcards {
		for _, text := range splitOutsideQuotes(w, ',') {
			text = strings.TrimSpace(text)
			if text == "" {
				return nil, fmt.Errorf("nix: empty pattern in %q", w)
			}
			if _, _, err := parseWildcards([]string{text}); err != nil {
				return nil, err
			}
			included = included || !strings.HasPrefix(text, "!")
			out = append(out, text)
		}
	}
	if !included {
		return nil, errors.New("nix: no pattern to evaluate (exclusions alone select nothing)")
	}
	return out, nil
}

func parsePattern(text string) (pattern, error) {
	p := pattern{explicit: true}
	var names []string
	for _, raw := range splitOutsideQuotes(text, '.') {
		var s segment
		switch raw {
		case "*":
			s = segment{Kind: "star"}
			p.explicit = false
			if n := len(p.segments); n > 0 && p.segments[n-1].Kind == "star" {
				continue // consecutive stars collapse
			}
		case "#":
			s = segment{Kind: "hash"}
			p.explicit = false
		case "":
			return pattern{}, fmt.Errorf("nix: pattern %q has an empty segment", text)
		default:
			s = segment{Kind: "name", Name: unquote(raw)}
			names = append(names, s.Name)
		}
		p.segments = append(p.segments, s)
	}
	if first := p.segments[0]; first.Kind != "name" || !slices.Contains(wildcardRoots, first.Name) {
		return pattern{}, fmt.Errorf("nix: pattern %q must start with one of %s", text, strings.Join(wildcardRoots, ", "))
	}
	if p.explicit {
		p.text = formatAttr(names)
	} else {
		p.text = text
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

// formatAttr joins an attribute path, quoting segments that contain dots.
func formatAttr(segs []string) string {
	out := make([]string, len(segs))
	for i, s := range segs {
		if strings.ContainsAny(s, ".\" ") {
			s = `"` + s + `"`
		}
		out[i] = s
	}
	return strings.Join(out, ".")
}

// nixString quotes s as a Nix string literal.
func nixString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "${", `\${`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}
