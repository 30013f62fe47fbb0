package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// The real binary, started with nothing but variables, the reference's
// names for everything its NixOS module sets: the start-up line reports
// them, a second /proto upgrade past GRADIENT_PROTO_MAX_CONNECTIONS gets
// 503, and a silent worker is dropped after
// GRADIENT_PROTO_WORKER_HEARTBEAT_TIMEOUT_SECS.
func TestBinaryRunsOnTheReferenceVariables(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	const adminToken = "reference-env-admin-token"
	tmp := t.TempDir()
	tokenFile := filepath.Join(tmp, "admin.token")
	if err := os.WriteFile(tokenFile, []byte(adminToken), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startChildWithEnv(t, buildServer(t), []string{
		"GRADIENT_LISTEN=127.0.0.1:0", "GRADIENT_DATABASE=" + filepath.Join(tmp, "data"),
		"GRADIENT_ADMIN_TOKEN_FILE=" + tokenFile, "GRADIENT_LOG_FORMAT=json",
		"GRADIENT_PROTO_WORKER_HEARTBEAT_TIMEOUT_SECS=2",
		"GRADIENT_PROTO_MAX_CONNECTIONS=1",
		"GRADIENT_PROTO_FEDERATE=true",
		"GRADIENT_PROTO_DISCOVERABLE=false",
		"GRADIENT_PROTO_ANONYMOUS_CACHE_ENABLE=false",
		"GRADIENT_PROTO_ANONYMOUS_CACHE_MAX_CONNECTIONS_PER_IP=3",
		"GRADIENT_BUILD_DEFAULT_TIMEOUT_SECS=777",
		"GRADIENT_BUILD_DEFAULT_MAX_SILENT_SECS=55",
	})

	// The start-up line: what the binary runs with, no secret.
	start := startupLine(t, srv.log.String())
	for key, want := range map[string]any{"heartbeat_timeout": "2s", "max_connections": 1.0, "federate": true, "discoverable": false,
		"anonymous_cache": false, "anonymous_cache_per_ip": 3.0, "build_default_timeout_secs": 777.0,
		"build_default_max_silent_secs": 55.0, "database_engine": "sqlite", "admin_api": true, "dial_key": false,
		"nar_dir": filepath.Join(tmp, "data")} {
		if start[key] != want {
			t.Errorf("start-up line %s = %v, want %v", key, start[key], want)
		}
	}
	if strings.Contains(srv.log.String(), adminToken) {
		t.Error("the admin token appears in the log")
	}

	// The connection limit: one upgrade holds the only slot, so the
	// second (unauthenticated like it) takes it by closing the first.
	first, _, err := websocket.DefaultDialer.DialContext(t.Context(), srv.ws, nil)
	if err != nil {
		t.Fatal(err)
	}
	second, _, err := websocket.DefaultDialer.DialContext(t.Context(), srv.ws, nil)
	if err != nil {
		t.Fatalf("second upgrade with GRADIENT_PROTO_MAX_CONNECTIONS=1: %v, want it admitted in place of the first", err)
	}
	var closed *websocket.CloseError
	for range 3 { // the version agreement frame comes first
		if _, _, err = first.ReadMessage(); err != nil {
			break
		}
	}
	if !errors.As(err, &closed) || closed.Code != websocket.CloseTryAgainLater {
		t.Fatalf("first upgrade with GRADIENT_PROTO_MAX_CONNECTIONS=1 ended with %v, want closed with 1013 for the second", err)
	}
	first.Close()
	second.Close()

	// The heartbeat timeout: a registered worker that stays silent is
	// dropped with the configured timeout as the reason (dialWorker waits
	// for the closed upgrade's slot).
	admin := adminClient{t: t, base: srv.base, token: adminToken}
	admin.must(201, "POST", "/api/v1/teams", map[string]any{"name": "ops"}, nil)
	admin.must(201, "POST", "/api/v1/projects", map[string]any{"team": "ops", "name": "web", "repository": "https://example.invalid/web.git"}, nil)
	admin.must(201, "POST", "/api/v1/caches", map[string]any{"name": "main", "public": true}, nil)
	admin.must(0, "PUT", "/api/v1/projects/ops%2Fweb/caches/main", nil, nil)
	var cred struct {
		WorkerID string `json:"worker_id"`
		PeerID   string `json:"peer_id"`
		Token    string `json:"token"`
	}
	admin.must(201, "POST", "/api/v1/registrations", map[string]any{"peer_kind": "project", "peer": "ops/web"}, &cred)
	w := dialWorker(t, srv.ws, cred.WorkerID, map[string]string{cred.PeerID: cred.Token})
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second) // far below the default 120 s
	defer cancel()
	for {
		_, err := w.Recv(ctx)
		if err == nil {
			continue // the server's messages; the worker answers none
		}
		if ctx.Err() != nil {
			t.Fatal("the silent worker was not dropped: the heartbeat timeout did not apply")
		}
		// The close frame carries the server's reason; its log line may
		// reach the pipe a moment later.
		const reason = "no message for 2s (heartbeat timeout)"
		for deadline := time.Now().Add(5 * time.Second); !strings.Contains(err.Error(), reason) && !strings.Contains(srv.log.String(), reason); {
			if time.Now().After(deadline) {
				t.Fatalf("session ended (%v), but not by the 2 s heartbeat timeout:\n%s", err, srv.log.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		return
	}
}

// startupLine is the JSON record of the server's start-up line.
func startupLine(t *testing.T, log string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "gradient-server listening" {
			return rec
		}
	}
	t.Fatalf("no start-up line in:\n%s", log)
	return nil
}
