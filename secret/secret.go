// Package secret makes and checks the bearer tokens that workers, peers and
// operators present to the server. Only hashes are ever stored; tokens are
// never logged.
package secret

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"
)

// tokenBytes is the entropy of a generated token. 48 bytes encode to exactly
// 64 URL-safe base64 characters, the length of Gradient's other keys.
const tokenBytes = 48

// Argon2id parameters for new hashes: OWASP's recommended minimum
// (m=19 MiB, t=2, p=1). One Hash or Verify takes roughly 20-40 ms on the
// project's 2-core machines, well under the 100 ms budget of a handshake,
// and needs 19 MiB while it runs. Verify reads the parameters back from each
// stored string, so they can be raised later without invalidating old hashes.
const (
	argonMemoryKiB = 19 * 1024
	argonTime      = 2
	argonThreads   = 1
	argonSaltLen   = 16
	argonKeyLen    = 32
)

// Bounds on parameters read from stored strings, so a corrupt or hostile
// row cannot make one Verify allocate gigabytes or spin for minutes.
const (
	maxMemoryKiB = 1 << 20 // 1 GiB
	maxTime      = 64
	maxThreads   = 64
	maxKeyLen    = 1024
)

// Generate returns a new random token as URL-safe text (base64url, no
// padding) that fits in a worker's peers file as peer_id:token.
func Generate() (string, error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// Hash returns the argon2id PHC string of token:
// $argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash> (unpadded standard base64).
func Hash(token string) (string, error) {
	salt := make([]byte, argonSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("hash token: %w", err)
	}
	key := argon2.IDKey([]byte(token), salt, argonTime, argonMemoryKiB, argonThreads, argonKeyLen)
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s",
		argon2.Version, argonMemoryKiB, argonTime, argonThreads,
		phcBase64.EncodeToString(salt), phcBase64.EncodeToString(key)), nil
}

// Verify reports whether token matches stored. A stored value starting with
// '$' is a PHC argon2id (or argon2i) string; anything else must be the
// lowercase hex SHA-256 of the token. Malformed stored values never match.
func Verify(stored, token string) bool {
	if strings.HasPrefix(stored, "$") {
		return verifyPHC(stored, token)
	}
	return verifySHA256(stored, token)
}

func verifySHA256(stored, token string) bool {
	if len(stored) != 2*sha256.Size || strings.ToLower(stored) != stored {
		return false
	}
	want, err := hex.DecodeString(stored)
	if err != nil {
		return false
	}
	got := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(got[:], want) == 1
}

// phcBase64 is the PHC string format's base64: standard alphabet, no padding.
var phcBase64 = base64.RawStdEncoding
