package proxystore

import (
	"bufio"
	"errors"
	"fmt"
	"strings"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/storage/sqldb"
)

// PeerToken is one token of an upstream link: a peer (project, cache) on
// the tenant's server registered the proxy's worker ID with it.
type PeerToken struct {
	PeerID string
	Token  string
}

// maxPeersFile bounds a peers file the operator hands in.
const maxPeersFile = 1 << 20

// ParsePeersFile reads the peers-file lines a tenant hands over,
// `peer_id:token` as in a worker's peers file (handshake.ParsePeerLine):
// blank lines and # comments are skipped. Unlike a worker, which skips
// bad lines, it refuses the whole text, naming every bad line by number
// and never quoting a token. The peer ID is a UUID or the wildcard "*".
func ParsePeersFile(text string) ([]PeerToken, error) {
	if len(text) > maxPeersFile {
		return nil, sqldb.Invalid("peers file is larger than %d bytes", maxPeersFile)
	}
	var peers []PeerToken
	var errs []error
	seen := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 4096), maxPeersFile)
	for n := 1; sc.Scan(); n++ {
		peer, token, err := handshake.ParsePeerLine(sc.Text())
		if err == nil && peer == "" {
			continue
		}
		if err == nil {
			peer, err = checkPeerToken(PeerToken{peer, token})
		}
		if err == nil && seen[peer] != 0 {
			err = fmt.Errorf("peer %s is already on line %d", peer, seen[peer])
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", n, err))
			continue
		}
		seen[peer] = n
		peers = append(peers, PeerToken{PeerID: peer, Token: token})
	}
	if err := sc.Err(); err != nil {
		return nil, sqldb.Invalid("peers file: %v", err)
	}
	if len(errs) > 0 {
		return nil, sqldb.Invalid("peers file: %w", errors.Join(errs...))
	}
	if len(peers) == 0 {
		return nil, sqldb.Invalid("peers file has no peer_id:token line")
	}
	return peers, nil
}

// checkPeerToken validates one token of a link and returns its peer ID
// in canonical form. Errors never quote the token.
func checkPeerToken(p PeerToken) (string, error) {
	peer := p.PeerID
	if peer != handshake.WildcardPeer {
		var err error
		if peer, err = sqldb.CanonicalUUID("peer ID", p.PeerID); err != nil {
			return "", fmt.Errorf("peer ID %q is neither a UUID nor %q", p.PeerID, handshake.WildcardPeer)
		}
	}
	if len(p.Token) != handshake.PeerTokenLength {
		return "", fmt.Errorf("peer %s: the token must be %d characters, not %d", peer, handshake.PeerTokenLength, len(p.Token))
	}
	for i := 0; i < len(p.Token); i++ {
		if c := p.Token[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return "", fmt.Errorf("peer %s: the token holds a space, colon or non-ASCII byte", peer)
		}
	}
	return peer, nil
}
