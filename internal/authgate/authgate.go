// Package authgate holds back client addresses that made too many failed
// authentications (admin token, cache API keys over HTTP and on cache
// sessions): the server's admin API and binary cache share one Gate, the
// proxy's admin API has its own. Bearer is the admin token check both
// admin APIs run.
package authgate

import (
	"log/slog"
	"math"
	"net/http"
	"strconv"

	"gradient.dev/gradient/session/limit"
)

// Gate counts failed authentications per client address; a nil Gate
// holds back nobody (the limit is disabled).
type Gate struct {
	failures *limit.Failures
	log      *slog.Logger
}

// New is a gate over failures, logging addresses it starts holding back.
func New(failures *limit.Failures, log *slog.Logger) *Gate {
	return &Gate{failures: failures, log: log}
}

// HeldBack answers 429 when the request's address has no failed
// authentications left (Config.AuthFailuresPerMinute); true when it did.
// Callers ask before checking a presented credential, so a held-back
// address costs no check at all; requests without credentials are not
// asked about.
func (g *Gate) HeldBack(w http.ResponseWriter, r *http.Request, answer func(w http.ResponseWriter, status int, msg string)) bool {
	if g == nil {
		return false
	}
	wait, blocked := g.failures.Blocked(limit.ClientIP(r))
	if !blocked {
		return false
	}
	seconds := strconv.Itoa(int(math.Ceil(wait.Seconds())))
	w.Header().Set("Retry-After", seconds)
	answer(w, http.StatusTooManyRequests, "too many failed authentications from this address: retry in "+seconds+" s")
	return true
}

// Failed records a wrong credential (what names it in the log) of the
// request's address.
func (g *Gate) Failed(r *http.Request, what string) {
	if g == nil {
		return
	}
	ip := limit.ClientIP(r)
	g.failures.Fail(ip)
	if _, blocked := g.failures.Blocked(ip); blocked {
		g.log.Warn("failed authentications: address held back", "remote", ip, "credential", what)
	}
}
