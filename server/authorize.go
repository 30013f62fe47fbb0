package server

import (
	"slices"

	"gradient.dev/gradient/authority"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// PeerKind is what registered a worker.
type PeerKind string

const (
	PeerProject PeerKind = "project" // jobs from the project's evaluations
	PeerCache   PeerKind = "cache"   // serving and pulling from the cache
	PeerProxy   PeerKind = "proxy"   // membership in the proxy's worker pool
)

// Registration is one peer's registration of a worker ID.
type Registration struct {
	Kind      PeerKind
	PeerID    string
	TokenHash string
	Abilities authority.Abilities
	// HasCache: a project peer subscribes to at least one cache. Jobs of a
	// project without a cache could not store their outputs.
	HasCache bool
	// DialURL is where the server dials the worker presenting this peer's
	// token; "" when the server cannot (no URL, or no sealed token).
	DialURL string
}

// TeamWorker is a worker ID registered for a whole team. The worker holds
// one token for the team ID; every project granting the team joins.
type TeamWorker struct {
	TeamID    string
	TokenHash string
	Abilities authority.Abilities
	Grants    []GrantingProject
	DialURL   string // as Registration.DialURL
}

// GrantingProject is a project that grants a team's workers.
type GrantingProject struct {
	ProjectID string
	HasCache  bool
}

// WorkerRecord is everything the server knows about a worker ID when it
// authorizes a session.
type WorkerRecord struct {
	WorkerID      string
	Deactivated   bool
	Registrations []Registration
	Team          *TeamWorker
}

// Known reports whether any peer registered the worker ID.
func (r *WorkerRecord) Known() bool { return len(r.Registrations) > 0 || r.Team != nil }

// DialedAt narrows the record to a session the server dialed at url: only
// the peers whose tokens that dial presents take part.
func (r *WorkerRecord) DialedAt(url string) *WorkerRecord {
	out := &WorkerRecord{WorkerID: r.WorkerID, Deactivated: r.Deactivated}
	for _, reg := range r.Registrations {
		if reg.DialURL == url {
			out.Registrations = append(out.Registrations, reg)
		}
	}
	if r.Team != nil && r.Team.DialURL == url {
		out.Team = r.Team
	}
	return out
}

// ChallengePeers are the peers the worker must present tokens for.
func (r *WorkerRecord) ChallengePeers() []string {
	peers := make([]string, 0, len(r.Registrations)+1)
	for _, reg := range r.Registrations {
		peers = append(peers, reg.PeerID)
	}
	if r.Team != nil {
		peers = append(peers, r.Team.TeamID)
	}
	return peers
}

// authorize decides a worker's session from its record and the tokens it
// answered the challenge with. Each registered peer's token is checked on
// its own; the session survives with the peers that passed. Policy checks
// that need no token (deactivated, no team grant) come first.
//
// verify checks a token against a stored hash (secret.Verify, or a
// server's secret.Verifier).
func authorize(rec *WorkerRecord, tokens []wire.Pair[string, string], verify func(stored, token string) bool) authority.Grant {
	if refusal := refuse(rec); refusal != nil {
		return authority.Grant{Decision: refusal.Decide()}
	}
	// The first token offered for a peer counts; later duplicates and
	// tokens for peers that did not register the worker are ignored.
	offered := make(map[string]string, len(tokens))
	for _, t := range tokens {
		if _, dup := offered[t.First]; !dup {
			offered[t.First] = t.Second
		}
	}
	check := func(peerID, hash string) (ok bool, reason string) {
		token, present := offered[peerID]
		switch {
		case !present:
			return false, handshake.ReasonNoToken
		case !verify(hash, token):
			return false, handshake.ReasonInvalidToken
		}
		return true, ""
	}
	return grant(rec, check)
}

// admitDialed decides a session the server dialed: the worker accepted
// every token the server presented (or it would have rejected the server),
// so each registration in rec (those whose tokens were presented) counts
// as proven, and only the policy checks remain.
func admitDialed(rec *WorkerRecord) authority.Grant {
	if refusal := refuse(rec); refusal != nil {
		return authority.Grant{Decision: refusal.Decide()}
	}
	return grant(rec, func(string, string) (bool, string) { return true, "" })
}

// refuse applies the policy checks that need no token.
func refuse(rec *WorkerRecord) *handshake.Rejection {
	switch {
	case !rec.Known():
		return &handshake.UnknownWorker
	case rec.Deactivated:
		return &handshake.WorkerDeactivated
	case rec.Team != nil && len(rec.Registrations) == 0 && len(rec.Team.Grants) == 0:
		return &handshake.NoTeamGrant
	}
	return nil
}

// grant builds the decision from each peer's token check: the session
// survives with the peers that passed and have what their jobs need.
func grant(rec *WorkerRecord, check func(peerID, hash string) (ok bool, reason string)) authority.Grant {
	var g authority.Grant
	var authorized []string
	var failed []wire.FailedPeer
	anyValid := false
	for _, reg := range rec.Registrations {
		ok, reason := check(reg.PeerID, reg.TokenHash)
		if !ok {
			failed = append(failed, wire.FailedPeer{PeerID: reg.PeerID, Reason: reason})
			continue
		}
		anyValid = true
		switch reg.Kind {
		case PeerProject:
			if !reg.HasCache {
				failed = append(failed, wire.FailedPeer{PeerID: reg.PeerID, Reason: handshake.NoCacheSubscribed.Reason})
				continue
			}
			g.Projects = append(g.Projects, reg.PeerID)
			g.Abilities = g.Abilities.Union(reg.Abilities)
			g.Allow(reg.PeerID, reg.Abilities)
		case PeerCache:
			g.Caches = append(g.Caches, reg.PeerID)
		case PeerProxy:
			g.Proxies = append(g.Proxies, reg.PeerID)
			g.Abilities = g.Abilities.Union(reg.Abilities)
		}
		authorized = append(authorized, reg.PeerID)
	}
	if team := rec.Team; team != nil {
		if ok, reason := check(team.TeamID, team.TokenHash); !ok {
			failed = append(failed, wire.FailedPeer{PeerID: team.TeamID, Reason: reason})
		} else {
			anyValid = true
			joined := 0
			for _, p := range team.Grants {
				if p.HasCache && !slices.Contains(g.Projects, p.ProjectID) {
					g.Projects = append(g.Projects, p.ProjectID)
					g.Allow(p.ProjectID, team.Abilities)
					joined++
				}
			}
			if joined == 0 {
				failed = append(failed, wire.FailedPeer{PeerID: team.TeamID, Reason: handshake.NoCacheSubscribed.Reason})
			} else {
				authorized = append(authorized, team.TeamID)
				g.Abilities = g.Abilities.Union(team.Abilities)
			}
		}
	}
	switch {
	case !anyValid:
		return authority.Grant{Decision: handshake.NoValidTokens.Decide()}
	case len(authorized) == 0:
		return authority.Grant{Decision: handshake.NoCacheSubscribed.Decide()}
	}
	allowed := wire.GradientCapabilities{
		Fetch: g.Abilities.Fetch,
		Eval:  g.Abilities.Eval,
		Build: g.Abilities.Build,
	}
	g.Decision = handshake.Accept(authorized, failed, allowed)
	return g
}
