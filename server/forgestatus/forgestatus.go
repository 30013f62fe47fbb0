// Package forgestatus posts the commit statuses of the outbox
// (storage.ForgeStatus rows, written in the transactions that queue and
// end evaluations) to the projects' forges. Its loop wakes on a nudge and
// on a periodic pass, posts each due row's newest version, and marks it
// posted only up to the version it sent, so a post that raced a newer
// state leaves the newer one due. Failures wait with exponential backoff,
// at least as long as the forge asked (forge.RetryableError.After:
// Retry-After, rate-limit resets). Everything it knows is in the
// database, so a restarted server posts what was left.
package forgestatus

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/server/forgelink"
	"gradient.dev/gradient/storage"
)

// Config is the poster's configuration.
type Config struct {
	DB    *storage.DB
	Links *forgelink.Links
	// ExternalURL is the server's address as users reach it; statuses
	// link to the dashboard's page ExternalURL/evaluations/ID. Empty: no link.
	ExternalURL string
	Logger      *slog.Logger
	Metrics     prometheus.Registerer
	// Interval is the periodic pass besides nudges (5 s).
	Interval time.Duration
	// MinBackoff is the first wait after a failed post, doubling per
	// attempt up to MaxBackoff (2 s, 10 min).
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// Concurrency is how many posts run at once (4).
	Concurrency int
	// Owner names this poster among several sharing the outbox (the
	// server instance's ID); "" is "local". Each poster claims the rows it
	// posts, so every status is posted once.
	Owner string
}

// maxPermanentAttempts is how often a status the forge refuses for good
// (bad credentials, unknown repository) is tried, MaxBackoff apart, before
// it is given up: long enough for an operator to fix the link.
const maxPermanentAttempts = 5

// postsPerSlot is how many due rows one pass claims per post slot
// (Config.Concurrency): few enough that the pass ends within claimHold
// even when every post waits out the forge client's 30 s timeout.
const postsPerSlot = 4

// claimHold is how long a poster's claim on a row lasts; a poster that
// died leaves its rows to the others after it.
const claimHold = 5 * time.Minute

// retention is how long posted statuses and seen deliveries are kept.
const retention = 7 * 24 * time.Hour

// Poster posts the outbox.
type Poster struct {
	cfg       Config
	log       *slog.Logger
	metrics   *metrics
	nudge     chan struct{}
	lastPrune time.Time
}

// New makes a poster; Run runs it.
func New(cfg Config) *Poster {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 2 * time.Second
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(10*time.Minute, cfg.MinBackoff)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	cfg.ExternalURL = strings.TrimRight(cfg.ExternalURL, "/")
	if cfg.Owner == "" {
		cfg.Owner = "local"
	}
	return &Poster{cfg: cfg, log: cfg.Logger, metrics: newMetrics(cfg.Metrics), nudge: make(chan struct{}, 1)}
}

// Nudge wakes the loop for new rows; it never blocks.
func (p *Poster) Nudge() {
	select {
	case p.nudge <- struct{}{}:
	default:
	}
}

// Run posts until ctx ends.
func (p *Poster) Run(ctx context.Context) {
	for {
		wait := p.pass(ctx)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-p.nudge:
			t.Stop()
		case <-t.C:
		}
	}
}

// pass posts the due rows and returns how long to sleep.
func (p *Poster) pass(ctx context.Context) time.Duration {
	now := time.Now()
	if now.Sub(p.lastPrune) > time.Hour {
		p.prune(ctx, now)
	}
	batch := postsPerSlot * p.cfg.Concurrency
	due, err := p.cfg.DB.ClaimDueForgeStatuses(ctx, p.cfg.Owner, now, now.Add(claimHold), batch)
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("forge statuses: reading the outbox failed", "error", err)
		}
		return p.cfg.Interval
	}
	slots := make(chan struct{}, p.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, s := range due {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			p.post(ctx, s)
		}()
	}
	wg.Wait()
	if depth, err := p.cfg.DB.ForgeStatusDepth(ctx); err == nil {
		p.metrics.depth.Set(float64(depth))
	}
	if len(due) == batch {
		return 0 // more are due
	}
	wait := p.cfg.Interval
	if next, err := p.cfg.DB.NextForgeStatusAt(ctx); err == nil && !next.IsZero() {
		wait = min(wait, max(time.Until(next), 0))
	}
	return wait
}

