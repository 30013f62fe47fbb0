package e2e

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/proxyworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/server/forge/forgetest"
)

// gatedFlake builds one package that notes its start in GATE/started and
// runs until GATE/release exists.
const gatedFlake = `{
  outputs = { self }: let
    system = "x86_64-linux";
  in {
    packages.${system}.gated = builtins.derivation {
      name = "forge-gated"; inherit system; builder = "/bin/sh";
      args = [ "-c" "echo started >> GATE/started; while [ ! -e GATE/release ]; do /bin/sleep 0.2; done; echo done > $out" ];
    };
  };
}
`

// A signed push reaches a real gradient-server; kill -9 of the server
// while its build runs; after the restart the build finishes and the
// forge receives the final status, once.
func TestForgeStatusSurvivesServerKill(t *testing.T) {
	nixtest.Require(t, "nix", "nix-store", "git")
	t.Parallel()
	gate := t.TempDir()
	repo, commit := nixtest.Repo(t, map[string]string{"flake.nix": strings.ReplaceAll(gatedFlake, "GATE", gate)})
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "dial-key")
	if err := os.WriteFile(keyFile, []byte(sealbox.EncodeKey(sealbox.NewKey())), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := proxyworld.StartServer(t, "server", proxyworld.ServerOptions{Args: []string{
		"--allow-local-repositories", "--dial-key-file", keyFile, "--external-url", "https://ci.example.com"}})
	project := srv.FlakeProject(t, "ops", "app", repo, "packages.x86_64-linux.*")

	fake := forgetest.New(t, forge.GitHub, forgetest.Options{})
	tokenFile := filepath.Join(dir, "forge-token")
	if err := os.WriteFile(tokenFile, []byte(fake.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	srv.CLI(t, "project", "forge", "set", project, "--kind", "github", "--repository", fake.Repository,
		"--api-url", fake.URL(), "--forge-token-file", tokenFile)
	secret := strings.TrimSpace(srv.CLI(t, "project", "forge", "webhook-secret", project))

	id, peers := srv.Register(t, project)
	n := nixtest.New(t)
	conf := []string{"store = " + n.Store}
	for _, line := range nixtest.Config {
		if strings.HasPrefix(line, "sandbox-paths") {
			line += " " + gate
		}
		conf = append(conf, line)
	}
	env := append(slices.Clone(n.Env), "NIX_CONFIG="+strings.Join(conf, "\n"))
	proxyworld.StartWorker(t, "worker", proxyworld.WorkerOptions{ServerURL: srv.ProtoURL, ID: id, Peers: peers,
		Args: []string{"--allow-local-repositories"}, Env: env})

	h, body := forgetest.PushDelivery(forge.GitHub, []byte(secret), fake.Repository, "main", commit)
	req, err := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/api/v1/forge/github/"+project, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("push delivery: %d", resp.StatusCode)
	}
	context := "gradient/app"
	waitfor.Within(t, 3*time.Minute, "the gated build runs and the forge shows pending", func() bool {
		data, _ := os.ReadFile(filepath.Join(gate, "started"))
		return len(data) > 0 && len(fake.Statuses(commit, context)) > 0
	})
	srv.Kill()
	if err := os.WriteFile(filepath.Join(gate, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	srv.Restart(t)
	waitfor.Within(t, 3*time.Minute, "the final status reaches the forge", func() bool {
		st := fake.Statuses(commit, context)
		return len(st) > 0 && st[len(st)-1].State == "success"
	})
	time.Sleep(6 * time.Second) // the poster's periodic pass, had it anything left
	var finals int
	for _, s := range fake.Statuses(commit, context) {
		if s.State != "pending" {
			finals++
		}
	}
	if finals != 1 {
		t.Fatalf("statuses %+v: want the final one once", fake.Statuses(commit, context))
	}
	if got := fake.Statuses(commit, context); got[0].State != "pending" || got[len(got)-1].Description != "1 built" ||
		!strings.HasPrefix(got[len(got)-1].TargetURL, "https://ci.example.com/evaluations/") {
		t.Fatalf("statuses %+v", got)
	}
}
