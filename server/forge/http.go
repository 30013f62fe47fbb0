package forge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// DefaultTimeout bounds each API call of a client made without an
// http.Client of the caller's.
const DefaultTimeout = 30 * time.Second

// maxResponse bounds the bytes read of any API answer; the answers the
// client reads are a few kilobytes.
const maxResponse = 1 << 20

// maxRetryAfter bounds how long a forge may ask us to wait, so a wrong
// clock or header never parks a status for days.
const maxRetryAfter = time.Hour

// apiClient is what the three kinds share: the base URL, the http.Client
// and how a request is sent, authenticated and classified.
type apiClient struct {
	kind Kind
	base string // API root without a trailing slash
	hc   *http.Client
	// auth sets the request's credentials. A cached App token obtained
	// before staleBefore (when it was refused) is replaced; zero means
	// none was refused. It answers whether a retry with fresh
	// credentials could help after a 401.
	auth func(ctx context.Context, r *http.Request, staleBefore time.Time) (retryable bool, err error)
	now  func() time.Time
}

// NewClient makes the client of a link, which must pass Validate. With
// hc nil it uses an http.Client with a 30 s timeout. Redirects are not
// followed (a redirect could carry the credentials' headers to another
// host): they are errors naming where the forge points to.
//
// Errors from the client's methods are *RetryableError for network
// errors, 5xx, 429 and GitHub's secondary rate limits (403 with
// Retry-After, or x-ratelimit-remaining: 0 until x-ratelimit-reset);
// every other error is permanent. No error contains a credential.
func NewClient(l Link, hc *http.Client) (Client, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	var c http.Client
	if hc != nil {
		c = *hc
	} else {
		c.Timeout = DefaultTimeout
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	api := &apiClient{kind: l.Kind, base: strings.TrimRight(l.APIURL, "/"), hc: &c, now: time.Now}
	switch l.Kind {
	case GitHub:
		gh := &gitHub{api: api, owner: ownerOf(l.Repository), name: nameOf(l.Repository)}
		if l.App != nil {
			key, err := parsePrivateKey(l.App.PrivateKeyPEM)
			if err != nil {
				return nil, err
			}
			gh.app = &appTokens{api: api, appID: l.App.AppID, key: key, owner: gh.owner, name: gh.name}
			api.auth = gh.app.authorize
		} else {
			api.auth = headerAuth("Authorization", "Bearer "+l.Token)
		}
		return gh, nil
	case Gitea:
		// The host root is documented; the API root as operators often
		// paste it works too.
		api.base = strings.TrimSuffix(api.base, "/api/v1") + "/api/v1"
		api.auth = headerAuth("Authorization", "token "+l.Token)
		return &gitea{api: api, owner: ownerOf(l.Repository), name: nameOf(l.Repository)}, nil
	case GitLab:
		api.base = strings.TrimSuffix(api.base, "/api/v4") + "/api/v4"
		api.auth = headerAuth("PRIVATE-TOKEN", l.Token)
		return &gitLab{api: api, project: url.PathEscape(l.Repository)}, nil
	}
	return nil, fmt.Errorf("forge: unknown kind %q", l.Kind)
}

func headerAuth(name, value string) func(context.Context, *http.Request, time.Time) (bool, error) {
	return func(_ context.Context, r *http.Request, _ time.Time) (bool, error) {
		r.Header.Set(name, value)
		return false, nil
	}
}

func ownerOf(repo string) string { o, _, _ := strings.Cut(repo, "/"); return o }
func nameOf(repo string) string  { _, n, _ := strings.Cut(repo, "/"); return n }

// headerReceiver is an answer that keeps some of its response headers
// (GitHub's X-OAuth-Scopes).
type headerReceiver interface{ receiveHeader(http.Header) }

// apiError is a forge's refusal, permanent unless wrapped in a
// RetryableError. It carries the status and the forge's own message
// (bounded), never a request header.
type apiError struct {
	Method, Path string
	Status       int
	Message      string
}

func (e *apiError) Error() string {
	s := fmt.Sprintf("forge: %s %s: %d %s", e.Method, e.Path, e.Status, http.StatusText(e.Status))
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// statusOf is the HTTP status of an error from the API, 0 when there is none.
func statusOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// call sends one request: path is already escaped and relative to the
// API root; in, when not nil, is sent as JSON; a 2xx answer is decoded
// into out when out is not nil. A 401 with App credentials is retried
// once with a fresh installation token.
func (a *apiClient) call(ctx context.Context, method, path string, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return fmt.Errorf("forge: encoding the request: %v", err)
		}
	}
	// A token refused on the first attempt was obtained before it
	// started; one a concurrent call obtained since is not stale.
	started := a.now()
	var staleBefore time.Time
	for {
		err := a.send(ctx, method, path, body, out, staleBefore)
		var ue *unauthorized
		if errors.As(err, &ue) && ue.retryable && staleBefore.IsZero() {
			staleBefore = started
			continue
		}
		if ue != nil {
			return ue.err
		}
		return err
	}
}

// unauthorized is a 401; retryable says fresh credentials might help.
type unauthorized struct {
	err       error
	retryable bool
}

func (u *unauthorized) Error() string { return u.err.Error() }

