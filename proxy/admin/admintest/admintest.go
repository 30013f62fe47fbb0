// Package admintest runs, for tests, a federation proxy on loopback the
// way gradient-proxy wires it: a real store, both legs, the admin API and
// the dashboard on one HTTP server (/api/v1, /proto, /), and a tenant's real Gradient
// server that registered a worker ID for the proxy.
package admintest

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/authgate"
	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/proxy/admin"
	"gradient.dev/gradient/proxy/dashboard"
	"gradient.dev/gradient/proxy/downstream"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/proxy/upstream"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/session/limit"
	"gradient.dev/gradient/workersession"
)

// Proxy is a running proxy.
type Proxy struct {
	URL      string // HTTP base URL: the admin API is under URL+"/api/v1"
	ProtoURL string // ws:// URL of its /proto, for its workers
	// Token is the admin token ("" when started without one).
	Token      string
	Store      *proxystore.Store
	Leg        *downstream.Leg
	Supervisor *upstream.Supervisor
	// Logs holds everything the proxy logged.
	Logs *Buffer
}

// Options change what Start runs.
type Options struct {
	// NoAdminToken starts the API without a token (it answers 503).
	NoAdminToken bool
	// AuthFailuresPerMinute limits wrong admin tokens per address; 0
	// does not limit.
	AuthFailuresPerMinute int
}

// Start runs a proxy over the database at dbURL until the test ends.
func Start(tb testing.TB, dbURL string, opts Options) *Proxy {
	tb.Helper()
	ctx := context.Background()
	p := &Proxy{Logs: &Buffer{}}
	log := slog.New(slog.NewTextHandler(p.Logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		tb.Fatal(err)
	}
	if p.Store, err = proxystore.Open(ctx, dbURL, box); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Store.Close() })
	var sup *upstream.Supervisor
	if p.Leg, err = downstream.New(downstream.Config{Store: p.Store, Logger: log,
		PoolChanged: func(tenant string) { sup.PoolChanged(tenant) }}); err != nil {
		tb.Fatal(err)
	}
	sup, err = upstream.New(upstream.Config{
		Store: p.Store, Capabilities: upstream.DefaultCapabilities, Pool: p.Leg, PollInterval: 20 * time.Millisecond,
		Session: workersession.Config{BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Heartbeat: time.Hour},
		Logger:  log,
	})
	if err != nil {
		tb.Fatal(err)
	}
	p.Supervisor = sup
	hash := ""
	if !opts.NoAdminToken {
		if p.Token, err = secret.Generate(); err != nil {
			tb.Fatal(err)
		}
		if hash, err = secret.Hash(p.Token); err != nil {
			tb.Fatal(err)
		}
	}
	var gate *authgate.Gate
	if opts.AuthFailuresPerMinute > 0 {
		gate = authgate.New(limit.NewFailures(opts.AuthFailuresPerMinute, time.Minute, nil), log)
	}
	mux := http.NewServeMux()
	api := admin.New(admin.Config{Store: p.Store, AdminTokenHash: hash, Gate: gate, Downstream: p.Leg, Upstream: sup, Logger: log})
	api.Mount(mux)
	mux.Handle("/", dashboard.New(dashboard.Config{API: api, Gate: gate, Logger: log}).Handler())
	mux.Handle("GET /proto", p.Leg.Authority().ProtoHandler())
	hs := httptest.NewServer(mux)
	p.URL = hs.URL
	p.ProtoURL = "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto"
	supCtx, stop := context.WithCancel(context.Background())
	supDone := make(chan error, 1)
	go func() { supDone <- sup.Run(supCtx) }()
	tb.Cleanup(func() {
		stop()
		<-supDone
		p.Leg.Close()
		hs.Close()
	})
	return p
}

// Tenant is a tenant's real Gradient server with project "ops/demo",
// which registered WorkerID for the proxy.
type Tenant struct {
	ProtoURL  string // the server's ws:// /proto URL, the link's URL
	WorkerID  string // the proxy's worker ID on the server
	ProjectID string
	// Peers is the peers line PROJECT_ID:TOKEN the tenant hands over.
	Peers string
}

// TenantServer runs a tenant's server over the database at dbURL (which
// may be the proxy's: the schemas do not meet) until the test ends.
func TenantServer(tb testing.TB, dbURL string) Tenant {
	tb.Helper()
	db := testworld.Open(tb, dbURL)
	project, _ := testworld.Project(tb, db, "https://example.invalid/demo.git")
	var t Tenant
	t.ProjectID = project.ID
	t.WorkerID, t.Peers = testworld.Register(tb, db, project.ID)
	t.ProtoURL, _ = testworld.Serve(tb, db, server.Config{})
	return t
}

// Buffer is a log sink safe for concurrent writers.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
