package dashboard

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"gradient.dev/gradient/internal/webui"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// sessionCookie holds the session ID: a random 256-bit secret whose
// SHA-256 alone the proxy keeps.
const sessionCookie = "gradient_proxy_session"

// sessions are the logins, in memory: the SHA-256 of each session ID and
// when it expires, at most max of them.
type sessions struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu     sync.Mutex
	expiry map[[sha256.Size]byte]time.Time
}

func newSessions(ttl time.Duration, max int) *sessions {
	return &sessions{ttl: ttl, max: max, now: time.Now, expiry: map[[sha256.Size]byte]time.Time{}}
}

// create starts a session and returns its ID and expiry.
func (s *sessions) create() (string, time.Time) {
	id := rand.Text() + rand.Text() // 2×130 bits
	now := s.now()
	exp := now.Add(s.ttl)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.expiry) >= s.max {
		// Expired ones first; else the one closest to expiry goes.
		var soonest [sha256.Size]byte
		var soonestAt time.Time
		for k, at := range s.expiry {
			if !at.After(now) {
				delete(s.expiry, k)
			} else if soonestAt.IsZero() || at.Before(soonestAt) {
				soonest, soonestAt = k, at
			}
		}
		if len(s.expiry) >= s.max {
			delete(s.expiry, soonest)
		}
	}
	s.expiry[sha256.Sum256([]byte(id))] = exp
	return id, exp
}

// valid reports whether id is a live session.
func (s *sessions) valid(id string) bool {
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.expiry[k]
	if ok && !at.After(s.now()) {
		delete(s.expiry, k)
		return false
	}
	return ok
}

func (s *sessions) end(id string) {
	s.mu.Lock()
	delete(s.expiry, sha256.Sum256([]byte(id)))
	s.mu.Unlock()
}

// viewer is who asks for a page.
type viewer struct {
	LoggedIn bool
	// CSRF is the token the logout form carries, bound to the session.
	CSRF      string
	sessionID string
}

// csrfToken derives the session's CSRF token: knowing it does not reveal
// the session ID, and it needs no storage.
func csrfToken(sessionID string) string {
	sum := sha256.Sum256([]byte("gradient-proxy-dashboard-csrf\x00" + sessionID))
	return hex.EncodeToString(sum[:])
}

func (d *Dashboard) viewerOf(r *http.Request) viewer {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" || !d.sessions.valid(c.Value) {
		return viewer{}
	}
	return viewer{LoggedIn: true, CSRF: csrfToken(c.Value), sessionID: c.Value}
}

type pageFunc func(w http.ResponseWriter, r *http.Request, v viewer)

// member serves a page only to logged-in viewers; others go to the login.
func (d *Dashboard) member(page pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := d.viewerOf(r)
		if !v.LoggedIn {
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		page(w, r, v)
	}
}

type loginData struct {
	Next  string
	Error string
}

func (d *Dashboard) loginPage(w http.ResponseWriter, r *http.Request) {
	d.render(w, http.StatusOK, "login", d.viewerOf(r), loginData{Next: webui.SafeNext(r.URL.Query().Get("next"))})
}

func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	next := webui.SafeNext(r.PostFormValue("next"))
	token := strings.TrimSpace(r.PostFormValue("token"))
	if !webui.SameOrigin(r) {
		d.fail(w, r, viewer{}, http.StatusForbidden, "Log in from the dashboard's own page.")
		return
	}
	if token == "" {
		d.render(w, http.StatusUnauthorized, "login", viewer{}, loginData{Next: next, Error: "Give the proxy's admin token."})
		return
	}
	if d.cfg.Gate.HeldBack(w, r, func(w http.ResponseWriter, status int, msg string) {
		d.render(w, status, "login", viewer{}, loginData{Next: next, Error: msg})
	}) {
		return
	}
	if !d.api.CheckToken(token) {
		d.cfg.Gate.Failed(r, "proxy dashboard login")
		d.render(w, http.StatusUnauthorized, "login", viewer{}, loginData{Next: next, Error: "Wrong admin token (or the proxy runs without one)."})
		return
	}
	id, exp := d.sessions.create()
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: id, Path: "/", Expires: exp,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	d.log.Info("proxy dashboard: logged in")
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	v := d.viewerOf(r)
	if v.LoggedIn {
		if !webui.SameOrigin(r) || subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(v.CSRF)) != 1 {
			d.fail(w, r, v, http.StatusForbidden, "This form expired: reload the page and try again.")
			return
		}
		d.sessions.end(v.sessionID)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
