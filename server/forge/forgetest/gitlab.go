package forgetest

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// gitLabLevel is a GitHub permission in GitLab's access levels: Guest
// 10, Reporter 20, Developer 30, Maintainer 40, Owner 50.
func gitLabLevel(perm string) int {
	return map[string]int{"admin": 50, "maintain": 40, "write": 30, "triage": 20, "read": 10}[perm]
}

func (s *Server) gitlabAuth(r *http.Request) bool {
	cred := r.Header.Get("PRIVATE-TOKEN")
	if cred == "" {
		cred = bearer(r)
	}
	return cred != "" && cred == s.Token
}

// userID is a user's fixed fake ID: its position in the sorted names is
// not stable across SetPermission, so it is derived from the name.
func userID(name string) int {
	id := 1000
	for _, c := range strings.ToLower(name) {
		id = (id*31 + int(c)) % 1_000_000
	}
	return id + 1000
}

func (s *Server) serveGitLab(w http.ResponseWriter, r *http.Request, path string, body []byte) {
	if !s.gitlabAuth(r) {
		s.unauthorized(w)
		return
	}
	if path == "/personal_access_tokens/self" && r.Method == http.MethodGet {
		writeJSON(w, http.StatusOK, map[string]any{
			"id": 42, "name": "gradient", "revoked": false, "active": true, "user_id": 9,
			"scopes": s.scopes, "created_at": "2026-01-01T00:00:00.000Z", "expires_at": "2027-01-01",
		})
		return
	}
	if path == "/users" && r.Method == http.MethodGet {
		name := r.URL.Query().Get("username")
		out := []map[string]any{}
		if _, ok := s.permission(name); ok {
			out = append(out, map[string]any{"id": userID(name), "username": name, "state": "active"})
		}
		w.Header().Set("X-Total", strconv.Itoa(len(out)))
		w.Header().Set("X-Page", "1")
		w.Header().Set("X-Total-Pages", "1")
		writeJSON(w, http.StatusOK, out)
		return
	}
	rest, ok := strings.CutPrefix(path, "/projects/")
	if !ok {
		s.notFound(w)
		return
	}
	// The project ID is its number or its URL-encoded full path: a
	// literal "/" in it would be another path segment.
	idSeg, rest, _ := strings.Cut(rest, "/")
	id, err := url.PathUnescape(idSeg)
	if err != nil || (id != strconv.Itoa(projectID) && !s.sameRepo(id)) {
		s.notFound(w)
		return
	}
	segs := []string{}
	if rest != "" {
		segs = strings.Split(rest, "/")
	}
	switch {
	case len(segs) == 0 && r.Method == http.MethodGet:
		level := 40
		if s.readOnly {
			level = 20
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": projectID, "path_with_namespace": s.Repository, "default_branch": "main",
			"permissions": map[string]any{"project_access": map[string]int{"access_level": level, "notification_level": 3}, "group_access": nil},
		})
	case len(segs) == 2 && segs[0] == "statuses" && r.Method == http.MethodPost:
		s.gitlabPostStatus(w, r, segs[1], body)
	case len(segs) == 3 && segs[0] == "members" && segs[1] == "all" && r.Method == http.MethodGet:
		s.mu.Lock()
		var found string
		level := 0
		for u, p := range s.perms {
			if strconv.Itoa(userID(u)) == segs[2] && gitLabLevel(p) > 0 {
				found, level = u, gitLabLevel(p)
			}
		}
		s.mu.Unlock()
		if found == "" {
			writeJSON(w, http.StatusNotFound, map[string]string{"message": "404 Not found"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": userID(found), "username": found, "access_level": level, "state": "active"})
	default:
		s.notFound(w)
	}
}

// gitlabPostStatus follows GitLab's commit status API: states pending,
// running, success, failed, canceled; a status of the same name still
// pending or running cannot take a state it cannot transition to (400
// "Cannot transition status via :X from :Y"); a finished one starts over.
func (s *Server) gitlabPostStatus(w http.ResponseWriter, r *http.Request, sha string, body []byte) {
	if s.readOnly {
		writeJSON(w, http.StatusForbidden, map[string]string{"message": "403 Forbidden"})
		return
	}
	req, err := statusRequest(r, body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "state is invalid"})
		return
	}
	events := map[string]string{"pending": "enqueue", "running": "run", "success": "success", "failed": "drop", "canceled": "cancel"}
	event, ok := events[req["state"]]
	switch {
	case !validSHA(sha):
		writeJSON(w, http.StatusNotFound, map[string]string{"message": "404 Commit Not Found"})
		return
	case !ok:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "state does not have a valid value"})
		return
	case utf8.RuneCountInString(req["description"]) > 255:
		writeJSON(w, http.StatusBadRequest, map[string]string{"message": "description is too long (maximum is 255 characters)"})
		return
	}
	name := req["name"]
	if name == "" {
		name = req["context"]
	}
	if name == "" {
		name = "default"
	}
	s.mu.Lock()
	last := ""
	for _, st := range s.statuses {
		if strings.EqualFold(st.Commit, sha) && st.Context == name {
			last = st.State
		}
	}
	allowed := last == "" || last == "success" || last == "failed" || last == "canceled" ||
		last == "pending" && req["state"] != "pending" ||
		last == "running" && req["state"] != "pending" && req["state"] != "running"
	if !allowed {
		s.mu.Unlock()
		writeJSON(w, http.StatusBadRequest, map[string]string{
			"message": fmt.Sprintf("Cannot transition status via :%s from :%s (Reason(s): Status cannot transition via \"%s\")", event, last, event),
		})
		return
	}
	rec := Received{Commit: strings.ToLower(sha), Context: name, State: req["state"], Description: req["description"], TargetURL: req["target_url"]}
	s.statuses = append(s.statuses, rec)
	s.nextStateID++
	id := s.nextStateID
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, map[string]any{
		"id": id, "sha": rec.Commit, "ref": "main", "status": rec.State, "name": rec.Context,
		"description": rec.Description, "target_url": rec.TargetURL, "created_at": time.Now().UTC().Format(time.RFC3339),
	})
}
