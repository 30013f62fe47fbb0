package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"gradient.dev/gradient/internal/authgate"
	"gradient.dev/gradient/internal/dialguard"
	"gradient.dev/gradient/internal/healthz"
	"gradient.dev/gradient/internal/httpguard"
	"gradient.dev/gradient/metrics"
	"gradient.dev/gradient/proxy/admin"
	"gradient.dev/gradient/proxy/dashboard"
	"gradient.dev/gradient/proxy/downstream"
	"gradient.dev/gradient/proxy/hetzner"
	"gradient.dev/gradient/proxy/hub"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/proxy/upstream"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/session/limit"
	"gradient.dev/gradient/workersession"
)

const (
	shutdownTimeout = 10 * time.Second
	// hetznerCallTimeout bounds one Hetzner API request.
	hetznerCallTimeout = 30 * time.Second
)

// serve opens the database, runs both legs and the HTTP endpoints until
// ctx ends, then stops every upstream and downstream session. ready, when set,
// learns the bound address (tests listen on port 0).
func serve(ctx context.Context, opts options, log *slog.Logger, ready func(net.Addr)) error {
	adminHash := ""
	if opts.AdminToken != "" {
		var err error
		if adminHash, err = secret.Hash(opts.AdminToken); err != nil {
			return err
		}
	}
	opts.AdminToken = "" // only the hash lives on, for the admin API

	box, err := sealbox.OpenKeyFile(opts.EncryptionKeyFile)
	if err != nil {
		return fmt.Errorf("encryption key: %w", err)
	}
	store, err := proxystore.Open(ctx, opts.Database, box)
	if err != nil {
		return err
	}
	defer store.Close()

	registry := metrics.NewRegistry() // with the Go runtime and process series
	hubMetrics, err := hub.NewMetrics(registry)
	if err != nil {
		return err
	}
	// One hub per tenant forwards its jobs between its server and its
	// workers behind the proxy; both legs share them.
	hubs := hub.NewSet(log, hubMetrics)
	hubs.SetLimits(opts.Tenant)
	hubsCtx, stopHubs := context.WithCancel(ctx)
	defer stopHubs()
	go hubs.Run(hubsCtx)
	// The downstream leg tells the supervisor of pool changes and the
	// supervisor reads its pools; sup is set before any session starts.
	var sup *upstream.Supervisor
	// Worker and admin tokens are argon2id checks; one set of series.
	tokenChecks := secret.NewCheckMetrics(registry)
	leg, err := downstream.New(downstream.Config{
		Store: store, Logger: log, Metrics: registry, Hubs: hubs, ObserveTokenCheck: tokenChecks.Checked,
		PoolChanged: func(tenantID string) { sup.PoolChanged(tenantID) },
	})
	if err != nil {
		return err
	}
	defer leg.Close()
	// With Hetzner workers a tenant's session also reports the systems
	// its VMs can boot, so its server offers their builds from zero VMs
	// on; reconciler is set before the supervisor runs.
	var reconciler *hetzner.Reconciler
	bootable := func(tenantID string) []string {
		if reconciler == nil {
			return nil
		}
		return reconciler.Bootable(tenantID)
	}
	sup, err = upstream.New(upstream.Config{
		Store: store, Capabilities: opts.UpstreamCapabilities, Logger: log, Pool: leg, Hubs: hubs,
		Bootable: bootable, Session: upstreamSession(opts),
	})
	if err != nil {
		return err
	}

	if opts.Hetzner.Token != "" {
		h := opts.Hetzner
		client := hetzner.NewClient(h.Endpoint, h.Token, &http.Client{Timeout: hetznerCallTimeout})
		// The demand is each tenant's offer book (its hub's build
		// candidates per system).
		reconciler, err = hetzner.New(hetzner.Config{Store: store, Client: client, Sessions: leg, Demand: hubs,
			ProtoURL: h.ProtoURL, BootableChanged: sup.PoolChanged, Interval: h.Interval, BillingUnit: h.BillingUnit, ScaleDownWindow: h.ScaleDownWindow,
			BootDeadline: h.BootDeadline, DrainGrace: h.DrainGrace, ListGrace: h.ListGrace,
			BackoffMin: h.BackoffInitial, BackoffMax: h.BackoffMax, BootBackoffMax: h.BootBackoffMax, Logger: log, Metrics: registry})
		if err != nil {
			return err
		}
	}
	opts.Hetzner.Token = ""

	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", opts.Listen, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", healthz.Handler(store.Ping))
	mux.Handle("GET /proto", leg.Authority().ProtoHandler())
	var gate *authgate.Gate // nil: --auth-failures-per-minute 0
	if opts.AuthFailures > 0 {
		gate = authgate.New(limit.NewFailures(opts.AuthFailures, time.Minute, nil), log)
	}
	api := admin.New(admin.Config{Store: store, AdminTokenHash: adminHash, Gate: gate, ObserveTokenCheck: tokenChecks.Checked,
		Downstream: leg, Upstream: sup, AllowLinkLocalLinks: opts.AllowLinkLocalLinks,
		TenantDeleted: hubs.Remove, Logger: log})
	api.Mount(mux)
	// The dashboard at /: the admin API's views, behind a login with the
	// admin token counted by the same gate.
	mux.Handle("/", dashboard.New(dashboard.Config{API: api, Gate: gate, Logger: log}).Handler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(prometheus.Gatherers{registry, sup}, promhttp.HandlerOpts{}))
	// Header, body and keep-alive timeouts (/proto sessions keep their own
	// heartbeat), and room made near the open-file limit so /healthz and
	// workers still get in when idle clients hold the descriptors.
	guardMetrics, err := httpguard.NewMetrics(registry, "gradient_proxy")
	if err != nil {
		ln.Close()
		return err
	}
	guarded := httpguard.NewListener(ln, guardMetrics, log)
	guarded.ShedUnauthenticated = leg.Authority().ShedUnauthenticated
	httpServer := httpguard.Server(mux, opts.HTTP, log)
	httpServer.ConnState = guarded.ConnState
	served := make(chan error, 1)
	go func() { served <- httpServer.Serve(guarded) }()

	supCtx, stopSup := context.WithCancel(ctx)
	supDone := make(chan error, 1)
	go func() { supDone <- sup.Run(supCtx) }()
	recDone := make(chan error, 1)
	if reconciler != nil {
		go func() { recDone <- reconciler.Run(supCtx) }()
	} else {
		recDone <- nil
	}

	// One line with what the proxy runs with; never a secret (sqldb logs
	// the database location redacted).
	log.Info("gradient-proxy listening", "address", ln.Addr().String(), "database_engine", store.Engine(),
		"encryption_key_file", opts.EncryptionKeyFile, "admin_token", adminHash != "",
		"upstream_capabilities", opts.UpstreamCapabilities.Names(),
		"hetzner", reconciler != nil, "hetzner_endpoint", opts.Hetzner.Endpoint,
		"http_header_timeout", opts.HTTP.Header.String(), "http_body_timeout", opts.HTTP.Body.String(), "http_idle_timeout", opts.HTTP.Idle.String(),
		"serves", "/proto /api/v1 /healthz /metrics, the dashboard at /", "forwards", "jobs and cache traffic per tenant")
	if ready != nil {
		ready(ln.Addr())
	}

	var httpErr error
	select {
	case httpErr = <-served:
	case <-ctx.Done():
	}
	log.Info("stopping: closing every upstream and downstream session")
	stopSup()
	<-supDone
	<-recDone
	leg.Close()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if httpErr == nil {
		if err := httpServer.Shutdown(shutdownCtx); err != nil {
			log.Warn("http shutdown did not finish cleanly", "error", err)
		}
		httpErr = <-served
	}
	if httpErr != nil && !errors.Is(httpErr, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", httpErr)
	}
	log.Info("stopped")
	return nil
}

// upstreamSession is the template of every upstream session's shell:
// unless the operator allows them, its dials refuse link-local and cloud
// metadata addresses, also when a link's host name resolves to one.
func upstreamSession(opts options) workersession.Config {
	if opts.AllowLinkLocalLinks {
		return workersession.Config{}
	}
	return workersession.Config{DialControl: dialguard.Control}
}
