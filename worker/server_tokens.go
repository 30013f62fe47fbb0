package worker

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// ServerTokens is the accepted-server-tokens file of a server-dialed worker
// (docs/protocol/worker.md §2.2): `peer_id:hash` lines, the hash an argon2id PHC string or
// the hex SHA-256 of the token, `*` matching any peer. It implements
// session.ServerVerifier.
type ServerTokens struct {
	workerID string
	hashes   map[string][]string // peer → accepted hashes
	// unreadable: the file is configured but could not be read, so every
	// server is rejected rather than every server accepted.
	unreadable bool
	log        *slog.Logger
}

// LoadServerTokens reads the accepted-server-tokens file. An unreadable file
// is not an error: it rejects every server (and says so in the log).
func LoadServerTokens(file, workerID string, log *slog.Logger) *ServerTokens {
	st := &ServerTokens{workerID: workerID, hashes: map[string][]string{}, log: log}
	f, err := os.Open(file)
	if err != nil {
		log.Warn("accepted server tokens file unreadable: rejecting every server", "file", file, "error", err)
		st.unreadable = true
		return st
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		peer, hash, found := strings.Cut(line, ":")
		peer, hash = strings.TrimSpace(peer), strings.TrimSpace(hash)
		if !found || peer == "" || hash == "" {
			log.Warn("skipping malformed accepted server tokens line: want peer_id:hash", "file", file, "line", n)
			continue
		}
		st.hashes[peer] = append(st.hashes[peer], hash)
	}
	if err := sc.Err(); err != nil {
		log.Warn("accepted server tokens file unreadable: rejecting every server", "file", file, "error", err)
		st.unreadable = true
	}
	return st
}

// VerifyServer accepts a dialing server when it names this worker and every
// token it presents matches a hash of its peer (or of `*`).
func (st *ServerTokens) VerifyServer(workerID string, tokens []wire.Pair[string, string]) bool {
	if st.unreadable || !strings.EqualFold(workerID, st.workerID) || len(tokens) == 0 {
		return false
	}
	for _, p := range tokens {
		if !st.accepts(p.First, p.Second) {
			st.log.Warn("dialing server presented a token that is not accepted", "peer", p.First)
			return false
		}
	}
	return true
}

func (st *ServerTokens) accepts(peer, token string) bool {
	for _, h := range st.hashes[peer] {
		if secret.Verify(h, token) {
			return true
		}
	}
	for _, h := range st.hashes[handshake.WildcardPeer] {
		if secret.Verify(h, token) {
			return true
		}
	}
	return false
}

// String describes the file's content without hashes.
func (st *ServerTokens) String() string {
	return fmt.Sprintf("accepted server tokens for %d peers", len(st.hashes))
}
