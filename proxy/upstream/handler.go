package upstream

import (
	"gradient.dev/gradient/proxy/hub"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/workersession"
)

// tenantHandler is a tenant's upstream sessions' handler: the host is
// the tenant's pool (Supervisor.Hardware), the job side its hub.
type tenantHandler struct {
	s        *Supervisor
	tenantID string
	hub      *hub.Hub // nil: no hubs configured
}

func (h *tenantHandler) Host() wire.WorkerCapabilities { return h.s.Hardware(h.tenantID).Host }

func (h *tenantHandler) Load() *wire.WorkerMetrics {
	m := h.s.Hardware(h.tenantID).Metrics
	return &m
}

func (h *tenantHandler) Open(s *workersession.Session) workersession.SessionHandler {
	if h.hub == nil {
		return noJobs{s}
	}
	return h.hub.Attach(s.Send, s)
}

// noJobs is a session without hubs: it polls for nothing and declines
// every AssignJob.
type noJobs struct{ s *workersession.Session }

func (noJobs) Start()       {}
func (noJobs) Tick()        {}
func (noJobs) Stop()        {}
func (noJobs) Ended(string) {}

func (n noJobs) Handle(m wire.ServerMessage) {
	if a, ok := m.(*wire.AssignJob); ok {
		reason := "worker has no job executor"
		n.s.Send(&wire.AssignJobResponse{JobID: a.JobID, Accepted: false, Reason: &reason})
	}
}
