package server

import (
	"reflect"
	"testing"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/wire"
)

func hashOf(t *testing.T, token string) string {
	t.Helper()
	h, err := secret.Hash(token)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func tok(pairs ...string) []wire.Pair[string, string] {
	var out []wire.Pair[string, string]
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, wire.Pair[string, string]{First: pairs[i], Second: pairs[i+1]})
	}
	return out
}

// The rules of docs/protocol/connection.md "Authorization" and "Rejections", one case at
// a time.
func TestAuthorize(t *testing.T) {
	hA, hB, hC, hT := hashOf(t, "token-a"), hashOf(t, "token-b"), hashOf(t, "token-c"), hashOf(t, "token-t")
	build := authority.Abilities{Build: true}
	projA := Registration{Kind: PeerProject, PeerID: "proj-a", TokenHash: hA, Abilities: build, HasCache: true}
	projB := Registration{Kind: PeerProject, PeerID: "proj-b", TokenHash: hB, Abilities: authority.Abilities{Eval: true, Fetch: true}, HasCache: true}
	noCache := Registration{Kind: PeerProject, PeerID: "proj-c", TokenHash: hC, Abilities: build}
	cache := Registration{Kind: PeerCache, PeerID: "cache-1", TokenHash: hC}
	team := &TeamWorker{TeamID: "team-1", TokenHash: hT, Abilities: build, Grants: []GrantingProject{{"proj-x", true}, {"proj-y", false}}}

	cases := []struct {
		name       string
		rec        WorkerRecord
		tokens     []wire.Pair[string, string]
		code       uint16
		reason     string
		authorized []string
		failed     []wire.FailedPeer
		projects   []string
		caps       wire.GradientCapabilities
	}{
		{name: "unknown worker", rec: WorkerRecord{}, code: 403, reason: "unknown worker"},
		{name: "deactivated", rec: WorkerRecord{Deactivated: true, Registrations: []Registration{projA}}, tokens: tok("proj-a", "token-a"), code: 403, reason: "worker is deactivated"},
		{name: "team without grants", rec: WorkerRecord{Team: &TeamWorker{TeamID: "team-1", TokenHash: hT}}, tokens: tok("team-1", "token-t"), code: 403, reason: "no project grants this team's workers"},
		{name: "no tokens", rec: WorkerRecord{Registrations: []Registration{projA}}, code: 401, reason: "no valid peer tokens provided"},
		{name: "all tokens wrong", rec: WorkerRecord{Registrations: []Registration{projA, projB}}, tokens: tok("proj-a", "token-b", "proj-b", "token-a"), code: 401, reason: "no valid peer tokens provided"},
		{name: "one project", rec: WorkerRecord{Registrations: []Registration{projA}}, tokens: tok("proj-a", "token-a"),
			authorized: []string{"proj-a"}, projects: []string{"proj-a"}, caps: wire.GradientCapabilities{Build: true}},
		{name: "partial failure keeps the session", rec: WorkerRecord{Registrations: []Registration{projA, projB}}, tokens: tok("proj-a", "token-a", "proj-b", "wrong"),
			authorized: []string{"proj-a"}, failed: []wire.FailedPeer{{PeerID: "proj-b", Reason: "invalid token"}}, projects: []string{"proj-a"}, caps: wire.GradientCapabilities{Build: true}},
		{name: "missing token is its own reason", rec: WorkerRecord{Registrations: []Registration{projA, projB}}, tokens: tok("proj-b", "token-b"),
			authorized: []string{"proj-b"}, failed: []wire.FailedPeer{{PeerID: "proj-a", Reason: "no token provided"}}, projects: []string{"proj-b"}, caps: wire.GradientCapabilities{Fetch: true, Eval: true}},
		{name: "first token of a peer wins, extras ignored", rec: WorkerRecord{Registrations: []Registration{projA}}, tokens: tok("stranger", "x", "proj-a", "token-a", "proj-a", "wrong"),
			authorized: []string{"proj-a"}, projects: []string{"proj-a"}, caps: wire.GradientCapabilities{Build: true}},
		{name: "project without cache moves to failed", rec: WorkerRecord{Registrations: []Registration{projA, noCache}}, tokens: tok("proj-a", "token-a", "proj-c", "token-c"),
			authorized: []string{"proj-a"}, failed: []wire.FailedPeer{{PeerID: "proj-c", Reason: "project has no cache subscribed"}}, projects: []string{"proj-a"}, caps: wire.GradientCapabilities{Build: true}},
		{name: "495 when no peer remains", rec: WorkerRecord{Registrations: []Registration{noCache}}, tokens: tok("proj-c", "token-c"), code: 495, reason: "project has no cache subscribed"},
		{name: "cache peer needs no subscription", rec: WorkerRecord{Registrations: []Registration{cache}}, tokens: tok("cache-1", "token-c"),
			authorized: []string{"cache-1"}},
		{name: "team worker joins granting projects with a cache", rec: WorkerRecord{Team: team}, tokens: tok("team-1", "token-t"),
			authorized: []string{"team-1"}, projects: []string{"proj-x"}, caps: wire.GradientCapabilities{Build: true}},
	}
	for _, c := range cases {
		g := authorize(&c.rec, c.tokens, secret.Verify)
		if c.code != 0 {
			if g.Decision.Reject == nil || g.Decision.Reject.Code != c.code || g.Decision.Reject.Reason != c.reason {
				t.Errorf("%s: got %+v, want reject %d %q", c.name, g.Decision, c.code, c.reason)
			}
			continue
		}
		if g.Decision.Reject != nil {
			t.Errorf("%s: rejected %+v", c.name, *g.Decision.Reject)
			continue
		}
		if !reflect.DeepEqual(g.Decision.Authorized, c.authorized) || !reflect.DeepEqual(g.Decision.Failed, c.failed) ||
			!reflect.DeepEqual(g.Projects, c.projects) || g.Decision.Allowed != c.caps {
			t.Errorf("%s: got authorized %v failed %v projects %v caps %+v", c.name, g.Decision.Authorized, g.Decision.Failed, g.Projects, g.Decision.Allowed)
		}
	}
}
