package server

import (
	"context"
	"errors"
	"fmt"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// workerRecord reads what the server knows about a worker ID, in the shape
// the pure authorize function takes.
func (s *Server) workerRecord(ctx context.Context, workerID string) (*WorkerRecord, error) {
	access, err := s.db.WorkerAccess(ctx, workerID)
	if errors.Is(err, storage.ErrInvalid) {
		// Not a UUID: no peer can have registered it.
		return &WorkerRecord{WorkerID: workerID}, nil
	}
	if err != nil {
		return nil, err
	}
	rec := &WorkerRecord{WorkerID: access.WorkerID, Deactivated: access.Deactivated}
	hasCache := map[string]bool{}
	cached := func(projectID string) (bool, error) {
		if v, ok := hasCache[projectID]; ok {
			return v, nil
		}
		caches, err := s.db.ProjectCaches(ctx, projectID)
		if err != nil {
			return false, err
		}
		hasCache[projectID] = len(caches) > 0
		return len(caches) > 0, nil
	}
	for _, reg := range access.Registrations {
		r := Registration{
			Kind:      PeerKind(reg.Peer.Kind),
			PeerID:    reg.Peer.ID,
			TokenHash: reg.TokenHash,
			Abilities: Abilities{Fetch: reg.WorkerSettings.EnableFetch, Eval: reg.WorkerSettings.EnableEval, Build: reg.WorkerSettings.EnableBuild},
			DialURL:   s.dialURL(reg.URL, reg.DialTokenSealed, registrationIdentity(reg.Peer, reg.WorkerID)),
		}
		if r.Kind == PeerProject {
			if r.HasCache, err = cached(r.PeerID); err != nil {
				return nil, err
			}
		}
		rec.Registrations = append(rec.Registrations, r)
	}
	if tw := access.TeamWorker; tw != nil {
		team := &TeamWorker{
			TeamID:    tw.TeamID,
			TokenHash: tw.TokenHash,
			Abilities: Abilities{Fetch: tw.WorkerSettings.EnableFetch, Eval: tw.WorkerSettings.EnableEval, Build: tw.WorkerSettings.EnableBuild},
			DialURL:   s.dialURL(tw.URL, tw.DialTokenSealed, teamWorkerIdentity(tw.TeamID, tw.WorkerID)),
		}
		for _, p := range access.GrantingProjects {
			has, err := cached(p.ID)
			if err != nil {
				return nil, err
			}
			team.Grants = append(team.Grants, GrantingProject{ProjectID: p.ID, HasCache: has})
		}
		rec.Team = team
	}
	return rec, nil
}

// dialURL is where the server can dial with a credential: only where it
// holds a sealed token that opens, i.e. one it can present.
func (s *Server) dialURL(url string, sealed, identity []byte) string {
	if _, ok := s.openToken(sealed, identity); !ok {
		return ""
	}
	return url
}

// connAuthority is the session.Authority of one worker-dialed connection:
// it asks the database, decides with authorize, claims the worker ID (496
// for a second connection) and remembers the grant for the dispatch loop.
type connAuthority struct {
	s    *Server
	conn *workerConn
	// known: the worker ID is registered, so its failures are kept as its
	// offline reason.
	known       bool
	established bool
	reserved    bool
}

func (a *connAuthority) Challenge(ctx context.Context, workerID string) ([]string, error) {
	rec, err := a.s.workerRecord(ctx, workerID)
	if err != nil {
		return nil, fmt.Errorf("reading worker %s: %w", workerID, err)
	}
	a.known = rec.Known()
	return rec.ChallengePeers(), nil
}

func (a *connAuthority) Authorize(ctx context.Context, workerID string, tokens []wire.Pair[string, string]) (handshake.Decision, error) {
	rec, err := a.s.workerRecord(ctx, workerID)
	if err != nil {
		return handshake.Decision{}, fmt.Errorf("reading worker %s: %w", workerID, err)
	}
	a.known = rec.Known()
	if a.established {
		// Reauth: add what the new tokens grant; never revoke.
		g := authorize(rec, tokens, a.s.verifier.Verify)
		if !g.Rejected() {
			a.conn.merge(g)
		}
		return g.Decision, nil
	}
	if !a.s.Accepting() {
		return handshake.Reject(403, "server is not accepting connections"), nil
	}
	g := authorize(rec, tokens, a.s.verifier.Verify)
	if g.Rejected() {
		return g.Decision, nil
	}
	a.conn.workerID = rec.WorkerID
	a.conn.grant = g
	if !a.s.live.reserve(ctx, a.conn) {
		return handshake.AlreadyConnected.Decide(), nil
	}
	a.reserved = true
	return g.Decision, nil
}
