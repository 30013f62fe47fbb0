package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/internal/s3test"
	"gradient.dev/gradient/narstore/s3store"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// Crash safety of the binary cache (docs/protocol/cache.md §4): an upload interrupted by
// SIGKILL leaves no visible object, start-up removes the staging file, and
// after the restart the same upload succeeds and is served byte-exact.
// The server is the real binary, a child process on an SQLite data dir.
func TestUploadSurvivesServerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	const adminToken = "crash-test-admin-token"
	tmp := t.TempDir()
	bin := buildServer(t)
	dataDir, narDir := filepath.Join(tmp, "data"), filepath.Join(tmp, "nar")
	tokenFile := filepath.Join(tmp, "admin.token")
	if err := os.WriteFile(tokenFile, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func() *childServer {
		return startChild(t, bin, "--listen", "127.0.0.1:0", "--database", dataDir,
			"--nar-dir", narDir, "--admin-token-file", tokenFile, "--log-format", "json", "--log-level", "debug")
	}

	srv := start()
	admin := adminClient{t: t, token: adminToken}
	admin.base = srv.base
	admin.must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, nil)
	admin.must(201, "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "web", "repository": "https://example.invalid/web.git"}, nil)
	admin.must(201, "POST", "/api/v1/caches", map[string]any{"name": "main", "public": true}, nil)
	admin.must(0, "PUT", "/api/v1/projects/"+url.PathEscape("ops/web")+"/caches/main", nil, nil)
	var cred struct {
		WorkerID string `json:"worker_id"`
		PeerID   string `json:"peer_id"`
		Token    string `json:"token"`
	}
	// A cache peer: without a job, only a cache's own peers may upload.
	admin.must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "cache", "peer": "main"}, &cred)
	tokens := map[string]string{cred.PeerID: cred.Token}

	// A few MiB of incompressible NAR: many bulk chunks.
	nar := make([]byte, 3<<20+4321)
	rand.Read(nar)
	up := compressForUpload(t, nar)
	var pathHash [20]byte
	rand.Read(pathHash[:])
	path := storage.StoreDir + "/" + nixbase32.Encode(pathHash[:]) + "-crash"
	hash, err := storage.StorePathHash(path)
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimPrefix(up.meta.FileHash, "sha256:")
	finalObject := filepath.Join(narDir, "nars", key[:2], key[2:]+".nar.zst")
	nChunks := (len(up.zst) + session.BulkChunkSize - 1) / session.BulkChunkSize
	if nChunks < 4 {
		t.Fatalf("only %d chunks; the NAR is too small to interrupt", nChunks)
	}

	// First attempt: half the chunks, then SIGKILL once they are on disk.
	w := dialWorker(t, srv.ws, cred.WorkerID, tokens)
	sendMsg(t, w, &wire.UploadRequest{JobID: "job", RequestID: 1, Object: &wire.UploadNar{StorePath: path}, Size: up.meta.NarSize})
	if grant := awaitGrantOf(t, w, 1); !isPassthrough(grant) {
		t.Fatalf("first upload granted %T, want Passthrough", grant)
	}
	sent := (nChunks / 2) * session.BulkChunkSize
	for off := 0; off < sent; off += session.BulkChunkSize {
		sendMsg(t, w, &wire.UploadChunk{RequestID: 1, Data: up.zst[off : off+session.BulkChunkSize], Offset: uint64(off)})
	}
	staging, named := waitForStaging(t, srv, narDir, int64(sent))
	srv.kill()
	w.Close(session.CloseNormal, "server killed")

	// A named staging file survives SIGKILL (else the start-up cleanup
	// below proves nothing); an unnamed one (O_TMPFILE) goes with the
	// process's last descriptor.
	if _, err := os.Stat(staging); named && err != nil {
		t.Fatalf("the staging file should survive SIGKILL (else the test proves nothing): %v", err)
	}
	assertNoObject(t, finalObject, narDir, "the interrupted upload")

	// Restart on the same data and NAR dir.
	srv = start()
	admin.base = srv.base
	if _, err := os.Stat(staging); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("staging file %s after restart: %v, want it removed at start-up", staging, err)
	}
	if left, _ := filepath.Glob(filepath.Join(narDir, "nars", ".put-*.tmp")); len(left) > 0 {
		t.Fatalf("staging files left after restart: %v", left)
	}
	assertNoObject(t, finalObject, narDir, "the interrupted upload")
	if code, body := httpGet(t, srv.base+"/cache/main/"+hash+".narinfo"); code != http.StatusNotFound {
		t.Fatalf("narinfo after the crash: %d %s, want 404", code, body)
	}
	if code, _ := httpGet(t, srv.base+"/cache/main/nar/"+key+".nar.zst"); code != http.StatusNotFound {
		t.Fatalf("NAR after the crash: %d, want 404", code)
	}
	var paths []json.RawMessage
	admin.must(200, "GET", "/api/v1/caches/main/paths", nil, &paths)
	if len(paths) != 0 {
		t.Fatalf("cache paths after the crash: %s", paths)
	}

	// Second attempt, a new session: the whole upload commits.
	w = dialWorker(t, srv.ws, cred.WorkerID, tokens)
	sendMsg(t, w, &wire.UploadRequest{JobID: "job", RequestID: 2, Object: &wire.UploadNar{StorePath: path}, Size: up.meta.NarSize})
	if grant := awaitGrantOf(t, w, 2); !isPassthrough(grant) {
		t.Fatalf("second upload granted %T, want Passthrough", grant)
	}
	for off := 0; off < len(up.zst); off += session.BulkChunkSize {
		end := min(off+session.BulkChunkSize, len(up.zst))
		sendMsg(t, w, &wire.UploadChunk{RequestID: 2, Data: up.zst[off:end], Offset: uint64(off)})
	}
	sendMsg(t, w, &wire.UploadChunk{RequestID: 2, Offset: uint64(len(up.zst)), IsFinal: true})
	meta := up.meta
	sendMsg(t, w, &wire.UploadFinished{RequestID: 2, Metadata: &meta})
	committed := recvMsg[*wire.UploadCommitted](t, w)
	if _, ok := committed.Outcome.(*wire.UploadOk); !ok || committed.RequestID != 2 {
		t.Fatalf("second upload: request %d, outcome %#v, want UploadOk", committed.RequestID, committed.Outcome)
	}

	code, narinfo := httpGet(t, srv.base+"/cache/main/"+hash+".narinfo")
	if code != http.StatusOK {
		t.Fatalf("narinfo after the upload: %d %s", code, narinfo)
	}
	for _, line := range []string{"StorePath: " + path, "URL: nar/" + key + ".nar.zst", "FileHash: " + up.meta.FileHash,
		fmt.Sprintf("FileSize: %d", len(up.zst)), "NarHash: " + up.meta.NarHash, fmt.Sprintf("NarSize: %d", len(nar))} {
		if !strings.Contains(string(narinfo), line+"\n") {
			t.Fatalf("narinfo lacks %q:\n%s", line, narinfo)
		}
	}
	code, body := httpGet(t, srv.base+"/cache/main/nar/"+key+".nar.zst")
	if code != http.StatusOK || !bytes.Equal(body, up.zst) {
		t.Fatalf("NAR over HTTP: %d, %d bytes, want the uploaded %d", code, len(body), len(up.zst))
	}
	if stored, err := os.ReadFile(finalObject); err != nil || !bytes.Equal(stored, up.zst) {
		t.Fatalf("stored object %s: %d bytes, %v", finalObject, len(stored), err)
	}
	admin.must(200, "GET", "/api/v1/caches/main/paths", nil, &paths)
	if len(paths) != 1 {
		t.Fatalf("cache paths after the upload: %s", paths)
	}
}

