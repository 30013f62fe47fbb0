// Package admin is the operator's JSON API under /api/v1: teams,
// projects, caches and their content, subscriptions and grants, worker
// registrations, evaluations and builds, workers' live state and the
// server's acceptance of connections. It reads and writes storage itself
// and reaches everything else through the small interfaces its Config
// takes: the workers' sessions and the dialer (Workers, Dialer), the
// binary cache (CacheContent), deploy keys, the job loop's evaluations and
// branch heads.
package admin

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/authgate"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
)

// The operator's JSON API, under /api/v1. Every request carries
// "Authorization: Bearer <admin token>". Teams and caches are named by
// name or UUID; a project is one path segment: its UUID, or TEAM/PROJECT
// with the slash escaped as %2F (in JSON bodies and query strings a plain
// TEAM/PROJECT). A worker is its UUID.
//
//	POST   /api/v1/teams                                {name}
//	GET    /api/v1/teams
//	GET    /api/v1/teams/{team}
//	DELETE /api/v1/teams/{team}
//	POST   /api/v1/teams/{team}/workers                 {worker_id?, url?, fetch?, eval?, build?} → token, once
//	GET    /api/v1/teams/{team}/workers
//	DELETE /api/v1/teams/{team}/workers/{worker}
//
//	POST   /api/v1/projects                             {team, name, repository, branch?, wildcards?}
//	GET    /api/v1/projects                             ?team=TEAM to filter
//	GET    /api/v1/projects/{project}                   with its caches and granted teams
//	PATCH  /api/v1/projects/{project}                   {wildcards}: what later evaluations build
//	DELETE /api/v1/projects/{project}
//	PUT    /api/v1/projects/{project}/caches/{cache}    subscribe (reauths the project's workers)
//	DELETE /api/v1/projects/{project}/caches/{cache}    unsubscribe
//	PUT    /api/v1/projects/{project}/teams/{team}      grant the team's workers (reauths them)
//	DELETE /api/v1/projects/{project}/teams/{team}      revoke
//	GET    /api/v1/projects/{project}/workers           live state of the project's workers
//	POST   /api/v1/projects/{project}/deploy-key        generate an SSH deploy key (replaces one) → public key
//	DELETE /api/v1/projects/{project}/deploy-key
//	PUT|GET|DELETE /api/v1/projects/{project}/forge     the project's forge link (forges.go), test, webhook-secret
//
//	POST   /api/v1/caches                               {name, public?}
//	GET    /api/v1/caches
//	GET    /api/v1/caches/{cache}                       with public_key for trusted-public-keys
//	DELETE /api/v1/caches/{cache}
//	PUT    /api/v1/caches/{cache}/paths                 NAR body + X-Nix-* headers (cachepaths.go)
//	GET    /api/v1/caches/{cache}/paths
//	GET    /api/v1/caches/{cache}/paths/{path}          with its signed narinfo
//	DELETE /api/v1/caches/{cache}/paths/{path}
//	POST   /api/v1/caches/{cache}/keys                  private-cache API key → key, once
//
//	POST   /api/v1/registrations                        {peer_kind, peer, worker_id?, url?, fetch?, eval?, build?} → token, once
//	GET    /api/v1/registrations?peer_kind=K&peer=P
//	DELETE /api/v1/registrations/{peer_kind}/{peer}/{worker}
//
//	GET    /api/v1/workers/{worker}                     live state, registrations, deactivation
//	POST   /api/v1/workers/{worker}/deactivate
//	POST   /api/v1/workers/{worker}/activate
//
//	GET    /api/v1/server                               accepting, connected workers
//	POST   /api/v1/server/stop-accepting
//	POST   /api/v1/server/resume-accepting
//
// API tokens, public projects and restart-failed: access.go; evaluations
// and builds: evaluations.go; cache content: cachepaths.go.
//
// Errors are {"error": "sentence"}: 400 invalid input, 401 wrong or
// missing token, 403 a read-only API token's change, 404 unknown record, 409 conflict, 429 too many wrong
// tokens from the address (Retry-After), 503 API disabled.

// Workers is what the admin API asks of the server about workers: their
// live sessions (authority), and the operations that change them.
type Workers interface {
	WorkerStatus(workerID string) authority.WorkerStatus
	// ProjectWorkers lists the workers registered for or granted to a
	// project, live only where their session authenticated for it.
	ProjectWorkers(ctx context.Context, projectID string) ([]ProjectWorker, error)
	ConnectedWorkers() int
	Accepting() bool
	SetAccepting(on bool)
	// ConfigWarnings are configuration problems `gradient server status`
	// shows.
	ConfigWarnings() []string
	// Reauth, ReauthProject and ReauthTeam reauthorize live sessions
	// after a change widened their access; they report how many.
	Reauth(workerID string) bool
	ReauthProject(ctx context.Context, projectID string) (int, error)
	ReauthTeam(ctx context.Context, teamID string) (int, error)
	// DeactivateWorker marks a worker deactivated and ends its session.
	DeactivateWorker(ctx context.Context, workerID string) error
}

