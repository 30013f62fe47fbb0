package storage

import (
	"errors"
	"strings"
	"testing"

	"gradient.dev/gradient/sealbox"
)

// A server with a key file keeps no cache signing key in the clear: new
// caches' keys are sealed, older ones are sealed at start, and a server
// without the key (or with another) cannot sign instead of signing wrongly.
func TestSigningKeysSealedAtRest(t *testing.T) {
	t.Parallel()
	forEachEngineURL(t, func(t *testing.T, _ Engine, dbURL string) {
		ctx := t.Context()
		db := openTestDB(t, dbURL)
		older := mustCache(t, db, "older") // made before the server had a key file
		olderKey, err := db.CacheSigningKey(ctx, older.ID)
		if err != nil {
			t.Fatal(err)
		}

		box, err := sealbox.New(sealbox.NewKey())
		if err != nil {
			t.Fatal(err)
		}
		db.SealSecretsWith(box)
		if n, err := db.SealStoredSigningKeys(ctx); err != nil || n != 1 {
			t.Fatalf("SealStoredSigningKeys = %d, %v; want 1 sealed", n, err)
		}
		if n, err := db.SealStoredSigningKeys(ctx); err != nil || n != 0 {
			t.Fatalf("second SealStoredSigningKeys = %d, %v; want 0", n, err)
		}
		newer, err := db.CreateCache(ctx, NewCache{Name: "newer"})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []Cache{older, newer} {
			var stored string
			if err := db.sql.QueryRowContext(ctx, `SELECT secret_key FROM caches WHERE id = $1`, c.ID).Scan(&stored); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(stored, sealedKeyPrefix) || strings.Contains(stored, c.Name+":") {
				t.Fatalf("cache %s: secret_key stored as %.20q…, want it sealed", c.Name, stored)
			}
			key, err := db.CacheSigningKey(ctx, c.ID)
			if err != nil {
				t.Fatalf("cache %s: %v", c.Name, err)
			}
			if key.PublicKeyText() != c.PublicKey() {
				t.Fatalf("cache %s: opened key's public half %s, want %s", c.Name, key.PublicKeyText(), c.PublicKey())
			}
		}
		if got, _ := db.CacheSigningKey(ctx, older.ID); got.SecretKeyText() != olderKey.SecretKeyText() {
			t.Fatal("sealing changed the older cache's key")
		}
		if n, err := db.CountSealedSigningKeys(ctx); err != nil || n != 2 {
			t.Fatalf("CountSealedSigningKeys = %d, %v; want 2", n, err)
		}

		withoutKey := openTestDB(t, dbURL)
		if _, err := withoutKey.CacheSigningKey(ctx, newer.ID); !errors.Is(err, ErrSealedKey) || !strings.Contains(err.Error(), "--dial-key-file") {
			t.Fatalf("no key file: err = %v, want ErrSealedKey naming --dial-key-file", err)
		}
		otherBox, _ := sealbox.New(sealbox.NewKey())
		withoutKey.SealSecretsWith(otherBox)
		if _, err := withoutKey.CacheSigningKey(ctx, newer.ID); !errors.Is(err, ErrSealedKey) {
			t.Fatalf("another key file: err = %v, want ErrSealedKey", err)
		}
	})
}