// unnamedFiles are the /proc paths of pid's descriptors of unnamed files
// (O_TMPFILE) in dir: their link reads "<dir>/#<inode> (deleted)".
func unnamedFiles(pid int, dir string) []string {
	fds := fmt.Sprintf("/proc/%d/fd", pid)
	entries, _ := os.ReadDir(fds)
	var out []string
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(fds, e.Name()))
		if err == nil && strings.HasPrefix(target, dir+"/#") && strings.HasSuffix(target, " (deleted)") {
			out = append(out, filepath.Join(fds, e.Name()))
		}
	}
	return out
}

// childServer is a gradient-server process.
type childServer struct {
	t      *testing.T
	cmd    *exec.Cmd
	base   string // http://127.0.0.1:PORT
	ws     string // ws://127.0.0.1:PORT/proto
	log    *lineLog
	exited chan struct{}
}

// buildServer builds the binary into the test's temporary directory.
func buildServer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gradient-server")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startChild runs the binary and waits for its "listening" log line, which
// carries the bound address (it listens on port 0).
func startChild(t *testing.T, bin string, args ...string) *childServer {
	t.Helper()
	return startChildWithEnv(t, bin, append(os.Environ(), "CI=true"), args...)
}

// startChildWithEnv is startChild with exactly the environment env.
func startChildWithEnv(t *testing.T, bin string, env []string, args ...string) *childServer {
	t.Helper()
	log := &lineLog{listening: make(chan string, 1)}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = io.Discard, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &childServer{t: t, cmd: cmd, log: log, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			t.Logf("server (pid %d) log:\n%s", cmd.Process.Pid, log.String())
		}
	})
	select {
	case addr := <-log.listening:
		c.base, c.ws = "http://"+addr, "ws://"+addr+"/proto"
	case <-c.exited:
		t.Fatalf("gradient-server exited before listening: %v\n%s", cmd.ProcessState, log.String())
	case <-t.Context().Done():
		t.Fatal("test ended before the server listened")
	}
	return c
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *childServer) kill() {
	c.cmd.Process.Kill()
	<-c.exited
}

