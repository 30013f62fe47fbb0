package admin

import (
	"errors"
	"fmt"
	"net/http"

	"gradient.dev/gradient/storage"
)

func (a *API) createTeam(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		Name string `json:"name"`
	}
	if err := decodeBody(w, r, &in); err != nil {
		return err
	}
	t, err := a.db.CreateTeam(r.Context(), in.Name)
	if err != nil {
		return err
	}
	a.log.Info("admin: team created", "team", t.Name, "team_id", t.ID)
	writeJSON(w, http.StatusCreated, viewTeam(t))
	return nil
}

func (a *API) listTeams(w http.ResponseWriter, r *http.Request) error {
	teams, err := a.db.ListTeams(r.Context())
	if err != nil {
		return err
	}
	views := make([]TeamView, 0, len(teams))
	for _, t := range teams {
		views = append(views, viewTeam(t))
	}
	writeJSON(w, http.StatusOK, views)
	return nil
}

func (a *API) showTeam(w http.ResponseWriter, r *http.Request) error {
	t, err := a.team(r.Context(), r.PathValue("team"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewTeam(t))
	return nil
}

func (a *API) deleteTeam(w http.ResponseWriter, r *http.Request) error {
	t, err := a.team(r.Context(), r.PathValue("team"))
	if err == nil {
		err = a.db.DeleteTeam(r.Context(), t.ID)
	}
	if errors.Is(err, storage.ErrConflict) {
		// Storage names the team by UUID; the operator named it.
		err = &adminError{kind: storage.ErrConflict, msg: fmt.Sprintf("team %q still has projects; delete them first", t.Name)}
	}
	if err != nil {
		return err
	}
	a.log.Info("admin: team deleted", "team", t.Name, "team_id", t.ID)
	a.cfg.Dialer.RefreshDials() // its team workers went with it
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) createTeamWorker(w http.ResponseWriter, r *http.Request) error {
	var in workerSettingsInput
	if err := decodeBody(w, r, &in); err != nil {
		return err
	}
	t, err := a.team(r.Context(), r.PathValue("team"))
	if err != nil {
		return err
	}
	worker, settings, err := in.resolve()
	if err != nil {
		return err
	}
	tw, token, err := a.cfg.Dialer.CreateTeamWorker(r.Context(), t.ID, worker, settings)
	if err != nil {
		return err
	}
	a.log.Info("admin: team worker created", "team", t.Name, "worker", tw.WorkerID)
	reauthorized := a.cfg.Workers.Reauth(tw.WorkerID)
	cred, err := credential("team", t.ID, tw.WorkerID, token, tw.WorkerSettings, reauthorized)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, cred)
	return nil
}

func (a *API) listTeamWorkers(w http.ResponseWriter, r *http.Request) error {
	t, err := a.team(r.Context(), r.PathValue("team"))
	if err != nil {
		return err
	}
	workers, err := a.db.ListTeamWorkers(r.Context(), t.ID)
	if err != nil {
		return err
	}
	views := make([]TeamWorkerView, 0, len(workers))
	for _, tw := range workers {
		views = append(views, viewTeamWorker(tw))
	}
	writeJSON(w, http.StatusOK, views)
	return nil
}

func (a *API) deleteTeamWorker(w http.ResponseWriter, r *http.Request) error {
	t, err := a.team(r.Context(), r.PathValue("team"))
	if err != nil {
		return err
	}
	worker, err := parseWorkerID(r.PathValue("worker"))
	if err != nil {
		return err
	}
	// The team in the path must own the worker: a typo in the team must
	// not delete another team's worker.
	tw, err := a.db.TeamWorker(r.Context(), worker)
	if err == nil && tw.TeamID != t.ID {
		err = notFoundf("worker %s is not a worker of team %q", worker, t.Name)
	}
	if err == nil {
		err = a.db.DeleteTeamWorker(r.Context(), worker)
	}
	if err != nil {
		return err
	}
	a.log.Info("admin: team worker deleted", "team", t.Name, "worker", worker)
	a.cfg.Dialer.RefreshDials()
	w.WriteHeader(http.StatusNoContent)
	return nil
}