// Instances lists the server instances sharing the database
// (server/instance.Instance).
type Instances interface {
	ID() string
	Live(ctx context.Context) ([]storage.ServerInstance, error)
	// SessionCounts is the worker sessions each instance holds; nil
	// when the instances do not share sessions (one instance).
	SessionCounts(ctx context.Context) (map[string]int, error)
}

// Dialer creates the registrations whose dial tokens the server seals,
// and rescans its dial targets after a change.
type Dialer interface {
	CreateRegistration(ctx context.Context, peer storage.Peer, workerID string, settings storage.WorkerSettings) (storage.Registration, string, error)
	CreateTeamWorker(ctx context.Context, teamID, workerID string, settings storage.WorkerSettings) (storage.TeamWorker, string, error)
	RefreshDials()
}

// DeployKeys generates projects' SSH deploy keys (deploykeys.Keys).
type DeployKeys interface {
	Generate(ctx context.Context, p storage.Project, comment string) (string, error)
}

// CacheContent is the binary cache's content as the operator manages it
// (cache.Cache).
type CacheContent interface {
	HasNarStore() bool
	// PushPath stores an upload; a NAR that does not match its metadata
	// is an error of kind storage.ErrInvalid.
	PushPath(ctx context.Context, c storage.Cache, in storage.CachePath, narHash [32]byte, body io.Reader) (storage.CachePath, bool, error)
	SignedNarinfo(ctx context.Context, p storage.CachePath) ([]byte, error)
	DeletePath(ctx context.Context, c storage.Cache, hash string) error
	// Forget drops what the cache keeps of a deleted cache.
	Forget(c storage.Cache)
	// SubscriptionsChanged drops what the cache keeps of a project's
	// subscriptions, after they changed or the project was deleted.
	SubscriptionsChanged(projectID string)
}

// Evaluations starts and cancels evaluations: the job loop, when it can.
type Evaluations interface {
	StartEvaluation(ctx context.Context, in storage.NewEvaluation) (storage.Evaluation, error)
	CancelEvaluation(ctx context.Context, evalID string) error
}

// BranchHeads resolves the head of a project's branch (git ls-remote with
// the project's deploy key).
type BranchHeads interface {
	// BranchHead is the commit at the head of p's branch; missing: the
	// repository answered, without the branch.
	BranchHead(ctx context.Context, p storage.Project) (commit string, missing bool, err error)
}

// Config is the admin API's configuration, filled by the server.
type Config struct {
	DB *storage.DB
	// AdminTokenHash is the hash (secret.Hash, or hex SHA-256) of the
	// token the API requires. Empty disables the API (503).
	AdminTokenHash string
	// Gate holds back addresses with too many wrong admin tokens; nil
	// holds back nobody.
	Gate *authgate.Gate
	// ObserveTokenCheck hears each argon2 check of an admin token.
	ObserveTokenCheck func(elapsed time.Duration, matched bool)
	// AllowLocalRepositories lets projects name file:// URLs and local
	// paths.
	AllowLocalRepositories bool
	Logger                 *slog.Logger

	Workers    Workers
	Dialer     Dialer
	DeployKeys DeployKeys
	Cache      CacheContent
	// Collector runs garbage collections; nil answers 503.
	Collector Collector
	// Instances are the server instances sharing the database; nil: the
	// status shows none.
	Instances Instances
	// Evaluations is nil when the job loop cannot start evaluations (a
	// cache-only server): those endpoints answer 503.
	Evaluations Evaluations
	// Progress is nil when the job loop reports no build progress.
	Progress BuildProgress
	Branches BranchHeads
	// Forges is nil when the server keeps no forge links: those
	// endpoints answer 503.
	Forges Forges
	// ExternalURL is the server's address as forges and users reach it
	// (webhook URLs); "" gives paths.
	ExternalURL string
	// StatusesChanged nudges the commit-status poster; nil is fine.
	StatusesChanged func()
}

// API serves the admin endpoints of one server.
type API struct {
	cfg   Config
	db    *storage.DB
	queue *jobqueue.Queue
	log   *slog.Logger
	// tokens checks the admin token: each argon2id check takes ~19 MiB,
	// so at most a few run at once, and the token that matched is
	// remembered, so the operator's requests skip the queue that wrong
	// tokens wait in (those are also limited per address, Config.Gate).
	tokens *secret.Verifier

	internalOnce sync.Once
	internal     *http.ServeMux // Internal's routes
}

// adminVerifyConcurrency is how many admin token checks run at once.
const adminVerifyConcurrency = 4

