package proxystore

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/secret"
	"gradient.dev/gradient/storage/sqldb"
)

const testServerURL = "wss://ci.example.com/proto"

func newToken(t *testing.T) string {
	t.Helper()
	token, err := secret.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// mustLink sets a link with two fresh peer tokens and returns them.
func mustLink(t *testing.T, s *Store, tenant string) []PeerToken {
	t.Helper()
	peers := []PeerToken{{sqldb.NewID(), newToken(t)}, {sqldb.NewID(), newToken(t)}}
	if _, err := s.SetLink(t.Context(), tenant, testServerURL, sqldb.NewID(), peers); err != nil {
		t.Fatal(err)
	}
	return peers
}

func TestSetLinkValidates(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		mustTenant(t, s, "acme")
		good := []PeerToken{{sqldb.NewID(), newToken(t)}}
		worker := sqldb.NewID()
		for name, call := range map[string]func() error{
			"http scheme": func() error {
				_, err := s.SetLink(ctx, "acme", "https://ci.example.com/proto", worker, good)
				return err
			},
			"no host": func() error { _, err := s.SetLink(ctx, "acme", "wss:///proto", worker, good); return err },
			"user info": func() error {
				_, err := s.SetLink(ctx, "acme", "wss://u:pw@ci.example.com/proto", worker, good)
				return err
			},
			"query":         func() error { _, err := s.SetLink(ctx, "acme", testServerURL+"?token=x", worker, good); return err },
			"bad worker ID": func() error { _, err := s.SetLink(ctx, "acme", testServerURL, "worker-1", good); return err },
			"no peers":      func() error { _, err := s.SetLink(ctx, "acme", testServerURL, worker, nil); return err },
			"bad peer ID": func() error {
				_, err := s.SetLink(ctx, "acme", testServerURL, worker, []PeerToken{{"p1", newToken(t)}})
				return err
			},
			"short token": func() error {
				_, err := s.SetLink(ctx, "acme", testServerURL, worker, []PeerToken{{sqldb.NewID(), "short"}})
				return err
			},
			"token with space": func() error {
				_, err := s.SetLink(ctx, "acme", testServerURL, worker, []PeerToken{{sqldb.NewID(), strings.Repeat("a", 63) + " "}})
				return err
			},
			"peer twice": func() error {
				id := sqldb.NewID()
				_, err := s.SetLink(ctx, "acme", testServerURL, worker, []PeerToken{{id, newToken(t)}, {strings.ToUpper(id), newToken(t)}})
				return err
			},
		} {
			if err := call(); !errors.Is(err, sqldb.ErrInvalid) {
				t.Errorf("%s: err = %v, want ErrInvalid", name, err)
			} else if strings.Contains(err.Error(), "pw") {
				t.Errorf("%s: the error shows the URL's password: %v", name, err)
			}
		}
		if _, err := s.SetLink(ctx, "nobody", testServerURL, worker, good); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("unknown tenant: err = %v", err)
		}
		if _, err := s.Link(ctx, "acme"); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("a refused link was stored: %v", err)
		}
	})
}

