package worker

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// PeerTokenLength is the only accepted token length (base64 of 48 random
// bytes, WORKER.md §2.2).
const PeerTokenLength = 64

// WildcardPeer answers every challenged peer not listed explicitly.
const WildcardPeer = handshake.WildcardPeer

// ParsePeers reads `peer_id:token` lines (ParsePeerLine); malformed lines
// are skipped with a warning naming the line, never the token. source
// labels the warnings.
func ParsePeers(text, source string, log *slog.Logger) map[string]string {
	peers := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		peer, token, err := ParsePeerLine(sc.Text())
		switch {
		case err != nil:
			log.Warn("skipping peers line", "source", source, "line", n, "error", err)
		case peer != "":
			peers[peer] = token
		}
	}
	return peers
}

// ParsePeerLine reads one line of a peers file: blank lines and # comments
// give an empty peer; others split at the first colon into a peer ID and
// a token, both trimmed, and the token must be PeerTokenLength characters.
// Errors never quote the token.
func ParsePeerLine(line string) (peer, token string, err error) {
	line = strings.TrimSpace(line)
	if line == "" || strings.HasPrefix(line, "#") {
		return "", "", nil
	}
	peer, token, found := strings.Cut(line, ":")
	peer, token = strings.TrimSpace(peer), strings.TrimSpace(token)
	switch {
	case !found || peer == "" || token == "":
		return "", "", errors.New("malformed: want peer_id:token")
	case len(token) != PeerTokenLength:
		return "", "", fmt.Errorf("peer %q: the token must be %d characters, not %d", peer, PeerTokenLength, len(token))
	}
	return peer, token, nil
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
