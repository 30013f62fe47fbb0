package termsafe

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestStrip(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain line", "plain line"},
		{"\x1b[31mred\x1b[0m text", "red text"},
		{"\x1b]0;window title\x07after", "after"},
		{"\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\", "link"},
		{"\x1b]52;c;aGVsbG8=\x07copied", "copied"},
		{"a\x1b[2J\x1b[Hb", "ab"},
		{"tab\there", "tab\there"},
		{"bell\x07 back\bspace\r", "bell backspace"},
		{"\u009b31mc1\u009dtitle\u009cdone", "c1done"},
		{"bidi \u202eevil", "bidi evil"},
		{"\u2066isolated\u2069 line\u2028sep", "isolated linesep"},
		{"<script>alert(1)</script>", "<script>alert(1)</script>"}, // HTML is the template's
		{"bad \xff utf8", "bad \uFFFD utf8"},
		{"trailing escape \x1b", "trailing escape "},
		{"\x1bPdevice control\x1b\\x", "x"},
		{"\x1b(Bcharset", "charset"},
	} {
		if got := Strip(c.in); got != c.want {
			t.Errorf("Strip(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func FuzzStrip(f *testing.F) {
	f.Add("\x1b[31mred\x1b]0;t\x07\u009b1m")
	f.Fuzz(func(t *testing.T, s string) {
		got := Strip(s)
		if !utf8.ValidString(got) {
			t.Fatalf("invalid UTF-8 out of %q", s)
		}
		for _, r := range got {
			if (r < 0x20 && r != '\t') || (r >= 0x7f && r < 0xa0) {
				t.Fatalf("control %U left in %q (from %q)", r, got, s)
			}
		}
		if strings.ContainsRune(got, 0x1b) {
			t.Fatalf("ESC left in %q", got)
		}
	})
}
