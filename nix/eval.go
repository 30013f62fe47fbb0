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

	"gradient.dev/gradient/nix/wildcard"
)

// walkerExpr walks flake outputs along parsed patterns; see walker.nix.
//
//go:embed walker.nix
var walkerExpr string

// DefaultWildcard is what to evaluate when a job names no patterns.
const DefaultWildcard = wildcard.Default

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

// Attributes finds the derivations in flakeRef's outputs matching wildcards
// (comma-separated patterns; `*`, `#`, quoted segments, `!exclusions`; see
// docs/protocol/worker.md §6.2) and instantiates them.
//
// Nix 2.8's tryEval only catches throw and assert: an attribute failing
// otherwise (abort, type error) aborts the walk and Attributes returns the
// error. The message of a caught failure is recovered by evaluating that
// attribute alone.
func (n *Nix) Attributes(ctx context.Context, flakeRef string, wildcards []string) (*Evaluation, error) {
	patterns, exclusions, err := wildcard.Parse(wildcards)
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
		attr := wildcard.FormatAttr(w.Attr)
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
		if p.Explicit && !seen[p.Text] && !slices.Contains(exclusions, p.Text) {
			eval.Unmatched = append(eval.Unmatched, fmt.Sprintf("target '%s' matched no derivations in the flake", p.Text))
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

func segmentsOf(patterns []wildcard.Pattern) [][]wildcard.Segment {
	out := make([][]wildcard.Segment, len(patterns))
	for i, p := range patterns {
		out[i] = p.Segments
	}
	return out
}

// nixString quotes s as a Nix string literal.
func nixString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "${", `\${`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}
