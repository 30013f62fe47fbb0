package narsig

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"slices"
	"strings"
	"testing"
)

func newKey(t *testing.T, name string) (PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return PublicKey{Name: name, Key: pub}, priv
}

func sign(name string, priv ed25519.PrivateKey, fp []byte) string {
	return name + ":" + base64.StdEncoding.EncodeToString(ed25519.Sign(priv, fp))
}

func TestFingerprintIsNixs(t *testing.T) {
	// Nix's form: references sorted and unique, full paths, commas.
	got := string(Fingerprint("/nix/store/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-x", "sha256:1b8m03r63zqhnjf7l5wnldhh7c134ap5vpj0850ymkq1iyzicy5s", 120,
		[]string{"/nix/store/cccccccccccccccccccccccccccccccc-c", "/nix/store/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-b", "/nix/store/cccccccccccccccccccccccccccccccc-c"}))
	want := "1;/nix/store/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-x;sha256:1b8m03r63zqhnjf7l5wnldhh7c134ap5vpj0850ymkq1iyzicy5s;120;" +
		"/nix/store/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-b,/nix/store/cccccccccccccccccccccccccccccccc-c"
	if got != want {
		t.Errorf("fingerprint\n%s\nwant\n%s", got, want)
	}
	if got := string(Fingerprint("/nix/store/p", "sha256:h", 1, nil)); got != "1;/nix/store/p;sha256:h;1;" {
		t.Errorf("without references: %s", got)
	}
}

func TestVerify(t *testing.T) {
	trusted, priv := newKey(t, "cache.example-main")
	_, other := newKey(t, "cache.example-main") // same name, another key
	stranger, strangerPriv := newKey(t, "elsewhere-1")
	keys, err := ParseKeys(trusted.String())
	if err != nil {
		t.Fatal(err)
	}
	fp := Fingerprint("/nix/store/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-x", "sha256:h", 1, nil)
	good := sign(trusted.Name, priv, fp)
	for _, tc := range []struct {
		name string
		sigs []string
		want []string
	}{
		{"signed by the trusted key", []string{good}, []string{good}},
		{"unsigned", nil, nil},
		{"signed by another key of the same name", []string{sign(trusted.Name, other, fp)}, nil},
		{"signed by an untrusted key", []string{sign(stranger.Name, strangerPriv, fp)}, nil},
		{"over other metadata", []string{sign(trusted.Name, priv, Fingerprint("/nix/store/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-x", "sha256:h", 2, nil))}, nil},
		{"malformed ones skipped", []string{"nocolon", "cache.example-main:!!!", "cache.example-main:AAAA", good}, []string{good}},
	} {
		if got := keys.Verify(fp, tc.sigs); !slices.Equal(got, tc.want) {
			t.Errorf("%s: verified %v, want %v", tc.name, got, tc.want)
		}
	}
	var none *Keys
	if got := none.Verify(fp, []string{good}); got != nil {
		t.Errorf("an empty set verified %v", got)
	}
	if got := Merge(none, keys).Verify(fp, []string{good}); len(got) != 1 {
		t.Errorf("merged set verified %v", got)
	}
}

func TestParseKeys(t *testing.T) {
	a, _ := newKey(t, "a-1")
	b, _ := newKey(t, "b-1")
	keys, err := ParseKeys(" " + a.String() + ",\n" + b.String() + "  " + a.String())
	if err != nil {
		t.Fatal(err)
	}
	if got := keys.Names(); !slices.Equal(got, []string{"a-1", "b-1"}) {
		t.Errorf("names %v", got)
	}
	if keys, err := ParseKeys(""); err != nil || keys.Len() != 0 {
		t.Errorf("empty list: %v %v", keys, err)
	}
	for _, bad := range []string{"nokey", ":" + strings.TrimPrefix(a.String(), "a-1:"), "a-1:not base64!", "a-1:AAAA"} {
		if _, err := ParseKeys(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzParseKeys(f *testing.F) {
	f.Add("cache.nixos.org-1:6NCHdD59X431o0gWypbMrAURkbJ16ZPMQFGspcDShjY=")
	f.Add("a:AAAA, b:")
	f.Fuzz(func(t *testing.T, list string) {
		keys, err := ParseKeys(list)
		if err != nil {
			return
		}
		for _, k := range keys.List() {
			again, err := ParsePublicKey(k.String())
			if err != nil || again.Name != k.Name || !again.Key.Equal(k.Key) {
				t.Fatalf("%q does not read back: %v", k.String(), err)
			}
		}
		keys.Verify([]byte(list), strings.Fields(list))
	})
}

// BenchmarkVerify is the cost a pulled input-addressed path adds to its
// import: the fingerprint and one Ed25519 verification.
func BenchmarkVerify(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	keys := &Keys{}
	keys.Add(PublicKey{Name: "cache.example-main", Key: pub})
	refs := []string{"/nix/store/cccccccccccccccccccccccccccccccc-c", "/nix/store/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-b"}
	path, hash := "/nix/store/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-x", "sha256:1b8m03r63zqhnjf7l5wnldhh7c134ap5vpj0850ymkq1iyzicy5s"
	sigs := []string{sign("cache.example-main", priv, Fingerprint(path, hash, 120, refs))}
	b.ReportAllocs()
	for b.Loop() {
		if len(keys.Verify(Fingerprint(path, hash, 120, refs), sigs)) != 1 {
			b.Fatal("not verified")
		}
	}
}

func TestSignerNamesAreBounded(t *testing.T) {
	sigs := []string{"a-1:x", strings.Repeat("n", 200) + ":x", "c\x1b]0;title\a:x", "d:x", "e:x", "f:x", "g:x"}
	got := SignerNames(sigs)
	if len(got) != 6 || got[5] != "and 2 more" || len(got[1]) > 90 || strings.ContainsRune(got[2], 0x1b) {
		t.Errorf("signer names %q", got)
	}
}
