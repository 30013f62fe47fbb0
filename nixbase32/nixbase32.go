// Package nixbase32 is Nix's base-32 encoding of hashes ("nix32"): the
// alphabet 0-9a-z without e, o, u and t, written from the last 5-bit group
// of the little-endian digest to the first. Store path hashes and the
// sha256:… hashes in narinfo files use it.
package nixbase32

import (
	"errors"
	"fmt"
	"strings"
)

// Alphabet is Nix's base-32 alphabet.
const Alphabet = "0123456789abcdfghijklmnpqrsvwxyz"

// EncodedLen is the length of the encoding of n bytes.
func EncodedLen(n int) int { return (n*8 + 4) / 5 }

// DecodedLen is the number of bytes an encoding of length n holds.
func DecodedLen(n int) int { return n * 5 / 8 }

// Encode returns the nix32 text of b, as nix-hash --to-base32 writes it.
func Encode(b []byte) string {
	n := EncodedLen(len(b))
	out := make([]byte, n)
	for i := n - 1; i >= 0; i-- {
		bit := i * 5
		j, k := bit/8, bit%8
		c := b[j] >> k
		if j+1 < len(b) {
			c |= b[j+1] << (8 - k)
		}
		out[n-1-i] = Alphabet[c&0x1f]
	}
	return string(out)
}

var errInvalid = errors.New("nixbase32: invalid encoding")

// Decode parses nix32 text. Bits beyond the decoded length must be zero,
// so every byte string has exactly one accepted encoding.
func Decode(s string) ([]byte, error) {
	out := make([]byte, DecodedLen(len(s)))
	for n := 0; n < len(s); n++ {
		digit := strings.IndexByte(Alphabet, s[len(s)-n-1])
		if digit < 0 {
			return nil, fmt.Errorf("%w: character %q", errInvalid, s[len(s)-n-1])
		}
		bit := n * 5
		i, j := bit/8, bit%8
		if i < len(out) {
			out[i] |= byte(digit << j)
		} else if byte(digit<<j) != 0 {
			return nil, errInvalid
		}
		if carry := byte(digit >> (8 - j)); i+1 < len(out) {
			out[i+1] |= carry
		} else if carry != 0 {
			return nil, errInvalid
		}
	}
	return out, nil
}
