package termsafe

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text\n\tindented\n", "plain text\n\tindented\n"},
		{"héllo ✓ 日本", "héllo ✓ 日本"},
		{"\x1b[1;31mred\x1b[0m", "\x1b[1;31mred\x1b[0m"},
		{"\x1b[38:5:196mred\x1b[m", "\x1b[38:5:196mred\x1b[m"},
		{"\x1b]0;pwned\x07", `\x1b]0;pwned\x07`},
		{"\x1b]52;c;ZWNobyBwd25lZA==\x07", `\x1b]52;c;ZWNobyBwd25lZA==\x07`},
		{"\x1b[2J\x1b[H", `\x1b[2J\x1b[H`},
		{"\x1b[?1049h", `\x1b[?1049h`},
		{"\x1bP+q\x1b\\", `\x1bP+q\x1b\`},
		{"progress 10%\rprogress 20%", `progress 10%\x0dprogress 20%`},
		{"line\r\n", "line\r\n"},
		{"bell\x07 back\x08 nul\x00 del\x7f", `bell\x07 back\x08 nul\x00 del\u007f`},
		{"c1 \u009b2J and \u0085", `c1 \u009b2J and \u0085`},
		{"raw 8-bit \x9b2J", `raw 8-bit \x9b2J`},
		{"bad \xff\xfe utf8 \xe2\x82", `bad \xff\xfe utf8 \xe2\x82`},
		{"bidi \u202eevil\u202c \u2066x\u2069", `bidi \u202eevil\u202c \u2066x\u2069`},
		{"\x1b", `\x1b`},
		{"\x1b[", `\x1b[`},
		{"\x1b[" + strings.Repeat("1;", 40) + "m", `\x1b[` + strings.Repeat("1;", 40) + "m"},
	} {
		if got := String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// Whatever the split, the writer renders the same as String of the whole.
func TestWriterSplits(t *testing.T) {
	in := "a\x1b[31mred\x1b[0m é\r\n\x1b]0;t\x07 \u009b \xff 日\r"
	for cut := 0; cut <= len(in); cut++ {
		for cut2 := cut; cut2 <= len(in); cut2++ {
			var out bytes.Buffer
			w := NewWriter(&out)
			for _, part := range []string{in[:cut], in[cut:cut2], in[cut2:]} {
				if n, err := w.Write([]byte(part)); n != len(part) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if want := String(in); out.String() != want {
				t.Fatalf("split at %d,%d: %q, want %q", cut, cut2, out.String(), want)
			}
		}
	}
}

// checkSafe fails unless out is safe to print: UTF-8, no control
// character but \n, \t, \r before \n and ESC starting an SGR sequence.
func checkSafe(t *testing.T, in, out string) {
	t.Helper()
	if !utf8.ValidString(out) {
		t.Fatalf("%q: output %q is not UTF-8", in, out)
	}
	for i := 0; i < len(out); {
		r, size := utf8.DecodeRuneInString(out[i:])
		switch {
		case r == '\n' || r == '\t':
		case r == '\r':
			if !strings.HasPrefix(out[i+1:], "\n") {
				t.Fatalf("%q: lone \\r at %d of %q", in, i, out)
			}
		case r == 0x1b:
			n, complete := sgrLength([]byte(out[i:]))
			if n == 0 || !complete {
				t.Fatalf("%q: ESC not starting SGR at %d of %q", in, i, out)
			}
			size = n
		case r < 0x20 || r == 0x7f || isHiddenControl(r):
			t.Fatalf("%q: control %U at %d of %q", in, r, i, out)
		}
		i += size
	}
}

func FuzzString(f *testing.F) {
	for _, s := range []string{"", "plain\n", "\x1b]52;c;AAAA\x07\x1b[2J", "\x1b[1;31mx\x1b[0m", "\xff\x9b\u009b", "a\rb\r\n", "\u202e"} {
		f.Add(s, 3)
	}
	f.Fuzz(func(t *testing.T, in string, cut int) {
		out := String(in)
		checkSafe(t, in, out)
		// Safe text stays as it is.
		if again := String(out); again != out {
			t.Fatalf("String is not idempotent on %q: %q then %q", in, out, again)
		}
		// The writer, split anywhere, renders the same.
		if cut < 0 {
			cut = -cut
		}
		if cut < 0 {
			cut = 0
		}
		cut %= len(in) + 1
		var buf bytes.Buffer
		w := NewWriter(&buf)
		w.Write([]byte(in[:cut]))
		w.Write([]byte(in[cut:]))
		w.Flush()
		if buf.String() != out {
			t.Fatalf("writer split at %d of %q: %q, want %q", cut, in, buf.String(), out)
		}
	})
}

func BenchmarkWriterPlainLog(b *testing.B) {
	line := []byte("building '/nix/store/abc-hello-2.12.drv'... \x1b[32mok\x1b[0m compiling hello.c\n")
	w := NewWriter(discard{})
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		w.Write(line)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
