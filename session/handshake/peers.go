package handshake

import (
	"errors"
	"fmt"
	"strings"
)

// PeerTokenLength is the only accepted token length of a peers file
// (base64 of 48 random bytes).
const PeerTokenLength = 64

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
