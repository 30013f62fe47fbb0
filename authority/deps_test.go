package authority_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The authority and the proxy built on it know no database, no NAR store,
// no binary cache, no admin API and no scheduler: those plug in through
// Policy, JobLoop and CacheFactory. Importing one of them here would drag
// the server into the proxy (and, through the server, a cycle).
func TestDependencies(t *testing.T) {
	forbidden := []string{
		"gradient.dev/gradient/storage",
		"gradient.dev/gradient/narstore",
		"gradient.dev/gradient/server", // and every package under it: cache, admin, scheduler
		"gradient.dev/gradient/worker",
		"gradient.dev/gradient/nix",
	}
	for _, pkg := range []string{"gradient.dev/gradient/authority", "gradient.dev/gradient/proxy"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") {
					t.Errorf("%s imports %s", pkg, dep)
				}
			}
		}
	}
}
