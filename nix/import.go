package nix

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"path/filepath"
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/internal/zstdbound"
	"gradient.dev/gradient/nix/daemon"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/storepath"
)

// NarImport is a store path to add from a NAR with known metadata.
type NarImport struct {
	StorePath  string // full /nix/store/... path
	NarHash    string // sha256:<nix32> (SRI and base 16 are accepted too)
	NarSize    int64
	References []string // full store paths
	Deriver    string   // full path or ""
	CA         string
	// Signatures are the narinfo's, NAME:base64 each: an input-addressed
	// path is added only when one verifies under a trusted key.
	Signatures []string
}

// NarMismatchError: a NAR's bytes do not match the hash or size it was
// announced with, or its compressed stream needs a zstd window beyond
// zstdbound.MaxWindow. The path was not added.
type NarMismatchError struct {
	Path    string
	Message string
}

func (e *NarMismatchError) Error() string {
	return fmt.Sprintf("nix: NAR of %s: %s", e.Path, e.Message)
}

// decoders are zstd decoders for imports (one holds ≈ 100 KiB of
// state and its window; a fresh one per import would be garbage per
// path). The stream comes from a server or proxy: its window is bounded.
var decoders = sync.Pool{New: func() any {
	d, err := zstd.NewReader(nil, append(zstdbound.DecoderOptions(), zstd.WithDecoderConcurrency(1))...)
	if err != nil {
		panic(err) // only for invalid options
	}
	return d
}}

// ImportNAR adds it to the store through the daemon (AddToStoreNar),
// streaming its NAR from zst, a zstd-compressed stream (as the server's
// cache stores it), without a temporary file. Its references must be
// valid already (Nix registers a path only after them).
//
// Only what vouches for itself is added (trust.go): a content-addressed
// path whose name and content match its CA (else a *NarMismatchError), an
// input-addressed one signed by a trusted key (else an
// *UntrustedPathError, before a byte is read), unless ImportUnsigned.
//
// The NAR is checked against it.NarHash and it.NarSize as it passes: the
// last bytes go to the daemon only once the whole stream (zst to its end,
// so a reader that checks the compressed bytes fails first) matched, so
// a wrong NAR fails with a *NarMismatchError and the daemon, which never
// saw a complete NAR, adds nothing. The daemon checks the hash again.
func (n *Nix) ImportNAR(ctx context.Context, it NarImport, zst io.Reader) error {
	imp, err := daemonImport(it)
	if err != nil {
		return err
	}
	ca, err := n.vouch(ctx, it, &imp)
	if err != nil {
		return err
	}
	dec := decoders.Get().(*zstd.Decoder)
	defer func() {
		dec.Reset(nil)
		decoders.Put(dec)
	}()
	if err := dec.Reset(zst); err != nil {
		return fmt.Errorf("nix: importing %s: %w", it.StorePath, err)
	}
	v := newNarVerifier(dec, it.StorePath, imp.NarHash, it.NarSize)
	v.ca = ca
	// vouch checked the signatures against the worker's keys, which the
	// daemon does not know. On the long operations' pool: the import holds its
	// connection while zst arrives, at the pace of a download (longOpConns).
	err = daemonError(ctx, n.longOpClient(0).AddToStoreNar(ctx, imp, v, true))
	if v.err != nil && !errors.Is(v.err, io.EOF) {
		// The stream's own failure says more than the daemon's
		// reaction to it (a broken connection).
		var mismatch *NarMismatchError
		if errors.As(v.err, &mismatch) {
			return mismatch
		}
		if zstdbound.Exceeded(v.err) {
			// Unusable like a corrupt object (the pull reports the path
			// unavailable), not a transient failure.
			return &NarMismatchError{Path: it.StorePath, Message: fmt.Sprintf("its zstd frame declares a window beyond the %d MiB limit", zstdbound.MaxWindow>>20)}
		}
		return fmt.Errorf("nix: importing %s: reading the NAR: %w", it.StorePath, v.err)
	}
	if err != nil {
		return fmt.Errorf("nix: importing %s: %w", it.StorePath, err)
	}
	return nil
}

// holdBack is how many bytes of a NAR the verifier keeps from the daemon
// until it checked the whole: more than the NAR's closing ")" token (a
// length and a padded byte), without which the daemon cannot finish
// parsing, so it cannot register the path.
const holdBack = 16

