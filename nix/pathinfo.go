package nix

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"path"
	"strings"

	"gradient.dev/gradient/nixbase32"
)

// storeDir is the logical store directory; chroot stores keep it.
const storeDir = "/nix/store"

// NarHashNix32 returns the NAR hash as sha256:<nix32> (the narinfo and
// Gradient cache form), whichever form Nix printed.
func (p PathInfo) NarHashNix32() (string, error) {
	if !strings.HasPrefix(p.NarHash, "sha256") {
		return "", fmt.Errorf("nix: NAR hash of %s is not SHA-256: %q", p.Path, p.NarHash)
	}
	digest, err := decodeHash(p.NarHash)
	if err != nil {
		return "", fmt.Errorf("nix: NAR hash of %s: %w", p.Path, err)
	}
	return "sha256:" + nixbase32.Encode(digest), nil
}

// decodeHash reads "<algo>-<base64>" (SRI) or "<algo>:<nix32|hex|base64>".
func decodeHash(s string) ([]byte, error) {
	i := strings.IndexAny(s, "-:")
	if i < 0 {
		return nil, fmt.Errorf("hash %q has no algorithm prefix", s)
	}
	algo, encoded := s[:i], s[i+1:]
	if s[i] == '-' {
		digest, err := base64.StdEncoding.DecodeString(encoded)
		if err != nil {
			return nil, fmt.Errorf("hash %q: %w", s, err)
		}
		if want := digestSize(algo); want == 0 || len(digest) != want {
			return nil, fmt.Errorf("hash %q has %d bytes", s, len(digest))
		}
		return digest, nil
	}
	return decodeDigest(algo, encoded)
}

// decodeDigest reads a digest in any of Nix's encodings, told apart by
// length as Nix does.
func decodeDigest(algo, encoded string) ([]byte, error) {
	size := digestSize(algo)
	if size == 0 {
		return nil, fmt.Errorf("unknown hash algorithm %q", algo)
	}
	var digest []byte
	var err error
	switch len(encoded) {
	case hex.EncodedLen(size):
		digest, err = hex.DecodeString(encoded)
	case nixbase32.EncodedLen(size):
		digest, err = nixbase32.Decode(encoded)
	case base64.StdEncoding.EncodedLen(size):
		digest, err = base64.StdEncoding.DecodeString(encoded)
	default:
		return nil, fmt.Errorf("%s hash %q has an unexpected length", algo, encoded)
	}
	if err != nil {
		return nil, fmt.Errorf("%s hash %q: %w", algo, encoded, err)
	}
	if len(digest) != size {
		return nil, fmt.Errorf("%s hash %q has %d bytes", algo, encoded, len(digest))
	}
	return digest, nil
}

func digestSize(algo string) int {
	switch algo {
	case "md5":
		return 16
	case "sha1":
		return 20
	case "sha256", "blake3":
		return 32
	case "sha512":
		return 64
	}
	return 0
}

// baseName is a store path's file name (what narinfo files list).
func baseName(p string) string { return path.Base(p) }
