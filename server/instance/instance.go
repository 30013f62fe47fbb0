// Package instance gives a server process its identity among the server
// instances that share one PostgreSQL database (README "Several
// instances"): an ID, a row in server_instances renewed as a lease while
// the process runs and deleted when it stops, a check at start that the
// settings every instance must share agree, and the one-at-a-time
// primitive the singletons use (a branch's poll, a garbage collection).
// On SQLite (one instance) the row is kept too, and every singleton is
// trivially this process's.
package instance

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/storage"
)

// Defaults of Config.
const (
	DefaultRenewEvery = 5 * time.Second
	DefaultLease      = 30 * time.Second
)

// pruneEvery is how often an instance deletes leases expired for as long
// (a deleted project's poll lease would otherwise stay forever).
const pruneEvery = time.Hour

// Config configures Join.
type Config struct {
	DB *storage.DB
	// ID names the instance (--instance-id); empty: a random one.
	ID      string
	Host    string // the machine (os.Hostname)
	Addr    string // the address the server listens on
	Version string
	// Fingerprint is what every instance must share (Fingerprint).
	Fingerprint storage.ConfigFingerprint
	// AcceptConfigChange replaces the cluster's stored fingerprint when no
	// live instance disagrees (--accept-config-change).
	AcceptConfigChange bool
	// RenewEvery renews the lease, which lasts Lease (5 s, 30 s).
	RenewEvery time.Duration
	Lease      time.Duration
	Logger     *slog.Logger
}

// Instance is this process among the server instances.
type Instance struct {
	cfg    Config
	db     *storage.DB
	log    *slog.Logger
	shared bool // PostgreSQL: other instances may exist

	mu  sync.Mutex
	row storage.ServerInstance

	cancel context.CancelFunc
	done   chan struct{}
}

// NewID is a random instance ID.
func NewID() string { return "srv-" + rand.Text()[:12] }

// Join registers this process (refusing a configuration that differs from
// the other instances', storage.ConfigMismatchError) and renews its lease
// until Leave.
func Join(ctx context.Context, cfg Config) (*Instance, error) {
	if cfg.ID == "" {
		cfg.ID = NewID()
	}
	if cfg.RenewEvery <= 0 {
		cfg.RenewEvery = DefaultRenewEvery
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Lease <= cfg.RenewEvery {
		return nil, fmt.Errorf("instance lease (%s) must be longer than its renewal period (%s)", cfg.Lease, cfg.RenewEvery)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	self := storage.ServerInstance{
		ID: cfg.ID, Host: cfg.Host, Addr: cfg.Addr, PID: os.Getpid(), Version: cfg.Version, Fingerprint: cfg.Fingerprint,
	}
	row, err := cfg.DB.RegisterInstance(ctx, self, cfg.Lease, cfg.AcceptConfigChange)
	var inUse *storage.InstanceInUseError
	if errors.As(err, &inUse) && predecessor(inUse.Holder, self) {
		// Restarted under its ID after a crash, before the old lease
		// passed (a service manager restarts at once): the row is its own.
		cfg.Logger.Warn("server instance: replacing the row of this instance's previous run, which is gone",
			"instance", cfg.ID, "previous_pid", inUse.Holder.PID, "previous_start", inUse.Holder.StartedAt)
		if err = cfg.DB.DeleteInstance(ctx, cfg.ID); err == nil {
			row, err = cfg.DB.RegisterInstance(ctx, self, cfg.Lease, cfg.AcceptConfigChange)
		}
	}
	if err != nil {
		return nil, err
	}
	i := &Instance{cfg: cfg, db: cfg.DB, log: cfg.Logger.With("instance", cfg.ID), row: row,
		shared: cfg.DB.Engine() == storage.EnginePostgres, done: make(chan struct{})}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	i.cancel = cancel
	go i.renew(runCtx)
	live, err := cfg.DB.LiveInstances(ctx)
	if err != nil {
		live = nil // only for the count below
	}
	i.log.Info("server instance registered", "host", cfg.Host, "addr", cfg.Addr, "lease", cfg.Lease,
		"renew_every", cfg.RenewEvery, "live_instances", len(live))
	return i, nil
}

// InfoCollector is the instance's info series for /metrics:
// gradient_server_instance_info{instance_id, host} 1.
func (i *Instance) InfoCollector() prometheus.Collector {
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "gradient_server_instance_info",
		Help:        "This server instance (always 1): its ID and host among the instances sharing the database.",
		ConstLabels: prometheus.Labels{"instance_id": i.cfg.ID, "host": i.cfg.Host}})
	info.Set(1)
	return info
}

