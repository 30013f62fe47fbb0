package e2e

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/proxyworld"
	"gradient.dev/gradient/internal/s3test"
	"gradient.dev/gradient/internal/waitfor"
)

// answerHold is a TCP relay to the object store that forwards requests at
// once but holds the store's answers until release: a presigned PUT
// lands in the bucket while its worker still waits to report it.
type answerHold struct {
	addr    string
	waiting atomic.Int32 // connections whose answer is held
	release func()
}

func startAnswerHold(t *testing.T, target string) *answerHold {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	var once sync.Once
	h := &answerHold{addr: ln.Addr().String(), release: func() { once.Do(func() { close(released) }) }}
	t.Cleanup(func() {
		h.release()
		ln.Close()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go io.Copy(up, c)
				select {
				case <-released:
				default:
					h.waiting.Add(1)
					<-released
					h.waiting.Add(-1)
				}
				io.Copy(c, up)
			}()
		}
	}()
	return h
}

// kill -9 of a real gradient-server on S3 between a presigned grant and
// its finish (issue 31): the evaluating worker's PUT has landed in the
// bucket but the store's answer is held, so the worker cannot report it.
// Nothing is committed (no object under nars/, no narinfo); after the
// restart the job runs again, every upload commits through a new grant,
// and a real Nix copies the output from the HTTP cache with signatures
// checked.
func TestServerKilledBetweenPresignedGrantAndFinish(t *testing.T) {
	nixtest.Require(t, "nix", "nix-store", "git")
	t.Parallel()
	s3 := s3test.Start(t)
	hold := startAnswerHold(t, strings.TrimPrefix(s3.Endpoint, "http://"))
	repo, _ := nixtest.Repo(t, map[string]string{"flake.nix": `{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: script: builtins.derivation { inherit name system; builder = "/bin/sh"; args = [ "-c" script ]; };
  in { packages.${system} = rec {
    base = step "grant-base" "echo base > $out";
    top = step "grant-top" "read v < ${base}; echo $v top > $out";
  }; };
}
`})
	commit := nixtest.Git(t, repo, "rev-parse", "HEAD")
	server := proxyworld.StartServer(t, "server", proxyworld.ServerOptions{
		Args: []string{"--allow-local-repositories", "--nar-store", "s3", "--s3-endpoint", s3.Endpoint, "--s3-bucket", s3.Bucket,
			"--s3-region", s3.Region, "--s3-path-style", "--s3-presign-endpoint", "http://" + hold.addr},
		Env: []string{"AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3.SecretKey},
	})
	project := server.FlakeProject(t, "team", "app", repo, "packages.x86_64-linux.*")
	key := strings.TrimSpace(server.CLI(t, "cache", "public-key", "app-cache"))
	id, peers := server.Register(t, project)
	n := nixtest.New(t)
	env := append(slices.Clone(n.Env), "NIX_CONFIG="+strings.Join(append([]string{"store = " + n.Store}, nixtest.Config...), "\n"),
		"GRADIENT_WORKER_TRUSTED_PUBLIC_KEYS="+key)
	proxyworld.StartWorker(t, "worker", proxyworld.WorkerOptions{ServerURL: server.ProtoURL, ID: id, Peers: peers,
		Args: []string{"--allow-local-repositories", "--log-level", "info"}, Env: env})

	keys := func(prefix string) []string {
		var out []string
		for _, k := range s3.Keys(t) {
			if strings.HasPrefix(k, prefix) {
				out = append(out, k)
			}
		}
		return out
	}
	ev := startEval(t, server, project, commit)
	waitfor.Within(t, 2*time.Minute, "a presigned PUT in the bucket, its answer held", func() bool {
		return hold.waiting.Load() > 0 && len(keys("incoming/")) > 0
	})
	server.Kill()
	landed := keys("incoming/")
	if committed := keys("nars/"); len(committed) != 0 {
		t.Fatalf("objects committed before any finish: %q", committed)
	}
	hold.release()
	server.Restart(t)

	builds := succeeded(t, server, waitEval(t, server, ev, "ends after the restart", terminal), "base", "top")
	client := nixtest.New(t)
	top := builds["top"].Outputs[0].Path
	if err := client.CopyFrom(t.Context(), server.URL+"/cache/app-cache", []string{key}, top); err != nil {
		t.Fatalf("nix copy: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(client.Store, top)); err != nil || strings.TrimSpace(string(got)) != "base top" {
		t.Fatalf("top holds %q (%v)", got, err)
	}
	t.Logf("%d uploads landed before the kill; %d objects committed after the restart", len(landed), len(keys("nars/")))
}
