package narstore

import (
	"context"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
)

// Sums reads a compressed object from r to its end and returns its file
// hash and size and, decompressed (with the window bound uploads get), its
// NAR hash and size, passing the NAR to inspect if not nil. Key is set. A
// stream that is not valid zstd is ErrCorrupt; a failing r returns r's
// error, so callers can tell a bad object from a broken connection.
func Sums(ctx context.Context, r io.Reader, inspect io.Writer) (Object, error) {
	file := newCountingHash()
	src := &errReader{r: &contextReader{ctx: ctx, r: r}}
	tee := io.TeeReader(src, file)
	nar := newCountingHash()
	var sink io.Writer = nar
	if inspect != nil {
		sink = io.MultiWriter(nar, inspect)
	}
	dec := decoders.Get().(*zstd.Decoder)
	err := dec.Reset(tee)
	if err == nil {
		_, err = dec.WriteTo(sink)
	}
	dec.Reset(nil)
	decoders.Put(dec)
	if err == nil {
		// Bytes after the last frame still count towards the file sums.
		_, err = io.Copy(io.Discard, tee)
	}
	if src.err != nil && src.err != io.EOF {
		return Object{}, src.err
	}
	if err != nil {
		return Object{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	o := Object{NarHash: nar.sum(), NarSize: nar.n, FileHash: file.sum(), FileSize: file.n}
	o.Key = KeyOf(o.FileHash)
	return o, nil
}

// errReader remembers its reader's first error.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}

// ValidKey reports whether key is a well-formed object key (the nix32 of
// a SHA-256), for backends other than Local.
func ValidKey(key string) bool { return validKey(key) }
