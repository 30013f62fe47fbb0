// Package sealbox keeps secrets the server must be able to present again
// (the tokens it dials workers with) sealed at rest: AES-256-GCM under a
// server key that never reaches the database, a random nonce per value,
// and the owning row's identity as additional data so a sealed value copied
// to another row does not open.
package sealbox

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
)

// KeySize is the size of a key: 32 bytes selects AES-256.
const KeySize = 32

// version is the first byte of every sealed value, so a later format or
// key rotation can tell old values apart.
const version byte = 1

// ErrOpen is a sealed value that did not open: another key, another
// owner, or corrupted bytes.
var ErrOpen = errors.New("sealbox: value does not open with this key and owner")

// Box seals and opens values under one key. It is safe for concurrent use.
type Box struct {
	aead cipher.AEAD
}

// New makes a Box from a KeySize-byte key.
func New(key []byte) (*Box, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("sealbox: key must be %d bytes, got %d", KeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Box{aead: aead}, nil
}

// NewKey returns a fresh random key.
func NewKey() []byte {
	key := make([]byte, KeySize)
	rand.Read(key) // never fails (crypto/rand, Go 1.24+)
	return key
}

// EncodeKey is a key's text form for a key file: standard base64.
func EncodeKey(key []byte) string { return base64.StdEncoding.EncodeToString(key) }

// ParseKey reads a key file's content: the KeySize raw bytes, or their
// standard base64 (surrounding whitespace ignored), e.g. from
// `head -c 32 /dev/urandom | base64`.
func ParseKey(content []byte) ([]byte, error) {
	if len(content) == KeySize {
		return bytes.Clone(content), nil
	}
	key, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(content)))
	if err != nil || len(key) != KeySize {
		return nil, fmt.Errorf("sealbox: want %d raw bytes or their base64", KeySize)
	}
	return key, nil
}

// OpenKeyFile reads a key file and makes a Box from it.
func OpenKeyFile(path string) (*Box, error) {
	content, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	key, err := ParseKey(content)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return New(key)
}

// Seal encrypts plaintext for the owner named by aad:
// version | nonce | ciphertext+tag.
func (b *Box) Seal(plaintext, aad []byte) []byte {
	out := make([]byte, 1+b.aead.NonceSize(), 1+b.aead.NonceSize()+len(plaintext)+b.aead.Overhead())
	out[0] = version
	rand.Read(out[1:]) // a random 96-bit nonce per value
	return b.aead.Seal(out, out[1:], plaintext, aad)
}

// Open decrypts a value Seal made for the same aad; anything else is
// ErrOpen.
func (b *Box) Open(sealed, aad []byte) ([]byte, error) {
	n := b.aead.NonceSize()
	if len(sealed) < 1+n+b.aead.Overhead() || sealed[0] != version {
		return nil, ErrOpen
	}
	plain, err := b.aead.Open(nil, sealed[1:1+n], sealed[1+n:], aad)
	if err != nil {
		return nil, ErrOpen
	}
	return plain, nil
}
