package server

import (
	"context"
	"slices"
	"time"

	"gradient.dev/gradient/session"
)

// WorkerStatus is the operator's view of one worker ID.
type WorkerStatus struct {
	WorkerID     string    `json:"worker_id"`
	Live         bool      `json:"live"`
	ConnectedAt  time.Time `json:"connected_at,omitzero"`
	Projects     []string  `json:"projects,omitempty"` // authenticated for, while live
	Capabilities []string  `json:"capabilities,omitempty"`
	Draining     bool      `json:"draining,omitempty"`
	// DialedURL is set while the server's own dial holds the session.
	DialedURL string `json:"dialed_url,omitempty"`
	// OfflineReason is the last failure or disconnect of the worker ID.
	OfflineReason string    `json:"offline_reason,omitempty"`
	OfflineSince  time.Time `json:"offline_since,omitzero"`
}

// WorkerStatus reports whether a worker is connected, and why it last went
// away.
func (s *Server) WorkerStatus(workerID string) WorkerStatus {
	st := WorkerStatus{WorkerID: workerID}
	// A session holds the worker ID from its admission on, which is just
	// before the worker reads its InitAck.
	if conn := s.live.get(workerID); conn != nil {
		conn.mu.Lock()
		st.Live = true
		st.ConnectedAt = conn.connectedAt
		st.DialedURL = conn.dialURL
		st.Projects = slices.Clone(conn.grant.Projects)
		st.Capabilities = capabilityNames(conn.capabilities)
		st.Draining = conn.draining
		conn.mu.Unlock()
	}
	if r, ok := s.offline.get(workerID); ok {
		st.OfflineReason, st.OfflineSince = r.Reason, r.At
	}
	return st
}

// ProjectWorker is one worker of a project's worker list.
type ProjectWorker struct {
	WorkerStatus
	TeamID      string `json:"team_id,omitempty"` // set for team workers granted to the project
	Deactivated bool   `json:"deactivated,omitempty"`
}

// ProjectWorkers lists the workers registered for or granted to a project.
// A worker shows as live only when its session authenticated for this
// project.
func (s *Server) ProjectWorkers(ctx context.Context, projectID string) ([]ProjectWorker, error) {
	rows, err := s.db.ProjectWorkers(ctx, projectID)
	if err != nil {
		return nil, err
	}
	out := make([]ProjectWorker, 0, len(rows))
	for _, r := range rows {
		st := s.WorkerStatus(r.WorkerID)
		if st.Live && !slices.Contains(st.Projects, projectID) {
			st.Live = false
			st.Projects, st.Capabilities, st.ConnectedAt = nil, nil, time.Time{}
			if st.OfflineReason == "" {
				st.OfflineReason = "connected, but not authenticated for this project"
			}
		}
		out = append(out, ProjectWorker{WorkerStatus: st, TeamID: r.TeamID, Deactivated: r.Deactivated})
	}
	return out, nil
}

// ReauthProject challenges every live worker registered for or granted to
// a project again, e.g. after the project subscribed to a cache.
func (s *Server) ReauthProject(ctx context.Context, projectID string) (int, error) {
	rows, err := s.db.ProjectWorkers(ctx, projectID)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rows {
		if s.Reauth(r.WorkerID) {
			n++
		}
	}
	return n, nil
}

// ReauthTeam challenges every live team worker of a team again, e.g.
// after a project granted the team.
func (s *Server) ReauthTeam(ctx context.Context, teamID string) (int, error) {
	workers, err := s.db.ListTeamWorkers(ctx, teamID)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, w := range workers {
		if s.Reauth(w.WorkerID) {
			n++
		}
	}
	return n, nil
}

// DeactivateWorker marks a worker deactivated and ends its live session:
// an operator who deactivates a worker expects it to stop taking work now,
// not at its next reconnect.
func (s *Server) DeactivateWorker(ctx context.Context, workerID string) error {
	if err := s.db.DeactivateWorker(ctx, workerID); err != nil {
		return err
	}
	s.disconnect(workerID, "worker deactivated")
	s.RefreshDials()
	return nil
}

// disconnect starts closing the live session of a worker, if any.
func (s *Server) disconnect(workerID, reason string) {
	conn := s.live.get(workerID)
	if conn == nil {
		return
	}
	conn.mu.Lock()
	sess := conn.sess
	if sess == nil {
		// Admitted, not yet split: serveSession closes it right after.
		conn.kickReason = reason
	}
	conn.mu.Unlock()
	s.log.Info("closing worker session", "worker", workerID, "reason", reason)
	if sess == nil {
		return
	}
	// Close waits for the worker's close frame; the caller need not.
	go sess.Close(session.ClosePolicy, reason)
}
