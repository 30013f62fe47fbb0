package hetzner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/storage/sqldb"
)

// Demand is how many jobs wait for each tenant, per Nix system: the
// job forwarding's mirror of the upstream offer book (proxy/hub's Set)
// implements it; NoDemand boots nothing.
type Demand interface {
	// PendingJobs maps a Nix system to the tenant's jobs waiting for a
	// worker of that system.
	PendingJobs(tenantID string) map[string]int
}

// NoDemand is a Demand with no pending jobs.
type NoDemand struct{}

// PendingJobs is always empty.
func (NoDemand) PendingJobs(string) map[string]int { return nil }

// Sessions is what the reconciler asks the downstream leg about a VM's
// worker (downstream.Leg implements it).
type Sessions interface {
	// Connected: an established session holds the worker.
	Connected(workerID string) bool
	// Busy: the worker runs a job the proxy forwarded.
	Busy(workerID string) bool
	// Drain sends Draining to the worker's session.
	Drain(workerID string) bool
	// Revoke deletes the worker's row and closes its session.
	Revoke(ctx context.Context, workerID string) error
}

// Config configures a Reconciler; zero durations take the defaults.
type Config struct {
	Store    *proxystore.Store
	Client   *hcloud.Client // NewClient
	Sessions Sessions
	Demand   Demand // nil: NoDemand
	// ProtoURL is the proxy's ws(s):// /proto URL as the VMs reach it.
	ProtoURL string
	// BootableChanged, when set, learns after a pass that a tenant's
	// Bootable systems changed (the upstream leg re-sends the tenant's
	// WorkerCapabilities: upstream.Supervisor.PoolChanged).
	BootableChanged func(tenantID string)

	Interval        time.Duration // 60 s between passes
	BillingUnit     time.Duration // 60 min
	ScaleDownWindow time.Duration // 5 min: an idle VM goes only in its unit's last window
	// BootDeadline is how long a VM has to connect (5 min), and how
	// long a VM whose worker connected and went away may stay away
	// before it is deleted as lost.
	BootDeadline time.Duration
	DrainGrace   time.Duration // 15 min from Draining to deletion
	// ListGrace is how long a list may not show a server just created
	// (or a row just written may lack its server) before the leak
	// guard acts.
	ListGrace  time.Duration // 3 min
	BackoffMin time.Duration // 1 s after a failed call, doubling
	BackoffMax time.Duration // 5 min
	// BootBackoffMax caps the wait after a tenant's consecutive failed
	// boots of a system (1 h): after n, the next VM of that system boots
	// BootDeadline·2ⁿ⁻¹ after the last failure, at most this much.
	BootBackoffMax time.Duration
	// Now is the clock (time.Now); tests set their own.
	Now func() time.Time

	Logger  *slog.Logger
	Metrics prometheus.Registerer
}

// Defaults of Config's durations.
const (
	DefaultInterval        = time.Minute
	DefaultBillingUnit     = time.Hour
	DefaultScaleDownWindow = 5 * time.Minute
	DefaultBootDeadline    = 5 * time.Minute
	DefaultDrainGrace      = 15 * time.Minute
	DefaultListGrace       = 3 * time.Minute
	DefaultBackoffMin      = time.Second
	DefaultBackoffMax      = 5 * time.Minute
	DefaultBootBackoffMax  = time.Hour
)

// Reconciler runs the passes; see the package comment.
type Reconciler struct {
	cfg      Config
	store    *proxystore.Store
	cloud    *cloud
	sessions Sessions
	demand   Demand
	log      *slog.Logger
	m        *metrics

	passMu sync.Mutex // one pass at a time
	// backoff per tenant ID; "" is the server list's.
	backoff map[string]*backoff
	// gone is when each connected VM's worker was first seen without a
	// session, by VM ID (under passMu; a restart starts the wait anew).
	gone map[string]time.Time

	bootMu   sync.Mutex
	bootable map[string][]string // by tenant ID, from the last pass
}

type backoff struct {
	until time.Time
	next  time.Duration
}