func (a *apiClient) send(ctx context.Context, method, path string, body []byte, out any, staleBefore time.Time) error {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("forge: %s %s: %v", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "gradient-server")
	if a.kind == GitHub {
		req.Header.Set("Accept", "application/vnd.github+json")
		req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	canRefresh, err := a.auth(ctx, req, staleBefore)
	if err != nil {
		return err
	}
	return a.do(req, path, out, canRefresh)
}

// do sends an authenticated request and classifies its answer.
func (a *apiClient) do(req *http.Request, path string, out any, canRefresh bool) error {
	resp, err := a.hc.Do(req)
	if err != nil {
		if ctxErr := req.Context().Err(); ctxErr != nil {
			// The forge refused nothing: the caller gave up (shutdown). The
			// status is still to be posted; errors.Is finds the cause.
			return &RetryableError{Err: fmt.Errorf("forge: %s %s: %w", req.Method, path, ctxErr)}
		}
		return &RetryableError{Err: fmt.Errorf("forge: %s %s: %v", req.Method, path, transportError(err))}
	}
	defer resp.Body.Close()
	data, readErr := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if readErr != nil {
			return &RetryableError{Err: fmt.Errorf("forge: %s %s: reading the answer: %v", req.Method, path, readErr)}
		}
		if len(data) > maxResponse {
			return fmt.Errorf("forge: %s %s: answer larger than %d bytes", req.Method, path, maxResponse)
		}
		if out != nil {
			if err := json.Unmarshal(data, out); err != nil {
				return fmt.Errorf("forge: %s %s: answer is not the expected JSON: %v", req.Method, path, err)
			}
		}
		if hr, ok := out.(headerReceiver); ok {
			hr.receiveHeader(resp.Header)
		}
		return nil
	}
	ae := &apiError{Method: req.Method, Path: path, Status: resp.StatusCode, Message: forgeMessage(data)}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		ae.Message = "redirected to " + sanitize(resp.Header.Get("Location")) + "; set the API URL to where the forge answers"
		return ae
	}
	if after, ok := a.retryable(resp); ok {
		return &RetryableError{After: after, Err: ae}
	}
	if resp.StatusCode == http.StatusUnauthorized {
		if ae.Message != "" {
			ae.Message = "the forge refused the credentials (" + ae.Message + ")"
		} else {
			ae.Message = "the forge refused the credentials"
		}
		return &unauthorized{err: ae, retryable: canRefresh}
	}
	return ae
}

// retryable says whether an error answer is worth retrying and after
// how long the forge asked for.
func (a *apiClient) retryable(resp *http.Response) (time.Duration, bool) {
	code := resp.StatusCode
	after, hasAfter := a.retryAfter(resp.Header)
	switch {
	case code >= 500, code == http.StatusTooManyRequests:
		if !hasAfter && limitExhausted(resp.Header) {
			after, _ = a.rateLimitReset(resp.Header)
		}
		return after, true
	case code == http.StatusForbidden && a.kind == GitHub:
		// GitHub's secondary rate limits answer 403 with Retry-After; its
		// primary limit answers 403 with x-ratelimit-remaining: 0.
		if hasAfter {
			return after, true
		}
		if limitExhausted(resp.Header) {
			after, _ := a.rateLimitReset(resp.Header)
			return after, true
		}
	}
	return 0, false
}

// retryAfter reads Retry-After, in seconds or as an HTTP date.
func (a *apiClient) retryAfter(h http.Header) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return boundWait(time.Duration(min(secs, int64(maxRetryAfter/time.Second))) * time.Second), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return boundWait(t.Sub(a.now())), true
	}
	return 0, false
}

// limitExhausted: the answer says no requests are left until the reset
// (GitHub's x-ratelimit-remaining, GitLab's RateLimit-Remaining).
func limitExhausted(h http.Header) bool {
	v := h.Get("X-Ratelimit-Remaining")
	if v == "" {
		v = h.Get("Ratelimit-Remaining")
	}
	return strings.TrimSpace(v) == "0"
}

// rateLimitReset reads x-ratelimit-reset (GitHub, GitLab's
// RateLimit-Reset): the Unix time the limit resets.
func (a *apiClient) rateLimitReset(h http.Header) (time.Duration, bool) {
	v := h.Get("X-Ratelimit-Reset")
	if v == "" {
		v = h.Get("Ratelimit-Reset")
	}
	secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || secs <= 0 {
		return 0, false
	}
	return boundWait(time.Unix(secs, 0).Sub(a.now())), true
}

func boundWait(d time.Duration) time.Duration {
	return max(0, min(d, maxRetryAfter))
}

// forgeMessage is the forge's explanation from an error answer: the
// "message" (GitHub, Gitea, GitLab) or "error" (GitLab) field, bounded
// and printable.
func forgeMessage(data []byte) string {
	var m struct {
		Message json.RawMessage `json:"message"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &m) != nil {
		return ""
	}
	raw := m.Message
	if len(raw) == 0 {
		raw = m.Error
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		s = string(raw) // GitLab sends validation errors as an object
	}
	return sanitize(s)
}

// sanitize keeps a forge's text fit for an error: printable, one line,
// at most 200 bytes.
func sanitize(s string) string {
	const limit = 200
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= limit {
			b.WriteString("…")
			break
		}
		if r < ' ' || r == 0x7f || r == utf8.RuneError {
			r = ' '
		}
		b.WriteRune(r)
	}
	return strings.TrimSpace(b.String())
}

// transportError drops the request URL from a client error (it names
// only the API, but the answer is clearer without repeating it).
func transportError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// truncate cuts s to at most n runes.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n])
}
