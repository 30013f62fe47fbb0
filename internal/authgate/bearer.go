package authgate

import (
	"net/http"
	"strings"

	"gradient.dev/gradient/secret"
)

// Bearer is the admin API's token check, shared by the server's and the
// proxy's admin APIs: the request must carry "Authorization: Bearer
// <token>" matching Hash (secret.Hash, or hex SHA-256), checked in
// constant time through Tokens, with the failures of each address
// counted by Gate.
type Bearer struct {
	// Hash is the admin token's hash; empty disables the API (503).
	Hash string
	// Realm names the API in WWW-Authenticate.
	Realm  string
	Tokens *secret.Verifier
	Gate   *Gate // nil holds back nobody
}

// Require lets a request through to next only with the admin token;
// answer writes every refusal (503, 401, 429) in the API's error form.
func (b *Bearer) Require(next http.Handler, answer func(w http.ResponseWriter, status int, msg string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b.Hash == "" {
			answer(w, http.StatusServiceUnavailable, "admin API disabled: set an admin token")
			return
		}
		token, ok := BearerToken(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+b.Realm+`"`)
			answer(w, http.StatusUnauthorized, "missing admin token: send Authorization: Bearer <admin token>")
			return
		}
		if b.Gate.HeldBack(w, r, answer) {
			return
		}
		if !b.Tokens.Verify(b.Hash, token) { // constant time
			b.Gate.Failed(r, "admin token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+b.Realm+`", error="invalid_token"`)
			answer(w, http.StatusUnauthorized, "wrong admin token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// BearerToken is the request's bearer token, if it carries one.
func BearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
