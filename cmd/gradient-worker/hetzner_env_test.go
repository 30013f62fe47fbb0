package main

import (
	"io"
	"strings"
	"testing"

	"gradient.dev/gradient/proxy/hetzner"
)

// The env file a Hetzner VM's user data writes (the proxy's
// hetzner.UserData) configures this binary through the variables it
// really reads: the snapshot's unit needs nothing but EnvironmentFile.
func TestHetznerEnvFileConfiguresTheWorker(t *testing.T) {
	const id = "0190f0c2-7c4e-7a6b-9c1d-2e3f4a5b6c7d"
	ud, err := hetzner.UserData("wss://proxy.example/proto", id, "tok3n", 4)
	if err != nil {
		t.Fatal(err)
	}
	_, content, ok := strings.Cut(ud, "content: |\n")
	if !ok {
		t.Fatalf("no env file content in\n%s", ud)
	}
	env := map[string]string{}
	for _, line := range strings.Split(strings.TrimRight(content, "\n"), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			t.Fatalf("env line %q", line)
		}
		env[k] = v
	}
	opts, err := parseOptions(nil, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if opts.ServerURL != "wss://proxy.example/proto" || opts.ID != id || opts.Peers != id+":tok3n" || opts.MaxBuilds != 4 || opts.RequireSigs {
		t.Fatalf("options from the env file: server %q, id %q, peers %q, builds %d, require sigs %v", opts.ServerURL, opts.ID, opts.Peers, opts.MaxBuilds, opts.RequireSigs)
	}
}
