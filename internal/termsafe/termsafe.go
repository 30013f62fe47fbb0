// Package termsafe makes text from elsewhere (a build's log, a worker's
// reason, a server's error) safe to print on an operator's terminal: it
// keeps printable text, newlines, tabs and plain colour (SGR) sequences,
// and shows every other control character visibly instead of letting the
// terminal act on it. A build that prints a window-title change (OSC 0),
// a clipboard write (OSC 52) or a screen clear (CSI 2J) reaches the
// terminal as readable text such as `\x1b]52;c;…`.
//
// Renderings:
//   - C0 controls other than \n and \t, and a \r not followed by \n:
//     `\xNN` (ESC is `\x1b`).
//   - DEL, the C1 controls U+0080–U+009F and the bidirectional formatting
//     controls (U+202A–U+202E, U+2066–U+2069, which reorder what is shown):
//     `\uNNNN`. Inside a JSON string that is the same character again, so
//     JSON stays JSON.
//   - Bytes that are not UTF-8 (among them 8-bit C1 such as 0x9b, which
//     some terminals read as CSI): `\xNN`.
//   - ESC [ digits/;/: m (SGR, colour and weight) is kept as is.
//
// Strip is the other mode, for text shown outside a terminal (the web
// dashboard's pages): every escape sequence and control character is
// removed instead, SGR included.
package termsafe

import (
	"io"
	"sync"
	"unicode/utf8"
)

// maxSGR bounds a kept SGR sequence: longer parameter lists are shown
// visibly, so the writer never holds back more than a few bytes.
const maxSGR = 64

const hex = "0123456789abcdef"

// String is s made safe to print.
func String(s string) string {
	out, _ := appendSafe(make([]byte, 0, len(s)), []byte(s), true)
	return string(out)
}

// appendSafe appends the safe rendering of src to dst. Unless final, an
// incomplete sequence at the end of src (a split UTF-8 character, an SGR
// sequence without its final byte, a \r that may precede \n) is left
// unconsumed for the next call; consumed says how much of src was used.
func appendSafe(dst, src []byte, final bool) ([]byte, int) {
	i := 0
	for i < len(src) {
		c := src[i]
		switch {
		case c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f):
			// Fast path over a run of plain bytes.
			j := i + 1
			for j < len(src) && (src[j] == '\n' || src[j] == '\t' || (src[j] >= 0x20 && src[j] < 0x7f)) {
				j++
			}
			dst = append(dst, src[i:j]...)
			i = j
		case c == '\r':
			if i+1 == len(src) && !final {
				return dst, i
			}
			if i+1 < len(src) && src[i+1] == '\n' {
				dst = append(dst, "\r\n"...)
				i += 2
				continue
			}
			dst = appendByte(dst, c)
			i++
		case c == 0x1b:
			n, complete := sgrLength(src[i:])
			if !complete && !final {
				return dst, i
			}
			if n > 0 {
				dst = append(dst, src[i:i+n]...)
				i += n
				continue
			}
			dst = appendByte(dst, c)
			i++
		case c < 0x20:
			dst = appendByte(dst, c)
			i++
		case c == 0x7f:
			dst = appendRune(dst, rune(c))
			i++
		default: // c >= 0x80
			if !final && !utf8.FullRune(src[i:]) {
				return dst, i
			}
			r, size := utf8.DecodeRune(src[i:])
			switch {
			case r == utf8.RuneError && size <= 1:
				dst = appendByte(dst, c)
				i++
			case isHiddenControl(r):
				dst = appendRune(dst, r)
				i += size
			default:
				dst = append(dst, src[i:i+size]...)
				i += size
			}
		}
	}
	return dst, len(src)
}

// sgrLength is the length of the SGR sequence src starts with (ESC [
// params m), 0 if it does not start with one; complete is false while
// more bytes could still make it one.
func sgrLength(src []byte) (n int, complete bool) {
	if len(src) < 2 {
		return 0, false
	}
	if src[1] != '[' {
		return 0, true
	}
	for j := 2; j < len(src) && j < maxSGR; j++ {
		switch c := src[j]; {
		case c == 'm':
			return j + 1, true
		case (c >= '0' && c <= '9') || c == ';' || c == ':':
		default:
			return 0, true
		}
	}
	return 0, len(src) >= maxSGR
}

// isHiddenControl: characters a terminal acts on or that reorder text,
// shown as \uNNNN.
func isHiddenControl(r rune) bool {
	return (r >= 0x80 && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}

func appendByte(dst []byte, c byte) []byte {
	return append(dst, '\\', 'x', hex[c>>4], hex[c&0xf])
}

func appendRune(dst []byte, r rune) []byte {
	return append(dst, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
}

// Writer passes what is written to it on to an underlying writer made
// safe. A sequence split across writes is held back (a few bytes at most)
// until it is complete or Flush is called. Safe for concurrent use.
type Writer struct {
	mu      sync.Mutex
	w       io.Writer
	pending []byte
	buf     []byte
}

// NewWriter wraps w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write renders p safely; it reports len(p) once the underlying writer
// took the rendering.
func (s *Writer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	src := p
	if len(s.pending) > 0 {
		src = append(s.pending, p...)
	}
	out, used := appendSafe(s.buf[:0], src, false)
	s.pending = append(s.pending[:0:0], src[used:]...)
	s.buf = out[:0]
	if len(out) > 0 {
		if _, err := s.w.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush writes what is held back, rendered as it stands.
func (s *Writer) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 {
		return nil
	}
	out, _ := appendSafe(s.buf[:0], s.pending, true)
	s.pending = s.pending[:0]
	_, err := s.w.Write(out)
	return err
}
