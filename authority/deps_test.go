package authority_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The split of the server pinned: the authority, and the proxy built on
// it, know no database, no NAR store, no binary cache, no admin API and
// no scheduler (those plug in through Policy, JobLoop and CacheFactory);
// the cache and the admin API use storage (the admin API the authority's
// WorkerStatus too), never the server that wires them or each other; the scheduler plugs into the
// authority and imports no other part of the server; the server binary
// links no Nix execution code (nix, nix/daemon) and no worker.
func TestDependencies(t *testing.T) {
	// Each package's forbidden imports, exact or "x/..." for every
	// package under x. A "p/..." row checks every package under p but
	// its tests' helper packages (named …test).
	const m = "gradient.dev/gradient/"
	for pkg, forbidden := range map[string][]string{
		"authority":     {"storage", "narstore", "server", "server/...", "worker", "nix"},
		"workersession": {"storage", "narstore", "server", "server/...", "worker", "worker/...", "nix", "authority"},
		// The proxy is an authority and session shells joined by hubs:
		// no build runner, no NAR store.
		"proxy/...":        {"storage", "narstore", "server", "server/...", "worker", "worker/...", "nix", "nix/daemon"},
		"proxy/hetzner":    {"proxy/downstream", "proxy/upstream"},
		"server/cache":     {"authority", "server", "server/admin", "server/scheduler"},
		"server/admin":     {"server", "server/cache", "server/scheduler", "narstore", "nix", "nix/daemon"},
		"server/scheduler": {"server", "server/cache", "server/admin", "narstore"},
		// The admin API's types, shared with the CLI: JSON shapes only.
		"server/adminapi": {"storage", "narstore", "server", "server/admin", "server/cache", "server/scheduler", "nix"},
		// The server binary carries no Nix execution code: it checks
		// wildcards with the leaf nix/wildcard, never through nix.
		"cmd/gradient-server": {"nix", "nix/daemon", "worker", "worker/..."},
		// The proxy binary carries neither the build runner nor the NAR
		// store: its upstream sessions are session shells.
		"cmd/gradient-proxy": {"narstore", "worker", "worker/...", "nix", "nix/daemon"},
		// ... and a build machine no database drivers.
		"cmd/gradient-worker": {"storage", "storage/...", "server", "server/..."},
	} {
		pkgs := []string{pkg}
		if strings.HasSuffix(pkg, "/...") {
			out, err := exec.Command("go", "list", m+pkg).CombinedOutput()
			if err != nil {
				t.Fatalf("go list %s: %v\n%s", pkg, err, out)
			}
			pkgs = nil
			for _, p := range strings.Fields(string(out)) {
				if p = strings.TrimPrefix(p, m); !strings.HasSuffix(p, "test") {
					pkgs = append(pkgs, p)
				}
			}
			if len(pkgs) < 2 {
				t.Fatalf("go list %s found %v", pkg, pkgs)
			}
		}
		for _, pkg := range pkgs {
			checkDeps(t, pkg, forbidden)
		}
	}
}

// checkDeps fails the test for each package pkg links that forbidden
// names.
func checkDeps(t *testing.T, pkg string, forbidden []string) {
	t.Helper()
	const m = "gradient.dev/gradient/"
	out, err := exec.Command("go", "list", "-deps", m+pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		dep, ok := strings.CutPrefix(dep, m)
		if !ok || dep == pkg {
			continue
		}
		for _, f := range forbidden {
			// "x/..." is every package under x.
			if dep == f || strings.HasSuffix(f, "/...") && strings.HasPrefix(dep, strings.TrimSuffix(f, "...")) {
				t.Errorf("%s imports %s", pkg, dep)
			}
		}
	}
}
