package workersession

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/internal/testlog"

	"gradient.dev/gradient/wire"
)

func TestParsePeers(t *testing.T) {
	t.Parallel()
	tok := strings.Repeat("a", 64)
	other := strings.Repeat("B", 64)
	text := strings.Join([]string{
		"# projects",
		"",
		"  p1 : " + tok + "  ",
		"p2:" + other,
		"*:" + tok,
		"no-colon",
		":" + tok,
		"p3:",
		"p4:short-token-never-logged",
		"p5:" + tok + ":" + "x", // split at the first colon: a 66-character token
	}, "\n")
	log, buf := testlog.New(t, "parse")
	got := ParsePeers(text, "peers", log)
	want := map[string]string{"p1": tok, "p2": other, "*": tok}
	if !maps.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	logs := buf.String()
	if n := strings.Count(logs, "skipping"); n != 5 {
		t.Fatalf("%d warnings, want 5:\n%s", n, logs)
	}
	if strings.Contains(logs, "short-token-never-logged") || strings.Contains(logs, tok) {
		t.Fatalf("a token reached the log:\n%s", logs)
	}
}

func TestLoadPeersFileWinsAndMissingFileIsOpenMode(t *testing.T) {
	t.Parallel()
	log, _ := testlog.New(t, "load")
	inline := "p1:" + strings.Repeat("a", 64)
	if got := LoadPeers("", inline, log); len(got) != 1 {
		t.Fatalf("inline: %v", got)
	}
	if got := LoadPeers(t.TempDir()+"/missing", inline, log); len(got) != 0 {
		t.Fatalf("a missing file must mean no tokens, got %v", got)
	}
}

func TestAnswerChallengeUsesWildcardForUnlistedPeers(t *testing.T) {
	t.Parallel()
	tokens := map[string]string{"p1": "one", "*": "any"}
	resp := answerChallenge(tokens, &wire.AuthChallenge{Peers: []string{"p1", "p2"}})
	want := []wire.Pair[string, string]{{First: "p1", Second: "one"}, {First: "p2", Second: "any"}}
	if !slices.Equal(resp.Tokens, want) {
		t.Fatalf("got %v, want %v", resp.Tokens, want)
	}
	if resp := answerChallenge(map[string]string{"p1": "one"}, &wire.AuthChallenge{Peers: []string{"p2"}}); len(resp.Tokens) != 0 {
		t.Fatalf("a peer without a token got %v", resp.Tokens)
	}
}
