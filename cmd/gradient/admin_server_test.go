package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http/httptest"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/instance"
	"gradient.dev/gradient/storage"
)

// `gradient server status` names the instance that answered and lists the
// live ones.
func TestServerStatusShowsInstances(t *testing.T) {
	t.Parallel()
	db, err := storage.Open(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	inst, err := instance.Join(t.Context(), instance.Config{DB: db, ID: "eu-1", Host: "ci-host", Addr: "0.0.0.0:3000"})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(cliAdminToken))
	srv := server.New(db, server.Config{AdminTokenHash: hex.EncodeToString(sum[:]), Instance: inst, Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Close()
		inst.Leave(context.Background())
		db.Close()
	})
	s := &adminServer{url: hs.URL, db: db}
	mustContain(t, s.ok(t, "server", "status"), "instance:", "eu-1", "live instance:", "eu-1 on ci-host (0.0.0.0:3000), started ")
}
