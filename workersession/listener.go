package workersession

import (
	"context"
	"net/http"

	"gradient.dev/gradient/session"
)

// DialedHandler serves server-dialed sessions (docs/protocol/worker.md §3): the server
// proves itself with its tokens (checked against ServerTokens; a wrong one
// is answered with Reject 401, any other first message with 400 by the
// handshake), then the session runs like a dialed-out one until ctx ends.
func (sh *Shell) DialedHandler(ctx context.Context) http.Handler {
	return session.Handler(func(r *http.Request, t session.Transport) {
		if !sh.trackSession() {
			return // the worker is stopping
		}
		defer sh.sessions.Done()
		log := sh.log.With("remote", r.RemoteAddr)
		c := session.NewConn(t, session.ConnOptions{Logger: log})
		est, err := session.RunDialed(r.Context(), c, session.DialedConfig{
			WorkerID: sh.cfg.WorkerID, Capabilities: sh.cfg.Capabilities, Verifier: sh.cfg.ServerTokens, Timeout: sh.cfg.HandshakeTimeout,
		})
		if err != nil {
			log.Warn("server-dialed handshake failed", "error", err)
			return
		}
		log.Info("server dialed in", "authorized", est.AuthorizedPeers)
		sh.serve(ctx, c, est, sh.currentTokens())
	})
}
