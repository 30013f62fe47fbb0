package admin

import (
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/server/adminapi"
	"gradient.dev/gradient/storage"
)

// The admin API's JSON shapes live in server/adminapi, shared with the
// CLI; the names here are the API's own.
type (
	TeamView         = adminapi.Team
	ProjectView      = adminapi.Project
	CacheView        = adminapi.Cache
	settingsView     = adminapi.WorkerSettings
	RegistrationView = adminapi.Registration
	TeamWorkerView   = adminapi.TeamWorker
	NewCredential    = adminapi.NewCredential
	WorkerView       = adminapi.Worker
	ProjectWorker    = adminapi.ProjectWorker
	Activation       = adminapi.Activation
	ServerView       = adminapi.Server
	LinkResult       = adminapi.Link
	DeployKeyView    = adminapi.DeployKey
)

func viewTeam(t storage.Team) TeamView {
	return TeamView{ID: t.ID, Name: t.Name, CreatedAt: t.CreatedAt}
}

func viewProject(p storage.Project, teamName string) ProjectView {
	return ProjectView{
		ID: p.ID, TeamID: p.TeamID, Team: teamName, Name: p.Name,
		Repository: p.Repository, Branch: p.Branch, Wildcards: listOf(p.Wildcards), CreatedAt: p.CreatedAt,
	}
}

func viewCache(c storage.Cache) CacheView {
	return CacheView{ID: c.ID, Name: c.Name, Public: c.Public, PublicKey: c.PublicKey(), CreatedAt: c.CreatedAt}
}

func viewSettings(s storage.WorkerSettings) settingsView {
	return settingsView{URL: s.URL, Fetch: s.EnableFetch, Eval: s.EnableEval, Build: s.EnableBuild}
}

func viewRegistration(r storage.Registration) RegistrationView {
	return RegistrationView{
		PeerKind: string(r.Peer.Kind), PeerID: r.Peer.ID, WorkerID: r.WorkerID,
		WorkerSettings: viewSettings(r.WorkerSettings), CreatedAt: r.CreatedAt,
	}
}

func viewTeamWorker(w storage.TeamWorker) TeamWorkerView {
	return TeamWorkerView{WorkerID: w.WorkerID, TeamID: w.TeamID, WorkerSettings: viewSettings(w.WorkerSettings), CreatedAt: w.CreatedAt}
}

const tokenShownOnce = "the token is shown only now; the server keeps only its hash"

func credential(kind, peerID, worker, token string, s storage.WorkerSettings, reauthorized bool) (NewCredential, error) {
	c := NewCredential{
		WorkerID: worker, PeerKind: kind, PeerID: peerID, Token: token,
		PeersLine: peerID + ":" + token, WorkerSettings: viewSettings(s),
		Reauthorized: reauthorized, Note: tokenShownOnce,
	}
	if s.URL != "" {
		var err error
		if c.AcceptedServerTokenLine, err = AcceptedServerTokenLine(peerID, token); err != nil {
			return NewCredential{}, err
		}
	}
	return c, nil
}

// workerSettingsInput is the optional settings part of a create request;
// absent job kinds default to enabled, as the schema does.
type workerSettingsInput struct {
	WorkerID string `json:"worker_id"`
	URL      string `json:"url"`
	Fetch    *bool  `json:"fetch"`
	Eval     *bool  `json:"eval"`
	Build    *bool  `json:"build"`
}

// resolve returns the worker ID (a new one when omitted) and settings.
func (in workerSettingsInput) resolve() (string, storage.WorkerSettings, error) {
	id := storage.NewID()
	if in.WorkerID != "" {
		var err error
		if id, err = parseWorkerID(in.WorkerID); err != nil {
			return "", storage.WorkerSettings{}, err
		}
	}
	s := storage.DefaultWorkerSettings()
	s.URL = in.URL
	for _, f := range []struct {
		in  *bool
		out *bool
	}{{in.Fetch, &s.EnableFetch}, {in.Eval, &s.EnableEval}, {in.Build, &s.EnableBuild}} {
		if f.in != nil {
			*f.out = *f.in
		}
	}
	return id, s, nil
}

// listOf keeps empty lists as [] rather than null in responses.
func listOf[T any](items []T) []T {
	if items == nil {
		return []T{}
	}
	return items
}

// AcceptedServerTokenLine is the line of a worker's accepted-server-tokens
// file that accepts the server presenting token for peerID: peer_id:hash.
func AcceptedServerTokenLine(peerID, token string) (string, error) {
	hash, err := secret.Hash(token)
	if err != nil {
		return "", err
	}
	return peerID + ":" + hash, nil
}