// lineLog keeps the child's stderr and reports the listening address.
type lineLog struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	partial   []byte
	listening chan string
	announced bool
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := l.partial[:i]
		var rec struct {
			Msg     string `json:"msg"`
			Address string `json:"address"`
		}
		if !l.announced && json.Unmarshal(line, &rec) == nil && rec.Msg == "gradient-server listening" && rec.Address != "" {
			l.announced = true
			l.listening <- rec.Address
		}
		l.partial = l.partial[i+1:]
	}
	return len(p), nil
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// waitForStaging waits until the one staging file in the NAR dir holds
// want bytes, i.e. the server wrote every chunk sent, and returns it and
// whether it is named: a temporary file in the NAR dir, else an unnamed
// one (O_TMPFILE) reached through the server's descriptor. It polls the
// filesystem (there is no event to wait on) but asserts nothing on time:
// the test's deadline bounds it.
func waitForStaging(t *testing.T, srv *childServer, narDir string, want int64) (path string, named bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		assertNoObject(t, "", narDir, "the upload in progress") // nothing visible before the commit
		names, _ := filepath.Glob(filepath.Join(narDir, "nars", ".put-*.tmp"))
		unnamed := unnamedFiles(srv.cmd.Process.Pid, filepath.Join(narDir, "nars"))
		if len(names)+len(unnamed) > 1 {
			t.Fatalf("several staging files: %v %v", names, unnamed)
		}
		for _, name := range append(names, unnamed...) {
			if st, err := os.Stat(name); err == nil && st.Size() >= want {
				return name, len(names) == 1
			}
		}
		select {
		case <-tick.C:
		case <-srv.exited:
			t.Fatalf("server exited while waiting for the staging file")
		case <-t.Context().Done():
			t.Fatal("test ended while waiting for the staging file")
		}
	}
}

// assertNoObject: no object file under its name (final; "" skips), and no
// other object either.
func assertNoObject(t *testing.T, final, narDir, what string) {
	t.Helper()
	if _, err := os.Stat(final); final != "" && !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("object %s after %s: %v, want none", final, what, err)
	}
	filepath.WalkDir(filepath.Join(narDir, "nars"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".nar.zst") {
			t.Fatalf("object %s is visible; %s never committed", p, what)
		}
		return nil
	})
}

type upload struct {
	zst  []byte
	meta wire.NarUploadMetadata
}

// compressForUpload compresses nar as a worker relays it, with the sums
// the server verifies.
func compressForUpload(t *testing.T, nar []byte) upload {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	zst := enc.EncodeAll(nar, nil)
	fileSum, narSum := sha256.Sum256(zst), sha256.Sum256(nar)
	return upload{zst: zst, meta: wire.NarUploadMetadata{
		FileHash: "sha256:" + nixbase32.Encode(fileSum[:]), FileSize: uint64(len(zst)),
		NarHash: "sha256:" + nixbase32.Encode(narSum[:]), NarSize: uint64(len(nar)), References: []string{},
	}}
}