func TestLinkLifecycle(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		acme := mustTenant(t, s, "acme")
		peerA, peerB := sqldb.NewID(), sqldb.NewID()
		tokens := []PeerToken{{strings.ToUpper(peerB), newToken(t)}, {peerA, newToken(t)}, {"*", newToken(t)}}
		workerID := sqldb.NewID()
		l, err := s.SetLink(ctx, "acme", "ws://127.0.0.1:3000/proto", strings.ToUpper(workerID), tokens)
		if err != nil {
			t.Fatal(err)
		}
		if l.TenantID != acme.ID || l.TenantName != "acme" || l.WorkerID != workerID || l.URL != "ws://127.0.0.1:3000/proto" {
			t.Fatalf("link %+v", l)
		}
		if !l.Enabled || l.State != LinkOK || !l.TenantMayRun || !l.Connects() {
			t.Fatalf("a new link must be enabled, ok and connecting: %+v", l)
		}
		wantPeers := []string{"*", peerA, peerB}
		if strings.Join(l.Peers, " ") != strings.Join(slices.Sorted(slices.Values(wantPeers)), " ") {
			t.Fatalf("peers %v, want %v", l.Peers, slices.Sorted(slices.Values(wantPeers)))
		}
		view, _ := json.Marshal(l)
		for _, p := range tokens {
			if strings.Contains(string(view), p.Token) {
				t.Fatalf("the link's view carries a token: %s", view)
			}
		}

		got, err := s.LinkTokens(ctx, acme.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 3 {
			t.Fatalf("LinkTokens = %d tokens, want 3", len(got))
		}
		byPeer := map[string]string{}
		for _, p := range got {
			byPeer[p.PeerID] = p.Token
		}
		if byPeer[peerB] != tokens[0].Token || byPeer[peerA] != tokens[1].Token || byPeer["*"] != tokens[2].Token {
			t.Fatal("LinkTokens did not return the tokens set, under canonical peer IDs")
		}

		if l, err = s.DisableLink(ctx, "acme"); err != nil || l.Enabled || l.Connects() {
			t.Fatalf("DisableLink = %+v, %v", l, err)
		}
		// Setting the link again keeps it disabled: enabling is its own step.
		if l, err = s.SetLink(ctx, "acme", testServerURL, workerID, tokens[:1]); err != nil || l.Enabled {
			t.Fatalf("SetLink on a disabled link = %+v, %v", l, err)
		}
		if len(l.Peers) != 1 || l.Peers[0] != peerB {
			t.Fatalf("setting the link again must replace its tokens: peers %v", l.Peers)
		}
		if l, err = s.EnableLink(ctx, "acme"); err != nil || !l.Enabled || !l.Connects() {
			t.Fatalf("EnableLink = %+v, %v", l, err)
		}
		if _, err := s.SetTenantMayRun(ctx, "acme", false); err != nil {
			t.Fatal(err)
		}
		if l, _ = s.Link(ctx, "acme"); l.TenantMayRun || l.Connects() {
			t.Fatalf("a tenant that may not run must not connect: %+v", l)
		}
		if _, err := s.SetTenantMayRun(ctx, "acme", true); err != nil {
			t.Fatal(err)
		}

		failing, err := s.MarkLinkFailing(ctx, "acme", "401\x1b[31m: token rejected\n")
		if err != nil {
			t.Fatal(err)
		}
		if failing.State != LinkFailing || failing.FailureReason != "401 [31m: token rejected" || failing.Connects() {
			t.Fatalf("MarkLinkFailing = %+v", failing)
		}
		again, err := s.MarkLinkFailing(ctx, "acme", "403: forbidden")
		if err != nil || again.FailureReason != "403: forbidden" || !again.StateSince.Equal(failing.StateSince) {
			t.Fatalf("failing again must keep since when (%v): %+v, %v", failing.StateSince, again, err)
		}
		if ok, err := s.MarkLinkOK(ctx, "acme"); err != nil || ok.State != LinkOK || ok.FailureReason != "" {
			t.Fatalf("MarkLinkOK = %+v, %v", ok, err)
		}
		if _, err := s.MarkLinkFailing(ctx, "acme", strings.Repeat("é", 600)); err != nil {
			t.Fatal(err)
		}
		if l, _ = s.Link(ctx, "acme"); len(l.FailureReason) > maxReasonLen+len("…") || !strings.HasSuffix(l.FailureReason, "é…") {
			t.Fatalf("a long reason must be cut on a character boundary: %d bytes", len(l.FailureReason))
		}
		if l, err = s.SetLink(ctx, "acme", testServerURL, workerID, tokens); err != nil || l.State != LinkOK || l.FailureReason != "" || !l.Connects() {
			t.Fatalf("setting the link again must clear failing: %+v, %v", l, err)
		}

		mustTenant(t, s, "bare")
		for name, call := range map[string]func() error{
			"Link":            func() error { _, err := s.Link(ctx, "bare"); return err },
			"LinkTokens":      func() error { _, err := s.LinkTokens(ctx, "bare"); return err },
			"EnableLink":      func() error { _, err := s.EnableLink(ctx, "bare"); return err },
			"DisableLink":     func() error { _, err := s.DisableLink(ctx, "bare"); return err },
			"MarkLinkFailing": func() error { _, err := s.MarkLinkFailing(ctx, "bare", "x"); return err },
			"MarkLinkOK":      func() error { _, err := s.MarkLinkOK(ctx, "bare"); return err },
		} {
			if err := call(); !errors.Is(err, sqldb.ErrNotFound) {
				t.Errorf("%s on a tenant without a link: err = %v, want ErrNotFound", name, err)
			}
		}
		links, err := s.Links(ctx)
		if err != nil || len(links) != 1 || links[0].TenantName != "acme" || len(links[0].Peers) != 3 {
			t.Fatalf("Links = %+v, %v", links, err)
		}
	})
}

