package cache

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/limit"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// The read-only cache session at GET /cache/{cache}/proto (docs/protocol/cache.md §8):
// the /proto framing for one cache. Access is decided on the upgrade
// request: a public cache needs nothing (unless anonymous access is
// disabled), a private one a cache API key. Then version agreement,
// InitConnection → InitAck without peers, and only CacheQuery (Normal,
// Pull) and NarRequest; anything else is answered Reject 403 and the
// session goes on.

func (bc *Cache) serveSession(w http.ResponseWriter, r *http.Request) {
	s := bc
	cache, err := s.db.CacheByName(r.Context(), r.PathValue("cache"))
	if errors.Is(err, storage.ErrNotFound) {
		http.Error(w, "no such cache", http.StatusNotFound)
		return
	}
	if err != nil {
		bc.internal(w, r, err)
		return
	}
	// A presented key is checked even on a public cache, and makes the
	// session keyed: only sessions without one count as anonymous.
	token, hasKey := cacheKeyFromRequest(r)
	anonymous := !hasKey
	if hasKey {
		if s.gate.HeldBack(w, r, plainError) {
			return
		}
		allowed, err := s.cacheKeyAllows(r, cache.ID, token)
		if err != nil {
			bc.internal(w, r, err)
			return
		}
		if !allowed {
			http.Error(w, "this cache API key does not grant reading the cache", http.StatusUnauthorized)
			return
		}
	} else if !cache.Public || s.cfg.DisableAnonymousCache {
		http.Error(w, "this cache needs a cache API key: Authorization: Bearer GRAD…", http.StatusUnauthorized)
		return
	}
	// Every session counts against MaxConnections; refusing beats queueing.
	releaseSlot, ok := s.sessions.TakeSlot()
	if !ok {
		http.Error(w, "too many connections", http.StatusServiceUnavailable)
		return
	}
	defer releaseSlot()
	if anonymous {
		release, ok := s.anonymousCache.TryAcquire(limit.ClientIP(r))
		if !ok {
			s.sessions.Refused("anonymous cache sessions per IP")
			http.Error(w, "too many anonymous cache sessions from this address", http.StatusServiceUnavailable)
			return
		}
		defer release()
	}
	t, err := session.Accept(w, r)
	if err != nil {
		s.log.Warn("websocket upgrade failed", "remote", r.RemoteAddr, "error", err)
		return
	}
	defer t.Close(session.CloseNormal, "")
	log := s.log.With("remote", r.RemoteAddr, "cache", cache.Name, "anonymous", anonymous)
	s.sessions.Attach(func(ctx context.Context) { s.runCacheSession(ctx, log, t, cache) })
}

func (s *Cache) runCacheSession(ctx context.Context, log *slog.Logger, t session.Transport, cache storage.Cache) {
	c := session.NewConn(t, session.ConnOptions{Logger: log})
	est, err := session.RunCache(ctx, c, s.cfg.HandshakeTimeout)
	if err != nil {
		log.Info("cache session handshake failed", "error", err)
		return
	}
	// SAFE_INFLIGHT_MESSAGE_SIZE caps every message of the session; the
	// transport refuses a larger one unread (close 1009).
	session.LimitMessageSize(t, safeInflightMessageSize)
	sess := session.SplitServer(c, est, session.Options{Logger: log})
	cc := newCacheConn(ctx, s, log, sess.Send, oneCacheScope{cache: cache}, true)
	log.Info("cache session started", "version", est.Version)
	go s.closeIdleCacheSession(sess, cc)
	reason := dispatchCacheSession(ctx, sess, cc)
	sess.Close(session.CloseNormal, reason)
	<-sess.Done()
	cc.Close()
	if r := sess.Reason(); r != "" {
		reason = r
	}
	log.Info("cache session ended", "reason", reason)
}

// dispatchCacheSession serves the session's messages until it ends: only
// CacheQuery (Normal, Pull) and NarRequest; every other message, bulk
// frames too, is answered Reject 403 and the session goes on.
func dispatchCacheSession(ctx context.Context, sess *session.ServerSession, cc *Conn) string {
	for {
		m, err := sess.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return "server stopping"
			}
			return "connection lost: " + err.Error()
		}
		switch m := m.(type) {
		case *wire.CacheQuery:
			if m.Mode != wire.QueryNormal && m.Mode != wire.QueryPull {
				sess.Send(&wire.ServerReject{Code: 403, Reason: "Push not allowed on a read-only cache session"})
				continue
			}
			cc.Handle(m)
		case *wire.NarRequest:
			cc.Handle(m)
		default:
			sess.Send(&wire.ServerReject{Code: 403, Reason: m.WireName() + " not allowed on a read-only cache session"})
			sess.Reader.Release() // nothing refers to the refused message: reuse its frame
		}
	}
}

// closeIdleCacheSession closes the session once it had no NAR transfer
// for the idle timeout (never while one is in flight).
func (s *Cache) closeIdleCacheSession(sess *session.ServerSession, cc *Conn) {
	idle := s.cfg.CacheSessionIdleTimeout
	timer := time.NewTimer(idle)
	defer timer.Stop()
	for {
		select {
		case <-sess.Done():
			return
		case <-timer.C:
		}
		if wait := idle - time.Since(cc.idleSince()); wait > 0 {
			timer.Reset(wait)
			continue
		}
		sess.Close(session.CloseNormal, "idle: no NAR transfer")
		return
	}
}
