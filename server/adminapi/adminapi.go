// Package adminapi is the JSON of the server's admin API under /api/v1,
// declared once: server/admin answers with these types and the gradient
// CLI decodes them. Token hashes never appear; plaintext tokens only in
// NewCredential, the answer that creates them. It knows no handler or
// database; a worker's live state is the authority's WorkerStatus.
package adminapi

import (
	"time"

	"gradient.dev/gradient/authority"
)

// Team is a team.
type Team struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// Project is a project.
type Project struct {
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

// FullName is TEAM/PROJECT.
func (p Project) FullName() string { return p.Team + "/" + p.Name }

// DeployKey answers the generation of a deploy key: the line to add to
// the repository host as a (read-only) deploy key.
type DeployKey struct {
	Project   string `json:"project"`
	PublicKey string `json:"public_key"`
}

// Cache is a cache.
type Cache struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Public    bool      `json:"public"`
	PublicKey string    `json:"public_key"` // NAME:base64, for trusted-public-keys
	CreatedAt time.Time `json:"created_at"`
	// Projects subscribed to the cache, as TEAM/PROJECT; show only.
	Projects []string `json:"projects,omitempty"`
}

// WorkerSettings are a registration's or team worker's URL and job kinds.
type WorkerSettings struct {
	URL   string `json:"url,omitempty"`
	Fetch bool   `json:"fetch"`
	Eval  bool   `json:"eval"`
	Build bool   `json:"build"`
}

// Registration is a peer's registration of a worker; never its token or
// hash.
type Registration struct {
	PeerKind string `json:"peer_kind"`
	PeerID   string `json:"peer_id"`
	WorkerID string `json:"worker_id"`
	WorkerSettings
	CreatedAt time.Time `json:"created_at"`
}

// TeamWorker is a team worker; never its token or hash.
type TeamWorker struct {
	WorkerID string `json:"worker_id"`
	TeamID   string `json:"team_id"`
	WorkerSettings
	CreatedAt time.Time `json:"created_at"`
}

// NewCredential is the one answer that carries a plaintext worker token:
// the operator copies PeersLine into the worker's peers file.
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
	WorkerSettings
	// Reauthorized: a live session of the worker was challenged again so
	// it can pick up the new peer without reconnecting.
	Reauthorized bool   `json:"reauthorized"`
	Note         string `json:"note"`
}

// Worker is one worker's live state with what the database knows.
type Worker struct {
	authority.WorkerStatus
	Deactivated   bool           `json:"deactivated"`
	Registrations []Registration `json:"registrations,omitempty"`
	TeamWorker    *TeamWorker    `json:"team_worker,omitempty"`
}

// ProjectWorker is one worker of a project's worker list.
type ProjectWorker struct {
	authority.WorkerStatus
	TeamID      string `json:"team_id,omitempty"` // set for team workers granted to the project
	Deactivated bool   `json:"deactivated,omitempty"`
}

// Activation is the answer of deactivate and activate.
type Activation struct {
	WorkerID    string `json:"worker_id"`
	Deactivated bool   `json:"deactivated"`
	// Live: the worker still has a session; deactivation refuses its
	// next connect, and does not end the current session.
	Live bool `json:"live"`
}

// Server is the server's connection state.
type Server struct {
	Accepting        bool `json:"accepting"`
	ConnectedWorkers int  `json:"connected_workers"` // sessions up or handshaking
	// Warnings are configuration problems the operator should fix (a NAR
	// store whose presigned URLs name a loopback address, …).
	Warnings []string `json:"warnings,omitempty"`
	// InstanceID is the server instance that answered; Instances are the
	// live instances sharing its database (README "Several instances").
	// Empty for a server that runs without an instance row.
	InstanceID string           `json:"instance_id,omitempty"`
	Instances  []ServerInstance `json:"instances,omitempty"`
}

// ServerInstance is one live server instance.
type ServerInstance struct {
	ID         string    `json:"id"`
	Host       string    `json:"host"`
	Addr       string    `json:"addr"`
	Version    string    `json:"version"`
	StartedAt  time.Time `json:"started_at"`
	RenewedAt  time.Time `json:"renewed_at"`
	LeaseUntil time.Time `json:"lease_until"`
	// Workers is how many worker sessions the instance holds; absent
	// where instances share no sessions (one instance on SQLite).
	Workers *int `json:"workers,omitempty"`
}

// Link answers subscribe and grant: whether the link is new, and how many
// live sessions were challenged again because of it.
type Link struct {
	Added                bool `json:"added"`
	ReauthorizedSessions int  `json:"reauthorized_sessions"`
}

// GCPath is a cache path a garbage collection deleted (or, dry, would
// delete).
type GCPath struct {
	CacheID   string `json:"cache_id"`
	StorePath string `json:"store_path"`
	FileSize  int64  `json:"file_size"`
	Reason    string `json:"reason"` // unreachable, cap
}

// GCReport is what a garbage collection freed, or would free
// (POST /api/v1/gc).
type GCReport struct {
	DryRun       bool             `json:"dry_run"`
	Paths        []GCPath         `json:"paths"`
	PathsFreed   int64            `json:"paths_freed"`
	Objects      []string         `json:"objects"`
	ObjectsFreed int64            `json:"objects_freed"`
	BytesFreed   int64            `json:"bytes_freed"` // of NAR objects
	Truncated    bool             `json:"truncated"`   // lists cut at 1,000 entries each; the counts are complete
	LogsPruned   int64            `json:"evaluations_logs_pruned"`
	LogBytes     int64            `json:"log_bytes_freed"`
	Protected    map[string]int64 `json:"protected"` // paths per root kind
	Duration     time.Duration    `json:"duration_ns"`
}