// narVerifier passes a NAR through, hashing and counting it, and holds
// its last holdBack bytes until the source ended and hash and size
// matched.
type narVerifier struct {
	src        io.Reader
	path       string
	want       []byte
	size, seen int64
	h          hash.Hash
	buf        []byte
	start, end int
	checked    bool
	ca         *storepath.Verifier // a content address the NAR must match, or nil
	err        error               // sticky: io.EOF after the last byte, or the failure
}

func newNarVerifier(src io.Reader, path string, want []byte, size int64) *narVerifier {
	return &narVerifier{src: src, path: path, want: want, size: size, h: sha256.New(), buf: make([]byte, 64<<10+holdBack)}
}

func (v *narVerifier) Read(p []byte) (int, error) {
	for {
		avail := v.end - v.start
		if !v.checked {
			avail -= holdBack
		}
		if avail > 0 {
			n := copy(p, v.buf[v.start:v.start+avail])
			v.start += n
			return n, nil
		}
		if v.err != nil {
			return 0, v.err
		}
		if v.checked {
			v.err = io.EOF
			return 0, io.EOF
		}
		v.end = copy(v.buf, v.buf[v.start:v.end])
		v.start = 0
		n, err := v.src.Read(v.buf[v.end:])
		v.h.Write(v.buf[v.end : v.end+n])
		if v.ca != nil {
			v.ca.Write(v.buf[v.end : v.end+n])
		}
		v.end += n
		v.seen += int64(n)
		switch {
		case v.seen > v.size:
			v.err = &NarMismatchError{Path: v.path, Message: fmt.Sprintf("more than the %d bytes announced", v.size)}
		case err == io.EOF:
			if v.seen != v.size {
				v.err = &NarMismatchError{Path: v.path, Message: fmt.Sprintf("%d bytes, announced %d", v.seen, v.size)}
			} else if sum := v.h.Sum(nil); !bytes.Equal(sum, v.want) {
				v.err = &NarMismatchError{Path: v.path, Message: fmt.Sprintf("hash sha256:%s, announced sha256:%s",
					nixbase32.Encode(sum), nixbase32.Encode(v.want))}
			} else if err := v.checkCA(); err != nil {
				v.err = &NarMismatchError{Path: v.path, Message: err.Error()}
			} else {
				v.checked = true
			}
		case err != nil:
			v.err = err
		}
		if v.err != nil {
			return 0, v.err
		}
	}
}

// checkCA is the content address's verdict on the whole NAR (nil
// without one).
func (v *narVerifier) checkCA() error {
	if v.ca == nil {
		return nil
	}
	return v.ca.Check()
}

// daemonImport checks an item's metadata and puts it in the daemon's form.
func daemonImport(it NarImport) (daemon.Import, error) {
	if err := checkStorePath(it.StorePath); err != nil {
		return daemon.Import{}, fmt.Errorf("nix: importing %q: %w", it.StorePath, err)
	}
	if it.NarSize <= 0 {
		return daemon.Import{}, fmt.Errorf("nix: importing %s: NAR size %d", it.StorePath, it.NarSize)
	}
	narHash, err := (PathInfo{Path: it.StorePath, NarHash: it.NarHash}).NarHashNix32()
	if err != nil {
		return daemon.Import{}, fmt.Errorf("nix: importing: %w", err)
	}
	digest, err := nixbase32.Decode(strings.TrimPrefix(narHash, "sha256:"))
	if err != nil {
		return daemon.Import{}, fmt.Errorf("nix: importing %s: %w", it.StorePath, err)
	}
	for _, ref := range it.References {
		if err := checkStorePath(ref); err != nil {
			return daemon.Import{}, fmt.Errorf("nix: importing %s: reference %q: %w", it.StorePath, ref, err)
		}
	}
	if it.Deriver != "" {
		if err := checkStorePath(it.Deriver); err != nil {
			return daemon.Import{}, fmt.Errorf("nix: importing %s: deriver %q: %w", it.StorePath, it.Deriver, err)
		}
	}
	return daemon.Import{Path: it.StorePath, Deriver: it.Deriver, NarHash: digest, NarSize: uint64(it.NarSize),
		References: it.References, CA: it.CA}, nil
}

// checkStorePath accepts /nix/store/<32 nix32 characters>-<name>.
func checkStorePath(p string) error {
	base := baseName(p)
	if filepath.Dir(p) != storeDir || len(base) < 34 || base[32] != '-' {
		return fmt.Errorf("not a store path")
	}
	if _, err := nixbase32.Decode(base[:32]); err != nil {
		return fmt.Errorf("not a store path: %w", err)
	}
	return nil
}
