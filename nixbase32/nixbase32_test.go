package nixbase32

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"testing"
)

// Known values from `nix-hash --type sha256|sha1 --to-base32 HEX` (Nix 2.8).
var known = []struct{ hex, nix32 string }{
	{"2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", "094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic"}, // sha256("hello")
	{"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "0mdqa9w1p6cmli6976v4wi0sw9r4p5prkj7lzfd1877wk11c9c73"}, // sha256("")
	{"aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d", "9m1skbnr5i43n3yypvda5s65vhfwdx5a"},                                             // sha1("hello")
	{"", ""},
}

func TestKnownValues(t *testing.T) {
	for _, k := range known {
		raw, _ := hex.DecodeString(k.hex)
		if got := Encode(raw); got != k.nix32 {
			t.Errorf("Encode(%s) = %s, want %s", k.hex, got, k.nix32)
		}
		back, err := Decode(k.nix32)
		if err != nil || !bytes.Equal(back, raw) {
			t.Errorf("Decode(%s) = %x, %v; want %s", k.nix32, back, err, k.hex)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for n := range 70 {
		b := make([]byte, n)
		rand.Read(b)
		s := Encode(b)
		if len(s) != EncodedLen(n) {
			t.Fatalf("len %d: encoded %d chars, want %d", n, len(s), EncodedLen(n))
		}
		back, err := Decode(s)
		if err != nil || !bytes.Equal(back, b) {
			t.Fatalf("len %d: round trip gave %x, %v", n, back, err)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, s := range []string{
		"e94qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic", // 'e' is not in the alphabet
		"z94qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic", // high bits beyond 32 bytes set
		"094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwiC",
	} {
		if _, err := Decode(s); err == nil {
			t.Errorf("Decode(%q) accepted", s)
		}
	}
}
