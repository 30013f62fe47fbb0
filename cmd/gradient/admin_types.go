package main

import (
	"fmt"
	"strconv"
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
	Host          *hostInfo `json:"host"`
	OfflineReason string    `json:"offline_reason"`
	OfflineSince  time.Time `json:"offline_since"`
	Deactivated   bool      `json:"deactivated"`
}

// hostInfo is what a live worker (or a proxy, for its pool) reported of
// its machine.
type hostInfo struct {
	Architectures       []string `json:"architectures"`
	SystemFeatures      []string `json:"system_features"`
	MaxConcurrentBuilds uint32   `json:"max_concurrent_builds"`
	CPUCount            uint32   `json:"cpu_count"`
	RAMTotalMB          uint64   `json:"ram_total_mb"`
	CPUCoreScore        uint32   `json:"cpu_core_score"`
	Zone                string   `json:"zone"`
	CPUUsagePct         *float32 `json:"cpu_usage_pct"`
	RAMFreeMB           *uint64  `json:"ram_free_mb"`
}

// architectures and slots are the list's columns; "-" before the worker
// reported its host.
func (h *hostInfo) architectures() string {
	if h == nil {
		return "-"
	}
	return listOrDash(h.Architectures)
}

func (h *hostInfo) slots() string {
	if h == nil {
		return "-"
	}
	return strconv.FormatUint(uint64(h.MaxConcurrentBuilds), 10)
}

// pairs are the host's lines in worker show.
func (h *hostInfo) pairs() []string {
	if h == nil {
		return []string{"host", "- (not reported yet)"}
	}
	load := "-"
	if h.RAMFreeMB != nil {
		load = fmt.Sprintf("%d MB RAM free", *h.RAMFreeMB)
		if h.CPUUsagePct != nil {
			load = fmt.Sprintf("%.0f%% CPU, %s", *h.CPUUsagePct, load)
		}
	}
	return []string{
		"architectures", listOrDash(h.Architectures),
		"system features", listOrDash(h.SystemFeatures),
		"build slots", h.slots(),
		"cpus", fmt.Sprintf("%d (core score %d)", h.CPUCount, h.CPUCoreScore),
		"ram", fmt.Sprintf("%d MB", h.RAMTotalMB),
		"zone", orDash(h.Zone),
		"load", load,
	}
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
	Accepting        bool     `json:"accepting"`
	ConnectedWorkers int      `json:"connected_workers"`
	Warnings         []string `json:"warnings"`
}
