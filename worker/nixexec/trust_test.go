package nixexec_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/nix/narsig"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/worker/nixexec"
	"gradient.dev/gradient/workersession"
)

// plantingServer is a hand-encoded server (the protocol, no server
// package) that answers every pull with the object and metadata the test
// planted, signed as the test says, and counts every upload as done.
type plantingServer struct {
	url     string
	plants  chan plant
	reports chan wire.ClientMessage // JobCompleted and JobFailed
}

// plant is what the server answers a job's pull with.
type plant struct {
	path       string
	nar        []byte
	signatures []string
}

type acceptAll struct{}

func (acceptAll) Challenge(context.Context, string) ([]string, error) { return []string{"peer"}, nil }
func (acceptAll) Authorize(context.Context, string, []wire.Pair[string, string]) (handshake.Decision, error) {
	return handshake.Accept([]string{"peer"}, nil, handshake.AllCapabilities), nil
}

func newPlantingServer(t *testing.T) *plantingServer {
	p := &plantingServer{plants: make(chan plant, 8), reports: make(chan wire.ClientMessage, 8)}
	quiet := slog.New(slog.DiscardHandler)
	hs := httptest.NewServer(session.Handler(func(r *http.Request, tr session.Transport) {
		c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
		est, err := session.RunAuthority(r.Context(), c, session.AuthorityConfig{Policy: acceptAll{}})
		if err != nil {
			return
		}
		sess := session.SplitServer(c, est, session.Options{Logger: quiet})
		p.serve(r.Context(), t, sess)
	}))
	t.Cleanup(hs.Close)
	p.url = "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto"
	return p
}

// serve assigns each plant as a fetch job whose cached source is the
// planted path, and answers that job's pull with it.
func (p *plantingServer) serve(ctx context.Context, t *testing.T, sess *session.ServerSession) {
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	var current plant
	job := 0
	for {
		select {
		case current = <-p.plants:
		case <-ctx.Done():
			return
		}
		job++
		jobID := "plant-" + string(rune('0'+job))
		sess.Send(&wire.AssignJob{JobID: jobID, AssignmentID: jobID + "-a", Job: &wire.FlakeJob{
			Steps: []wire.FlakeStep{wire.FlakeStepFetchFlake}, Source: &wire.FlakeSourceCached{StorePath: current.path}}})
		object := enc.EncodeAll(current.nar, nil)
		narSum, fileSum := sha256.Sum256(current.nar), sha256.Sum256(object)
		narHash, fileHash := "sha256:"+nixbase32.Encode(narSum[:]), "sha256:"+nixbase32.Encode(fileSum[:])
		narSize, fileSize := uint64(len(current.nar)), uint64(len(object))
		for done := false; !done; {
			m, err := sess.Recv(ctx)
			if err != nil {
				return
			}
			switch m := m.(type) {
			case *wire.CacheQuery:
				entries := make([]wire.CachedPath, len(m.Paths))
				for i, path := range m.Paths {
					entries[i] = wire.CachedPath{Path: path, Cached: true}
					if m.Mode == wire.QueryPull {
						entries[i] = wire.CachedPath{Path: path, Cached: true, FileSize: &fileSize, NarSize: &narSize,
							NarHash: &narHash, FileHash: &fileHash, References: &[]string{}, Signatures: &current.signatures}
					}
				}
				sess.Send(&wire.CacheStatus{QueryID: m.QueryID, Cached: entries})
			case *wire.NarRequest:
				for _, path := range m.Paths {
					sess.Send(&wire.NarStreamHeader{JobID: m.JobID, StorePath: path, TotalBytes: fileSize, StreamToken: "t"})
					sess.Send(&wire.NarPush{JobID: m.JobID, StorePath: path, Data: object, IsFinal: true})
				}
			case *wire.JobCompleted, *wire.JobFailed:
				p.reports <- m
				done = true
			}
		}
	}
}

// singleFileNAR is the NAR of a store path that is one regular file.
func singleFileNAR(contents string) []byte {
	var b []byte
	str := func(s string) {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
		b = append(b, make([]byte, (8-len(s)%8)%8)...)
	}
	for _, s := range []string{"nix-archive-1", "(", "type", "regular", "contents", contents, ")"} {
		str(s)
	}
	return b
}

