package nix

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

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

// EvalOptions tunes how Evaluate runs Nix.
type EvalOptions struct {
	// Shards is how many Nix processes walk disjoint parts of the
	// attribute tree at once; below 2, one process walks everything.
	Shards int
	// MaxMemoryMiB bounds each evaluating process's resident memory: a
	// process past it is killed and a new one resumes the walk where it
	// was, skipping what was already found. 0: no bound.
	MaxMemoryMiB int
}

// Attributes finds the derivations in flakeRef's outputs matching wildcards
// (comma-separated patterns; `*`, `#`, quoted segments, `!exclusions`; see
// docs/protocol/worker.md §6.2) and instantiates them. It is Evaluate with
// one process and nothing streamed.
func (n *Nix) Attributes(ctx context.Context, flakeRef string, wildcards []string) (*Evaluation, error) {
	return n.Evaluate(ctx, flakeRef, wildcards, EvalOptions{}, nil)
}

// Evaluate is Attributes that calls found (never concurrently) with each
// derivation as soon as a walking process reports it, in no fixed order,
// and walks with opts.Shards processes. The returned Evaluation is the
// same whatever the sharding: derivations sorted by attribute, the same
// attribute errors.
//
// Nix 2.8's tryEval only catches throw and assert: an attribute failing
// otherwise (abort, type error) aborts the walk and Evaluate returns the
// error. The message of a caught failure is recovered by evaluating that
// attribute alone.
func (n *Nix) Evaluate(ctx context.Context, flakeRef string, wildcards []string, opts EvalOptions, found func(FoundDerivation)) (*Evaluation, error) {
	patterns, exclusions, err := wildcard.Parse(wildcards)
	if err != nil {
		return nil, err
	}
	shards := max(opts.Shards, 1)
	n.logger().Info("nix: evaluating", "flake", flakeRef, "patterns", len(patterns), "shards", shards)

	eval := &Evaluation{AttrErrors: map[string]string{}}
	var (
		mu     sync.Mutex
		seen   = map[string]bool{}
		failed []string
	)
	onFound := func(path []string, drvPath string, bad bool) {
		attr := wildcard.FormatAttr(path)
		mu.Lock()
		defer mu.Unlock()
		if seen[attr] || slices.Contains(exclusions, attr) {
			return
		}
		seen[attr] = true
		if bad {
			failed = append(failed, attr)
			return
		}
		d := FoundDerivation{Attr: attr, DrvPath: drvPath}
		eval.Derivations = append(eval.Derivations, d)
		if found != nil {
			found(d)
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for i := range shards {
		wg.Go(func() {
			w := &shardWalk{n: n, flakeRef: flakeRef, patterns: segmentsOf(patterns), shard: i, shards: shards,
				maxRSS: int64(opts.MaxMemoryMiB) << 20, found: onFound}
			if err := w.run(ctx); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil {
		return nil, cause // the first failure; the other shards stopped for it
	}
	sort.Strings(failed)
	for _, attr := range failed {
		eval.AttrErrors[attr] = n.attrError(ctx, flakeRef, attr)
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
// Without the eval cache: Nix 2.8 answers an attribute whose failure it
// cached with "… is not an attribute set" from the second time on.
func (n *Nix) attrError(ctx context.Context, flakeRef, attr string) string {
	_, err := n.output(ctx, "nix", "eval", "--no-eval-cache", "--raw", flakeRef+"#"+attr+".drvPath")
	if err == nil {
		return "evaluation failed (it succeeded when evaluated alone)"
	}
	return evalError(err).Error()
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
