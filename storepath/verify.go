package storepath

import (
	"bytes"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"errors"
	"fmt"
	stdhash "hash"
	"io"

	"gradient.dev/gradient/nixbase32"
)

// Verifier checks that a NAR is the content its content address
// certifies: written the NAR (uncompressed, in order), Check compares the
// hash of the whole NAR (recursive) or of the single file it must hold
// (text, flat) with the address's digest. It buffers only a NAR's header,
// so any size streams through. Write never fails: the verdict waits for
// Check, so a caller can tee a stream into it without the stream's reader
// mistaking a refusal for a read error.
//
// A recursive path that references itself is hashed modulo its own hash
// part (NewSelfVerifier).
type Verifier struct {
	ca   ContentAddress
	sum  stdhash.Hash
	self *rewriter // nil: no self-reference
	// Single-file NARs: the header still expected (filled up to the
	// contents' length), the contents left, the padding and trailer.
	head     []byte
	headPos  int
	size     uint64
	left     uint64
	trailer  []byte
	trailPos int
	n        int64
	err      error
}

// NewVerifier returns a Verifier for ca.
func NewVerifier(ca ContentAddress) *Verifier {
	v := &Verifier{ca: ca, sum: newHash(ca.Algo)}
	if ca.Method != Recursive {
		v.head = append(narStrings("nix-archive-1", "(", "type", "regular", "contents"), make([]byte, 8)...)
	}
	return v
}

// NewSelfVerifier returns a Verifier for a recursive ca whose path, of
// hash part selfHash, references itself: Nix hashes its NAR with every
// occurrence of selfHash zeroed, then the occurrences' offsets.
func NewSelfVerifier(ca ContentAddress, selfHash string) *Verifier {
	v := NewVerifier(ca)
	if ca.Method == Recursive {
		v.self = &rewriter{from: []byte(selfHash), out: v.sum}
	}
	return v
}

// rewriter zeroes every occurrence of from in a stream, remembering the
// offsets, as Nix's HashModuloSink does.
type rewriter struct {
	from    []byte
	out     io.Writer
	prev    []byte // the tail that may begin an occurrence
	pos     int64  // bytes passed on
	matches []int64
}

func (r *rewriter) write(p []byte) {
	s := append(r.prev, p...)
	for j := 0; ; {
		k := bytes.Index(s[j:], r.from)
		if k < 0 {
			break
		}
		j += k
		r.matches = append(r.matches, r.pos+int64(j))
		clear(s[j : j+len(r.from)])
		j += len(r.from)
	}
	keep := min(len(s), len(r.from)-1)
	done := len(s) - keep
	r.out.Write(s[:done])
	r.pos += int64(done)
	r.prev = append(make([]byte, 0, len(r.from)), s[done:]...)
}

func (r *rewriter) finish() {
	r.out.Write(r.prev)
	r.pos += int64(len(r.prev))
	r.prev = nil
	for _, at := range r.matches {
		fmt.Fprintf(r.out, "|%d", at)
	}
}

// narStrings is the NAR encoding of strings: each a little-endian u64
// length, the bytes, zeros up to a multiple of 8.
func narStrings(ss ...string) []byte {
	var b []byte
	for _, s := range ss {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
		b = append(b, make([]byte, pad(uint64(len(s))))...)
	}
	return b
}

func pad(n uint64) uint64 { return (8 - n%8) % 8 }

// errNotSingleFile is the refusal of a text or flat address's NAR.
var errNotSingleFile = errors.New("the NAR is not a single non-executable regular file")

func (v *Verifier) Write(p []byte) (int, error) {
	n := len(p)
	v.n += int64(n)
	if v.err != nil {
		return n, nil
	}
	if v.ca.Method == Recursive {
		if v.self != nil {
			v.self.write(p)
		} else {
			v.sum.Write(p)
		}
		return n, nil
	}
	// The header up to the contents' length field.
	for v.headPos < len(v.head)-8 && len(p) > 0 {
		if p[0] != v.head[v.headPos] {
			v.err = errNotSingleFile
			return n, nil
		}
		v.headPos, p = v.headPos+1, p[1:]
	}
	// The length itself.
	for v.headPos < len(v.head) && len(p) > 0 {
		v.head[v.headPos] = p[0]
		v.headPos, p = v.headPos+1, p[1:]
		if v.headPos == len(v.head) {
			v.size = binary.LittleEndian.Uint64(v.head[len(v.head)-8:])
			v.left = v.size
			v.trailer = append(make([]byte, pad(v.size)), narStrings(")")...)
		}
	}
	if v.headPos < len(v.head) {
		return n, nil
	}
	take := min(uint64(len(p)), v.left)
	v.sum.Write(p[:take])
	v.left -= take
	p = p[take:]
	if len(p) > len(v.trailer)-v.trailPos || !bytes.Equal(p, v.trailer[v.trailPos:v.trailPos+len(p)]) {
		v.err = errNotSingleFile
		return n, nil
	}
	v.trailPos += len(p)
	return n, nil
}

// Check is the verdict on everything written.
func (v *Verifier) Check() error {
	if v.err == nil && v.ca.Method != Recursive && (v.headPos < len(v.head) || v.left > 0 || v.trailPos < len(v.trailer)) {
		v.err = fmt.Errorf("%w (it ends after %d bytes)", errNotSingleFile, v.n)
	}
	if v.err != nil {
		return invalid("content address %s: %v", v.ca, v.err)
	}
	if v.self != nil {
		v.self.finish()
		v.self = nil
	}
	got := v.sum.Sum(nil)
	if !bytes.Equal(got, v.ca.Digest) {
		what := "the file's"
		if v.ca.Method == Recursive {
			what = "the NAR's"
		}
		return invalid("content address %s: %s %s hash is %s", v.ca, what, v.ca.Algo, nixbase32.Encode(got))
	}
	return nil
}

func newHash(algo string) stdhash.Hash {
	switch algo {
	case "md5":
		return md5.New()
	case "sha1":
		return sha1.New()
	case "sha512":
		return sha512.New()
	}
	return sha256.New()
}