func (p *Poster) prune(ctx context.Context, now time.Time) {
	p.lastPrune = now
	if n, err := p.cfg.DB.PruneForgeDeliveries(ctx, now.Add(-retention)); err != nil {
		p.log.Warn("forge: pruning old deliveries failed", "error", err)
	} else if n > 0 {
		p.log.Info("forge: pruned old webhook deliveries", "count", n)
	}
	if _, err := p.cfg.DB.PruneForgeStatuses(ctx, now.Add(-retention)); err != nil {
		p.log.Warn("forge: pruning posted statuses failed", "error", err)
	}
}

// post sends one row and records the outcome.
func (p *Poster) post(ctx context.Context, s storage.ForgeStatus) {
	client, link, err := p.cfg.Links.Client(ctx, s.ProjectID)
	if errors.Is(err, storage.ErrNotFound) {
		return // the link was removed (with its rows) meanwhile
	}
	kind := link.Kind
	if err == nil {
		status := forge.Status{
			Commit: s.Commit, Context: s.Context, State: forge.State(s.State), Description: s.Description,
		}
		if p.cfg.ExternalURL != "" {
			status.TargetURL = p.cfg.ExternalURL + "/evaluations/" + s.EvaluationID
		}
		start := time.Now()
		err = client.PostStatus(ctx, status)
		p.metrics.latency.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	}
	if err == nil {
		p.metrics.posted.WithLabelValues(kind, s.State).Inc()
		newest, merr := p.cfg.DB.MarkForgeStatusPosted(ctx, s)
		if merr != nil {
			p.log.Warn("forge statuses: marking a status posted failed", "error", merr)
		}
		p.log.Debug("forge status posted", "project_id", s.ProjectID, "commit", s.Commit, "context", s.Context,
			"state", s.State, "version", s.Version, "newest", newest)
		return
	}
	if ctx.Err() != nil {
		return
	}
	var retry *forge.RetryableError
	reason, wait := "permanent", p.cfg.MaxBackoff
	if errors.As(err, &retry) {
		reason = "retryable"
		wait = p.backoff(s.Attempts)
		if retry.After > wait {
			wait = retry.After
		}
	} else if s.Attempts+1 >= maxPermanentAttempts {
		p.metrics.failed.WithLabelValues(kind, "given_up").Inc()
		p.log.Error("forge statuses: the forge refuses the status, given up", "project_id", s.ProjectID,
			"commit", s.Commit, "context", s.Context, "attempts", s.Attempts+1, "error", err)
		if _, merr := p.cfg.DB.MarkForgeStatusPosted(ctx, s); merr != nil {
			p.log.Warn("forge statuses: giving up a status failed", "error", merr)
		}
		return
	}
	p.metrics.failed.WithLabelValues(kind, reason).Inc()
	p.log.Warn("forge statuses: posting failed, will retry", "project_id", s.ProjectID, "commit", s.Commit,
		"context", s.Context, "attempt", s.Attempts+1, "retry_in", wait, "error", err)
	if derr := p.cfg.DB.DeferForgeStatus(ctx, s, time.Now().Add(wait), err.Error()); derr != nil {
		p.log.Warn("forge statuses: deferring a status failed", "error", derr)
	}
}

// backoff is the wait after attempts failed posts of a version.
func (p *Poster) backoff(attempts int) time.Duration {
	wait := p.cfg.MinBackoff
	for range min(attempts, 30) {
		wait *= 2
		if wait >= p.cfg.MaxBackoff {
			return p.cfg.MaxBackoff
		}
	}
	return wait
}
