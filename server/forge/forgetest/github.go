package forgetest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"gradient.dev/gradient/server/forge"
)

// NewApp makes a GitHub App identity with a fresh 2048-bit RSA key in
// PKCS#1 PEM, as GitHub hands App keys out.
func NewApp(t testing.TB, appID int64) *forge.GitHubApp {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatalf("forgetest: generating an RSA key: %v", err)
	}
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	return &forge.GitHubApp{AppID: appID, PrivateKeyPEM: pemBytes}
}

type appKey struct {
	id  int64
	pub *rsa.PublicKey
}

func publicKeyOf(app *forge.GitHubApp) (*appKey, error) {
	block, _ := pem.Decode(app.PrivateKeyPEM)
	if block == nil {
		return nil, errors.New("the App key is not PEM")
	}
	var key *rsa.PrivateKey
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		key = k
	} else if k8, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		rk, ok := k8.(*rsa.PrivateKey)
		if !ok {
			return nil, errors.New("the App key is not RSA")
		}
		key = rk
	} else {
		return nil, errors.New("the App key is neither PKCS#1 nor PKCS#8")
	}
	return &appKey{id: app.AppID, pub: &key.PublicKey}, nil
}

// verifyJWT checks an App JWT as GitHub does: RS256 signed by the App's
// key, iss the App's ID, issued in the past and expiring within 10 minutes.
func (k *appKey) verifyJWT(token string, now time.Time) error {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return errors.New("not a JWT")
	}
	var header struct {
		Alg string `json:"alg"`
	}
	if err := decodeSegment(parts[0], &header); err != nil || header.Alg != "RS256" {
		return errors.New("bad JWT header")
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return errors.New("bad JWT signature encoding")
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPKCS1v15(k.pub, crypto.SHA256, digest[:], sig); err != nil {
		return errors.New("JWT signature does not verify")
	}
	var claims struct {
		Iat int64           `json:"iat"`
		Exp int64           `json:"exp"`
		Iss json.RawMessage `json:"iss"`
	}
	if err := decodeSegment(parts[1], &claims); err != nil {
		return errors.New("bad JWT claims")
	}
	iss := strings.Trim(string(claims.Iss), `"`)
	if iss != strconv.FormatInt(k.id, 10) {
		return fmt.Errorf("iss %s is not the App's ID", iss)
	}
	switch {
	case claims.Iat > now.Unix()+30:
		return errors.New("'Issued at' claim (iat) must be an Integer representing a time in the past")
	case claims.Exp <= now.Unix():
		return errors.New("'Expiration time' claim ('exp') must be a numeric value representing the future time")
	case claims.Exp-claims.Iat > 600+60:
		return errors.New("'Expiration time' claim ('exp') is too far in the future")
	}
	return nil
}

func decodeSegment(seg string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// githubAuth checks a request's credentials: the token, or a live
// installation token when an App is installed.
func (s *Server) githubAuth(r *http.Request) bool {
	cred := bearer(r)
	if cred == "" {
		return false
	}
	if s.app == nil {
		return cred == s.Token
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.appTokens[cred]
	return ok && time.Now().Before(exp)
}

func (s *Server) serveGitHub(w http.ResponseWriter, r *http.Request, path string, body []byte) {
	if rest, ok := strings.CutPrefix(path, "/app/installations/"); ok && r.Method == http.MethodPost {
		s.githubExchange(w, r, rest, body)
		return
	}
	rest, ok := strings.CutPrefix(path, "/repos/")
	if !ok {
		s.notFound(w)
		return
	}
	segs := strings.Split(rest, "/")
	if len(segs) < 2 {
		s.notFound(w)
		return
	}
	owner, err1 := url.PathUnescape(segs[0])
	name, err2 := url.PathUnescape(segs[1])
	if err1 != nil || err2 != nil {
		s.notFound(w)
		return
	}
	segs = segs[2:]
	if len(segs) == 1 && segs[0] == "installation" && r.Method == http.MethodGet {
		s.githubInstallation(w, r, owner+"/"+name)
		return
	}
	if !s.githubAuth(r) {
		s.unauthorized(w)
		return
	}
	if s.app == nil && len(s.scopes) > 0 {
		w.Header().Set("X-OAuth-Scopes", strings.Join(s.scopes, ", "))
		w.Header().Set("X-Accepted-OAuth-Scopes", "repo")
	}
	if !s.sameRepo(owner + "/" + name) {
		s.notFound(w)
		return
	}
	switch {
	case len(segs) == 0 && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{
			"id": 1296269, "name": name, "full_name": s.Repository, "private": true,
			"owner":       map[string]any{"login": owner, "id": 1},
			"permissions": map[string]bool{"admin": false, "maintain": false, "push": !s.readOnly, "triage": true, "pull": true},
		})
	case len(segs) == 2 && segs[0] == "statuses" && r.Method == http.MethodPost:
		s.hubPostStatus(w, r, segs[1], body, 140)
	case len(segs) == 3 && segs[0] == "collaborators" && segs[2] == "permission" && r.Method == http.MethodGet:
		user, _ := url.PathUnescape(segs[1])
		perm, ok := s.permission(user)
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"message": user + " is not a user"})
			return
		}
		folded := map[string]string{"admin": "admin", "maintain": "write", "write": "write", "triage": "read", "read": "read"}[perm]
		if folded == "" {
			folded = "none"
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"permission": folded, "role_name": perm,
			"user": map[string]any{"login": user, "id": 100},
		})
	default:
		s.notFound(w)
	}
}

