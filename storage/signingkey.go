package storage

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
)

// SigningKey is a cache's Nix binary-cache key pair. Its text forms are
// the ones nix-store --generate-binary-cache-key writes:
// secret NAME:base64(64-byte ed25519 private key), public
// NAME:base64(32-byte public key); signatures are NAME:base64(signature).
type SigningKey struct {
	Name    string
	Private ed25519.PrivateKey
}

// GenerateSigningKey makes a new key pair called name.
func GenerateSigningKey(name string) (SigningKey, error) {
	if err := validKeyName(name); err != nil {
		return SigningKey{}, err
	}
	_, private, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return SigningKey{}, fmt.Errorf("generate signing key: %w", err)
	}
	return SigningKey{Name: name, Private: private}, nil
}

// ParseSigningKey reads a secret key in Nix's NAME:base64 form.
func ParseSigningKey(text string) (SigningKey, error) {
	name, key, err := parseNixKey(text, ed25519.PrivateKeySize)
	if err != nil {
		return SigningKey{}, fmt.Errorf("secret signing key: %w", err)
	}
	return SigningKey{Name: name, Private: ed25519.PrivateKey(key)}, nil
}

// ParsePublicKey reads a public key in Nix's NAME:base64 form.
func ParsePublicKey(text string) (name string, key ed25519.PublicKey, err error) {
	name, raw, err := parseNixKey(text, ed25519.PublicKeySize)
	if err != nil {
		return "", nil, fmt.Errorf("public signing key: %w", err)
	}
	return name, ed25519.PublicKey(raw), nil
}

// SecretKeyText is the secret key in Nix's form (a secret: never log it).
func (k SigningKey) SecretKeyText() string {
	return k.Name + ":" + base64.StdEncoding.EncodeToString(k.Private)
}

// PublicKeyText is the public key in Nix's form, for trusted-public-keys.
func (k SigningKey) PublicKeyText() string {
	public := k.Private.Public().(ed25519.PublicKey)
	return k.Name + ":" + base64.StdEncoding.EncodeToString(public)
}

// Sign signs a narinfo fingerprint and returns NAME:base64(signature).
func (k SigningKey) Sign(fingerprint []byte) string {
	return k.Name + ":" + base64.StdEncoding.EncodeToString(ed25519.Sign(k.Private, fingerprint))
}

func parseNixKey(text string, size int) (string, []byte, error) {
	name, encoded, ok := strings.Cut(text, ":")
	if !ok {
		return "", nil, invalid("want NAME:base64")
	}
	if err := validKeyName(name); err != nil {
		return "", nil, err
	}
	raw, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return "", nil, invalid("key is not base64")
	}
	if len(raw) != size {
		return "", nil, invalid("key is %d bytes, want %d", len(raw), size)
	}
	return name, raw, nil
}

// validKeyName keeps names that Nix's NAME:base64 forms can carry.
func validKeyName(name string) error {
	if name == "" {
		return invalid("signing key name is empty")
	}
	if strings.ContainsAny(name, ": \t\r\n") {
		return invalid("signing key name %q may not contain ':' or whitespace", name)
	}
	return nil
}
