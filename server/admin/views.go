package admin

import (
	"time"

	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/storage"
)

// The admin API's JSON shapes. Token hashes never leave the server;
// plaintext tokens appear only in the create responses (NewCredential).

// TeamView is a team in admin answers.
type TeamView struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

func viewTeam(t storage.Team) TeamView {
	return TeamView{ID: t.ID, Name: t.Name, CreatedAt: t.CreatedAt}
}

// ProjectView is a project in admin answers.
type ProjectView struct {
	ID         string `json:"id"`
	TeamID     string `json:"team_id"`
	Team       string `json:"team"`
	Name       string `json:"name"`
	Repository string `json:"repository"`
	Branch     string `json:"branch"`
	// Wildcards are the patterns its evaluations build, one per element.
	Wildcards []string  `json:"wildcards"`
	CreatedAt time.Time `json:"created_at"`
	// Caches, GrantedTeams and DeployKey are filled by show only.
	Caches       []string `json:"caches,omitempty"`
	GrantedTeams []string `json:"granted_teams,omitempty"`
	// DeployKey is the public half of the project's SSH deploy key.
	DeployKey string `json:"deploy_key,omitempty"`
}

func viewProject(p storage.Project, teamName string) ProjectView {
	return ProjectView{
		ID: p.ID, TeamID: p.TeamID, Team: teamName, Name: p.Name,
		Repository: p.Repository, Branch: p.Branch, Wildcards: listOf(p.Wildcards), CreatedAt: p.CreatedAt,
	}
}

// CacheView is a cache in admin answers.
type CacheView struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Public    bool      `json:"public"`
	PublicKey string    `json:"public_key"` // NAME:base64, for trusted-public-keys
	CreatedAt time.Time `json:"created_at"`
	// Projects subscribed to the cache, as TEAM/PROJECT; show only.
	Projects []string `json:"projects,omitempty"`
}

func viewCache(c storage.Cache) CacheView {
	return CacheView{ID: c.ID, Name: c.Name, Public: c.Public, PublicKey: c.PublicKey(), CreatedAt: c.CreatedAt}
}

// settingsView is a registration's or team worker's URL and job kinds.
type settingsView struct {
	URL   string `json:"url,omitempty"`
	Fetch bool   `json:"fetch"`
	Eval  bool   `json:"eval"`
	Build bool   `json:"build"`
}

func viewSettings(s storage.WorkerSettings) settingsView {
	return settingsView{URL: s.URL, Fetch: s.EnableFetch, Eval: s.EnableEval, Build: s.EnableBuild}
}

// RegistrationView is a peer's registration of a worker in admin answers;
// never its token or hash.
type RegistrationView struct {
	PeerKind string `json:"peer_kind"`
	PeerID   string `json:"peer_id"`
	WorkerID string `json:"worker_id"`
	settingsView
	CreatedAt time.Time `json:"created_at"`
}

func viewRegistration(r storage.Registration) RegistrationView {
	return RegistrationView{
		PeerKind: string(r.Peer.Kind), PeerID: r.Peer.ID, WorkerID: r.WorkerID,
		settingsView: viewSettings(r.WorkerSettings), CreatedAt: r.CreatedAt,
	}
}

// TeamWorkerView is a team worker in admin answers; never its token or
// hash.
type TeamWorkerView struct {
	WorkerID string `json:"worker_id"`
	TeamID   string `json:"team_id"`
	settingsView
	CreatedAt time.Time `json:"created_at"`
}

func viewTeamWorker(w storage.TeamWorker) TeamWorkerView {
	return TeamWorkerView{WorkerID: w.WorkerID, TeamID: w.TeamID, settingsView: viewSettings(w.WorkerSettings), CreatedAt: w.CreatedAt}
}

// NewCredential is the one response that carries a plaintext worker
// token: the operator copies PeersLine into the worker's peers file.
type NewCredential struct {
	WorkerID string `json:"worker_id"`
	PeerKind string `json:"peer_kind"` // project, cache, proxy or team
	PeerID   string `json:"peer_id"`
	Token    string `json:"token"`
	// PeersLine is "peer_id:token", one line of the worker's peers file.
	PeersLine string `json:"peers_line"`
	// AcceptedServerTokenLine is set for a worker the server dials (a
	// URL): "peer_id:hash", one line of the worker's accepted-server-tokens
	// file, so the worker accepts the server presenting the token.
	AcceptedServerTokenLine string `json:"accepted_server_token_line,omitempty"`
	settingsView
	// Reauthorized: a live session of the worker was challenged again so
	// it can pick up the new peer without reconnecting.
	Reauthorized bool   `json:"reauthorized"`
	Note         string `json:"note"`
}

const tokenShownOnce = "the token is shown only now; the server keeps only its hash"

func credential(kind, peerID, worker, token string, s storage.WorkerSettings, reauthorized bool) (NewCredential, error) {
	c := NewCredential{
		WorkerID: worker, PeerKind: kind, PeerID: peerID, Token: token,
		PeersLine: peerID + ":" + token, settingsView: viewSettings(s),
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
