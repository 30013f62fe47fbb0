package termsafe

import (
	"strings"
	"unicode/utf8"
)

// Strip is the strip mode, for a line shown somewhere other than a
// terminal (the dashboard's HTML): where String shows a sequence
// visibly, Strip removes it whole (ESC with its CSI parameters, SGR
// colour included; OSC/DCS/APC/PM/SOS strings up to their terminator;
// the 8-bit C1 forms too), as well as every other control character but
// tab, the bidirectional controls and the line separators U+2028 and
// U+2029; invalid UTF-8 becomes U+FFFD. HTML is left to the caller's
// escaping (html/template, textContent).
func Strip(s string) string {
	if isPlain(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			b.WriteRune(utf8.RuneError)
			i += max(size, 1)
		case r == 0x1b: // ESC
			i = skipEscape(s, i+1)
		case r == 0x9b: // 8-bit CSI
			i = skipCSI(s, i+size)
		case r == 0x9d, r == 0x90, r == 0x98, r == 0x9e, r == 0x9f: // 8-bit OSC, DCS, SOS, PM, APC
			i = skipString(s, i+size)
		case r == '\t':
			b.WriteByte('\t')
			i += size
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			i += size // other C0 and C1 controls, DEL
		case isHiddenControl(r) || r == 0x2028 || r == 0x2029:
			i += size // bidirectional controls and line separators
		default:
			b.WriteString(s[i : i+size])
			i += size
		}
	}
	return b.String()
}

// isPlain reports whether s is printable ASCII (and tabs) only: most log
// lines, returned without a copy.
func isPlain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 0x20 && c != '\t') || c >= 0x7f {
			return false
		}
	}
	return true
}

// skipEscape skips what follows an ESC at s[i:] and returns where the
// text resumes.
func skipEscape(s string, i int) int {
	if i >= len(s) {
		return i
	}
	switch s[i] {
	case '[':
		return skipCSI(s, i+1)
	case ']', 'P', 'X', '^', '_': // OSC, DCS, SOS, PM, APC
		return skipString(s, i+1)
	}
	// Intermediate bytes, then one final byte (e.g. ESC ( B, ESC 7).
	for i < len(s) && s[i] >= 0x20 && s[i] <= 0x2f {
		i++
	}
	if i < len(s) && s[i] >= 0x30 && s[i] <= 0x7e {
		i++
	}
	return i
}

// skipCSI skips a control sequence's parameter and intermediate bytes and
// its final byte.
func skipCSI(s string, i int) int {
	for i < len(s) {
		c := s[i]
		i++
		if c >= 0x40 && c <= 0x7e {
			return i
		}
		if c < 0x20 || c > 0x7e {
			return i // malformed: stop at the odd byte (dropped with it)
		}
	}
	return i
}

// skipString skips a control string up to its terminator: BEL, ESC \ or
// the 8-bit ST.
func skipString(s string, i int) int {
	for i < len(s) {
		switch {
		case s[i] == 0x07:
			return i + 1
		case s[i] == 0x1b && i+1 < len(s) && s[i+1] == '\\':
			return i + 2
		case strings.HasPrefix(s[i:], "\u009c"):
			return i + len("\u009c")
		}
		i++
	}
	return i
}
