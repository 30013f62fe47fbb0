package server

import (
	"context"
	"errors"
	"fmt"

	"gradient.dev/gradient/authority"
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
			Abilities: authority.Abilities{Fetch: reg.WorkerSettings.EnableFetch, Eval: reg.WorkerSettings.EnableEval, Build: reg.WorkerSettings.EnableBuild},
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
			Abilities: authority.Abilities{Fetch: tw.WorkerSettings.EnableFetch, Eval: tw.WorkerSettings.EnableEval, Build: tw.WorkerSettings.EnableBuild},
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

// policy is the server's authority.Policy for sessions workers dial: it
// reads the worker's registrations and decides with authorize.
type policy struct{ s *Server }

func (p policy) Challenge(ctx context.Context, workerID string) ([]string, bool, error) {
	rec, err := p.s.workerRecord(ctx, workerID)
	if err != nil {
		return nil, false, fmt.Errorf("reading worker %s: %w", workerID, err)
	}
	return rec.ChallengePeers(), rec.Known(), nil
}

func (p policy) Authorize(ctx context.Context, workerID string, tokens []wire.Pair[string, string]) (authority.Grant, error) {
	rec, err := p.s.workerRecord(ctx, workerID)
	if err != nil {
		return authority.Grant{}, fmt.Errorf("reading worker %s: %w", workerID, err)
	}
	g := authorize(rec, tokens, p.s.verifier.Verify)
	g.WorkerID, g.Known = rec.WorkerID, rec.Known()
	return g, nil
}
