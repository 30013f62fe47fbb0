package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/proxyworld"
	"gradient.dev/gradient/internal/waitfor"
)

// gcCrashNix: greet → hello, pushed for good; bundle references 60 small
// files and is pushed with a time to live, so once it expired a
// collection deletes 61 rows and their objects.
const gcCrashNix = `rec {
  hello = builtins.derivation { name = "hello"; system = builtins.currentSystem; builder = "/bin/sh"; args = ["-c" "echo hello > $out"]; };
  greet = builtins.derivation { name = "greet"; system = builtins.currentSystem; builder = "/bin/sh"; args = ["-c" "echo ${hello} > $out"]; };
  files = builtins.genList (i: builtins.toFile "f${toString i}" "file ${toString i}") 60;
  bundle = builtins.derivation { name = "bundle"; system = builtins.currentSystem; builder = "/bin/sh";
    args = ["-c" "echo ${builtins.concatStringsSep " " files} > $out"]; };
}`

type gcReport struct {
	PathsFreed   int64    `json:"paths_freed"`
	ObjectsFreed int64    `json:"objects_freed"`
	Objects      []string `json:"objects"`
}

// kill -9 of a real gradient-server in the middle of a collection's sweep
// (after its batch of rows is deleted, before their objects are):
// restarted on the same database and NAR directory, every kept path still
// copies into a real Nix with signatures checked and the deleted rows stay
// deleted; the next collection deletes the objects the killed one had
// queued, and the one after finds nothing left.
func TestServerKilledDuringCollection(t *testing.T) {
	nixtest.Require(t, "nix", "nix-build", "nix-store")
	dir := t.TempDir()
	pause := filepath.Join(dir, "gc-pause")
	server := proxyworld.StartServer(t, "server", proxyworld.ServerOptions{
		Args: []string{"--gc-grace", "0", "--gc-interval", "0"},
		Env:  []string{"GRADIENT_TEST_GC_PAUSE_FILE=" + pause},
	})
	server.CLI(t, "cache", "create", "main", "--public")
	pub := strings.TrimSpace(server.CLI(t, "cache", "public-key", "main"))

	src := nixtest.New(t)
	nixEnv := append(append([]string{}, src.Env...), "NIX_CONFIG="+strings.Join(nixtest.Config, "\n"))
	file := filepath.Join(dir, "gc.nix")
	os.WriteFile(file, []byte(gcCrashNix), 0o644)
	build := func(attr string) string {
		t.Helper()
		cmd := exec.Command("nix-build", file, "-A", attr, "--no-out-link", "--store", src.Store)
		cmd.Env, cmd.Dir = append(os.Environ(), nixEnv...), src.WorkDir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("nix-build %s: %v", attr, err)
		}
		return strings.TrimSpace(string(out))
	}
	greet, bundle := build("greet"), build("bundle")
	push := func(args ...string) {
		t.Helper()
		code, stdout, stderr := proxyworld.CLI(t, append(server.Env(), nixEnv...), append([]string{"cache", "push", "main"}, args...)...)
		if code != 0 {
			t.Fatalf("cache push %v: exit %d\n%s\n%s", args, code, stdout, stderr)
		}
	}
	push(greet, "--recursive", "--store", src.Store)
	push(bundle, "--recursive", "--store", src.Store, "--ttl", "1s")
	time.Sleep(1500 * time.Millisecond) // the time to live runs out

	narinfo := func(path string) int {
		t.Helper()
		resp, err := http.Get(server.URL + "/cache/main/" + strings.TrimPrefix(path, "/nix/store/")[:32] + ".narinfo")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	copies := func(what string) {
		t.Helper()
		client := nixtest.New(t)
		if err := client.CopyFrom(t.Context(), server.URL+"/cache/main", []string{pub}, greet); err != nil {
			t.Fatalf("%s: nix copy of the kept closure: %v", what, err)
		}
		if b, err := os.ReadFile(filepath.Join(client.Store, greet)); err != nil || !strings.HasSuffix(string(b), "-hello\n") {
			t.Fatalf("%s: copied greet reads %q, %v", what, b, err)
		}
	}
	// collect runs POST /api/v1/gc; the server pauses after its first
	// deleted batch: release lets it go on (else the caller kills it).
	collect := func(release bool) (gcReport, error) {
		t.Helper()
		type result struct {
			rep gcReport
			err error
		}
		done := make(chan result, 1)
		go func() {
			req, _ := http.NewRequest("POST", server.URL+"/api/v1/gc", nil)
			req.Header.Set("Authorization", "Bearer "+server.AdminToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- result{err: err}
				return
			}
			defer resp.Body.Close()
			var r result
			if resp.StatusCode != 200 {
				r.err = fmt.Errorf("POST /api/v1/gc: %s", resp.Status)
			} else {
				r.err = json.NewDecoder(resp.Body).Decode(&r.rep)
			}
			done <- r
		}()
		waitfor.True(t, "the collection pauses after its first batch", func() bool {
			_, err := os.Stat(pause)
			return err == nil
		})
		if !release {
			server.Kill()
		} else if err := os.Remove(pause); err != nil {
			t.Fatal(err)
		}
		r := <-done
		return r.rep, r.err
	}

	if _, err := collect(false); err == nil {
		t.Fatal("the collection answered although its server was killed")
	}
	os.Remove(pause)
	server.Restart(t)
	copies("after kill -9 mid-sweep")
	if code := narinfo(greet); code != 200 {
		t.Fatalf("kept greet answers %d", code)
	}
	if code := narinfo(bundle); code != http.StatusNotFound {
		t.Errorf("the expired bundle, deleted before the kill, answers %d after the restart", code)
	}

	rep, err := collect(true)
	if err != nil {
		t.Fatal(err)
	}
	// The killed run deleted the rows (one batch) and queued their
	// objects: this one deletes the 61 objects.
	if rep.PathsFreed != 0 || rep.ObjectsFreed != 61 {
		t.Errorf("the run after the crash freed %d paths and %d objects; want the 61 objects the killed run queued",
			rep.PathsFreed, rep.ObjectsFreed)
	}
	if code := narinfo(bundle); code != http.StatusNotFound {
		t.Errorf("the expired bundle answers %d, want 404", code)
	}
	copies("after the next collection")

	// Nothing is left to free.
	again, err := collect(true)
	if err != nil {
		t.Fatal(err)
	}
	if again.PathsFreed != 0 || again.ObjectsFreed != 0 {
		t.Errorf("a third collection freed %d paths and %d objects", again.PathsFreed, again.ObjectsFreed)
	}
}
