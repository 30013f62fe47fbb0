package server

import (
	"net/http"

	"gradient.dev/gradient/authority"
)

// workerView is one worker's live state with what the database knows.
type workerView struct {
	authority.WorkerStatus
	Deactivated   bool               `json:"deactivated"`
	Registrations []registrationView `json:"registrations,omitempty"`
	TeamWorker    *teamWorkerView    `json:"team_worker,omitempty"`
}

func (a *adminAPI) showWorker(w http.ResponseWriter, r *http.Request) {
	worker, err := parseWorkerID(r.PathValue("worker"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	access, err := a.s.db.WorkerAccess(r.Context(), worker)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	v := workerView{WorkerStatus: a.s.WorkerStatus(worker), Deactivated: access.Deactivated}
	if !access.Known() && !v.Live && v.OfflineReason == "" {
		a.fail(w, r, notFoundf("worker %s has no registration or team worker", worker))
		return
	}
	for _, reg := range access.Registrations {
		v.Registrations = append(v.Registrations, viewRegistration(reg))
	}
	if tw := access.TeamWorker; tw != nil {
		view := viewTeamWorker(*tw)
		v.TeamWorker = &view
	}
	writeJSON(w, http.StatusOK, v)
}

// activation is the answer of deactivate and activate.
type activation struct {
	WorkerID    string `json:"worker_id"`
	Deactivated bool   `json:"deactivated"`
	// Live: the worker still has a session; deactivation refuses its
	// next connect, and does not end the current session.
	Live bool `json:"live"`
}

func (a *adminAPI) deactivateWorker(w http.ResponseWriter, r *http.Request) {
	a.setDeactivated(w, r, true)
}

func (a *adminAPI) activateWorker(w http.ResponseWriter, r *http.Request) {
	a.setDeactivated(w, r, false)
}

func (a *adminAPI) setDeactivated(w http.ResponseWriter, r *http.Request, deactivate bool) {
	worker, err := parseWorkerID(r.PathValue("worker"))
	if err == nil {
		if deactivate {
			err = a.s.DeactivateWorker(r.Context(), worker)
		} else {
			err = a.s.db.ActivateWorker(r.Context(), worker)
		}
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.s.log.Info("admin: worker activation changed", "worker", worker, "deactivated", deactivate)
	a.s.RefreshDials() // the server does not dial deactivated workers
	writeJSON(w, http.StatusOK, activation{WorkerID: worker, Deactivated: deactivate, Live: a.s.WorkerStatus(worker).Live})
}

// serverView is the server's connection state.
type serverView struct {
	Accepting        bool `json:"accepting"`
	ConnectedWorkers int  `json:"connected_workers"` // sessions up or handshaking
}

func (a *adminAPI) serverState(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, serverView{Accepting: a.s.Accepting(), ConnectedWorkers: a.s.auth.Connected()})
}

func (a *adminAPI) stopAccepting(w http.ResponseWriter, r *http.Request) {
	a.s.SetAccepting(false)
	a.serverState(w, r)
}

func (a *adminAPI) resumeAccepting(w http.ResponseWriter, r *http.Request) {
	a.s.SetAccepting(true)
	a.serverState(w, r)
}
