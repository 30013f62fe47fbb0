package server

import (
	"context"
	"slices"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/server/admin"
)

// ConnectedWorkers is how many worker sessions are up or handshaking.
func (s *Server) ConnectedWorkers() int { return s.auth.Connected() }

// WorkerStatus reports whether a worker is connected, and why it last went
// away.
// A session another instance holds shows as live, with what that
// instance last stored of it.
func (s *Server) WorkerStatus(workerID string) authority.WorkerStatus {
	st := s.auth.WorkerStatus(workerID)
	if st.Live || s.claims == nil {
		return st
	}
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	ws, ok, err := s.db.LiveWorkerSession(ctx, workerID)
	if err != nil {
		s.log.Warn("reading the worker's session claim failed", "worker", workerID, "error", err)
	}
	if ok && ws.InstanceID != s.cfg.InstanceID {
		remote := remoteStatus(ws)
		remote.WorkerID = st.WorkerID
		return remote
	}
	return st
}

// ProjectWorkers lists the workers registered for or granted to a project.
// A worker shows as live only when its session authenticated for this
// project.
func (s *Server) ProjectWorkers(ctx context.Context, projectID string) ([]admin.ProjectWorker, error) {
	rows, err := s.db.ProjectWorkers(ctx, projectID)
	if err != nil {
		return nil, err
	}
	var remote map[string]authority.WorkerStatus
	if s.claims != nil {
		// Every instance's sessions, in one read.
		if remote, err = s.claims.remoteStatuses(ctx); err != nil {
			return nil, err
		}
	}
	out := make([]admin.ProjectWorker, 0, len(rows))
	for _, r := range rows {
		st := s.auth.WorkerStatus(r.WorkerID)
		if rs, ok := remote[r.WorkerID]; ok && !st.Live {
			st = rs
		}
		if st.Live && !slices.Contains(st.Projects, projectID) {
			st.Live = false
			st.Projects, st.Capabilities, st.ConnectedAt = nil, nil, time.Time{}
			if st.OfflineReason == "" {
				st.OfflineReason = "connected, but not authenticated for this project"
			}
		}
		out = append(out, admin.ProjectWorker{WorkerStatus: st, TeamID: r.TeamID, Deactivated: r.Deactivated})
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
	s.auth.Disconnect(workerID, "worker deactivated")
	if s.claims != nil {
		if _, err := s.claims.ask(ctx, noteDisconnect, workerID, "worker deactivated"); err != nil {
			s.log.Warn("asking another instance to disconnect the worker failed", "worker", workerID, "error", err)
		}
	}
	s.RefreshDials()
	return nil
}
