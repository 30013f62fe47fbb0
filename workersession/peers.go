package workersession

import (
	"bufio"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// PeerTokenLength is the only accepted token length (handshake.PeerTokenLength).
const PeerTokenLength = handshake.PeerTokenLength

// WildcardPeer answers every challenged peer not listed explicitly.
const WildcardPeer = handshake.WildcardPeer

// ParsePeers reads `peer_id:token` lines (handshake.ParsePeerLine); malformed lines
// are skipped with a warning naming the line, never the token. source
// labels the warnings.
func ParsePeers(text, source string, log *slog.Logger) map[string]string {
	peers := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		peer, token, err := handshake.ParsePeerLine(sc.Text())
		switch {
		case err != nil:
			log.Warn("skipping peers line", "source", source, "line", n, "error", err)
		case peer != "":
			peers[peer] = token
		}
	}
	return peers
}

// LoadPeers returns the tokens the worker holds: the peers file when one is
// configured (it wins over the inline list), else the inline list. An
// unreadable file means no tokens ("open mode"), with a warning.
func LoadPeers(file, inline string, log *slog.Logger) map[string]string {
	if file == "" {
		return ParsePeers(inline, "inline peers", log)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			log.Warn("peers file does not exist: connecting without tokens", "file", file)
		} else {
			log.Warn("peers file unreadable: connecting without tokens", "file", file, "error", err)
		}
		return map[string]string{}
	}
	return ParsePeers(string(b), file, log)
}

// peerIDs lists the peers (never the tokens) for logs.
func peerIDs(peers map[string]string) []string {
	ids := make([]string, 0, len(peers))
	for id := range peers {
		ids = append(ids, id)
	}
	return ids
}

// samePeers reports whether two token sets are equal.
func samePeers(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// answerChallenge is the AuthResponse to a mid-session AuthChallenge.
func answerChallenge(tokens map[string]string, ch *wire.AuthChallenge) *wire.AuthResponse {
	return &wire.AuthResponse{Tokens: handshake.AnswerChallenge(ch.Peers, tokens)}
}