// checkValidity is `nix-store --check-validity path` on n's store.
func checkValidity(t *testing.T, n *nix.Nix, path string) bool {
	t.Helper()
	cmd := exec.Command("nix-store", "--store", n.Store, "--check-validity", path)
	cmd.Env = append(append(os.Environ(), n.Env...), "NIX_CONFIG="+strings.Join(n.Config, "\n"))
	out, err := cmd.CombinedOutput()
	if err != nil && !strings.Contains(string(out), "is not valid") {
		t.Fatalf("nix-store --check-validity: %v: %s", err, out)
	}
	return err == nil
}

// A server (or a proxy in its place) answering a pull with an
// input-addressed path it made up cannot make it valid in the worker's
// store unless a key the worker trusts signed it: the planted
// /nix/store/<hash>-bash-5.2-p15. Unsigned, signed by a stranger, or with
// a signature of the trusted key's name that does not verify, the job
// fails saying why, and the path stays invalid; properly signed, it
// imports.
func TestPlantedInputAddressedPathRefused(t *testing.T) {
	n := nixtest.New(t)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	trusted := narsig.PublicKey{Name: "server.example-main", Key: pub}
	n.TrustedKeys = &narsig.Keys{}
	n.TrustedKeys.Add(trusted)
	_, strangerKey, _ := ed25519.GenerateKey(rand.Reader)

	srv := newPlantingServer(t)
	w, err := worker.New(worker.Config{
		Session: workersession.Config{
			ServerURL: srv.url, WorkerID: storage.NewID(),
			Capabilities: wire.GradientCapabilities{Fetch: true}, Heartbeat: time.Hour,
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
			Logger: slog.New(slog.DiscardHandler),
		},
		CPUCoreScore: 1,
		TempDir:      t.TempDir(),
		Executor:     &nixexec.Executor{Nix: n, Logger: slog.New(slog.DiscardHandler)},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })

	nar := singleFileNAR("#!/bin/sh\necho planted by the server\n")
	sum := sha256.Sum256(nar)
	path := "/nix/store/" + nixbase32.Encode(sum[:20]) + "-bash-5.2-p15"
	narSum := sha256.Sum256(nar)
	fingerprint := narsig.Fingerprint(path, "sha256:"+nixbase32.Encode(narSum[:]), uint64(len(nar)), nil)
	sign := func(name string, key ed25519.PrivateKey, fp []byte) string {
		return name + ":" + base64.StdEncoding.EncodeToString(ed25519.Sign(key, fp))
	}
	wrongMetadata := narsig.Fingerprint(path, "sha256:"+nixbase32.Encode(narSum[:]), uint64(len(nar))+1, nil)

	next := func(p plant) wire.ClientMessage {
		t.Helper()
		srv.plants <- p
		select {
		case m := <-srv.reports:
			return m
		case <-time.After(2 * time.Minute):
			t.Fatal("no report of the job")
			return nil
		}
	}
	for _, c := range []struct {
		name string
		sigs []string
		says string
	}{
		{"unsigned", nil, "no signature"},
		{"signed by a key the worker does not trust", []string{sign("stranger-1", strangerKey, fingerprint)}, "do not verify"},
		{"signed by another key of the trusted key's name", []string{sign(trusted.Name, strangerKey, fingerprint)}, "do not verify"},
		{"a trusted signature of other metadata", []string{sign(trusted.Name, priv, wrongMetadata)}, "do not verify"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := next(plant{path: path, nar: nar, signatures: c.sigs})
			failed, ok := m.(*wire.JobFailed)
			if !ok {
				t.Fatalf("the job ended with %s, want JobFailed", m.WireName())
			}
			if failed.Kind != wire.FailureTransient || !strings.Contains(failed.Error, "refusing to import "+path) ||
				!strings.Contains(failed.Error, c.says) {
				t.Errorf("JobFailed kind %d: %q", failed.Kind, failed.Error)
			}
			if checkValidity(t, n, path) {
				t.Fatalf("%s is valid in the worker's store", path)
			}
		})
	}
	t.Run("signed by the trusted key", func(t *testing.T) {
		m := next(plant{path: path, nar: nar, signatures: []string{sign(trusted.Name, priv, fingerprint)}})
		if failed, ok := m.(*wire.JobFailed); ok {
			t.Fatalf("the job failed: %s", failed.Error)
		}
		if !checkValidity(t, n, path) {
			t.Fatalf("%s is not valid after a signed pull", path)
		}
	})
}
