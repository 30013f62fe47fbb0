package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/storage"
)

// What the server's tests (package server_test, on server/servertest)
// reach that no API route shows: the poller's pass on demand, git
// ls-remote, the failed-authentication limit's clock, the authority's
// sessions, the dialer's loops, sealed dial tokens and series.

// PollBranches runs one branch poll now, as the poller's tick does.
func (s *Server) PollBranches(ctx context.Context) []storage.Evaluation { return s.pollBranches(ctx) }

// LsRemote resolves branch in repository, local repositories allowed.
func LsRemote(ctx context.Context, repository, branch string) (string, error) {
	return lsRemote(ctx, repository, branch, gitAccess{allowLocal: true})
}

// WithAuthClock is cfg with clock as the failed-authentication limit's.
func WithAuthClock(cfg Config, clock func() time.Time) Config {
	cfg.authClock = clock
	return cfg
}

// AuthForTest reads the server's authority's internals.
func (s *Server) AuthForTest() authority.TestHandle { return s.auth.ForTest() }

// LiveSession is the authority's live session of workerID (nil: none).
func (s *Server) LiveSession(workerID string) *authority.LiveWorker { return s.auth.Session(workerID) }

// DialsRunning is how many redial loops are alive.
func (s *Server) DialsRunning() int32 { return s.dialer.running.Load() }

// OpenDialToken opens a registration's sealed dial token as the dialer does.
func (s *Server) OpenDialToken(sealed []byte, peer storage.Peer, workerID string) (string, bool) {
	return s.openToken(sealed, registrationIdentity(peer, workerID))
}

// DialMetrics are the dialer's series.
type DialMetrics struct {
	Rescans  prometheus.Counter
	Targets  *prometheus.GaugeVec
	Attempts *prometheus.CounterVec
}

// DialMetrics are the server's dialer series.
func (s *Server) DialMetrics() DialMetrics {
	return DialMetrics{Rescans: s.metrics.dialRescans, Targets: s.metrics.dialTargets, Attempts: s.metrics.dialAttempts}
}

// NotDialedReason is a target's offline reason while dialing is off.
const NotDialedReason = notDialedReason

// BranchPolls is the poller's count of polls with result ("polled" or
// "elsewhere": left to another instance).
func (s *Server) BranchPolls(result string) float64 {
	return testutil.ToFloat64(s.metrics.branchPolls.WithLabelValues(result))
}

// NudgeForgeStatuses wakes the commit-status poster.
func (s *Server) NudgeForgeStatuses() { s.forges.poster.Nudge() }

// ClaimsListening is closed once the instance listens for other
// instances' session notes (PostgreSQL only).
func (s *Server) ClaimsListening() <-chan struct{} { return s.claims.listening }

// AuthorityWorkerStatus is the authority's own view of workerID (this
// instance's sessions only).
func (s *Server) AuthorityWorkerStatus(workerID string) authority.WorkerStatus {
	return s.auth.WorkerStatus(workerID)
}

// AuthorityHolds reports whether this instance's authority holds workerID.
func (s *Server) AuthorityHolds(workerID string) bool { return s.auth.Holds(workerID) }
