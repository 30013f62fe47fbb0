package nix

import (
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
)

// shardFlake has derivations at several depths, a throwing attribute, a
// nested set under a trailing wildcard, a derivation reachable under two
// names and an explicit attribute.
const shardFlake = `{
  outputs = { self }: let
    sys = "x86_64-linux";
    mk = n: builtins.derivation { name = n; system = sys; builder = "/bin/sh"; args = [ "-c" "echo ${n} > $out" ]; };
    many = builtins.listToAttrs (builtins.genList (i: { name = "p${toString i}"; value = mk "p${toString i}"; }) 23);
  in {
    packages.${sys} = many // {
      bad = throw "bad attribute";
      nested = { a = mk "na"; b = mk "nb"; };
      alias = many.p3;
    };
    checks.${sys} = { hello = mk "hello"; other = mk "other"; };
  };
}`

func TestShardedEvaluationFindsTheSame(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	dir, commit := gitRepo(t, map[string]string{"flake.nix": shardFlake}, nil)
	ref := "git+file://" + dir + "?rev=" + commit
	wildcards := []string{"packages.x86_64-linux.*, checks.#.hello", "checks.x86_64-linux.other", "!packages.x86_64-linux.p7"}

	var results []*Evaluation
	for _, shards := range []int{1, 3, 4} {
		var mu sync.Mutex
		streamed := map[string]string{}
		ev, err := n.Evaluate(ctx, ref, wildcards, EvalOptions{Shards: shards}, func(d FoundDerivation) {
			mu.Lock()
			defer mu.Unlock()
			if _, dup := streamed[d.Attr]; dup {
				t.Errorf("%d shards: %s streamed twice", shards, d.Attr)
			}
			streamed[d.Attr] = d.DrvPath
		})
		if err != nil {
			t.Fatalf("%d shards: %v", shards, err)
		}
		got := map[string]string{}
		for _, d := range ev.Derivations {
			got[d.Attr] = d.DrvPath
		}
		if !maps.Equal(got, streamed) {
			t.Errorf("%d shards: streamed %v, returned %v", shards, streamed, got)
		}
		if !slices.IsSortedFunc(ev.Derivations, func(a, b FoundDerivation) int { return strings.Compare(a.Attr, b.Attr) }) {
			t.Errorf("%d shards: derivations not sorted by attribute", shards)
		}
		results = append(results, ev)
	}
	want := results[0]
	// 23 - p7 + nested.a, nested.b + alias + two checks
	if len(want.Derivations) != 22+2+1+2 {
		t.Errorf("unsharded found %d derivations: %v", len(want.Derivations), want.Derivations)
	}
	if !strings.Contains(want.AttrErrors["packages.x86_64-linux.bad"], "bad attribute") || len(want.AttrErrors) != 1 {
		t.Errorf("unsharded attribute errors %v", want.AttrErrors)
	}
	for i, got := range results[1:] {
		if !reflect.DeepEqual(got, want) {
			t.Errorf("sharded evaluation %d differs:\n got %+v\nwant %+v", i+1, got, want)
		}
	}
}

// A walking process past its memory bound is replaced and the new one
// resumes: every derivation is found once, none lost.
func TestEvaluationReplacesAProcessPastItsMemoryBound(t *testing.T) {
	n := newTestNix(t)
	ctx := testContext(t)
	// Each attribute holds a forced list of 300,000 integers (some 10
	// MB), kept alive by the flake's outputs: the process grows as the
	// walk goes on.
	flake := `{
  outputs = { self }: let
    sys = "x86_64-linux";
    mk = i: let big = builtins.genList (x: x * i) 300000; in
      builtins.seq (builtins.deepSeq big null) ((builtins.derivation { name = "m${toString i}"; system = sys; builder = "/bin/sh"; args = [ "-c" "echo > $out" ]; }) // { inherit big; });
  in { packages.${sys} = builtins.listToAttrs (builtins.genList (i: { name = "m${toString i}"; value = mk i; }) 16); };
}`
	dir, commit := gitRepo(t, map[string]string{"flake.nix": flake}, nil)
	ref := "git+file://" + dir + "?rev=" + commit
	wildcards := []string{"packages.x86_64-linux.*"}
	unbounded, err := n.Evaluate(ctx, ref, wildcards, EvalOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	count := map[string]int{}
	var logs syncBuffer
	n.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	bounded, err := n.Evaluate(ctx, ref, wildcards, EvalOptions{MaxMemoryMiB: 120}, func(d FoundDerivation) {
		mu.Lock()
		count[d.Attr]++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(bounded, unbounded) {
		t.Errorf("bounded evaluation differs: %d derivations, want %d", len(bounded.Derivations), len(unbounded.Derivations))
	}
	if len(count) != 16 {
		t.Errorf("streamed %d derivations, want 16", len(count))
	}
	for attr, c := range count {
		if c != 1 {
			t.Errorf("%s streamed %d times", attr, c)
		}
	}
	if !strings.Contains(logs.String(), "past its memory bound") {
		t.Errorf("no process was replaced (the bound was never reached); log:\n%s", logs.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
