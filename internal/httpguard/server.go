// Package httpguard bounds what a client can hold of an HTTP server: every
// http.Server of the binaries gets header, body and keep-alive timeouts
// (Server), and the server and the proxy accept through a Listener that
// closes idle and unauthenticated connections near the file limit instead
// of failing every accept, /healthz included.
package httpguard

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Timeouts of an HTTP server; zero fields take the defaults.
type Timeouts struct {
	// Header bounds reading a request's headers (10 s): half-sent
	// headers are closed.
	Header time.Duration
	// Body bounds each wait for request body bytes (60 s): a request
	// that announced a body and stopped sending it is closed. It is
	// renewed by every read, so a long upload that keeps moving runs on,
	// and it does not apply to WebSocket upgrades, whose sessions keep
	// their own protocol timeouts.
	Body time.Duration
	// Idle closes a keep-alive connection with no request for this long
	// (120 s).
	Idle time.Duration
}

// Default timeouts.
const (
	DefaultHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout   = 60 * time.Second
	DefaultIdleTimeout   = 120 * time.Second
)

func (t Timeouts) withDefaults() Timeouts {
	if t.Header <= 0 {
		t.Header = DefaultHeaderTimeout
	}
	if t.Body <= 0 {
		t.Body = DefaultBodyTimeout
	}
	if t.Idle <= 0 {
		t.Idle = DefaultIdleTimeout
	}
	return t
}

// Server is an http.Server for h with the timeouts. It sets no
// ReadTimeout or WriteTimeout: those would end long-lived WebSocket
// sessions and long downloads; request bodies get a deadline per read
// instead (Timeouts.Body).
func Server(h http.Handler, t Timeouts, log *slog.Logger) *http.Server {
	t = t.withDefaults()
	return &http.Server{
		Handler:           BodyDeadline(h, t.Body),
		ReadHeaderTimeout: t.Header,
		IdleTimeout:       t.Idle,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// BodyDeadline gives each read of a request body at most d: the
// connection's read deadline is set before the handler runs and renewed
// by every read that returns data, and cleared once the body is read, so
// a handler that then streams a long answer is not cut off. Requests
// without a body and WebSocket upgrades pass untouched.
func BodyDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || isUpgrade(r) {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(d)) != nil {
			h.ServeHTTP(w, r) // a writer without deadlines (tests' recorders)
			return
		}
		r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, d: d}
		h.ServeHTTP(w, r)
	})
}

func isUpgrade(r *http.Request) bool {
	for _, v := range r.Header.Values("Connection") {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), "upgrade") {
				return true
			}
		}
	}
	return false
}

// deadlineBody renews the read deadline while the body moves.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	d    time.Duration
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case b.done:
	case err == io.EOF:
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	case n > 0:
		b.rc.SetReadDeadline(time.Now().Add(b.d))
	}
	return n, err
}