// New builds the admin API.
func New(cfg Config) *API {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &API{cfg: cfg, db: cfg.DB, queue: jobqueue.New(cfg.DB), log: cfg.Logger, tokens: secret.NewVerifier(adminVerifyConcurrency)}
	a.tokens.Observe = cfg.ObserveTokenCheck
	return a
}

// Mount mounts the operator's JSON API under /api/v1 on mux.
func (a *API) Mount(mux *http.ServeMux) {
	api := http.NewServeMux()
	a.routes(api)
	// Unknown paths under /api/v1/ answer JSON 404 too, after the token
	// check, so the API's shape is not probeable without the token.
	api.HandleFunc("/api/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such admin endpoint: "+r.Method+" "+r.URL.Path)
	})
	mux.Handle("/api/v1/", a.requireScoped(a.requireAdmin(api), api))
}

func (a *API) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/teams", a.handle(a.createTeam))
	mux.HandleFunc("GET /api/v1/teams", a.handle(a.listTeams))
	mux.HandleFunc("GET /api/v1/teams/{team}", a.handle(a.showTeam))
	mux.HandleFunc("DELETE /api/v1/teams/{team}", a.handle(a.deleteTeam))
	mux.HandleFunc("POST /api/v1/teams/{team}/workers", a.handle(a.createTeamWorker))
	mux.HandleFunc("GET /api/v1/teams/{team}/workers", a.handle(a.listTeamWorkers))
	mux.HandleFunc("DELETE /api/v1/teams/{team}/workers/{worker}", a.handle(a.deleteTeamWorker))

	mux.HandleFunc("POST /api/v1/projects", a.handle(a.createProject))
	mux.HandleFunc("GET /api/v1/projects", a.handle(a.listProjects))
	mux.HandleFunc("GET /api/v1/projects/{project}", a.handle(a.showProject))
	mux.HandleFunc("PATCH /api/v1/projects/{project}", a.handle(a.updateProject))
	mux.HandleFunc("DELETE /api/v1/projects/{project}", a.handle(a.deleteProject))
	mux.HandleFunc("PUT /api/v1/projects/{project}/caches/{cache}", a.handle(a.subscribe))
	mux.HandleFunc("DELETE /api/v1/projects/{project}/caches/{cache}", a.handle(a.unsubscribe))
	mux.HandleFunc("PUT /api/v1/projects/{project}/teams/{team}", a.handle(a.grant))
	mux.HandleFunc("DELETE /api/v1/projects/{project}/teams/{team}", a.handle(a.revoke))
	mux.HandleFunc("GET /api/v1/projects/{project}/workers", a.handle(a.projectWorkers))
	mux.HandleFunc("POST /api/v1/projects/{project}/deploy-key", a.handle(a.generateDeployKey))
	mux.HandleFunc("DELETE /api/v1/projects/{project}/deploy-key", a.handle(a.deleteDeployKey))
	a.evaluationRoutes(mux) // evaluations and builds: evaluations.go
	a.forgeRoutes(mux)      // forge links and approvals: forges.go
	a.accessRoutes(mux)     // API tokens, public projects, restart-failed: access.go
	a.retentionRoutes(mux)  // garbage collection, pins, keep and caps: retention.go

	mux.HandleFunc("POST /api/v1/caches", a.handle(a.createCache))
	mux.HandleFunc("GET /api/v1/caches", a.handle(a.listCaches))
	mux.HandleFunc("GET /api/v1/caches/{cache}", a.handle(a.showCache))
	mux.HandleFunc("DELETE /api/v1/caches/{cache}", a.handle(a.deleteCache))
	a.cacheContentRoutes(mux) // paths and keys: cachepaths.go

	mux.HandleFunc("POST /api/v1/registrations", a.handle(a.createRegistration))
	mux.HandleFunc("GET /api/v1/registrations", a.handle(a.listRegistrations))
	mux.HandleFunc("DELETE /api/v1/registrations/{kind}/{peer}/{worker}", a.handle(a.deleteRegistration))

	mux.HandleFunc("GET /api/v1/workers/{worker}", a.handle(a.showWorker))
	mux.HandleFunc("POST /api/v1/workers/{worker}/deactivate", a.handle(a.deactivateWorker))
	mux.HandleFunc("POST /api/v1/workers/{worker}/activate", a.handle(a.activateWorker))

	mux.HandleFunc("GET /api/v1/server", a.handle(a.serverState))
	mux.HandleFunc("POST /api/v1/server/stop-accepting", a.handle(a.stopAccepting))
	mux.HandleFunc("POST /api/v1/server/resume-accepting", a.handle(a.resumeAccepting))
}

// requireAdmin lets a request through only with the admin bearer token.
func (a *API) requireAdmin(next http.Handler) http.Handler {
	b := &authgate.Bearer{Hash: a.cfg.AdminTokenHash, Realm: "gradient-admin", Tokens: a.tokens, Gate: a.cfg.Gate}
	return b.Require(next, writeError)
}
