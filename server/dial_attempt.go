package server

import (
	"context"
	"errors"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/server/instance"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
)

// dialLeaseName is the lease the instance dialing a worker holds (README
// "Several instances"): one instance at a time dials each worker.
func dialLeaseName(workerID string) string { return "dial/" + workerID }

// dialLeased is dialOnce under the worker's dial lease, held (renewed)
// while this instance dials it and while the session lives, released
// when it ends. elsewhere: another instance holds it (it dials the
// worker), so nothing was dialed. A lost lease ends the session, so two
// instances never both keep at it; the other takes over. Without shared
// instances (SQLite, no Instance) the lease is always this server's.
func (s *Server) dialLeased(ctx context.Context, key dialKey) (established, elsewhere bool) {
	err := s.cfg.Instance.RunExclusive(ctx, dialLeaseName(key.workerID), func(ctx context.Context) error {
		established = s.dialOnce(ctx, key)
		return nil
	})
	var held *instance.ErrHeldElsewhere
	switch {
	case errors.As(err, &held):
		return false, true
	case err != nil && ctx.Err() == nil:
		s.log.Warn("taking the worker's dial lease failed", "worker", key.workerID, "error", err)
	}
	return established, false
}

// dialElsewhereWait is how long a loop waits before asking again for a
// lease another instance holds: long enough not to load the database
// with a question per target per backoff step, short enough that a dead
// holder's worker is dialed soon after its lease expires.
func dialElsewhereWait(cfg *Config) time.Duration {
	return min(cfg.DialMaxBackoff, 5*time.Second)
}

// dialOnce dials one target: connect, present the target's tokens, admit
// the worker and serve the session until it ends (authority.ServeDialed). It reports whether a
// session was established. A failure is kept as the worker's offline
// reason (a dial target is always a registered worker ID).
func (s *Server) dialOnce(ctx context.Context, key dialKey) bool {
	target, found, err := s.dialTarget(ctx, key)
	if err != nil || !found {
		if err != nil && ctx.Err() == nil {
			s.log.Warn("reading dial target failed", "worker", key.workerID, "error", err)
		}
		return false
	}
	tokens := s.dialTokens(target)
	if len(tokens) == 0 {
		s.dialFailed(key, "no token to present: rotate the worker's token")
		return false
	}
	return s.auth.ServeDialed(ctx, authority.Dialed{
		WorkerID: key.workerID, URL: key.url, Tokens: tokens,
		Policy: &dialAdmitter{s: s, url: key.url, presented: presentedPeers(tokens)},
		Connect: func(ctx context.Context) (session.Transport, error) {
			// session.Dial warns about a ws:// URL itself.
			return session.Dial(ctx, key.url, session.DialOptions{
				TLS: s.cfg.DialTLS, ConnectTimeout: s.cfg.DialConnectTimeout, Logger: s.log.With("worker", key.workerID),
			})
		},
	})
}

// dialTarget reads the current target of key: its registrations (and
// their sealed tokens) may have changed since the loop started.
func (s *Server) dialTarget(ctx context.Context, key dialKey) (storage.DialTarget, bool, error) {
	targets, err := s.db.DialTargets(ctx)
	if err != nil {
		return storage.DialTarget{}, false, err
	}
	for _, t := range targets {
		if t.WorkerID == key.workerID && t.URL == key.url {
			return t, true, nil
		}
	}
	return storage.DialTarget{}, false, nil
}

func (s *Server) dialFailed(key dialKey, reason string) {
	s.auth.DialFailed(key.workerID, key.url, reason)
}
