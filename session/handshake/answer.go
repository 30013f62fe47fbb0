package handshake

import "gradient.dev/gradient/wire"

// WildcardPeer in a worker's peers file answers every challenged peer that
// has no explicit entry (docs/protocol/worker.md: the peers file).
const WildcardPeer = "*"

// AnswerChallenge picks the tokens of an AuthResponse: for each challenged
// peer its explicit token, else the `*` token; peers without either are
// left out. held maps peer id to token.
func AnswerChallenge(peers []string, held map[string]string) []wire.Pair[string, string] {
	tokens := make([]wire.Pair[string, string], 0, len(peers))
	wildcard, hasWildcard := held[WildcardPeer]
	for _, p := range peers {
		t, ok := held[p]
		if !ok && hasWildcard {
			t, ok = wildcard, true
		}
		if ok {
			tokens = append(tokens, wire.Pair[string, string]{First: p, Second: t})
		}
	}
	return tokens
}
