package storage

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

func TestCaches(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		main, err := db.CreateCache(ctx, NewCache{Name: "main", Public: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.CreateCache(ctx, NewCache{Name: "main"}); !errors.Is(err, ErrConflict) {
			t.Fatalf("duplicate cache: err = %v, want ErrConflict", err)
		}
		if _, err := db.CreateCache(ctx, NewCache{Name: "x", KeyName: "bad:name"}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("key name with ':': err = %v, want ErrInvalid", err)
		}
		got, err := db.Cache(ctx, main.ID)
		if err != nil || got != main {
			t.Fatalf("Cache = %+v, %v; want %+v", got, err, main)
		}
		if got, err := db.CacheByName(ctx, "main"); err != nil || got.ID != main.ID {
			t.Fatalf("CacheByName = %+v, %v", got, err)
		}
		if err := db.SetCachePublic(ctx, main.ID, false); err != nil {
			t.Fatal(err)
		}
		if got, _ := db.Cache(ctx, main.ID); got.Public {
			t.Fatal("cache still public")
		}
		if err := db.SetCachePublic(ctx, NewID(), true); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown cache: err = %v", err)
		}
		mustCache(t, db, "aux")
		caches, err := db.ListCaches(ctx)
		if err != nil || len(caches) != 2 || caches[0].Name != "aux" {
			t.Fatalf("ListCaches = %+v, %v", caches, err)
		}
		if err := db.DeleteCache(ctx, main.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Cache(ctx, main.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted cache: err = %v", err)
		}
	})
}

func TestCacheKeyPairIsNixFormatAndSigns(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		for _, tt := range []struct{ cache, keyName string }{
			{"main", ""},
			{"other", "gradient.example.com-other"},
		} {
			cache, err := db.CreateCache(ctx, NewCache{Name: tt.cache, KeyName: tt.keyName})
			if err != nil {
				t.Fatal(err)
			}
			wantName := tt.keyName
			if wantName == "" {
				wantName = tt.cache
			}
			name, encoded, ok := strings.Cut(cache.PublicKey(), ":")
			if !ok || name != wantName {
				t.Fatalf("public key %q: want name %q", cache.PublicKey(), wantName)
			}
			public, err := base64.StdEncoding.DecodeString(encoded)
			if err != nil || len(public) != ed25519.PublicKeySize {
				t.Fatalf("public key is not base64 of 32 bytes: %v (%d bytes)", err, len(public))
			}

			key, err := db.CacheSigningKey(ctx, cache.ID)
			if err != nil {
				t.Fatal(err)
			}
			secretName, secretEncoded, _ := strings.Cut(key.SecretKeyText(), ":")
			private, err := base64.StdEncoding.DecodeString(secretEncoded)
			if secretName != wantName || err != nil || len(private) != ed25519.PrivateKeySize {
				t.Fatalf("secret key is not NAME:base64(64 bytes): name %q, %v, %d bytes", secretName, err, len(private))
			}
			if key.PublicKeyText() != cache.PublicKey() {
				t.Fatal("secret key does not belong to the published public key")
			}

			fingerprint := []byte("1;/nix/store/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-x;sha256:abc;1;")
			sigName, sig, _ := strings.Cut(key.Sign(fingerprint), ":")
			rawSig, err := base64.StdEncoding.DecodeString(sig)
			if sigName != wantName || err != nil {
				t.Fatalf("signature not NAME:base64: %q %v", sigName, err)
			}
			if !ed25519.Verify(ed25519.PublicKey(public), fingerprint, rawSig) {
				t.Fatal("signature does not verify with the public key")
			}
			_, parsed, err := ParsePublicKey(cache.PublicKey())
			if err != nil || !parsed.Equal(ed25519.PrivateKey(private).Public()) {
				t.Fatalf("ParsePublicKey: %v", err)
			}
		}
	})
}

func TestParseNixKeysRejectsMalformed(t *testing.T) {
	for _, text := range []string{"", "nocolon", ":AAAA", "name:not base64!", "name:" + base64.StdEncoding.EncodeToString(make([]byte, 31))} {
		if _, _, err := ParsePublicKey(text); err == nil {
			t.Fatalf("ParsePublicKey(%q) accepted", text)
		}
		if _, err := ParseSigningKey(text); err == nil {
			t.Fatalf("ParseSigningKey(%q) accepted", text)
		}
	}
}

func TestSubscriptions(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		team := mustTeam(t, db, "a")
		web := mustProject(t, db, team.ID, "web")
		api := mustProject(t, db, team.ID, "api")
		main := mustCache(t, db, "main")
		aux := mustCache(t, db, "aux")

		added, err := db.SubscribeProject(ctx, web.ID, main.ID)
		if err != nil || !added {
			t.Fatalf("subscribe: added=%v err=%v", added, err)
		}
		added, err = db.SubscribeProject(ctx, web.ID, main.ID)
		if err != nil || added {
			t.Fatalf("subscribe again: added=%v err=%v, want false, nil", added, err)
		}
		if _, err := db.SubscribeProject(ctx, web.ID, aux.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.SubscribeProject(ctx, api.ID, main.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.SubscribeProject(ctx, NewID(), main.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown project: err = %v", err)
		}
		if _, err := db.SubscribeProject(ctx, web.ID, NewID()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown cache: err = %v", err)
		}

		caches, err := db.ProjectCaches(ctx, web.ID)
		if err != nil || len(caches) != 2 || caches[0].Name != "aux" || caches[1].Name != "main" {
			t.Fatalf("ProjectCaches = %+v, %v", caches, err)
		}
		if caches[1].PublicKey() != main.PublicKey() {
			t.Fatal("ProjectCaches lost the public key")
		}
		projects, err := db.CacheProjects(ctx, main.ID)
		if err != nil || len(projects) != 2 {
			t.Fatalf("CacheProjects = %+v, %v", projects, err)
		}
		if err := db.UnsubscribeProject(ctx, web.ID, main.ID); err != nil {
			t.Fatal(err)
		}
		if err := db.UnsubscribeProject(ctx, web.ID, main.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unsubscribe twice: err = %v", err)
		}
		if err := db.DeleteCache(ctx, aux.ID); err != nil {
			t.Fatal(err)
		}
		caches, err = db.ProjectCaches(ctx, web.ID)
		if err != nil || len(caches) != 0 {
			t.Fatalf("after unsubscribe and cache deletion: %+v, %v", caches, err)
		}
	})
}
