package server

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gradient.dev/gradient/storage"
)

// dialer keeps one redial loop per dial target (worker ID, URL) that
// storage lists: a loop starts when its target appears and stops when it
// disappears. Each loop dials, serves the session while it lasts, and
// redials with backoff. With Config.DisableDialing it starts no loop and
// only counts the targets.
type dialer struct {
	s       *Server
	refresh chan struct{}         // a pending rescan; never blocks RefreshDials
	loops   map[dialKey]*dialLoop // owned by run's goroutine
	running atomic.Int32          // redial goroutines alive, for tests
	// undialed are the targets seen while dialing is disabled, to say
	// once per target why it is not dialed; owned by run's goroutine.
	undialed map[dialKey]bool
}

// dialKey is one dial target.
type dialKey struct{ workerID, url string }

// dialLoop is the redial loop of one target.
type dialLoop struct {
	stop  context.CancelFunc
	wake  chan struct{} // redial now: the target changed
	peers string        // the target's peers at the last rescan
}

func newDialer(s *Server) *dialer {
	return &dialer{s: s, refresh: make(chan struct{}, 1), loops: map[dialKey]*dialLoop{}, undialed: map[dialKey]bool{}}
}

// RefreshDials has the server read its dial targets again now, e.g. after
// the admin API created, changed or deleted a registration or team worker
// with a URL, or (re)activated a worker. A new target is dialed at once, a
// changed one is redialed without waiting out its backoff, and a target
// that disappeared is no longer dialed. A no-op without a dial key.
func (s *Server) RefreshDials() {
	if s.dialer == nil {
		return
	}
	select {
	case s.dialer.refresh <- struct{}{}:
	default: // a rescan is pending already
	}
}

// run rescans until ctx ends (Server.Close), then waits for the loops.
func (d *dialer) run(ctx context.Context) {
	var loops sync.WaitGroup
	defer loops.Wait()
	tick := time.NewTicker(d.s.cfg.DialRescan)
	defer tick.Stop()
	for {
		d.rescan(ctx, &loops)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-d.refresh:
		}
	}
}

// rescan reconciles the loops with storage's dial targets.
func (d *dialer) rescan(ctx context.Context, loops *sync.WaitGroup) {
	targets, err := d.s.db.DialTargets(ctx)
	if err != nil {
		if ctx.Err() == nil {
			d.s.log.Warn("reading dial targets failed", "error", err)
		}
		return
	}
	defer d.s.metrics.dialRescans.Inc()
	if d.s.cfg.DisableDialing {
		d.countUndialed(targets)
		return
	}
	d.s.metrics.dialTargets.WithLabelValues("dialing").Set(float64(len(targets)))
	current := make(map[dialKey]bool, len(targets))
	for _, t := range targets {
		key := dialKey{t.WorkerID, t.URL}
		current[key] = true
		peers := targetPeers(t)
		if l, ok := d.loops[key]; ok {
			if l.peers != peers {
				l.peers = peers
				select {
				case l.wake <- struct{}{}:
				default:
				}
			}
			continue
		}
		loopCtx, stop := context.WithCancel(ctx)
		l := &dialLoop{stop: stop, wake: make(chan struct{}, 1), peers: peers}
		d.loops[key] = l
		loops.Add(1)
		d.running.Add(1)
		go func() {
			defer loops.Done()
			defer d.running.Add(-1)
			d.redial(loopCtx, key, l)
		}()
	}
	for key, l := range d.loops {
		if !current[key] {
			// An established session stays up; only redialing stops.
			l.stop()
			delete(d.loops, key)
			d.s.log.Info("no longer dialing worker", "worker", key.workerID, "url", key.url)
		}
	}
}

// notDialedReason is the offline reason of a target while dialing is
// disabled.
const notDialedReason = "not dialed: the server's proto.discoverable is off (GRADIENT_PROTO_DISCOVERABLE); the worker may connect itself"

// countUndialed is rescan with dialing disabled: each new target gets
// its offline reason (and one log line), none is dialed.
func (d *dialer) countUndialed(targets []storage.DialTarget) {
	d.s.metrics.dialTargets.WithLabelValues("not_dialed").Set(float64(len(targets)))
	current := make(map[dialKey]bool, len(targets))
	for _, t := range targets {
		key := dialKey{t.WorkerID, t.URL}
		current[key] = true
		if !d.undialed[key] {
			d.s.dialFailed(key, notDialedReason)
		}
	}
	d.undialed = current
}

// targetPeers identifies what a dial of t presents, to notice changes.
func targetPeers(t storage.DialTarget) string {
	var peers []string
	for _, r := range t.Registrations {
		peers = append(peers, string(r.Peer.Kind)+"/"+r.Peer.ID+"/"+string(r.DialTokenSealed))
	}
	if tw := t.TeamWorker; tw != nil {
		peers = append(peers, "team/"+tw.TeamID+"/"+string(tw.DialTokenSealed))
	}
	slices.Sort(peers)
	return strings.Join(peers, ",")
}

// redial dials key until ctx ends: a failed dial waits out a backoff that
// doubles up to DialMaxBackoff; after a session the backoff starts over.
// A worker connected already (it dialed in, or another URL of it is up) is
// checked again after the first backoff step.
func (d *dialer) redial(ctx context.Context, key dialKey, l *dialLoop) {
	cfg := &d.s.cfg
	backoff := cfg.DialBackoff
	for ctx.Err() == nil {
		delay := cfg.DialBackoff
		switch {
		case d.s.auth.Holds(key.workerID), !d.s.Accepting():
			// Nothing to dial now: look again after the first step.
		default:
			established, elsewhere := d.s.dialLeased(ctx, key)
			switch {
			case elsewhere:
				// Another instance dials it: look again later, to take
				// over once its lease is free or expired.
				d.s.metrics.dialAttempts.WithLabelValues("elsewhere").Inc()
				delay = dialElsewhereWait(cfg)
			case established:
				d.s.metrics.dialAttempts.WithLabelValues("session").Inc()
				backoff = cfg.DialBackoff
			default:
				if ctx.Err() == nil {
					d.s.metrics.dialAttempts.WithLabelValues("failed").Inc()
				}
				delay = backoff
				backoff = min(2*backoff, cfg.DialMaxBackoff)
			}
		}
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
		case <-timer.C:
		case <-l.wake:
			backoff = cfg.DialBackoff
		}
		timer.Stop()
	}
}
