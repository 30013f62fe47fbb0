package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// sessionClaims keep one live worker session per worker ID across the
// server instances sharing one PostgreSQL database (authority.Claims over
// the worker_sessions table), and carry what one instance asks of another
// about the sessions it holds — probe a holder, reauthorize, disconnect —
// as notifications on storage.WorkerSessionsChannel.
type sessionClaims struct {
	s        *Server
	db       *storage.DB
	log      *slog.Logger
	instance string
	lease    time.Duration

	// listening closes once this instance's LISTEN is in place.
	listening chan struct{}
	readyOnce sync.Once

	mu sync.Mutex
	// probes are this instance's asks waiting for the holder's answer,
	// by request ID.
	probes map[string]chan bool
	// busy bounds the probes run for other instances at once.
	busy chan struct{}
}

// sessionNote is one notification between instances. It crosses the
// database: every field is checked before use.
type sessionNote struct {
	To     string `json:"to"`
	From   string `json:"from"`
	Kind   string `json:"kind"` // probe, probed, reauth, disconnect
	Worker string `json:"worker"`
	ID     string `json:"id,omitempty"`
	// Dropped answers a probe: the holder did not answer and is gone.
	Dropped bool   `json:"dropped,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

const (
	noteProbe      = "probe"
	noteProbed     = "probed"
	noteReauth     = "reauth"
	noteDisconnect = "disconnect"
	// maxRemoteRequests bounds the probes and reauths this instance runs
	// for others at once.
	maxRemoteRequests = 16
	// maxNoteReason bounds a disconnect reason taken from a note.
	maxNoteReason = 256
	// maxSessionStatus bounds a session's status read from a claim.
	maxSessionStatus = 64 << 10
)

func newSessionClaims(s *Server) *sessionClaims {
	return &sessionClaims{
		s: s, db: s.db, log: s.log.With("instance", s.cfg.InstanceID), instance: s.cfg.InstanceID, lease: s.cfg.SessionLease,
		listening: make(chan struct{}), probes: map[string]chan bool{}, busy: make(chan struct{}, maxRemoteRequests),
	}
}

func (c *sessionClaims) row(s authority.ClaimedSession) storage.WorkerSession {
	status, err := json.Marshal(s.Status)
	if err != nil {
		status = nil // an empty view beats no claim
	}
	return storage.WorkerSession{WorkerID: s.WorkerID, InstanceID: c.instance, Nonce: s.Nonce, ConnectedAt: s.ConnectedAt, Status: status}
}

func (c *sessionClaims) Claim(ctx context.Context, s authority.ClaimedSession) (string, error) {
	return c.db.ClaimWorkerSession(ctx, c.row(s), c.lease)
}

func (c *sessionClaims) Renew(ctx context.Context, sessions []authority.ClaimedSession) ([]string, error) {
	rows := make([]storage.WorkerSession, 0, len(sessions))
	for _, s := range sessions {
		rows = append(rows, c.row(s))
	}
	return c.db.RenewWorkerSessions(ctx, c.instance, rows, c.lease)
}

func (c *sessionClaims) Release(ctx context.Context, s authority.ClaimedSession) error {
	return c.db.ReleaseWorkerSession(ctx, s.WorkerID, c.instance, s.Nonce)
}

// ProbeHolder asks the holder instance to probe its session and waits for
// its answer, bounded by ctx.
func (c *sessionClaims) ProbeHolder(ctx context.Context, holder, workerID string) (bool, error) {
	id := storage.NewID()
	answer := make(chan bool, 1)
	c.mu.Lock()
	c.probes[id] = answer
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.probes, id)
		c.mu.Unlock()
	}()
	if err := c.send(ctx, sessionNote{To: holder, Kind: noteProbe, Worker: workerID, ID: id}); err != nil {
		return false, err
	}
	select {
	case dropped := <-answer:
		return dropped, nil
	case <-ctx.Done():
		return false, fmt.Errorf("instance %s did not answer the probe: %w", holder, ctx.Err())
	}
}

func (c *sessionClaims) send(ctx context.Context, n sessionNote) error {
	n.From = c.instance
	b, err := json.Marshal(n)
	if err != nil {
		return err
	}
	return c.db.NotifyWorkerSessions(ctx, string(b))
}

// listen receives the notes addressed to this instance until ctx ends,
// listening again after a lost connection.
func (c *sessionClaims) listen(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for {
		err := c.db.ListenWorkerSessions(ctx, func() {
			c.readyOnce.Do(func() { close(c.listening) })
			backoff = 100 * time.Millisecond
		}, func(payload string) { c.handle(ctx, payload) })
		if ctx.Err() != nil {
			return
		}
		c.log.Warn("listening for other instances' session requests failed; listening again", "error", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// handle takes one note; it runs on the listening connection's goroutine
// and must not block.
func (c *sessionClaims) handle(ctx context.Context, payload string) {
	var n sessionNote
	if err := json.Unmarshal([]byte(payload), &n); err != nil {
		c.log.Warn("malformed session note ignored", "error", err)
		return
	}
	if n.To != c.instance {
		return // another instance's
	}
	worker, err := sqldb.CanonicalUUID("worker ID", n.Worker)
	if err != nil {
		c.log.Warn("session note with a bad worker ID ignored", "kind", n.Kind, "from", n.From)
		return
	}
	switch n.Kind {
	case noteProbed:
		c.mu.Lock()
		answer := c.probes[n.ID]
		c.mu.Unlock()
		if answer != nil {
			select {
			case answer <- n.Dropped:
			default:
			}
		}
	case noteProbe:
		c.run(n, func() {
			dropped := c.s.auth.ProbeHolder(ctx, worker)
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := c.send(sctx, sessionNote{To: n.From, Kind: noteProbed, Worker: worker, ID: n.ID, Dropped: dropped}); err != nil {
				c.log.Warn("answering another instance's probe failed", "worker", worker, "error", err)
			}
		})
	case noteReauth:
		c.run(n, func() { c.s.auth.Reauth(worker) })
	case noteDisconnect:
		reason := n.Reason
		if len(reason) > maxNoteReason {
			// A close frame's reason must stay valid UTF-8.
			reason = strings.ToValidUTF8(reason[:maxNoteReason], "")
		}
		c.s.auth.Disconnect(worker, reason)
	default:
		c.log.Warn("session note of an unknown kind ignored", "kind", n.Kind, "from", n.From)
	}
}

// run runs what a note asks on a goroutine of the server's, at most
// maxRemoteRequests at once: beyond them the note is dropped (the asking
// instance's probe times out into a 496 the worker retries).
func (c *sessionClaims) run(n sessionNote, f func()) {
	select {
	case c.busy <- struct{}{}:
	default:
		c.log.Warn("too many requests from other instances; one is dropped", "kind", n.Kind, "worker", n.Worker, "from", n.From)
		return
	}
	// The listener is one of the server's goroutines, so the count is
	// above zero here, as WaitGroup.Go needs while Close may wait.
	c.s.wg.Go(func() {
		defer func() { <-c.busy }()
		f()
	})
}

// remoteHolder is the instance other than this one whose unexpired claim
// holds workerID; "" when none.
func (c *sessionClaims) remoteHolder(ctx context.Context, workerID string) (string, error) {
	ws, ok, err := c.db.LiveWorkerSession(ctx, workerID)
	if err != nil || !ok || ws.InstanceID == c.instance {
		return "", err
	}
	return ws.InstanceID, nil
}

// ask sends a note of kind about workerID to the instance holding its
// session, if another one does; false when none does.
func (c *sessionClaims) ask(ctx context.Context, kind, workerID, reason string) (bool, error) {
	holder, err := c.remoteHolder(ctx, workerID)
	if err != nil || holder == "" {
		return false, err
	}
	if err := c.send(ctx, sessionNote{To: holder, Kind: kind, Worker: workerID, Reason: reason}); err != nil {
		return false, err
	}
	c.log.Info("asked the instance holding the worker's session", "what", kind, "worker", workerID, "holder", holder)
	return true, nil
}

// remoteStatuses are the live sessions other instances hold, by worker ID.
func (c *sessionClaims) remoteStatuses(ctx context.Context) (map[string]authority.WorkerStatus, error) {
	rows, err := c.db.LiveWorkerSessions(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]authority.WorkerStatus{}
	for _, ws := range rows {
		if ws.InstanceID != c.instance {
			out[ws.WorkerID] = remoteStatus(ws)
		}
	}
	return out, nil
}

// remoteStatus is the view of a session another instance holds: what its
// holder last stored, live.
func remoteStatus(ws storage.WorkerSession) authority.WorkerStatus {
	var st authority.WorkerStatus
	if len(ws.Status) <= maxSessionStatus {
		_ = json.Unmarshal(ws.Status, &st) // a bad view still shows the session live
	}
	st.WorkerID, st.Live, st.ConnectedAt, st.Instance = ws.WorkerID, true, ws.ConnectedAt, ws.InstanceID
	st.OfflineReason, st.OfflineSince = "", time.Time{}
	return st
}
