// Package dashboard is the federation proxy's web dashboard, at / of
// gradient-proxy's listener: tenants with their links' state, the proxy's
// workers per tenant, both legs' sessions, Hetzner VMs and their usage
// with a chart of VMs over time (SVG drawn on the server). Pages are
// rendered by html/template, so everything that came from tenants'
// servers, workers or Hetzner is escaped; no JavaScript at all, nothing
// fetched from elsewhere. They read the admin API's own views
// (admin.API's Tenants, Workers, Sessions, Usage): one API, two clients.
// Login takes the proxy's admin token; sessions live in memory (a
// restart logs everybody out).
package dashboard

import (
	"embed"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"gradient.dev/gradient/internal/authgate"
	"gradient.dev/gradient/internal/webui"
	"gradient.dev/gradient/proxy/admin"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// Config is the dashboard's configuration, filled by gradient-proxy.
type Config struct {
	API *admin.API
	// Gate counts failed logins with the admin API's failed
	// authentications; nil holds back nobody.
	Gate   *authgate.Gate
	Logger *slog.Logger
	// SessionTTL is how long a login lasts (12 h).
	SessionTTL time.Duration
	// MaxSessions bounds the logins held at once (1024); a new login
	// beyond it ends the one closest to expiry.
	MaxSessions int
}

// Dashboard serves the pages.
type Dashboard struct {
	cfg      Config
	api      *admin.API
	log      *slog.Logger
	pages    map[string]*template.Template
	sessions *sessions
}

// New builds the dashboard.
func New(cfg Config) *Dashboard {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = 1024
	}
	return &Dashboard{cfg: cfg, api: cfg.API, log: cfg.Logger, pages: parsePages(),
		sessions: newSessions(cfg.SessionTTL, cfg.MaxSessions)}
}

// pageNames are the templates, each rendered inside layout.html.
var pageNames = []string{"login", "tenants", "workers", "sessions", "vms", "error"}

func parsePages() map[string]*template.Template {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t := template.New("layout.html").Funcs(funcs)
		pages[name] = template.Must(t.ParseFS(templateFiles, "templates/layout.html", "templates/"+name+".html"))
	}
	return pages
}

// Handler serves the dashboard's pages; gradient-proxy mounts it at /.
func (d *Dashboard) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFiles, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /login", d.loginPage)
	mux.HandleFunc("POST /login", d.login)
	mux.HandleFunc("POST /logout", d.logout)
	mux.HandleFunc("GET /{$}", d.member(d.tenants))
	mux.HandleFunc("GET /workers", d.member(d.workers))
	mux.HandleFunc("GET /sessions", d.member(d.sessionsPage))
	mux.HandleFunc("GET /vms", d.member(d.vms))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		d.fail(w, r, viewer{}, http.StatusNotFound, "No such page.")
	})
	return securityHeaders(mux)
}

// securityHeaders: styles and images only from the dashboard itself, no
// scripts at all (an injected <script> would not run even if escaping
// failed), no framing, no sniffing.
func securityHeaders(next http.Handler) http.Handler {
	return webui.SecurityHeaders("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'", next)
}
