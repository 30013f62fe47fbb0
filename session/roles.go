package session

import (
	"context"
	"errors"
	"time"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// Established is the outcome of a successful handshake.
type Established struct {
	handshake.Result
	Role    handshake.Role
	Version uint16
}

// AuthorityConfig configures the server side of a worker-dialed session.
type AuthorityConfig struct {
	Policy Authority
	// Capabilities are the server's own; nil means all.
	Capabilities *wire.GradientCapabilities
	// Timeout bounds agreement plus handshake; 0 means HandshakeTimeout.
	Timeout time.Duration
}

// DialerConfig configures the server dialing a worker.
type DialerConfig struct {
	WorkerID string
	// Tokens: one (peer, token) per registration with a stored token for
	// the dialed URL. Secrets: never logged.
	Tokens       []wire.Pair[string, string]
	Policy       Admitter
	Capabilities *wire.GradientCapabilities
	Timeout      time.Duration
}

// PeerConfig configures a worker dialing the server.
type PeerConfig struct {
	WorkerID     string
	Capabilities wire.GradientCapabilities // core and cache are cleared
	Tokens       map[string]string         // peer id → token (the peers file)
	Timeout      time.Duration
}

// DialedConfig configures a worker answering a server's dial.
type DialedConfig struct {
	WorkerID     string
	Capabilities wire.GradientCapabilities
	Verifier     ServerVerifier // nil accepts every server
	Timeout      time.Duration
}

// RunAuthority runs the authority role: ← InitConnection, → AuthChallenge,
// ← AuthResponse, → InitAck or Reject.
func RunAuthority(ctx context.Context, c *Conn, cfg AuthorityConfig) (*Established, error) {
	m := handshake.NewAuthority(serverCaps(cfg.Capabilities))
	return drive(ctx, c, m, m.Start(), cfg.Timeout, authorityAsk(cfg.Policy))
}

func authorityAsk(p Authority) asker {
	if p == nil {
		return nil // the handshake aborts at the first policy question
	}
	return func(ctx context.Context, m *handshake.Machine, s handshake.Step) handshake.Step {
		switch s.Action {
		case handshake.AskChallenge:
			return m.Challenged(p.Challenge(ctx, s.WorkerID))
		case handshake.AskAuthorize:
			return m.Decided(p.Authorize(ctx, s.WorkerID, s.Tokens))
		}
		return m.Lost(errors.New("unexpected policy question"))
	}
}

// RunCache runs the server side of a cache session: ← InitConnection,
// → InitAck with no peers. Access (API key, anonymous limits) was decided on
// the upgrade request.
func RunCache(ctx context.Context, c *Conn, timeout time.Duration) (*Established, error) {
	m := handshake.NewCache()
	return drive(ctx, c, m, m.Start(), timeout, nil)
}

// RunDialer runs the dialer role: → Authenticate, ← InitConnection,
// → InitAck or Reject.
func RunDialer(ctx context.Context, c *Conn, cfg DialerConfig) (*Established, error) {
	m := handshake.NewDialer(cfg.WorkerID, cfg.Tokens, serverCaps(cfg.Capabilities))
	var ask asker
	if cfg.Policy != nil {
		ask = func(ctx context.Context, m *handshake.Machine, s handshake.Step) handshake.Step {
			return m.Decided(cfg.Policy.Admit(ctx, s.WorkerID, s.Offered))
		}
	}
	return drive(ctx, c, m, m.Start(), cfg.Timeout, ask)
}

// RunPeer runs the peer role: → InitConnection, ← AuthChallenge,
// → AuthResponse, ← InitAck.
func RunPeer(ctx context.Context, c *Conn, cfg PeerConfig) (*Established, error) {
	m := handshake.NewPeer(cfg.WorkerID, cfg.Capabilities, cfg.Tokens)
	return drive(ctx, c, m, m.Start(), cfg.Timeout, nil)
}

// RunDialed runs the dialed role: ← Authenticate, → InitConnection,
// ← InitAck.
func RunDialed(ctx context.Context, c *Conn, cfg DialedConfig) (*Established, error) {
	m := handshake.NewDialed(cfg.WorkerID, cfg.Capabilities)
	return drive(ctx, c, m, m.Start(), cfg.Timeout, dialedAsk(cfg.Verifier))
}

func dialedAsk(v ServerVerifier) asker {
	if v == nil {
		v = AcceptAnyServer{}
	}
	return func(_ context.Context, m *handshake.Machine, s handshake.Step) handshake.Step {
		return m.Verified(v.VerifyServer(s.WorkerID, s.Tokens))
	}
}

func serverCaps(c *wire.GradientCapabilities) wire.GradientCapabilities {
	if c == nil {
		return handshake.AllCapabilities
	}
	return *c
}

// asker answers the machine's policy questions.
type asker func(ctx context.Context, m *handshake.Machine, s handshake.Step) handshake.Step

// drive performs the I/O the machine asks for until it is done or failed.
func drive(ctx context.Context, c *Conn, m *handshake.Machine, step handshake.Step, timeout time.Duration, ask asker) (*Established, error) {
	if timeout <= 0 {
		timeout = HandshakeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	server := m.Role().ServerSide()
	for {
		if step.Send != nil {
			err := sendStep(ctx, c, server, step.Send)
			if err != nil && step.Action != handshake.Fail {
				step = m.Lost(err)
			}
		}
		switch step.Action {
		case handshake.Read:
			var msg wire.Message
			var err error
			if server {
				msg, err = c.RecvClient(ctx)
			} else {
				msg, err = c.RecvServer(ctx)
			}
			if err != nil {
				step = m.Lost(err)
				continue
			}
			step = m.Received(msg)
		case handshake.Done:
			return &Established{Result: *step.Result, Role: m.Role(), Version: c.Version()}, nil
		case handshake.Fail:
			return nil, c.fail(step.Err)
		default:
			if ask == nil {
				step = m.Lost(errors.New("no policy for " + m.Role().String()))
				continue
			}
			step = ask(ctx, m, step)
		}
	}
}

func sendStep(ctx context.Context, c *Conn, server bool, msg wire.Message) error {
	if server {
		return c.SendServer(ctx, msg.(wire.ServerMessage))
	}
	return c.SendClient(ctx, msg.(wire.ClientMessage))
}

// fail closes the connection after a failed handshake and logs why. An
// agreement refusal replaces the generic abort reason.
func (c *Conn) fail(e *handshake.Error) error {
	if e.Code == 0 && c.refusal != "" {
		e.Reason = c.refusal
	}
	attrs := []any{"worker", e.WorkerID, "code", e.Code, "reason", e.Reason}
	if e.Err != nil { // a refusal (496, 401) has a reason and no error
		attrs = append(attrs, "error", e.Err)
	}
	c.log.Warn("handshake failed", attrs...)
	if e.Code != 0 {
		c.shutdown(CloseNormal, e.Reason)
	} else {
		c.shutdown(CloseProtocolError, e.Reason)
	}
	return e
}
