package proxystore

import (
	"errors"
	"strings"
	"testing"

	"gradient.dev/gradient/storage/sqldb"
)

func TestParsePeersFile(t *testing.T) {
	tok := strings.Repeat("a", 64)
	other := strings.Repeat("B", 64)
	p1, p2 := "0190a7c2-1b2c-7d3e-8f40-123456789abc", "0190A7C2-1B2C-7D3E-8F40-ABCDEF012345"
	tests := []struct {
		name string
		text string
		want []PeerToken
		errs []string // substrings of the error, in order
	}{
		{name: "lines, comments and blanks",
			text: "# from acme\n\n  " + p1 + " : " + tok + "  \r\n" + p2 + ":" + other + "\n",
			want: []PeerToken{{p1, tok}, {strings.ToLower(p2), other}}},
		{name: "wildcard", text: "*:" + tok, want: []PeerToken{{"*", tok}}},
		{name: "empty", text: "", errs: []string{"no peer_id:token line"}},
		{name: "comments only", text: "# nothing\n\n", errs: []string{"no peer_id:token line"}},
		{name: "every bad line named",
			text: p1 + ":" + tok + "\nno-colon\n" + p2 + ":short-secret\nproject:" + tok + "\n" + strings.ToUpper(p1) + ":" + other,
			errs: []string{"line 2: malformed", "line 3:", "64 characters", "line 4: peer ID \"project\"", "line 5: peer " + p1 + " is already on line 1"}},
		{name: "token with a colon", text: p1 + ":" + tok[:63] + ":", errs: []string{"line 1:", "colon"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePeersFile(tt.text)
			if tt.errs != nil {
				if !errors.Is(err, sqldb.ErrInvalid) {
					t.Fatalf("err = %v, want ErrInvalid", err)
				}
				msg := err.Error()
				for _, want := range tt.errs {
					i := strings.Index(msg, want)
					if i < 0 {
						t.Fatalf("error %q lacks %q", msg, want)
					}
					msg = msg[i+len(want):]
				}
				if strings.Contains(err.Error(), "short-secret") || strings.Contains(err.Error(), tok) {
					t.Fatalf("the error quotes a token: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("line %d: got %v, want %v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// The peers file is operator input: whatever it holds, ParsePeersFile
// returns valid tokens or an ErrInvalid that quotes none of them.
func FuzzParsePeersFile(f *testing.F) {
	f.Add("0190a7c2-1b2c-7d3e-8f40-123456789abc:" + strings.Repeat("a", 64))
	f.Add("# c\n*:" + strings.Repeat("z", 64) + "\nx:y\n")
	f.Add(":\n:::\n\xff\xfe")
	f.Fuzz(func(t *testing.T, text string) {
		peers, err := ParsePeersFile(text)
		if err != nil {
			if !errors.Is(err, sqldb.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, p := range peers {
			if _, err := checkPeerToken(p); err != nil {
				t.Fatalf("returned an invalid token for %q: %v", p.PeerID, err)
			}
			if seen[p.PeerID] {
				t.Fatalf("peer %q returned twice", p.PeerID)
			}
			seen[p.PeerID] = true
		}
	})
}
