package narstore

import (
	"context"
	"crypto/sha256"
	"hash"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// ZstdLevel is the zstd level of every NAR (docs/protocol/wire.md NAR_ZSTD_LEVEL).
const ZstdLevel = 6

// encoders are reused: a zstd encoder allocates its window tables once.
// One goroutine per encoder keeps the output deterministic and the memory
// per upload bounded.
var encoders = sync.Pool{New: func() any {
	enc, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(ZstdLevel)),
		zstd.WithEncoderConcurrency(1))
	if err != nil {
		panic(err) // only invalid options fail
	}
	return enc
}}

// countingHash is a writer that hashes and counts what passes through it.
type countingHash struct {
	h hash.Hash
	n int64
}

func newCountingHash() *countingHash { return &countingHash{h: sha256.New()} }

func (c *countingHash) Write(p []byte) (int, error) {
	c.h.Write(p)
	c.n += int64(len(p))
	return len(p), nil
}

func (c *countingHash) sum() (s [32]byte) {
	c.h.Sum(s[:0])
	return s
}

// Compress streams nar through zstd at ZstdLevel into dst, hashing and
// counting both sides, and returns the sums (Key set). It never buffers
// the whole NAR; its one encoder goroutine makes the output the same for
// the same NAR (a resumed upload relies on that).
func Compress(ctx context.Context, dst io.Writer, nar io.Reader) (Object, error) {
	narSum, fileSum := newCountingHash(), newCountingHash()
	enc := encoders.Get().(*zstd.Encoder)
	enc.Reset(io.MultiWriter(dst, fileSum))
	defer func() {
		enc.Reset(nil) // drop the reference to dst before pooling
		encoders.Put(enc)
	}()
	src := io.TeeReader(&contextReader{ctx: ctx, r: nar}, narSum)
	if _, err := enc.ReadFrom(src); err != nil {
		return Object{}, err
	}
	if err := enc.Close(); err != nil {
		return Object{}, err
	}
	o := Object{NarHash: narSum.sum(), NarSize: narSum.n, FileHash: fileSum.sum(), FileSize: fileSum.n}
	o.Key = KeyOf(o.FileHash)
	return o, nil
}

// contextReader stops a long copy when its context ends.
type contextReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *contextReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
