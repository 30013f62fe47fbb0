package daemon

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// maxStringLen bounds a string read from the daemon (log lines, error
// messages, store paths, realisation JSON): a corrupt length must not
// make the client allocate gigabytes.
const maxStringLen = 64 << 20

// maxListLen bounds a list's count for the same reason.
const maxListLen = 1 << 24

// ErrProtocol is wrapped by every error caused by bytes from the daemon
// that do not follow the protocol.
var ErrProtocol = errors.New("nix daemon: protocol violation")

// reader decodes the protocol's primitive values.
type reader struct {
	r   *bufio.Reader
	buf [8]byte
}

func (r *reader) u64() (uint64, error) {
	if _, err := io.ReadFull(r.r, r.buf[:]); err != nil {
		return 0, eof(err)
	}
	return binary.LittleEndian.Uint64(r.buf[:]), nil
}

func (r *reader) bool() (bool, error) {
	v, err := r.u64()
	return v != 0, err
}

func (r *reader) bytes() ([]byte, error) {
	n, err := r.u64()
	if err != nil {
		return nil, err
	}
	if n > maxStringLen {
		return nil, fmt.Errorf("%w: string of %d bytes", ErrProtocol, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.r, b); err != nil {
		return nil, eof(err)
	}
	if err := r.skipPadding(n); err != nil {
		return nil, err
	}
	return b, nil
}

func (r *reader) skipPadding(n uint64) error {
	pad := int(-n & 7)
	if pad == 0 {
		return nil
	}
	if _, err := io.ReadFull(r.r, r.buf[:pad]); err != nil {
		return eof(err)
	}
	for _, c := range r.buf[:pad] {
		if c != 0 {
			return fmt.Errorf("%w: non-zero string padding", ErrProtocol)
		}
	}
	return nil
}

func (r *reader) string() (string, error) {
	b, err := r.bytes()
	return string(b), err
}

func (r *reader) count() (int, error) {
	n, err := r.u64()
	if err != nil {
		return 0, err
	}
	if n > maxListLen {
		return 0, fmt.Errorf("%w: list of %d items", ErrProtocol, n)
	}
	return int(n), nil
}

func (r *reader) strings() ([]string, error) {
	n, err := r.count()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, min(n, 1024))
	for range n {
		s, err := r.string()
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// eof turns a clean EOF in the middle of a value into io.ErrUnexpectedEOF:
// the daemon never ends a connection between a request and its reply.
func eof(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// writer encodes the protocol's primitive values; errors stick until flush.
type writer struct {
	w   *bufio.Writer
	err error
	buf [8]byte
}

func (w *writer) u64(v uint64) *writer {
	if w.err == nil {
		binary.LittleEndian.PutUint64(w.buf[:], v)
		_, w.err = w.w.Write(w.buf[:])
	}
	return w
}

func (w *writer) bool(v bool) *writer {
	if v {
		return w.u64(1)
	}
	return w.u64(0)
}

var zeros [8]byte

func (w *writer) string(s string) *writer {
	w.u64(uint64(len(s)))
	if w.err == nil {
		_, w.err = w.w.WriteString(s)
	}
	if pad := int(-uint64(len(s)) & 7); pad > 0 && w.err == nil {
		_, w.err = w.w.Write(zeros[:pad])
	}
	return w
}

func (w *writer) strings(ss []string) *writer {
	w.u64(uint64(len(ss)))
	for _, s := range ss {
		w.string(s)
	}
	return w
}

func (w *writer) flush() error {
	if w.err == nil {
		w.err = w.w.Flush()
	}
	return w.err
}
