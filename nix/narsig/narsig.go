// Package narsig checks Nix's narinfo signatures: a store path's
// metadata signed with Ed25519 over Nix's fingerprint, by keys written in
// Nix's NAME:base64 form (as nix.conf's trusted-public-keys lists them
// and as `gradient cache create` prints a cache's key).
package narsig

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// PublicKey is one trusted key.
type PublicKey struct {
	Name string
	Key  ed25519.PublicKey
}

// String is the key in Nix's NAME:base64 form.
func (k PublicKey) String() string {
	return k.Name + ":" + base64.StdEncoding.EncodeToString(k.Key)
}

// ParsePublicKey reads a key in Nix's NAME:base64 form.
func ParsePublicKey(text string) (PublicKey, error) {
	name, encoded, ok := strings.Cut(text, ":")
	if !ok || name == "" {
		return PublicKey{}, fmt.Errorf("public key %q: want NAME:base64", clip(text))
	}
	if strings.ContainsAny(name, " \t\r\n,") {
		return PublicKey{}, fmt.Errorf("public key %q: the name may not contain whitespace or commas", clip(text))
	}
	raw, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return PublicKey{}, fmt.Errorf("public key %q: the key is not base64", clip(text))
	}
	if len(raw) != ed25519.PublicKeySize {
		return PublicKey{}, fmt.Errorf("public key %q: %d bytes, want %d", clip(text), len(raw), ed25519.PublicKeySize)
	}
	return PublicKey{Name: name, Key: ed25519.PublicKey(raw)}, nil
}

// Keys is a set of trusted keys; the zero value (or nil) trusts none.
type Keys struct {
	keys []PublicKey
}

// ParseKeys reads keys separated by whitespace or commas (nix.conf
// separates them by spaces); an empty list is an empty set.
func ParseKeys(list string) (*Keys, error) {
	var k Keys
	var errs []error
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r' }) {
		key, err := ParsePublicKey(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		k.Add(key)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &k, nil
}

// Add trusts key too (once, however often it is added).
func (k *Keys) Add(key PublicKey) {
	if !slices.ContainsFunc(k.keys, func(have PublicKey) bool { return have.Name == key.Name && have.Key.Equal(key.Key) }) {
		k.keys = append(k.keys, key)
	}
}

// Merge returns a set with the keys of both (either may be nil).
func Merge(a, b *Keys) *Keys {
	out := &Keys{}
	for _, s := range []*Keys{a, b} {
		for _, key := range s.List() {
			out.Add(key)
		}
	}
	return out
}

// Len is the number of keys.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.keys)
}

// List returns the keys, in the order they were added.
func (k *Keys) List() []PublicKey {
	if k == nil {
		return nil
	}
	return slices.Clone(k.keys)
}

// Names are the keys' names, for messages and logs.
func (k *Keys) Names() []string {
	var names []string
	for _, key := range k.List() {
		names = append(names, key.Name)
	}
	return names
}

// Fingerprint is what Nix signs for a store path (ValidPathInfo::
// fingerprint): "1;<path>;<narHash>;<narSize>;<references>", the NAR hash
// as sha256:<nix32>, the references as full paths, sorted, without
// duplicates, separated by commas.
func Fingerprint(path, narHash string, narSize uint64, references []string) []byte {
	refs := slices.Compact(slices.Sorted(slices.Values(references)))
	b := make([]byte, 0, 64+len(path)+len(narHash)+len(refs)*64)
	b = append(b, "1;"...)
	b = append(b, path...)
	b = append(b, ';')
	b = append(b, narHash...)
	b = append(b, ';')
	b = strconv.AppendUint(b, narSize, 10)
	b = append(b, ';')
	for i, r := range refs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, r...)
	}
	return b
}

// Verify returns the signatures among sigs (NAME:base64 each) that a
// trusted key of the same name made over fingerprint. Signatures of
// unknown keys and malformed ones are skipped, as Nix skips them.
func (k *Keys) Verify(fingerprint []byte, sigs []string) (valid []string) {
	if k.Len() == 0 {
		return nil
	}
	for _, sig := range sigs {
		name, encoded, ok := strings.Cut(sig, ":")
		if !ok {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(encoded)
		if err != nil || len(raw) != ed25519.SignatureSize {
			continue
		}
		for _, key := range k.keys {
			if key.Name == name && ed25519.Verify(key.Key, fingerprint, raw) {
				valid = append(valid, sig)
				break
			}
		}
	}
	return valid
}

// SignerNames are the key names sigs claim, for messages (unverified,
// so at most 5 of them, each clipped: they are a peer's text).
func SignerNames(sigs []string) []string {
	var names []string
	for i, sig := range sigs {
		if i == 5 {
			return append(names, fmt.Sprintf("and %d more", len(sigs)-i))
		}
		name, _, _ := strings.Cut(sig, ":")
		names = append(names, strconv.Quote(clip(name)))
	}
	return names
}

// clip shortens what a peer sent for a message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