// New checks cfg and builds the reconciler.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Store == nil || cfg.Client == nil || cfg.Sessions == nil {
		return nil, errors.New("hetzner: a store, a client and the sessions are required")
	}
	if !strings.HasPrefix(cfg.ProtoURL, "ws://") && !strings.HasPrefix(cfg.ProtoURL, "wss://") {
		return nil, fmt.Errorf("hetzner: the proxy's /proto URL %q is not a ws:// or wss:// URL", cfg.ProtoURL)
	}
	for _, d := range []struct {
		p   *time.Duration
		def time.Duration
	}{{&cfg.Interval, DefaultInterval}, {&cfg.BillingUnit, DefaultBillingUnit}, {&cfg.ScaleDownWindow, DefaultScaleDownWindow},
		{&cfg.BootDeadline, DefaultBootDeadline}, {&cfg.DrainGrace, DefaultDrainGrace}, {&cfg.ListGrace, DefaultListGrace},
		{&cfg.BackoffMin, DefaultBackoffMin}, {&cfg.BackoffMax, DefaultBackoffMax}, {&cfg.BootBackoffMax, DefaultBootBackoffMax}} {
		if *d.p <= 0 {
			*d.p = d.def
		}
	}
	if cfg.ScaleDownWindow > cfg.BillingUnit {
		return nil, fmt.Errorf("hetzner: the scale-down window %s is longer than the billing unit %s", cfg.ScaleDownWindow, cfg.BillingUnit)
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = cfg.BackoffMin
	}
	if cfg.Demand == nil {
		cfg.Demand = NoDemand{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := newMetrics(cfg.Metrics)
	return &Reconciler{cfg: cfg, store: cfg.Store, cloud: &cloud{c: cfg.Client, m: m}, sessions: cfg.Sessions,
		demand: cfg.Demand, log: cfg.Logger.With("component", "hetzner"), m: m, backoff: map[string]*backoff{},
		gone: map[string]time.Time{}, bootable: map[string][]string{}}, nil
}

// Run runs a pass at once and then every interval until ctx ends.
func (r *Reconciler) Run(ctx context.Context) error {
	r.log.Info("reconciling Hetzner workers", "interval", r.cfg.Interval, "billing_unit", r.cfg.BillingUnit,
		"scale_down_window", r.cfg.ScaleDownWindow, "boot_deadline", r.cfg.BootDeadline, "drain_grace", r.cfg.DrainGrace)
	tick := time.NewTicker(r.cfg.Interval)
	defer tick.Stop()
	for {
		if err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("reconcile pass failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Bootable is the Nix systems the tenant's Hetzner workers can boot, as
// of the last pass: none unless they are enabled with room for a VM;
// each configured system Hetzner has machines for. The upstream leg
// reports them as architectures (upstream.Config.Bootable), so the
// tenant's server offers their builds while no VM runs.
func (r *Reconciler) Bootable(tenantID string) []string {
	r.bootMu.Lock()
	defer r.bootMu.Unlock()
	return slices.Clone(r.bootable[tenantID])
}

// bootableOf is what Bootable reports for cfg.
func bootableOf(cfg *proxystore.HetznerConfig) []string {
	if cfg == nil || !cfg.Enabled || cfg.MaxVMs <= 0 {
		return nil
	}
	var out []string
	for _, system := range cfg.SortedSystems() {
		if sc := cfg.Systems[system]; sc.ServerType == "" || sc.Slots <= 0 {
			continue
		}
		if _, err := architecture(system); err == nil {
			out = append(out, system)
		}
	}
	return out
}

// setBootable records the configurations' bootable systems and tells
// BootableChanged of each tenant whose systems changed.
func (r *Reconciler) setBootable(configs []proxystore.HetznerConfig) {
	next := map[string][]string{}
	for i := range configs {
		if b := bootableOf(&configs[i]); len(b) > 0 {
			next[configs[i].TenantID] = b
		}
	}
	r.bootMu.Lock()
	var changed []string
	for id, b := range next {
		if !slices.Equal(b, r.bootable[id]) {
			changed = append(changed, id)
		}
	}
	for id := range r.bootable {
		if _, ok := next[id]; !ok {
			changed = append(changed, id)
		}
	}
	r.bootable = next
	r.bootMu.Unlock()
	if r.cfg.BootableChanged != nil {
		for _, id := range changed {
			r.cfg.BootableChanged(id)
		}
	}
}

func (r *Reconciler) backedOff(key string, now time.Time) bool {
	b := r.backoff[key]
	return b != nil && now.Before(b.until)
}

func (r *Reconciler) failed(key string, now time.Time) time.Duration {
	b := r.backoff[key]
	if b == nil {
		b = &backoff{next: r.cfg.BackoffMin}
		r.backoff[key] = b
	}
	wait := b.next
	b.until, b.next = now.Add(wait), min(2*b.next, r.cfg.BackoffMax)
	return wait
}

func (r *Reconciler) succeeded(key string) { delete(r.backoff, key) }

// world is what one pass reads.
type world struct {
	now     time.Time
	servers map[int64]*hcloud.Server
	// byVM is the servers by their gradient-vm label.
	byVM   map[string]*hcloud.Server
	images map[string]*hcloud.Image // per pass: "tenant\x00selector\x00arch"
	// failedBoots are the runs of failed boots by "tenant\x00system".
	failedBoots map[string]proxystore.BootBackoff
}

func bootKey(tenantID, system string) string { return tenantID + "\x00" + system }

// tenant is one tenant's part of a pass.
type tenant struct {
	id, name string
	cfg      *proxystore.HetznerConfig
	link     *proxystore.Link
	rows     []proxystore.VMUsage
}

// Pass reconciles every tenant once: one server list, then each
// tenant's rows, configuration and demand.
func (r *Reconciler) Pass(ctx context.Context) error {
	r.passMu.Lock()
	defer r.passMu.Unlock()
	start := time.Now()
	defer func() { r.m.passDuration.Observe(time.Since(start).Seconds()) }()
	now := r.cfg.Now()
	// The configurations first: what the tenants can boot is reported
	// upstream even while the API is backed off.
	configs, err := r.store.HetznerConfigs(ctx)
	if err != nil {
		return err
	}
	r.setBootable(configs)
	if r.backedOff("", now) {
		r.log.Debug("server list backed off", "until", r.backoff[""].until)
		return nil
	}
	list, _, err := r.cloud.listServers(ctx)
	if err != nil {
		wait := r.failed("", now)
		return fmt.Errorf("listing servers (next try in %s): %w", wait, err)
	}
	r.succeeded("")
	links, err := r.store.Links(ctx)
	if err != nil {
		return err
	}
	rows, err := r.store.OpenVMs(ctx)
	if err != nil {
		return err
	}
	failedBoots, err := r.store.BootBackoffs(ctx)
	if err != nil {
		return err
	}

	w := &world{now: now, servers: map[int64]*hcloud.Server{}, byVM: map[string]*hcloud.Server{}, images: map[string]*hcloud.Image{},
		failedBoots: map[string]proxystore.BootBackoff{}}
	for _, b := range failedBoots {
		w.failedBoots[bootKey(b.TenantID, b.System)] = b
	}
	for _, s := range list {
		w.servers[s.ID] = s
		if id := s.Labels[LabelVM]; id != "" {
			w.byVM[id] = s
		}
	}
	tenants := map[string]*tenant{}
	get := func(id, name string) *tenant {
		if tenants[id] == nil {
			tenants[id] = &tenant{id: id, name: name}
		}
		return tenants[id]
	}
	for i := range configs {
		get(configs[i].TenantID, configs[i].TenantName).cfg = &configs[i]
	}
	for i := range links {
		if t := tenants[links[i].TenantID]; t != nil {
			t.link = &links[i]
		}
	}
	rowByID := map[string]proxystore.VMUsage{}
	for _, row := range rows {
		rowByID[row.ID] = row
		t := get(row.TenantID, row.TenantName)
		t.rows = append(t.rows, row)
	}

	r.guardLeaks(ctx, w, list, rowByID)
	r.m.vms.Reset()
	r.m.failedBoots.Reset()
	r.m.bootBackoff.Reset()
	for _, t := range slices.SortedFunc(maps.Values(tenants), func(a, b *tenant) int { return cmp.Compare(a.name, b.name) }) {
		if err := r.reconcileTenant(ctx, w, t); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.log.Warn("reconciling tenant failed", "tenant", t.name, "error", err)
		}
	}
	return nil
}

// guardLeaks deletes every labelled server no open row names, unless it
// was created within the list grace.
func (r *Reconciler) guardLeaks(ctx context.Context, w *world, list []*hcloud.Server, rows map[string]proxystore.VMUsage) {
	for _, s := range list {
		row, ok := rows[s.Labels[LabelVM]]
		if ok && (row.Outcome == proxystore.VMCreating || row.ServerID == s.ID) {
			continue
		}
		if w.now.Sub(s.Created) < r.cfg.ListGrace {
			continue
		}
		tenantID := s.Labels[LabelTenant]
		if r.backedOff(tenantID, w.now) {
			continue
		}
		if _, err := r.cloud.deleteServer(ctx, s.ID); err != nil {
			wait := r.failed(tenantID, w.now)
			r.log.Warn("deleting a leaked server failed", "server_id", s.ID, "server", s.Name, "tenant_id", tenantID,
				"backoff", wait, "error", err)
			continue
		}
		r.succeeded(tenantID)
		r.m.actions.WithLabelValues("leaked_server").Inc()
		r.log.Warn("deleted a labelled server without a VM row", "server_id", s.ID, "server", s.Name, "tenant_id", tenantID)
	}
}

// whyNot is why the tenant may have no VMs, "" when it may.
func (t *tenant) whyNot() string {
	switch {
	case t.cfg == nil:
		return "no Hetzner configuration"
	case !t.cfg.Enabled:
		return "Hetzner workers disabled"
	case t.link == nil:
		return "no upstream link"
	case !t.link.TenantMayRun:
		return "tenant may not run"
	case !t.link.Enabled:
		return "upstream link disabled"
	case t.link.State != proxystore.LinkOK:
		return "upstream link failing"
	}
	return ""
}

func (r *Reconciler) reconcileTenant(ctx context.Context, w *world, t *tenant) error {
	log := r.log.With("tenant", t.name)
	// The rows that still stand for a VM after the lists' verdicts.
	var live []proxystore.VMUsage
	for _, row := range t.rows {
		switch s := w.byVM[row.ID]; {
		case row.Outcome == proxystore.VMCreating && s != nil:
			created := s.Created
			if created.IsZero() || created.After(w.now) {
				created = w.now
			}
			adopted, err := r.store.VMCreated(ctx, row.ID, s.ID, created)
			if err != nil {
				return err
			}
			r.m.actions.WithLabelValues("adopted").Inc()
			log.Info("adopted a server whose creation was not recorded", "server_id", s.ID, "vm", row.ID)
			row = adopted
		case row.Outcome == proxystore.VMCreating:
			if w.now.Sub(row.CreatedAt) < r.cfg.ListGrace {
				live = append(live, row)
				continue
			}
			if err := r.store.AbandonVM(ctx, row.ID); err != nil {
				return err
			}
			r.sessions.Revoke(ctx, row.WorkerID)
			log.Info("dropped a VM row whose server never appeared", "vm", row.ID)
			continue
		case w.servers[row.ServerID] == nil:
			if w.now.Sub(row.CreatedAt) < r.cfg.ListGrace {
				live = append(live, row) // created moments ago: the list may lag
				continue
			}
			if err := r.end(ctx, w, row, proxystore.VMMissing); err != nil {
				return err
			}
			r.m.actions.WithLabelValues("missing_server").Inc()
			log.Warn("closed a VM row whose server is missing", "server_id", row.ServerID, "vm", row.ID)
			continue
		}
		if row.ConnectedAt == nil && r.sessions.Connected(row.WorkerID) {
			marked, err := r.store.MarkVMConnected(ctx, row.ID, w.now)
			if err != nil {
				return err
			}
			log.Info("VM connected", "server_id", row.ServerID, "worker", row.WorkerID, "after", w.now.Sub(row.CreatedAt))
			row = marked
			if b, ok := w.failedBoots[bootKey(t.id, row.System)]; ok {
				if err := r.store.BootSucceeded(ctx, t.id, row.System); err != nil {
					return err
				}
				delete(w.failedBoots, bootKey(t.id, row.System))
				log.Info("a VM booted: the system's boot backoff ends", "system", row.System, "failed_boots", b.Failures)
			}
		}
		live = append(live, row)
	}

	why := t.whyNot()
	var active []proxystore.VMUsage
	counts := map[string]int{}
	for _, row := range live {
		if row.Outcome == proxystore.VMCreating {
			active = append(active, row)
			counts["booting"]++
			continue
		}
		connected := r.sessions.Connected(row.WorkerID)
		draining := why != "" || row.DrainingSince != nil
		// The boot deadline comes first: a VM that never connected ran
		// nothing, draining or not.
		if row.ConnectedAt == nil && !connected && w.now.Sub(row.CreatedAt) >= r.cfg.BootDeadline {
			if r.delete(ctx, w, t, row, proxystore.VMFailedBoot, "not connected within the boot deadline") {
				r.m.actions.WithLabelValues("failed_boot").Inc()
				r.bootFailed(ctx, w, t, row.System)
				continue
			}
		}
		// A worker that connected and went away is given the boot
		// deadline to come back (a reboot, a restarted unit); after
		// that the VM is lost: deleted and billed for the time it ran.
		// Not while draining: a drained worker may stay away (it
		// reconnects with backoff, or not at all), and the drain rule
		// ends the VM as drained after its grace.
		if row.ConnectedAt != nil && !connected && !draining {
			since, ok := r.gone[row.ID]
			if !ok {
				since = w.now
				r.gone[row.ID] = since
				log.Info("VM's worker went away", "server_id", row.ServerID, "worker", row.WorkerID)
			}
			if w.now.Sub(since) >= r.cfg.BootDeadline &&
				r.delete(ctx, w, t, row, proxystore.VMLost, "its worker was gone longer than the boot deadline") {
				r.m.actions.WithLabelValues("lost").Inc()
				continue
			}
		} else {
			delete(r.gone, row.ID)
		}
		if draining {
			if row.DrainingSince == nil {
				var err error
				if row, err = r.store.MarkVMDraining(ctx, row.ID, w.now); err != nil {
					return err
				}
				r.m.actions.WithLabelValues("drained").Inc()
				log.Info("draining VM", "server_id", row.ServerID, "reason", why)
			}
			if connected {
				r.sessions.Drain(row.WorkerID)
			}
			if w.now.Sub(*row.DrainingSince) >= r.cfg.DrainGrace {
				if r.delete(ctx, w, t, row, proxystore.VMDrained, "drained") {
					continue
				}
			}
			counts["draining"]++
			continue
		}
		if connected {
			counts["connected"]++
		} else {
			counts["booting"]++
		}
		active = append(active, row)
	}
	for state, n := range counts {
		r.m.vms.WithLabelValues(t.id, state).Set(float64(n))
	}
	if t.cfg != nil {
		for _, system := range t.cfg.SortedSystems() {
			if b, ok := w.failedBoots[bootKey(t.id, system)]; ok {
				r.m.failedBoots.WithLabelValues(t.name, system).Set(float64(b.Failures))
				r.m.bootBackoff.WithLabelValues(t.name, system).Set(max(b.RetryAt.Sub(w.now), 0).Seconds())
			}
		}
	}
	if why != "" {
		return nil
	}
	r.scale(ctx, w, t, active)
	return nil
}

// scale boots what the demand lacks and deletes idle surplus VMs in
// their billing unit's last window.
func (r *Reconciler) scale(ctx context.Context, w *world, t *tenant, active []proxystore.VMUsage) {
	cfg := t.cfg
	pending := r.demand.PendingJobs(t.id)
	bySystem := map[string][]proxystore.VMUsage{}
	for _, row := range active {
		bySystem[row.System] = append(bySystem[row.System], row)
	}
	systems := slices.Sorted(maps.Keys(bySystem))
	for _, s := range cfg.SortedSystems() {
		if !slices.Contains(systems, s) {
			systems = append(systems, s)
		}
	}
	slices.Sort(systems)
	room := cfg.MaxVMs - len(active)
	for _, system := range systems {
		target := 0
		if sc, ok := cfg.Systems[system]; ok && pending[system] > 0 {
			target = min(cfg.MaxVMs, (pending[system]+sc.Slots-1)/sc.Slots)
		}
		have := bySystem[system]
		n := min(target-len(have), room)
		if n > 0 {
			n = r.bootsAllowed(w, t, system, have, n)
		}
		for ; n > 0; n-- {
			if !r.boot(ctx, w, t, system) {
				break
			}
			room--
		}
		surplus := len(have) - target
		for _, row := range have {
			if surplus <= 0 {
				break
			}
			if row.Outcome != proxystore.VMRunning || row.ConnectedAt == nil || r.sessions.Busy(row.WorkerID) || !r.inLastWindow(row, w.now) {
				continue
			}
			if r.delete(ctx, w, t, row, proxystore.VMDeleted, "idle at the end of its billing unit") {
				r.m.actions.WithLabelValues("scaled_down").Inc()
				surplus--
			}
		}
	}
}

// bootsAllowed is how many of the n VMs the system lacks may boot now:
// all of them without failed boots; after some, none before the retry
// time, and then one at a time (a probe) until a VM of the system
// connects.
func (r *Reconciler) bootsAllowed(w *world, t *tenant, system string, have []proxystore.VMUsage, n int) int {
	b, ok := w.failedBoots[bootKey(t.id, system)]
	if !ok {
		return n
	}
	if w.now.Before(b.RetryAt) {
		r.log.Debug("boot backed off after failed boots", "tenant", t.name, "system", system, "failed_boots", b.Failures,
			"retry_at", b.RetryAt)
		return 0
	}
	for _, row := range have {
		if row.ConnectedAt == nil {
			return 0 // the probe still boots
		}
	}
	return 1
}

// bootWait is the wait after n consecutive failed boots: the boot
// deadline doubled n-1 times, at most BootBackoffMax.
func (r *Reconciler) bootWait(n int) time.Duration {
	wait := r.cfg.BootDeadline
	for i := 1; i < n && wait < r.cfg.BootBackoffMax; i++ {
		wait *= 2
	}
	return min(wait, r.cfg.BootBackoffMax)
}

// bootFailed counts a failed boot of the tenant's system and backs the
// system off.
func (r *Reconciler) bootFailed(ctx context.Context, w *world, t *tenant, system string) {
	b, err := r.store.BootFailed(ctx, t.id, system, w.now, r.bootWait)
	if err != nil {
		r.log.Error("counting a failed boot failed", "tenant", t.name, "system", system, "error", err)
		return
	}
	w.failedBoots[bootKey(t.id, system)] = b
	r.log.Warn("VM did not boot: the system's next VM waits", "tenant", t.name, "system", system, "failed_boots", b.Failures,
		"retry_at", b.RetryAt)
}

// inLastWindow: the VM's current billing unit ends within the
// scale-down window.
func (r *Reconciler) inLastWindow(row proxystore.VMUsage, now time.Time) bool {
	up := now.Sub(row.CreatedAt)
	return up > 0 && up%r.cfg.BillingUnit >= r.cfg.BillingUnit-r.cfg.ScaleDownWindow
}

// billedUnits are the started billing units from created to end.
func (r *Reconciler) billedUnits(created, end time.Time) int {
	up := end.Sub(created)
	if up <= 0 {
		return 1
	}
	return int((up + r.cfg.BillingUnit - 1) / r.cfg.BillingUnit)
}

// delete deletes the VM's server, revokes its worker and closes its row;
// false when the tenant is backed off or the API failed.
func (r *Reconciler) delete(ctx context.Context, w *world, t *tenant, row proxystore.VMUsage, outcome proxystore.VMOutcome, why string) bool {
	if r.backedOff(t.id, w.now) {
		return false
	}
	if _, err := r.cloud.deleteServer(ctx, row.ServerID); err != nil {
		wait := r.failed(t.id, w.now)
		r.log.Warn("deleting a VM failed", "tenant", t.name, "server_id", row.ServerID, "backoff", wait, "error", err)
		return false
	}
	r.succeeded(t.id)
	if err := r.end(ctx, w, row, outcome); err != nil {
		r.log.Error("closing a deleted VM's row failed", "tenant", t.name, "vm", row.ID, "error", err)
		return false
	}
	r.log.Info("deleted VM", "tenant", t.name, "server_id", row.ServerID, "outcome", outcome, "reason", why,
		"uptime", w.now.Sub(row.CreatedAt))
	return true
}

// end revokes the VM's worker (closing its session) and closes its row.
func (r *Reconciler) end(ctx context.Context, w *world, row proxystore.VMUsage, outcome proxystore.VMOutcome) error {
	if err := r.sessions.Revoke(ctx, row.WorkerID); err != nil && !errors.Is(err, sqldb.ErrNotFound) {
		return fmt.Errorf("revoking VM worker %s: %w", row.WorkerID, err)
	}
	delete(r.gone, row.ID)
	billed := 0
	if outcome != proxystore.VMFailedBoot {
		billed = r.billedUnits(row.CreatedAt, w.now)
	}
	_, err := r.store.EndVMUsage(ctx, row.ID, outcome, w.now, billed)
	return err
}

// boot creates one VM for the system; false when the tenant is backed
// off or a step failed.
func (r *Reconciler) boot(ctx context.Context, w *world, t *tenant, system string) bool {
	if r.backedOff(t.id, w.now) {
		return false
	}
	cfg, sc := t.cfg, t.cfg.Systems[system]
	log := r.log.With("tenant", t.name, "system", system)
	image, err := r.image(ctx, w, t, system)
	if err != nil {
		log.Warn("no worker snapshot to boot from", "error", err)
		return false
	}
	row, token, err := r.store.BeginVM(ctx, t.id, proxystore.NewVM{System: system, ServerType: sc.ServerType,
		Location: sc.Location, Allowed: cfg.Allowed}, w.now)
	if err != nil {
		log.Error("writing the VM row failed", "error", err)
		return false
	}
	userData, err := UserData(r.cfg.ProtoURL, row.WorkerID, token, sc.Slots)
	if err != nil {
		r.abandon(ctx, log, row)
		log.Error("no user data", "error", err)
		return false
	}
	labels := maps.Clone(cfg.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelTenant], labels[LabelVM] = t.id, row.ID
	start := true
	opts := hcloud.ServerCreateOpts{Name: row.ServerName, ServerType: &hcloud.ServerType{Name: sc.ServerType}, Image: image,
		UserData: userData, Labels: labels, StartAfterCreate: &start}
	if sc.Location != "" {
		opts.Location = &hcloud.Location{Name: sc.Location}
	}
	for _, id := range cfg.SSHKeys {
		opts.SSHKeys = append(opts.SSHKeys, &hcloud.SSHKey{ID: id})
	}
	server, _, err := r.cloud.createServer(ctx, opts)
	if err != nil {
		wait := r.failed(t.id, w.now)
		r.abandon(ctx, log, row)
		log.Warn("creating a VM failed", "server_type", sc.ServerType, "backoff", wait, "error", err)
		return false
	}
	r.succeeded(t.id)
	// Billing starts now that the server exists.
	if _, err := r.store.VMCreated(ctx, row.ID, server.ID, w.now); err != nil {
		log.Error("recording the created VM failed; the next pass adopts it", "server_id", server.ID, "error", err)
		return false
	}
	r.m.actions.WithLabelValues("booted").Inc()
	log.Info("booted VM", "server_id", server.ID, "server", row.ServerName, "server_type", sc.ServerType,
		"worker", row.WorkerID, "image", image.ID)
	return true
}

func (r *Reconciler) abandon(ctx context.Context, log *slog.Logger, row proxystore.VMUsage) {
	if err := r.store.AbandonVM(ctx, row.ID); err != nil {
		log.Error("dropping the row of a VM not created failed; the next pass drops it", "vm", row.ID, "error", err)
	}
}

// image is the worker snapshot for the system: by ID, or the newest
// available one labelled as configured for the system's architecture
// (one list per tenant, selector and architecture in a pass).
func (r *Reconciler) image(ctx context.Context, w *world, t *tenant, system string) (*hcloud.Image, error) {
	if t.cfg.SnapshotID != 0 {
		return &hcloud.Image{ID: t.cfg.SnapshotID}, nil
	}
	arch, err := architecture(system)
	if err != nil {
		return nil, err
	}
	key := t.id + "\x00" + t.cfg.SnapshotLabel + "\x00" + string(arch)
	if img := w.images[key]; img != nil {
		return img, nil
	}
	img, _, err := r.cloud.newestSnapshot(ctx, t.cfg.SnapshotLabel, arch)
	if err != nil {
		r.failed(t.id, w.now)
		return nil, err
	}
	// No reset of the backoff: only a create or delete that went
	// through shows the tenant's calls go through again.
	w.images[key] = img
	return img, nil
}

// architecture is the Hetzner architecture of a Nix system.
func architecture(system string) (hcloud.Architecture, error) {
	switch arch, _, _ := strings.Cut(system, "-"); arch {
	case "x86_64":
		return hcloud.ArchitectureX86, nil
	case "aarch64":
		return hcloud.ArchitectureARM, nil
	}
	return "", fmt.Errorf("Hetzner has no machines for system %s", system)
}
