package secret

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/crypto/argon2"
)

func TestGenerateIsRandomURLSafeText(t *testing.T) {
	a, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatal("two generated tokens are equal")
	}
	raw, err := base64.RawURLEncoding.DecodeString(a)
	if err != nil {
		t.Fatalf("token is not base64url: %v", err)
	}
	if len(raw) < 32 {
		t.Fatalf("token carries %d random bytes, want >= 32", len(raw))
	}
	if strings.ContainsAny(a, ":/+= \n") {
		t.Fatalf("token %q has characters unsafe in URLs or peers files", a)
	}
}

func TestHashIsArgon2idPHC(t *testing.T) {
	h, err := Hash("token")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h, "$argon2id$v=19$m=19456,t=2,p=1$") {
		t.Fatalf("hash %q is not the expected argon2id PHC string", h)
	}
	h2, _ := Hash("token")
	if h == h2 {
		t.Fatal("two hashes of one token are equal: salt is not random")
	}
}

func TestVerify(t *testing.T) {
	token, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	phc, err := Hash(token)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(token))
	shaHex := hex.EncodeToString(sum[:])
	_, phcRest, _ := strings.Cut(strings.TrimPrefix(phc, "$"), "$")

	tests := []struct {
		name   string
		stored string
		token  string
		want   bool
	}{
		{"argon2id right token", phc, token, true},
		{"argon2id wrong token", phc, token + "x", false},
		{"argon2id empty token", phc, "", false},
		{"sha256 right token", shaHex, token, true},
		{"sha256 wrong token", shaHex, "other", false},
		{"sha256 uppercase is not accepted", strings.ToUpper(shaHex), token, false},
		{"sha256 too short", shaHex[:62], token, false},
		{"sha256 not hex", strings.Repeat("z", 64), token, false},
		{"empty stored", "", token, false},
		{"empty stored empty token", "", "", false},
		{"phc unknown variant", "$argon2d$" + phcRest, token, false},
		{"phc missing parts", "$argon2id$v=19$m=19456,t=2,p=1", token, false},
		{"phc wrong version", strings.Replace(phc, "v=19", "v=16", 1), token, false},
		{"phc parameters reordered", strings.Replace(phc, "m=19456,t=2,p=1", "t=2,m=19456,p=1", 1), token, false},
		{"phc zero time", strings.Replace(phc, "t=2", "t=0", 1), token, false},
		{"phc huge memory", strings.Replace(phc, "m=19456", "m=99999999", 1), token, false},
		{"phc bad salt", replacePart(phc, 4, "!!!"), token, false},
		{"phc bad hash", replacePart(phc, 5, "@@@"), token, false},
		{"phc other parameters are read from the string", mustPHC(t, token, "m=8192,t=1,p=2"), token, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Verify(tt.stored, tt.token); got != tt.want {
				t.Fatalf("Verify = %v, want %v", got, tt.want)
			}
		})
	}
}

// mustPHC builds a PHC string with other parameters the way another
// argon2id implementation would.
func mustPHC(t *testing.T, token, params string) string {
	t.Helper()
	var m, tm, p uint32
	if _, err := fmt.Sscanf(params, "m=%d,t=%d,p=%d", &m, &tm, &p); err != nil {
		t.Fatal(err)
	}
	salt := []byte("0123456789abcdef")
	key := argon2.IDKey([]byte(token), salt, tm, m, uint8(p), argonKeyLen)
	return "$argon2id$v=19$" + params + "$" + phcBase64.EncodeToString(salt) + "$" + phcBase64.EncodeToString(key)
}

func replacePart(phc string, i int, with string) string {
	parts := strings.Split(phc, "$")
	parts[i] = with
	return strings.Join(parts, "$")
}

func BenchmarkVerify(b *testing.B) {
	phc, err := Hash("benchmark-token")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if !Verify(phc, "benchmark-token") {
			b.Fatal("Verify failed")
		}
	}
}

func BenchmarkVerifySHA256(b *testing.B) {
	sum := sha256.Sum256([]byte("benchmark-token"))
	stored := hex.EncodeToString(sum[:])
	b.ReportAllocs()
	for b.Loop() {
		if !Verify(stored, "benchmark-token") {
			b.Fatal("Verify failed")
		}
	}
}
