package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// syncBuffer collects the server's log from its goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

// A real start on a free port: health, metrics and the admin API answer,
// and cancelling the context stops the server cleanly.
func TestServeStartsAndStops(t *testing.T) {
	const adminToken = "serve-test-admin-token"
	keyFile := filepath.Join(t.TempDir(), "dial.key")
	if err := os.WriteFile(keyFile, []byte(sealbox.EncodeKey(sealbox.NewKey())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := parseOptions([]string{"--listen", "127.0.0.1:0", "--database", t.TempDir(), "--log-format", "json"},
		envOf(map[string]string{"GRADIENT_ADMIN_TOKEN": adminToken, "GRADIENT_DIAL_KEY_FILE": keyFile}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, opts, newLogger(opts, logs), func(a net.Addr) { addrs <- a }) }()
	var base string
	select {
	case a := <-addrs:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatalf("serve ended before listening: %v\n%s", err, logs.String())
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start")
	}

	get := func(path, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz", ""); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get("/metrics", ""); code != 200 || !strings.Contains(body, "gradient_server_accepting_connections 1") {
		t.Errorf("/metrics: %d %q", code, body)
	}
	if code, body := get("/api/v1/server", adminToken); code != 200 || !strings.Contains(body, `"accepting": true`) {
		t.Errorf("admin API with the token: %d %q", code, body)
	}
	if code, _ := get("/api/v1/server", "wrong"); code != 401 {
		t.Errorf("admin API with a wrong token: %d", code)
	}
	// The binary's registry: the Go runtime's and the process's series,
	// and the two admin token checks just made.
	_, body := get("/metrics", "")
	for _, want := range []string{"\ngo_goroutines ", "\nprocess_resident_memory_bytes ",
		"\ngradient_secret_argon2id_verification_duration_seconds_count 2\n",
		`gradient_secret_argon2id_verifications_total{result="match"} 1` + "\n",
		`gradient_secret_argon2id_verifications_total{result="mismatch"} 1` + "\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}

	// A worker in the middle of its handshake sees the stop as a close
	// frame, 1001, not as a dropped socket.
	closed := make(chan string, 1)
	ws, _, err := websocket.DefaultDialer.DialContext(t.Context(), "ws"+strings.TrimPrefix(base, "http")+"/proto", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if err := ws.WriteMessage(websocket.BinaryMessage, wire.VersionFrame(wire.Supported)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ws.ReadMessage(); err != nil { // the server's version frame
		t.Fatal(err)
	}
	go func() {
		ws.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, _, err := ws.ReadMessage()
		closed <- err.Error()
	}()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
	if got, want := <-closed, "websocket: close 1001 (going away): server stopping"; got != want {
		t.Errorf("the handshaking worker saw %q, want %q", got, want)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("still serving after stop")
	}
	out := logs.String()
	if strings.Contains(out, adminToken) {
		t.Error("the admin token appears in the log")
	}
	var sawListening, sawStopped bool
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		sawListening = sawListening || rec["msg"] == "gradient-server listening" && rec["dial_key"] == true
		sawStopped = sawStopped || rec["msg"] == "stopped"
	}
	if !sawListening || !sawStopped {
		t.Errorf("log lacks start or stop:\n%s", out)
	}
}

func TestServeWithoutAdminTokenDisablesTheAPI(t *testing.T) {
	opts, err := parseOptions([]string{"--listen", "127.0.0.1:0", "--database", t.TempDir()}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(t.Context())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, opts, slog.New(slog.NewTextHandler(logs, nil)), func(a net.Addr) { addrs <- a })
	}()
	a := <-addrs
	resp, err := http.Get("http://" + a.String() + "/api/v1/teams")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("admin API without a token: %d", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "no admin token configured") {
		t.Errorf("no warning about the disabled admin API:\n%s", logs.String())
	}
}

func TestServeRefusesABadDialKey(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "dial.key")
	os.WriteFile(bad, []byte("too short"), 0o600)
	opts, err := parseOptions([]string{"--database", t.TempDir(), "--dial-key-file", bad}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = serve(t.Context(), opts, slog.New(slog.DiscardHandler), nil)
	if err == nil || !strings.Contains(err.Error(), "dial key") {
		t.Fatalf("got %v", err)
	}
}

// run reports a bad database location instead of serving.
func TestRunFailsOnBadDatabase(t *testing.T) {
	err := run(t.Context(), []string{"--listen", "127.0.0.1:0", "--database", "mysql://nope"}, envOf(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "unsupported database URL scheme") {
		t.Fatalf("got %v", err)
	}
}

// A server started with a dial key seals the signing keys an earlier run
// stored in the clear; started again without the key, it refuses to start
// instead of failing every narinfo of those caches.
func TestServeSealsCachesSigningKeys(t *testing.T) {
	dataDir := t.TempDir()
	db, err := storage.Open(t.Context(), dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateCache(t.Context(), storage.NewCache{Name: "main", Public: true}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	keyFile := filepath.Join(t.TempDir(), "dial.key")
	if err := os.WriteFile(keyFile, []byte(sealbox.EncodeKey(sealbox.NewKey())), 0o600); err != nil {
		t.Fatal(err)
	}
	serveUntilListening := func(args ...string) (string, error) {
		t.Helper()
		opts, err := parseOptions(append([]string{"--listen", "127.0.0.1:0", "--database", dataDir}, args...), envOf(nil), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		logs := &syncBuffer{}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		listening := make(chan net.Addr, 1)
		done := make(chan error, 1)
		go func() {
			done <- serve(ctx, opts, slog.New(slog.NewTextHandler(logs, nil)), func(a net.Addr) { listening <- a })
		}()
		select {
		case <-listening:
			cancel()
			return logs.String(), <-done
		case err := <-done:
			return logs.String(), err
		}
	}

	logs, err := serveUntilListening("--dial-key-file", keyFile)
	if err != nil {
		t.Fatalf("serve with a dial key: %v\n%s", err, logs)
	}
	if !strings.Contains(logs, "sealed caches' signing keys") {
		t.Errorf("no log line about the sealed keys:\n%s", logs)
	}
	db, err = storage.Open(t.Context(), dataDir)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := db.CountSealedSigningKeys(t.Context())
	db.Close()
	if err != nil || sealed != 1 {
		t.Fatalf("sealed signing keys after the start: %d, %v; want 1", sealed, err)
	}

	if _, err := serveUntilListening(); err == nil || !strings.Contains(err.Error(), "--dial-key-file") {
		t.Fatalf("serve without the key: %v, want a refusal naming --dial-key-file", err)
	}
}
