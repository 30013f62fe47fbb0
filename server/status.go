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
func (s *Server) WorkerStatus(workerID string) authority.WorkerStatus {
	return s.auth.WorkerStatus(workerID)
}

// ProjectWorkers lists the workers registered for or granted to a project.
// A worker shows as live only when its session authenticated for this
// project.
func (s *Server) ProjectWorkers(ctx context.Context, projectID string) ([]admin.ProjectWorker, error) {
	rows, err := s.db.ProjectWorkers(ctx, projectID)
	if err != nil {
		return nil, err
	}
	out := make([]admin.ProjectWorker, 0, len(rows))
	for _, r := range rows {
		st := s.WorkerStatus(r.WorkerID)
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
	s.RefreshDials()
	return nil
}
