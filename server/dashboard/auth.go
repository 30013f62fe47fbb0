package dashboard

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"gradient.dev/gradient/internal/webui"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/storage"
)

// sessionCookie holds the session ID: a random 256-bit secret whose
// SHA-256 the database keeps.
const sessionCookie = "gradient_session"

// viewer is who asks for a page: logged in with a scope, or not.
type viewer struct {
	LoggedIn bool
	Scope    storage.TokenScope
	// CSRF is the token every state-changing form carries, bound to the
	// session.
	CSRF      string
	sessionID string
}

// Admin reports whether the viewer may act.
func (v viewer) Admin() bool { return v.LoggedIn && v.Scope == storage.ScopeAdmin }

// csrfToken derives the session's CSRF token: knowing it does not reveal
// the session ID, and it needs no storage.
func csrfToken(sessionID string) string {
	sum := sha256.Sum256([]byte("gradient-dashboard-csrf\x00" + sessionID))
	return hex.EncodeToString(sum[:])
}

// viewerOf reads the request's session; no cookie, an unknown or expired
// session is a viewer that is not logged in.
func (d *Dashboard) viewerOf(r *http.Request) (viewer, error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return viewer{}, nil
	}
	s, err := d.db.DashboardSessionByID(r.Context(), c.Value)
	if errors.Is(err, storage.ErrNotFound) {
		return viewer{}, nil
	}
	if err != nil {
		return viewer{}, err
	}
	return viewer{LoggedIn: true, Scope: s.Scope, CSRF: csrfToken(c.Value), sessionID: c.Value}, nil
}

type pageFunc func(w http.ResponseWriter, r *http.Request, v viewer)

// member serves a page only to logged-in viewers; others go to the login.
func (d *Dashboard) member(page pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := d.viewerOf(r)
		if err != nil {
			d.internalError(w, r, v, err)
			return
		}
		if !v.LoggedIn {
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		page(w, r, v)
	}
}

// action runs a state-changing form: logged in with the admin scope, from
// this origin, with the session's CSRF token (compared in constant time).
func (d *Dashboard) action(do pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		v, err := d.viewerOf(r)
		if err != nil {
			d.internalError(w, r, v, err)
			return
		}
		if !v.LoggedIn {
			d.fail(w, r, v, http.StatusUnauthorized, "Log in to do this.")
			return
		}
		if !webui.SameOrigin(r) || subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(v.CSRF)) != 1 {
			d.fail(w, r, v, http.StatusForbidden, "This form expired or came from another site: reload the page and try again.")
			return
		}
		if !v.Admin() {
			d.fail(w, r, v, http.StatusForbidden, "Your token may only read.")
			return
		}
		do(w, r, v)
	}
}

func (d *Dashboard) loginPage(w http.ResponseWriter, r *http.Request) {
	v, err := d.viewerOf(r)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	d.render(w, r, http.StatusOK, "login", v, loginData{Next: webui.SafeNext(r.URL.Query().Get("next"))})
}

type loginData struct {
	Next  string
	Error string
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
		d.render(w, r, http.StatusUnauthorized, "login", viewer{}, loginData{Next: next, Error: "Give the admin token or an API token."})
		return
	}
	if d.cfg.Gate.HeldBack(w, r, func(w http.ResponseWriter, status int, msg string) {
		d.render(w, r, status, "login", viewer{}, loginData{Next: next, Error: msg})
	}) {
		return
	}
	access, err := d.cfg.API.CheckToken(r.Context(), token)
	if errors.Is(err, admin.ErrWrongToken) {
		d.cfg.Gate.Failed(r, "dashboard login")
		d.render(w, r, http.StatusUnauthorized, "login", viewer{}, loginData{Next: next, Error: "Wrong or revoked token."})
		return
	}
	if err != nil {
		d.internalError(w, r, viewer{}, err)
		return
	}
	id, s, err := d.db.CreateDashboardSession(r.Context(), access.Scope, access.TokenID, d.cfg.SessionTTL)
	if err != nil {
		d.internalError(w, r, viewer{}, err)
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: id, Path: "/", Expires: s.ExpiresAt,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	d.log.Info("dashboard: logged in", "scope", access.Scope, "token_id", access.TokenID)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	v, err := d.viewerOf(r)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	if v.LoggedIn {
		if !webui.SameOrigin(r) || subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(v.CSRF)) != 1 {
			d.fail(w, r, v, http.StatusForbidden, "This form expired: reload the page and try again.")
			return
		}
		if err := d.db.DeleteDashboardSession(r.Context(), v.sessionID); err != nil {
			d.internalError(w, r, v, err)
			return
		}
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// mayReadProject reports whether v may read the project's evaluations,
// builds and logs: logged in, or the project is public.
func (d *Dashboard) mayReadProject(ctx context.Context, v viewer, projectID string) (bool, error) {
	if v.LoggedIn {
		return true, nil
	}
	return d.db.ProjectPublic(ctx, projectID)
}
