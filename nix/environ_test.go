package nix

import (
	"slices"
	"testing"
)

// A tenant's flake is evaluated with --impure: builtins.getEnv must not see
// the worker's GRADIENT_ settings (its tokens among them), while the rest of
// the environment stays as it was.
func TestEvaluationCannotReadTheWorkersSettings(t *testing.T) {
	t.Setenv("GRADIENT_WORKER_PEERS", "peer-id:secret-token")
	t.Setenv("GRADIENT_TEST_VISIBLE_ELSEWHERE", "x")
	t.Setenv("NOT_A_WORKER_SETTING", "kept")
	const flake = `{
  outputs = { self }: let
    sys = "x86_64-linux";
    mk = name: builtins.derivation { inherit name; system = sys; builder = "/bin/sh"; args = [ "-c" "echo > $out" ]; };
    peers = builtins.getEnv "GRADIENT_WORKER_PEERS";
    other = builtins.getEnv "NOT_A_WORKER_SETTING";
  in {
    packages.${sys} = {
      ${if peers == "" then "peers-hidden" else "peers-leaked"} = mk "peers";
      ${if other == "kept" then "other-kept" else "other-lost"} = mk "other";
    };
  };
}
`
	n := newTestNix(t)
	dir, commit := gitRepo(t, map[string]string{"flake.nix": flake}, nil)
	eval, err := n.Attributes(testContext(t), "git+file://"+dir+"?rev="+commit, []string{"packages.x86_64-linux.*"})
	if err != nil {
		t.Fatal(err)
	}
	var attrs []string
	for _, d := range eval.Derivations {
		attrs = append(attrs, d.Attr)
	}
	want := []string{"packages.x86_64-linux.other-kept", "packages.x86_64-linux.peers-hidden"}
	if !slices.Equal(attrs, want) {
		t.Errorf("the flake saw the environment as %v, want %v", attrs, want)
	}
}

func TestWithoutWorkerSettings(t *testing.T) {
	got := withoutWorkerSettings([]string{"PATH=/bin", "GRADIENT_WORKER_PEERS=a:b", "GRADIENT_X=", "XGRADIENT_Y=1", "HOME=/root"})
	want := []string{"PATH=/bin", "XGRADIENT_Y=1", "HOME=/root"}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
