// Package pathmeta checks an upload's metadata by Nix's rules before
// anything is stored or signed: what its narinfo will carry, and the
// SHA-256 forms Nix writes. The cache's worker uploads and the admin
// API's pushes share it.
package pathmeta

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"

	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storepath"
)

// Check checks what a narinfo will carry of an upload's
// metadata by Nix's rules (package storepath), before anything is stored
// or signed. Admin pushes and worker uploads both pass through it.
func Check(storePath string, references []string, deriver, ca string) error {
	if _, _, err := storepath.Parse(storePath); err != nil {
		return fmt.Errorf("store path: %w", err)
	}
	for _, ref := range references {
		if _, err := storepath.Base(ref); err != nil {
			return fmt.Errorf("reference: %w", err)
		}
	}
	if deriver != "" {
		if _, err := storepath.Base(deriver); err != nil {
			return fmt.Errorf("deriver: %w", err)
		}
	}
	if ca != "" {
		if err := storepath.CheckCA(ca); err != nil {
			return err
		}
	}
	return nil
}

// ParseSHA256 reads a SHA-256 in any form Nix writes one: sha256:<nix32>,
// sha256:<hex>, SRI sha256-<base64>, or a bare nix32 or hex digest.
func ParseSHA256(s string) ([32]byte, error) {
	var sum [32]byte
	var raw []byte
	var err error
	if b64, ok := strings.CutPrefix(s, "sha256-"); ok {
		raw, err = base64.StdEncoding.DecodeString(b64)
	} else {
		digest := strings.TrimPrefix(s, "sha256:")
		switch len(digest) {
		case nixbase32.EncodedLen(32):
			raw, err = nixbase32.Decode(digest)
		case hex.EncodedLen(32):
			raw, err = hex.DecodeString(digest)
		default:
			return sum, invalidf("hash %q is not a SHA-256 (sha256:<nix32>, hex or SRI)", s)
		}
	}
	if err != nil || len(raw) != 32 {
		return sum, invalidf("hash %q is not a SHA-256 (sha256:<nix32>, hex or SRI)", s)
	}
	copy(sum[:], raw)
	return sum, nil
}

// invalidError is bad input, of kind storage.ErrInvalid.
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return e.msg }
func (e *invalidError) Unwrap() error { return storage.ErrInvalid }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}
