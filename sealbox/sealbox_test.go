package sealbox

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func mustBox(t *testing.T, key []byte) *Box {
	t.Helper()
	b, err := New(key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSealOpen(t *testing.T) {
	box := mustBox(t, NewKey())
	owner := []byte("registration/project/p/w")
	a, b := box.Seal([]byte("token"), owner), box.Seal([]byte("token"), owner)
	if bytes.Equal(a, b) {
		t.Fatal("two seals of one value are equal: the nonce is not random")
	}
	if bytes.Contains(a, []byte("token")) {
		t.Fatal("plaintext visible in the sealed value")
	}
	got, err := box.Open(a, owner)
	if err != nil || string(got) != "token" {
		t.Fatalf("Open = %q, %v", got, err)
	}

	other := mustBox(t, NewKey())
	tampered := bytes.Clone(a)
	tampered[len(tampered)-1] ^= 1
	for name, open := range map[string]func() ([]byte, error){
		"other owner": func() ([]byte, error) { return box.Open(a, []byte("registration/project/p/x")) },
		"other key":   func() ([]byte, error) { return other.Open(a, owner) },
		"tampered":    func() ([]byte, error) { return box.Open(tampered, owner) },
		"truncated":   func() ([]byte, error) { return box.Open(a[:10], owner) },
		"empty":       func() ([]byte, error) { return box.Open(nil, owner) },
	} {
		if _, err := open(); !errors.Is(err, ErrOpen) {
			t.Errorf("%s: err = %v, want ErrOpen", name, err)
		}
	}
}

func TestKeys(t *testing.T) {
	if _, err := New(make([]byte, 16)); err == nil {
		t.Fatal("a 16-byte key was accepted")
	}
	key := NewKey()
	dir := t.TempDir()
	for name, content := range map[string][]byte{
		"raw":    key,
		"base64": []byte("  " + EncodeKey(key) + "\n"),
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		box, err := OpenKeyFile(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, err := box.Open(mustBox(t, key).Seal([]byte("x"), nil), nil); err != nil || string(got) != "x" {
			t.Fatalf("%s: key read differently: %v", name, err)
		}
	}
	if _, err := ParseKey([]byte("c2hvcnQ=")); err == nil {
		t.Fatal("a short base64 key was accepted")
	}
}