// predecessor reports whether holder, a live row with self's ID, is a
// process of self's host that no longer runs: self's previous run.
func predecessor(holder, self storage.ServerInstance) bool {
	if holder.Host != self.Host || holder.Host == "" || holder.PID <= 0 {
		return false
	}
	// A process with that ID runs (this one, in a container that restarted
	// and got the same PID again): not provably gone; the old lease
	// passes within --instance-lease.
	err := syscall.Kill(holder.PID, 0)
	return errors.Is(err, syscall.ESRCH)
}

// ID is the instance's ID; "" for a nil Instance.
func (i *Instance) ID() string {
	if i == nil {
		return ""
	}
	return i.cfg.ID
}

// Row is the instance's row as last renewed.
func (i *Instance) Row() storage.ServerInstance {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.row
}

// Live lists the live instances, this one included.
func (i *Instance) Live(ctx context.Context) ([]storage.ServerInstance, error) {
	return i.db.LiveInstances(ctx)
}

// SessionCounts is how many worker sessions each live instance holds, by
// instance ID (the claims of worker_sessions); nil when this is the only
// instance (SQLite), whose sessions the authority counts itself.
func (i *Instance) SessionCounts(ctx context.Context) (map[string]int, error) {
	if i == nil || !i.shared {
		return nil, nil
	}
	return i.db.LiveWorkerSessionCounts(ctx)
}

// renew extends the lease every RenewEvery. A row that is gone (another
// instance judged this one dead) is registered again, loudly: this
// process kept running, but the others may have acted on its death.
func (i *Instance) renew(ctx context.Context) {
	defer close(i.done)
	t := time.NewTicker(i.cfg.RenewEvery)
	defer t.Stop()
	lastPrune := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(lastPrune) >= pruneEvery {
			lastPrune = time.Now()
			if _, err := i.db.PruneLeases(ctx, pruneEvery); err != nil && ctx.Err() == nil {
				i.log.Warn("server instance: pruning expired leases failed", "error", err)
			}
		}
		row, err := i.db.RenewInstance(ctx, i.cfg.ID, i.cfg.Lease)
		if errors.Is(err, storage.ErrNotFound) {
			i.log.Error("server instance: its row was deleted while it ran (taken for dead?); registering again")
			row, err = i.db.RegisterInstance(ctx, storage.ServerInstance{
				ID: i.cfg.ID, Host: i.cfg.Host, Addr: i.cfg.Addr, Version: i.cfg.Version, Fingerprint: i.cfg.Fingerprint,
			}, i.cfg.Lease, false)
		}
		if err != nil {
			if ctx.Err() == nil {
				i.log.Warn("server instance: renewing the lease failed", "error", err)
			}
			continue
		}
		i.mu.Lock()
		if row.LeaseUntil.Sub(i.row.LeaseUntil) > i.cfg.Lease {
			i.log.Warn("server instance: the lease had passed before it was renewed", "was_until", i.row.LeaseUntil)
		}
		i.row = row
		i.mu.Unlock()
	}
}

// Leave stops renewing and deletes the row: a clean stop, so no other
// instance takes this one for dead.
func (i *Instance) Leave(ctx context.Context) error {
	if i == nil {
		return nil
	}
	i.cancel()
	<-i.done
	err := i.db.DeleteInstance(ctx, i.cfg.ID)
	if err == nil {
		i.log.Info("server instance left")
	}
	return err
}
