package forgetest

import (
	"net/http"
	"net/url"
	"strings"
)

func (s *Server) giteaAuth(r *http.Request) bool {
	cred := bearer(r)
	if cred == "" {
		cred = r.URL.Query().Get("access_token") // deprecated, still accepted
	}
	return cred != "" && cred == s.Token
}

func (s *Server) serveGitea(w http.ResponseWriter, r *http.Request, path string, body []byte) {
	rest, ok := strings.CutPrefix(path, "/repos/")
	if !ok {
		s.notFound(w)
		return
	}
	if !s.giteaAuth(r) {
		s.unauthorized(w)
		return
	}
	segs := strings.Split(rest, "/")
	if len(segs) < 2 {
		s.notFound(w)
		return
	}
	owner, err1 := url.PathUnescape(segs[0])
	name, err2 := url.PathUnescape(segs[1])
	if err1 != nil || err2 != nil || !s.sameRepo(owner+"/"+name) {
		s.notFound(w)
		return
	}
	segs = segs[2:]
	switch {
	case len(segs) == 0 && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{
			"id": 1, "name": name, "full_name": s.Repository, "private": true,
			"owner":       map[string]any{"login": owner, "username": owner, "id": 1},
			"permissions": map[string]bool{"admin": !s.readOnly, "push": !s.readOnly, "pull": true},
		})
	case len(segs) == 2 && segs[0] == "statuses" && r.Method == http.MethodPost:
		if s.readOnly {
			writeJSON(w, http.StatusForbidden, map[string]string{"message": "user should have a permission to write to the repository"})
			return
		}
		s.hubPostStatus(w, r, segs[1], body, 1<<20)
	case len(segs) == 3 && segs[0] == "collaborators" && segs[2] == "permission" && r.Method == http.MethodGet:
		if s.readOnly {
			// Only the repository's (or the instance's) admins may read
			// other users' permissions.
			writeJSON(w, http.StatusForbidden, map[string]string{"message": "Only admins can query all permissions, repo admins can query all repo permissions, collaborators can query only their own"})
			return
		}
		user, _ := url.PathUnescape(segs[1])
		perm, ok := s.permission(user)
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"message": "user does not exist [name: " + user + "]"})
			return
		}
		giteaPerm := map[string]string{"admin": "admin", "maintain": "write", "write": "write", "triage": "read", "read": "read"}[perm]
		if giteaPerm == "" {
			giteaPerm = "none"
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"permission": giteaPerm, "role_name": giteaPerm,
			"user": map[string]any{"login": user, "username": user, "id": 100},
		})
	default:
		s.notFound(w)
	}
}
