package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server/adminapi"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

func TestMain(m *testing.M) { os.Exit(storagetest.Main(m)) }

const instanceAdminToken = "instance-test-admin-token"

// running is a serve() of the test.
type running struct {
	base   string
	stop   context.CancelFunc
	done   chan error
	logs   *syncBuffer
	stdout string
}

// startServe runs serve with args; it returns the error when serve ends
// before listening (a refused start).
func startServe(t *testing.T, args ...string) (*running, error) {
	t.Helper()
	opts, err := parseOptions(append([]string{"--listen", "127.0.0.1:0", "--log-format", "json", "--poll-interval", "0"}, args...),
		envOf(map[string]string{"GRADIENT_ADMIN_TOKEN": instanceAdminToken}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r := &running{logs: &syncBuffer{}, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(t.Context())
	r.stop = cancel
	addrs := make(chan net.Addr, 1)
	go func() { r.done <- serve(ctx, opts, newLogger(opts, r.logs), func(a net.Addr) { addrs <- a }) }()
	select {
	case a := <-addrs:
		r.base = "http://" + a.String()
	case err := <-r.done:
		cancel()
		return nil, err
	case <-time.After(60 * time.Second):
		t.Fatalf("serve did not start:\n%s", r.logs.String())
	}
	t.Cleanup(func() { r.shutdown(t) })
	return r, nil
}

func (r *running) shutdown(t *testing.T) {
	if r.stop == nil {
		return
	}
	r.stop()
	r.stop = nil
	if err := <-r.done; err != nil {
		t.Errorf("serve: %v\n%s", err, r.logs.String())
	}
}

func (r *running) get(t *testing.T, path string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", r.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+instanceAdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b)
}

func writeDialKey(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "dial.key")
	if err := os.WriteFile(f, []byte(sealbox.EncodeKey(sealbox.NewKey())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// Real server processes' starts on one PostgreSQL database: instances
// with the same dial key and NAR store run side by side and list each
// other; one whose dial key or NAR store differs is refused with an error
// naming the setting, also after the others stopped, unless the change is
// accepted.
func TestInstancesMustShareConfiguration(t *testing.T) {
	t.Parallel()
	db := storagetest.PostgresURL(t)
	key, otherKey := writeDialKey(t), writeDialKey(t)
	nars := t.TempDir()
	shared := []string{"--database", db, "--nar-dir", nars}

	a, err := startServe(t, append(shared, "--dial-key-file", key, "--instance-id", "alpha")...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := startServe(t, append(shared, "--dial-key-file", key)...) // a random ID
	if err != nil {
		t.Fatalf("second instance with the same configuration: %v", err)
	}
	var view adminapi.Server
	if err := json.Unmarshal([]byte(b.get(t, "/api/v1/server")), &view); err != nil {
		t.Fatal(err)
	}
	if view.InstanceID == "" || view.InstanceID == "alpha" || len(view.Instances) != 2 ||
		view.Instances[0].ID != "alpha" || view.Instances[1].ID != view.InstanceID || view.Instances[0].Host == "" ||
		view.Instances[0].Workers == nil || *view.Instances[0].Workers != 0 {
		t.Fatalf("B's status: %+v", view)
	}
	if m := a.get(t, "/metrics"); !strings.Contains(m, `gradient_server_instance_info{host=`) || !strings.Contains(m, `instance_id="alpha"} 1`) {
		t.Errorf("A's /metrics lacks its instance:\n%s", m)
	}
	if !strings.Contains(a.logs.String(), `"instance":"alpha"`) {
		t.Errorf("A's log does not name its instance:\n%s", a.logs.String())
	}

	_, err = startServe(t, append(shared, "--dial-key-file", otherKey)...)
	if err == nil || !strings.Contains(err.Error(), "dial key (--dial-key-file") || !strings.Contains(err.Error(), "live instance alpha") ||
		strings.Contains(err.Error(), "NAR store") {
		t.Fatalf("another dial key: %v", err)
	}
	_, err = startServe(t, "--database", db, "--nar-dir", t.TempDir(), "--dial-key-file", key)
	if err == nil || !strings.Contains(err.Error(), "NAR store (--nar-store") || strings.Contains(err.Error(), "dial key") {
		t.Fatalf("another NAR directory: %v", err)
	}
	if _, err := startServe(t, append(shared, "--dial-key-file", key, "--instance-id", "alpha")...); err == nil ||
		!strings.Contains(err.Error(), "instance ID alpha is in use") {
		t.Fatalf("a second instance alpha: %v", err)
	}

	// Stopped cleanly: no instance is live, the fingerprint stays.
	a.shutdown(t)
	b.shutdown(t)
	check, err := storage.Open(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	if live, err := check.LiveInstances(t.Context()); err != nil || len(live) != 0 {
		t.Fatalf("instances after a clean stop: %+v, %v", live, err)
	}
	if _, err := startServe(t, append(shared, "--dial-key-file", otherKey)...); err == nil ||
		!strings.Contains(err.Error(), "last ran with") || !strings.Contains(err.Error(), "--accept-config-change") {
		t.Fatalf("another dial key with no instance running: %v", err)
	}
	if _, err := startServe(t, append(shared, "--dial-key-file", otherKey, "--accept-config-change")...); err != nil {
		t.Fatalf("an accepted change: %v", err)
	}
}