func TestLinkTokensAreSealedInTheDatabase(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, dbURL string, box *sealbox.Box) {
		ctx := t.Context()
		a, b := mustTenant(t, s, "a"), mustTenant(t, s, "b")
		tokensA := mustLink(t, s, a.ID)
		// b's server has a peer of the same ID (the wildcard, say): only
		// the tenant in the binding tells the two rows apart.
		tokensB := []PeerToken{{tokensA[0].PeerID, newToken(t)}}
		if _, err := s.SetLink(ctx, b.ID, testServerURL, sqldb.NewID(), tokensB); err != nil {
			t.Fatal(err)
		}

		// No row of any link table holds a token in the clear.
		for _, table := range []string{"upstream_links", "upstream_link_tokens"} {
			rows, err := s.sql.QueryContext(ctx, `SELECT * FROM `+table)
			if err != nil {
				t.Fatal(err)
			}
			cols, _ := rows.Columns()
			for rows.Next() {
				values := make([]any, len(cols))
				ptrs := make([]any, len(cols))
				for i := range values {
					ptrs[i] = &values[i]
				}
				if err := rows.Scan(ptrs...); err != nil {
					t.Fatal(err)
				}
				for i, v := range values {
					text := strings.TrimSpace(strings.ReplaceAll(toText(v), "\x00", ""))
					for _, p := range append(tokensA, tokensB...) {
						if strings.Contains(text, p.Token) {
							t.Fatalf("%s.%s holds a token in the clear", table, cols[i])
						}
					}
				}
			}
			rows.Close()
		}

		// A sealed value moved to another tenant's row, or to another
		// peer's row of the same tenant, does not open.
		var sealedA string
		if err := s.sql.QueryRowContext(ctx, `SELECT sealed_token FROM upstream_link_tokens WHERE tenant_id = $1 AND peer_id = $2`,
			a.ID, tokensA[0].PeerID).Scan(&sealedA); err != nil {
			t.Fatal(err)
		}
		if _, err := s.sql.ExecContext(ctx, `UPDATE upstream_link_tokens SET sealed_token = $1 WHERE tenant_id = $2 AND peer_id = $3`,
			sealedA, b.ID, tokensB[0].PeerID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.LinkTokens(ctx, b.ID); !errors.Is(err, sealbox.ErrOpen) {
			t.Fatalf("a token copied to another tenant's row: err = %v, want sealbox.ErrOpen", err)
		}
		if _, err := s.sql.ExecContext(ctx, `UPDATE upstream_link_tokens SET sealed_token = $1 WHERE tenant_id = $2 AND peer_id = $3`,
			sealedA, a.ID, tokensA[1].PeerID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.LinkTokens(ctx, a.ID); !errors.Is(err, sealbox.ErrOpen) {
			t.Fatalf("a token copied to another peer's row: err = %v, want sealbox.ErrOpen", err)
		}
		mustLink(t, s, a.ID) // set again: opens again

		// Another key opens nothing, and says why without a token.
		other := openStore(t, dbURL, newBox(t))
		_, err := other.LinkTokens(ctx, a.ID)
		if !errors.Is(err, sealbox.ErrOpen) || !strings.Contains(err.Error(), "encryption key") {
			t.Fatalf("wrong key: err = %v, want sealbox.ErrOpen naming the key", err)
		}
		if _, err := other.Link(ctx, a.ID); err != nil {
			t.Fatalf("the view needs no key: %v", err)
		}
		if _, err := s.LinkTokens(ctx, a.ID); err != nil {
			t.Fatalf("the right key: %v", err)
		}
	})
}

func toText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}
