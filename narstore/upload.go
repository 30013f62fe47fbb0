package narstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/internal/zstdbound"
)

// ErrCorrupt is returned by Commit when the uploaded bytes are not a
// complete zstd stream.
var ErrCorrupt = errors.New("narstore: object is not a valid zstd stream")

// Upload receives an object that is already compressed (a worker relays
// its own zstd stream; the server never recompresses it). Write takes the
// bytes as they arrive and never retains p, so the caller may reuse the
// buffer once Write returns. Nothing is visible until Commit succeeds.
type Upload interface {
	io.Writer
	// Written is how many compressed bytes were written so far.
	Written() int64
	// Commit decompresses what was written to learn the NAR's hash and
	// size, passing the NAR to inspect on the way (if not nil), lets
	// verify refuse the sums (and what inspect learnt), and makes the
	// object visible. inspect's Write must not fail.
	Commit(ctx context.Context, inspect io.Writer, verify func(Object) error) (Object, error)
	// Abort drops the upload; harmless after Commit or a second Abort.
	Abort()
}

// decoders are reused like encoders: a decoder allocates its window once.
// Uploads come from workers: the window a frame may declare is bounded
// (a refused one fails Commit with ErrCorrupt).
var decoders = sync.Pool{New: func() any {
	dec, err := zstd.NewReader(nil, append(zstdbound.DecoderOptions(),
		zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))...)
	if err != nil {
		panic(err) // only invalid options fail
	}
	return dec
}}

// Create implements Store: the bytes go to a temporary file in the store
// directory, hashed on the way.
func (l *Local) Create(ctx context.Context) (Upload, error) {
	tmp, err := l.stage()
	if err != nil {
		return nil, fmt.Errorf("nar store: %w", err)
	}
	return &localUpload{l: l, tmp: tmp, f: tmp.f, file: newCountingHash()}, nil
}

type localUpload struct {
	l    *Local
	tmp  staged
	f    *os.File // tmp.f
	file *countingHash
	done bool
}

func (u *localUpload) Write(p []byte) (int, error) {
	n, err := u.f.Write(p)
	u.file.Write(p[:n])
	if err != nil {
		return n, fmt.Errorf("nar store: %w", err)
	}
	return n, nil
}

func (u *localUpload) Written() int64 { return u.file.n }

func (u *localUpload) Commit(ctx context.Context, inspect io.Writer, verify func(Object) error) (obj Object, err error) {
	if u.done {
		return Object{}, errors.New("nar store: upload already finished")
	}
	defer func() {
		if err != nil {
			u.Abort()
		}
	}()
	obj = Object{FileHash: u.file.sum(), FileSize: u.file.n}
	obj.Key = KeyOf(obj.FileHash)
	// The NAR sums come from the bytes actually stored, so a worker's
	// claimed NarHash is checked, not trusted.
	if _, err = u.f.Seek(0, io.SeekStart); err != nil {
		return Object{}, fmt.Errorf("nar store: %w", err)
	}
	nar := newCountingHash()
	var sink io.Writer = nar
	if inspect != nil {
		sink = io.MultiWriter(nar, inspect)
	}
	dec := decoders.Get().(*zstd.Decoder)
	if err = dec.Reset(&contextReader{ctx: ctx, r: u.f}); err == nil {
		_, err = dec.WriteTo(sink)
	}
	dec.Reset(nil) // drop the reference to the file before pooling
	decoders.Put(dec)
	if err != nil {
		if ctx.Err() != nil {
			return Object{}, ctx.Err()
		}
		return Object{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	obj.NarHash, obj.NarSize = nar.sum(), nar.n
	if verify != nil {
		if err = verify(obj); err != nil {
			return Object{}, err
		}
	}
	if err = u.l.place(u.tmp, obj.Key); err != nil {
		return Object{}, fmt.Errorf("nar store: %w", err)
	}
	u.done = true
	return obj, nil
}

func (u *localUpload) Abort() {
	if u.done {
		return
	}
	u.done = true
	u.tmp.discard()
}