// dialWorker connects a worker built from the session layer.
func dialWorker(t *testing.T, wsURL, workerID string, tokens map[string]string) *session.WorkerSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)
	// A 503 passes once the server has seen an earlier connection close
	// and freed its slot.
	tr, err := session.Dial(ctx, wsURL, session.DialOptions{Logger: quiet})
	for err != nil && strings.Contains(err.Error(), "(HTTP 503)") && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
		tr, err = session.Dial(ctx, wsURL, session.DialOptions{Logger: quiet})
	}
	if err != nil {
		t.Fatalf("dial %s: %v", wsURL, err)
	}
	c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
	est, err := session.RunPeer(ctx, c, session.PeerConfig{WorkerID: workerID,
		Capabilities: wire.GradientCapabilities{Build: true}, Tokens: tokens})
	if err != nil {
		tr.Close(session.CloseNormal, "")
		t.Fatalf("handshake: %v", err)
	}
	sess := session.SplitWorker(c, est, session.Options{Logger: quiet})
	t.Cleanup(func() { sess.Close(session.CloseNormal, "test over") })
	return sess
}

func sendMsg(t *testing.T, sess *session.WorkerSession, m wire.ClientMessage) {
	t.Helper()
	if err := sess.Send(m); err != nil {
		t.Fatalf("send %s: %v", m.WireName(), err)
	}
}

// recvMsg returns the next message of type T, skipping others.
func recvMsg[T wire.ServerMessage](t *testing.T, sess *session.WorkerSession) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for {
		m, err := sess.Recv(ctx)
		if err != nil {
			var zero T
			t.Fatalf("recv, waiting for %T: %v", zero, err)
		}
		if v, ok := m.(T); ok {
			return v
		}
	}
}

// awaitGrantOf returns the grant of request id; an UploadCommitted first
// fails the test.
func awaitGrantOf(t *testing.T, sess *session.WorkerSession, id uint64) wire.GrantTarget {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for {
		m, err := sess.Recv(ctx)
		if err != nil {
			t.Fatalf("waiting for the grant of %d: %v", id, err)
		}
		switch m := m.(type) {
		case *wire.UploadGrant:
			if m.RequestID == id {
				return m.Target
			}
		case *wire.UploadCommitted:
			if m.RequestID == id {
				t.Fatalf("upload %d answered %#v before a grant", id, m.Outcome)
			}
		}
	}
}

func isPassthrough(g wire.GrantTarget) bool {
	_, ok := g.(*wire.GrantPassthrough)
	return ok
}

func httpGet(t *testing.T, u string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// adminClient calls the admin API with the admin token.
type adminClient struct {
	t     *testing.T
	base  string
	token string
}

// must requires status want (0: any 2xx) and decodes the body into out.
func (a adminClient) must(want int, method, path string, body, out any) {
	a.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(a.t.Context(), method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if (want == 0 && resp.StatusCode/100 != 2) || (want != 0 && resp.StatusCode != want) {
		a.t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, raw, want)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			a.t.Fatalf("%s %s: %v in %s", method, path, err, raw)
		}
	}
}

