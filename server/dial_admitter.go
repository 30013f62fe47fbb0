package server

import (
	"context"
	"fmt"
	"slices"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/wire"
)

// dialAdmitter is the authority.DialedPolicy of one session the server
// dialed at url. Its handshake decides with the server's rules on the
// registrations at url whose tokens the dial presented. Its reauths add
// what those tokens grant now, and ask for a redial when a registration at
// url appeared whose token the dial did not present.
type dialAdmitter struct {
	s   *Server
	url string
	// presented are the peers whose tokens the dial presented: the
	// worker proved only those registrations (and its team's).
	presented []string
}

func (a *dialAdmitter) Admit(ctx context.Context, workerID string) (authority.Grant, error) {
	rec, err := a.s.workerRecord(ctx, workerID)
	if err != nil {
		return authority.Grant{}, fmt.Errorf("reading worker %s: %w", workerID, err)
	}
	atURL, _ := a.atURL(rec)
	g := admitDialed(atURL)
	g.WorkerID, g.Known = rec.WorkerID, true
	return g, nil
}

// Reauthorize adds what the presented tokens grant now (a project that
// subscribed a cache, a project granting the team); never revokes. A new
// registration at the URL is not granted on this session: its token was
// not presented, so redial reports that the next dial must carry it.
func (a *dialAdmitter) Reauthorize(ctx context.Context, workerID string) (authority.Grant, bool, error) {
	rec, err := a.s.workerRecord(ctx, workerID)
	if err != nil {
		return authority.Grant{}, false, fmt.Errorf("reading worker %s: %w", workerID, err)
	}
	proven, redial := a.atURL(rec)
	g := admitDialed(proven)
	g.WorkerID, g.Known = rec.WorkerID, true
	return g, redial, nil
}

// atURL narrows rec to the registrations at the dialed URL whose tokens
// the dial presented; unpresented reports others at the URL.
func (a *dialAdmitter) atURL(rec *WorkerRecord) (proven *WorkerRecord, unpresented bool) {
	at := rec.DialedAt(a.url)
	proven = &WorkerRecord{WorkerID: at.WorkerID, Deactivated: at.Deactivated}
	for _, reg := range at.Registrations {
		if slices.Contains(a.presented, reg.PeerID) {
			proven.Registrations = append(proven.Registrations, reg)
		} else {
			unpresented = true
		}
	}
	if at.Team != nil {
		if slices.Contains(a.presented, at.Team.TeamID) {
			proven.Team = at.Team
		} else {
			unpresented = true
		}
	}
	return proven, unpresented
}

// presentedPeers are the peers of the tokens a dial presents.
func presentedPeers(tokens []wire.Pair[string, string]) []string {
	peers := make([]string, len(tokens))
	for i, t := range tokens {
		peers[i] = t.First
	}
	return peers
}
