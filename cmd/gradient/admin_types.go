package main

import (
	"strings"
	"time"
)

// The admin API's JSON answers, as far as the CLI prints them.

type teamInfo struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

type projectInfo struct {
	ID           string    `json:"id"`
	TeamID       string    `json:"team_id"`
	Team         string    `json:"team"`
	Name         string    `json:"name"`
	Repository   string    `json:"repository"`
	Branch       string    `json:"branch"`
	Wildcards    []string  `json:"wildcards"`
	CreatedAt    time.Time `json:"created_at"`
	Caches       []string  `json:"caches"`
	GrantedTeams []string  `json:"granted_teams"`
	DeployKey    string    `json:"deploy_key"`
}

type deployKeyInfo struct {
	Project   string `json:"project"`
	PublicKey string `json:"public_key"`
}

func (p projectInfo) fullName() string { return p.Team + "/" + p.Name }

// wildcards is the project's patterns as --wildcards takes them.
func (p projectInfo) wildcards() string { return orDash(strings.Join(p.Wildcards, ", ")) }

type cacheInfo struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Public    bool      `json:"public"`
	PublicKey string    `json:"public_key"`
	CreatedAt time.Time `json:"created_at"`
	Projects  []string  `json:"projects"`
}

// jobKinds are a registration's or team worker's URL and job kinds.
type jobKinds struct {
	URL   string `json:"url"`
	Fetch bool   `json:"fetch"`
	Eval  bool   `json:"eval"`
	Build bool   `json:"build"`
}

type credentialInfo struct {
	WorkerID  string `json:"worker_id"`
	PeerKind  string `json:"peer_kind"`
	PeerID    string `json:"peer_id"`
	Token     string `json:"token"`
	PeersLine string `json:"peers_line"`
	// AcceptedServerTokenLine is set when the server dials the worker.
	AcceptedServerTokenLine string `json:"accepted_server_token_line"`
	Reauthorized            bool   `json:"reauthorized"`
	jobKinds
}

type registrationInfo struct {
	PeerKind  string    `json:"peer_kind"`
	PeerID    string    `json:"peer_id"`
	WorkerID  string    `json:"worker_id"`
	CreatedAt time.Time `json:"created_at"`
	jobKinds
}

type teamWorkerInfo struct {
	WorkerID  string    `json:"worker_id"`
	TeamID    string    `json:"team_id"`
	CreatedAt time.Time `json:"created_at"`
	jobKinds
}

type workerStatusInfo struct {
	WorkerID      string    `json:"worker_id"`
	Live          bool      `json:"live"`
	ConnectedAt   time.Time `json:"connected_at"`
	Projects      []string  `json:"projects"`
	Capabilities  []string  `json:"capabilities"`
	Draining      bool      `json:"draining"`
	OfflineReason string    `json:"offline_reason"`
	OfflineSince  time.Time `json:"offline_since"`
	Deactivated   bool      `json:"deactivated"`
}

type projectWorkerInfo struct {
	workerStatusInfo
	TeamID string `json:"team_id"`
}

type workerInfo struct {
	workerStatusInfo
	Registrations []registrationInfo `json:"registrations"`
	TeamWorker    *teamWorkerInfo    `json:"team_worker"`
}

type linkInfo struct {
	Added                bool `json:"added"`
	ReauthorizedSessions int  `json:"reauthorized_sessions"`
}

type activationInfo struct {
	WorkerID    string `json:"worker_id"`
	Deactivated bool   `json:"deactivated"`
	Live        bool   `json:"live"`
}

type serverInfo struct {
	Accepting        bool `json:"accepting"`
	ConnectedWorkers int  `json:"connected_workers"`
}
