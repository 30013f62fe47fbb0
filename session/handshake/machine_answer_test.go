package handshake

import (
	"reflect"
	"testing"

	"gradient.dev/gradient/wire"
)

// The `*` entry of a peers file answers every challenged peer without an
// explicit token, in the handshake as in reauth.
func TestAnswerChallengeWildcard(t *testing.T) {
	held := map[string]string{"p1": "one", "*": "any"}
	got := AnswerChallenge([]string{"p1", "p2"}, held)
	want := []wire.Pair[string, string]{{First: "p1", Second: "one"}, {First: "p2", Second: "any"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v", got)
	}
	if got := AnswerChallenge([]string{"p2"}, map[string]string{"p1": "one"}); len(got) != 0 {
		t.Errorf("a peer without a token was answered: %v", got)
	}
	m := NewPeer("w", wire.GradientCapabilities{}, map[string]string{"*": "any"})
	m.Start()
	step := m.Received(&wire.AuthChallenge{Peers: []string{"p9"}})
	resp, ok := step.Send.(*wire.AuthResponse)
	if !ok || len(resp.Tokens) != 1 || resp.Tokens[0].Second != "any" {
		t.Fatalf("handshake answer %#v", step)
	}
}