// hubPostStatus is the status endpoint GitHub and Gitea share: 201 with
// the status, 422 on a state or description they refuse.
func (s *Server) hubPostStatus(w http.ResponseWriter, r *http.Request, sha string, body []byte, descriptionLimit int) {
	if s.readOnly {
		msg := "Resource not accessible by personal access token"
		if s.app != nil {
			msg = "Resource not accessible by integration"
		}
		writeJSON(w, http.StatusForbidden, map[string]string{"message": msg})
		return
	}
	req, err := statusRequest(r, body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"message": "Problems parsing JSON"})
		return
	}
	states := map[string]bool{"pending": true, "success": true, "failure": true, "error": true}
	if s.Kind == forge.Gitea {
		states["warning"] = true
	}
	switch {
	case !validSHA(sha):
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"message": "No commit found for SHA: " + sha})
		return
	case !states[req["state"]]:
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"message": "Validation Failed: state is not included in the list"})
		return
	case utf8.RuneCountInString(req["description"]) > descriptionLimit:
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"message": fmt.Sprintf("Validation Failed: description is too long (maximum is %d characters)", descriptionLimit)})
		return
	}
	ctx := req["context"]
	if ctx == "" {
		ctx = "default"
	}
	rec := Received{Commit: strings.ToLower(sha), Context: ctx, State: req["state"], Description: req["description"], TargetURL: req["target_url"]}
	s.record(rec)
	writeJSON(w, http.StatusCreated, map[string]any{
		"state": rec.State, "context": rec.Context, "description": rec.Description, "target_url": rec.TargetURL,
		"created_at": time.Now().UTC().Format(time.RFC3339),
	})
}

// githubApp authenticates an App JWT request; false when it answered.
func (s *Server) githubApp(w http.ResponseWriter, r *http.Request) bool {
	if s.appKey == nil {
		s.unauthorized(w)
		return false
	}
	if err := s.appKey.verifyJWT(bearer(r), time.Now()); err != nil {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"message": "A JSON web token could not be decoded: " + err.Error()})
		return false
	}
	return true
}

func (s *Server) githubInstallation(w http.ResponseWriter, r *http.Request, repo string) {
	if !s.githubApp(w, r) {
		return
	}
	if !s.sameRepo(repo) {
		s.notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": InstallationID, "app_id": s.app.AppID, "target_type": "Organization",
		"account": map[string]any{"login": strings.Split(s.Repository, "/")[0]},
	})
}

func (s *Server) githubExchange(w http.ResponseWriter, r *http.Request, rest string, body []byte) {
	id, ok := strings.CutSuffix(rest, "/access_tokens")
	if !ok {
		s.notFound(w)
		return
	}
	if !s.githubApp(w, r) {
		return
	}
	if id != strconv.Itoa(InstallationID) {
		s.notFound(w)
		return
	}
	var req struct {
		Repositories []string `json:"repositories"`
	}
	if len(body) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"message": "Problems parsing JSON"})
			return
		}
	}
	name := s.Repository[strings.Index(s.Repository, "/")+1:]
	for _, repo := range req.Repositories {
		if !strings.EqualFold(repo, name) {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"message": "There is at least one repository that does not exist or is not accessible to the parent installation."})
			return
		}
	}
	token := "ghs_" + randomHex(18)
	expires := time.Now().Add(s.lifetime).UTC().Truncate(time.Second)
	s.mu.Lock()
	s.appTokens[token] = expires
	s.exchanges++
	s.mu.Unlock()
	statuses := "write"
	if s.readOnly {
		statuses = "read"
	}
	writeJSON(w, http.StatusCreated, map[string]any{
		"token": token, "expires_at": expires.Format(time.RFC3339),
		"permissions":          map[string]string{"metadata": "read", "statuses": statuses},
		"repository_selection": "selected",
	})
}
