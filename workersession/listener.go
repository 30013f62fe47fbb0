package worker

import (
	"context"
	"net/http"

	"gradient.dev/gradient/session"
)

// DialedHandler serves server-dialed sessions (docs/protocol/worker.md §3): the server
// proves itself with its tokens (checked against ServerTokens; a wrong one
// is answered with Reject 401, any other first message with 400 by the
// handshake), then the session runs like a dialed-out one until ctx ends.
func (w *Worker) DialedHandler(ctx context.Context) http.Handler {
	return session.Handler(func(r *http.Request, t session.Transport) {
		if !w.trackSession() {
			return // the worker is stopping
		}
		defer w.sessions.Done()
		log := w.log.With("remote", r.RemoteAddr)
		c := session.NewConn(t, session.ConnOptions{Logger: log})
		est, err := session.RunDialed(r.Context(), c, session.DialedConfig{
			WorkerID: w.cfg.WorkerID, Capabilities: w.cfg.Capabilities, Verifier: w.cfg.ServerTokens, Timeout: w.cfg.HandshakeTimeout,
		})
		if err != nil {
			log.Warn("server-dialed handshake failed", "error", err)
			return
		}
		log.Info("server dialed in", "authorized", est.AuthorizedPeers)
		w.serve(ctx, c, est, w.currentTokens())
	})
}
