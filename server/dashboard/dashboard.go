// Package dashboard is the server's web dashboard: server-rendered pages
// (html/template, so everything that came from builds, workers or forges
// is escaped) with a little JavaScript of its own for live build logs
// (Server-Sent Events), all embedded in the binary: no framework, no
// build step, nothing fetched from elsewhere. Pages read through storage
// and the admin API's views; actions go through the admin API's own
// handlers (admin.API.Internal) after the dashboard checked the session,
// its scope and the CSRF token: one API, two clients.
package dashboard

import (
	"embed"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/internal/authgate"
	"gradient.dev/gradient/internal/webui"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// Workers is what the dashboard asks of the server about workers.
type Workers interface {
	WorkerStatus(workerID string) authority.WorkerStatus
}

// Config is the dashboard's configuration, filled by the server.
type Config struct {
	DB  *storage.DB
	API *admin.API
	// Gate counts failed logins with the admin API's and the cache's
	// failed authentications; nil holds back nobody.
	Gate    *authgate.Gate
	Workers Workers
	Logger  *slog.Logger
	// SessionTTL is how long a login lasts (12 h).
	SessionTTL time.Duration
	// LogPoll is how often a watched build's log is read (250 ms).
	LogPoll time.Duration
}

// Dashboard serves the pages.
type Dashboard struct {
	cfg   Config
	db    *storage.DB
	queue *jobqueue.Queue
	log   *slog.Logger
	pages map[string]*template.Template
	logs  *logHub
}

// New builds the dashboard.
func New(cfg Config) *Dashboard {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.LogPoll <= 0 {
		cfg.LogPoll = 250 * time.Millisecond
	}
	d := &Dashboard{cfg: cfg, db: cfg.DB, queue: jobqueue.New(cfg.DB), log: cfg.Logger, pages: parsePages()}
	d.logs = newLogHub(d.queue, cfg.Logger, cfg.LogPoll)
	return d
}

// pageNames are the templates, each rendered inside layout.html.
var pageNames = []string{"login", "overview", "projects", "project", "evaluation", "build", "workers", "caches", "cache", "error"}

func parsePages() map[string]*template.Template {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t := template.New("layout.html").Funcs(funcs)
		pages[name] = template.Must(t.ParseFS(templateFiles, "templates/layout.html", "templates/"+name+".html"))
	}
	return pages
}

// Handler serves the dashboard's pages; the server mounts it at /.
func (d *Dashboard) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFiles, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /login", d.loginPage)
	mux.HandleFunc("POST /login", d.login)
	mux.HandleFunc("POST /logout", d.logout)

	mux.HandleFunc("GET /{$}", d.member(d.overview))
	mux.HandleFunc("GET /projects", d.member(d.projects))
	mux.HandleFunc("GET /workers", d.member(d.workers))
	mux.HandleFunc("GET /caches", d.member(d.caches))
	mux.HandleFunc("GET /caches/{cache}", d.member(d.cache))

	// Readable logged out when the project is public (checked inside).
	mux.HandleFunc("GET /projects/{project}", d.project)
	mux.HandleFunc("GET /evaluations/{id}", d.evaluation)
	mux.HandleFunc("GET /builds/{id}", d.build)
	mux.HandleFunc("GET /builds/{id}/log", d.buildLog)
	mux.HandleFunc("GET /builds/{id}/log/stream", d.buildLogStream)

	mux.HandleFunc("POST /projects/{project}/evaluations", d.action(d.startEvaluation))
	mux.HandleFunc("POST /evaluations/{id}/cancel", d.action(d.evaluationAction("cancel", "The evaluation was not cancelled")))
	mux.HandleFunc("POST /evaluations/{id}/restart-failed", d.action(d.evaluationAction("restart-failed", "The failed builds were not restarted")))
	mux.HandleFunc("POST /evaluations/{id}/approve", d.action(d.evaluationAction("approve", "The evaluation was not approved")))

	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		d.fail(w, r, viewer{}, http.StatusNotFound, "No such page.")
	})
	return securityHeaders(mux)
}

// securityHeaders: scripts and styles only from the dashboard itself (an
// injected <script> would not run even if escaping failed), no framing,
// no sniffing.
func securityHeaders(next http.Handler) http.Handler {
	return webui.SecurityHeaders("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'", next)
}
