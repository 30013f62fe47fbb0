// Package session carries protocol messages over WebSocket: version
// agreement, the pure handshake state machine in its four roles (authority,
// dialer, peer, dialed), reauth, and the split into a typed reader and a
// two-lane writer. The server, the worker, cache sessions and both legs of
// the proxy use it unchanged.
//
// A connection goes through these steps:
//
//	t, err := session.Dial(ctx, url, session.DialOptions{})   // or session.Accept / session.Handler
//	c := session.NewConn(t, session.ConnOptions{})            // lazy version agreement
//	est, err := session.RunPeer(ctx, c, session.PeerConfig{…}) // or RunAuthority, RunDialer, RunDialed, RunCache
//	s := session.SplitWorker(c, est, session.Options{AckTimeout: session.AckTimeout})
//	for { m, err := s.Recv(ctx); …; s.Send(reply) }
//
// Policy enters through small interfaces (Authority, Admitter,
// ServerVerifier) returning handshake.Decision values; reauth state lives in
// ServerAuth and WorkerAuth. Failed handshakes are *handshake.Error values
// (code, reason, claimed worker id); a refused version agreement is kept as
// Conn.Refusal. See docs/WEBSOCKET.md for the transport choices.
package session
