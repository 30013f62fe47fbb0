package admin

import (
	"net/http"
)

func (a *API) createRegistration(w http.ResponseWriter, r *http.Request) error {
	var in struct {
		PeerKind string `json:"peer_kind"`
		Peer     string `json:"peer"`
		workerSettingsInput
	}
	if err := decodeBody(w, r, &in); err != nil {
		return err
	}
	peer, err := a.peer(r.Context(), in.PeerKind, in.Peer)
	if err != nil {
		return err
	}
	worker, settings, err := in.resolve()
	if err != nil {
		return err
	}
	// The Server method, not storage's: it also seals the token of a
	// worker the server dials.
	reg, token, err := a.cfg.Dialer.CreateRegistration(r.Context(), peer, worker, settings)
	if err != nil {
		return err
	}
	a.log.Info("admin: worker registered", "peer_kind", peer.Kind, "peer_id", peer.ID, "worker", reg.WorkerID)
	// docs/protocol/connection.md: a worker-dialed session is challenged again when a
	// peer registered the worker.
	reauthorized := a.cfg.Workers.Reauth(reg.WorkerID)
	cred, err := credential(string(peer.Kind), peer.ID, reg.WorkerID, token, reg.WorkerSettings, reauthorized)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, cred)
	return nil
}

func (a *API) listRegistrations(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	peer, err := a.peer(r.Context(), q.Get("peer_kind"), q.Get("peer"))
	if err != nil {
		return err
	}
	regs, err := a.db.ListPeerRegistrations(r.Context(), peer)
	if err != nil {
		return err
	}
	views := make([]RegistrationView, 0, len(regs))
	for _, reg := range regs {
		views = append(views, viewRegistration(reg))
	}
	writeJSON(w, http.StatusOK, views)
	return nil
}

func (a *API) deleteRegistration(w http.ResponseWriter, r *http.Request) error {
	peer, err := a.peer(r.Context(), r.PathValue("kind"), r.PathValue("peer"))
	if err != nil {
		return err
	}
	worker, err := parseWorkerID(r.PathValue("worker"))
	if err == nil {
		err = a.db.DeleteRegistration(r.Context(), peer, worker)
	}
	if err != nil {
		return err
	}
	a.log.Info("admin: worker registration deleted", "peer_kind", peer.Kind, "peer_id", peer.ID, "worker", worker)
	a.cfg.Dialer.RefreshDials()
	w.WriteHeader(http.StatusNoContent)
	return nil
}
