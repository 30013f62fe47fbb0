package admin

import (
	"net/http"

	"gradient.dev/gradient/server/adminapi"
)

func (a *API) showWorker(w http.ResponseWriter, r *http.Request) error {
	worker, err := parseWorkerID(r.PathValue("worker"))
	if err != nil {
		return err
	}
	access, err := a.db.WorkerAccess(r.Context(), worker)
	if err != nil {
		return err
	}
	v := WorkerView{WorkerStatus: a.cfg.Workers.WorkerStatus(worker), Deactivated: access.Deactivated}
	if !access.Known() && !v.Live && v.OfflineReason == "" {
		return notFoundf("worker %s has no registration or team worker", worker)
	}
	for _, reg := range access.Registrations {
		v.Registrations = append(v.Registrations, viewRegistration(reg))
	}
	if tw := access.TeamWorker; tw != nil {
		view := viewTeamWorker(*tw)
		v.TeamWorker = &view
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (a *API) deactivateWorker(w http.ResponseWriter, r *http.Request) error {
	a.setDeactivated(w, r, true)
	return nil
}

func (a *API) activateWorker(w http.ResponseWriter, r *http.Request) error {
	a.setDeactivated(w, r, false)
	return nil
}

func (a *API) setDeactivated(w http.ResponseWriter, r *http.Request, deactivate bool) {
	worker, err := parseWorkerID(r.PathValue("worker"))
	if err == nil {
		if deactivate {
			err = a.cfg.Workers.DeactivateWorker(r.Context(), worker)
		} else {
			err = a.db.ActivateWorker(r.Context(), worker)
		}
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("admin: worker Activation changed", "worker", worker, "deactivated", deactivate)
	a.cfg.Dialer.RefreshDials() // the server does not dial deactivated workers
	writeJSON(w, http.StatusOK, Activation{WorkerID: worker, Deactivated: deactivate, Live: a.cfg.Workers.WorkerStatus(worker).Live})
}

func (a *API) serverState(w http.ResponseWriter, r *http.Request) error {
	view := ServerView{Accepting: a.cfg.Workers.Accepting(), ConnectedWorkers: a.cfg.Workers.ConnectedWorkers(),
		Warnings: a.cfg.Workers.ConfigWarnings()}
	if a.cfg.Instances != nil {
		live, err := a.cfg.Instances.Live(r.Context())
		if err != nil {
			return err
		}
		counts, err := a.cfg.Instances.SessionCounts(r.Context())
		if err != nil {
			return err
		}
		view.InstanceID = a.cfg.Instances.ID()
		for _, in := range live {
			v := adminapi.ServerInstance{ID: in.ID, Host: in.Host, Addr: in.Addr,
				Version: in.Version, StartedAt: in.StartedAt, RenewedAt: in.RenewedAt, LeaseUntil: in.LeaseUntil}
			if counts != nil {
				v.Workers = new(counts[in.ID])
			}
			view.Instances = append(view.Instances, v)
		}
	}
	writeJSON(w, http.StatusOK, view)
	return nil
}

func (a *API) stopAccepting(w http.ResponseWriter, r *http.Request) error {
	a.cfg.Workers.SetAccepting(false)
	return a.serverState(w, r)
}

func (a *API) resumeAccepting(w http.ResponseWriter, r *http.Request) error {
	a.cfg.Workers.SetAccepting(true)
	return a.serverState(w, r)
}