// With an S3 store: the server killed between a presigned grant and the
// worker's UploadFinished commits nothing; after the restart the old
// request is unknown (Rejected, so the worker retries), a new request
// commits, and the sweep removes the dead grant's staging object.
func TestPresignedUploadSurvivesServerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	s3 := s3test.Start(t)
	const adminToken = "crash-test-admin-token"
	tmp := t.TempDir()
	bin := buildServer(t)
	tokenFile, credsFile := filepath.Join(tmp, "admin.token"), filepath.Join(tmp, "s3-credentials")
	os.WriteFile(tokenFile, []byte(adminToken+"\n"), 0o600)
	os.WriteFile(credsFile, []byte("[default]\naws_access_key_id = "+s3.AccessKey+"\naws_secret_access_key = "+s3.SecretKey+"\n"), 0o600)
	start := func() *childServer {
		return startChild(t, bin, "--listen", "127.0.0.1:0", "--database", filepath.Join(tmp, "data"), "--admin-token-file", tokenFile,
			"--nar-store", "s3://"+s3.Bucket+"?endpoint="+s3.Endpoint+"&path-style=true", "--s3-credentials-file", credsFile,
			"--log-format", "json", "--log-level", "debug")
	}
	srv := start()
	if strings.Contains(srv.log.String(), s3.SecretKey) {
		t.Fatal("the server logged the S3 secret")
	}
	admin := adminClient{t: t, token: adminToken, base: srv.base}
	admin.must(201, "POST", "/api/v1/caches", map[string]any{"name": "main", "public": true}, nil)
	var cred struct {
		WorkerID string `json:"worker_id"`
		PeerID   string `json:"peer_id"`
		Token    string `json:"token"`
	}
	admin.must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "cache", "peer": "main"}, &cred)
	tokens := map[string]string{cred.PeerID: cred.Token}
	nar := make([]byte, 1<<20+77)
	rand.Read(nar)
	up := compressForUpload(t, nar)
	var pathHash [20]byte
	rand.Read(pathHash[:])
	path := storage.StoreDir + "/" + nixbase32.Encode(pathHash[:]) + "-crash"
	hash, _ := storage.StorePathHash(path)
	key := strings.TrimPrefix(up.meta.FileHash, "sha256:")
	put := func(url string) {
		req, _ := http.NewRequest(http.MethodPut, url, bytes.NewReader(up.zst))
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("presigned PUT: %v %v", resp, err)
		}
		resp.Body.Close()
	}

	w := dialWorker(t, srv.ws, cred.WorkerID, tokens)
	sendMsg(t, w, &wire.UploadRequest{JobID: "job", RequestID: 1, Object: &wire.UploadNar{StorePath: path}, Size: up.meta.NarSize})
	grant, ok := awaitGrantOf(t, w, 1).(*wire.GrantPut)
	if !ok {
		t.Fatalf("granted %T, want Put", grant)
	}
	put(grant.URL)
	srv.kill()
	w.Close(session.CloseNormal, "server killed")

	srv = start()
	admin.base = srv.base
	if code, _ := httpGet(t, srv.base+"/cache/main/"+hash+".narinfo"); code != http.StatusNotFound {
		t.Fatalf("narinfo after the kill: %d, want 404", code)
	}
	for _, k := range s3.Keys(t) {
		if strings.HasPrefix(k, "nars/") {
			t.Fatalf("an object was placed before its commit: %s", k)
		}
	}
	w = dialWorker(t, srv.ws, cred.WorkerID, tokens)
	meta := up.meta
	sendMsg(t, w, &wire.UploadFinished{RequestID: 1, Metadata: &meta})
	if c := recvMsg[*wire.UploadCommitted](t, w); c.RequestID != 1 {
		t.Fatalf("answer for request %d", c.RequestID)
	} else if _, rejected := c.Outcome.(*wire.UploadRejected); !rejected {
		t.Fatalf("finish of a grant the old server gave: %#v, want Rejected", c.Outcome)
	}
	sendMsg(t, w, &wire.UploadRequest{JobID: "job", RequestID: 2, Object: &wire.UploadNar{StorePath: path}, Size: up.meta.NarSize})
	grant, ok = awaitGrantOf(t, w, 2).(*wire.GrantPut)
	if !ok {
		t.Fatalf("second grant %T, want Put", grant)
	}
	put(grant.URL)
	meta = up.meta
	sendMsg(t, w, &wire.UploadFinished{RequestID: 2, Metadata: &meta})
	if c := recvMsg[*wire.UploadCommitted](t, w); c.RequestID != 2 {
		t.Fatalf("answer for request %d", c.RequestID)
	} else if _, ok := c.Outcome.(*wire.UploadOk); !ok {
		t.Fatalf("second upload: %#v", c.Outcome)
	}
	code, body := httpGet(t, srv.base+"/cache/main/nar/"+key+".nar.zst") // follows the redirect
	if code != http.StatusOK || !bytes.Equal(body, up.zst) {
		t.Fatalf("NAR: %d, %d bytes", code, len(body))
	}
	// The first grant's staging object is still there; the sweep takes it.
	nars, err := s3store.Open(t.Context(), s3store.Config{Endpoint: s3.Endpoint, Bucket: s3.Bucket, PathStyle: true,
		AccessKey: s3.AccessKey, SecretKey: s3.SecretKey}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := nars.Sweep(t.Context(), time.Nanosecond); err != nil || res.DeletedIncoming != 1 {
		t.Fatalf("sweep: %+v, %v; want the dead grant's object deleted", res, err)
	}
	if keys := s3.Keys(t); !slices.Equal(keys, []string{"nars/" + key + ".nar.zst"}) {
		t.Fatalf("bucket holds %q", keys)
	}
}
