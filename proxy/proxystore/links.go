package proxystore

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"gradient.dev/gradient/storage/sqldb"
)

// LinkState is whether a link's last upstream session authenticated.
type LinkState string

const (
	LinkOK LinkState = "ok"
	// LinkFailing: the tenant's server rejected the proxy's credentials
	// (401 or 403). No new session starts until the link is set again.
	LinkFailing LinkState = "failing"
)

// Link is a tenant's upstream link as anyone but the upstream session
// sees it: the tokens' peer IDs, never the tokens.
type Link struct {
	TenantID     string `json:"tenant_id"`
	TenantName   string `json:"tenant_name"`
	TenantMayRun bool   `json:"tenant_may_run"`
	// URL is the tenant server's ws:// or wss:// /proto URL.
	URL string `json:"url"`
	// WorkerID is the proxy's worker ID on the tenant's server.
	WorkerID string    `json:"worker_id"`
	Peers    []string  `json:"peers"`
	Enabled  bool      `json:"enabled"`
	State    LinkState `json:"state"`
	// FailureReason is the server's reason while State is LinkFailing.
	FailureReason string    `json:"failure_reason,omitempty"`
	StateSince    time.Time `json:"state_since"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// Connects reports whether the proxy should hold an upstream session
// for the link: enabled, the tenant may run, and not failing.
func (l Link) Connects() bool { return l.Enabled && l.TenantMayRun && l.State == LinkOK }

// maxURLLen and maxReasonLen bound what a link stores.
const (
	maxURLLen    = 2048
	maxReasonLen = 512
)

// SetLink sets the tenant's upstream link, replacing its URL, worker ID
// and every token, and clears a failing state. A new link is enabled; a
// link set again keeps its enabled flag.
func (s *Store) SetLink(ctx context.Context, tenant, serverURL, workerID string, peers []PeerToken) (Link, error) {
	if err := checkServerURL(serverURL); err != nil {
		return Link{}, err
	}
	workerID, err := sqldb.CanonicalUUID("worker ID", workerID)
	if err != nil {
		return Link{}, err
	}
	if len(peers) == 0 {
		return Link{}, sqldb.Invalid("a link needs at least one peer token")
	}
	canonical := make([]PeerToken, 0, len(peers))
	for _, p := range peers {
		id, err := checkPeerToken(p)
		if err != nil {
			return Link{}, sqldb.Invalid("%v", err)
		}
		if slices.ContainsFunc(canonical, func(q PeerToken) bool { return q.PeerID == id }) {
			return Link{}, sqldb.Invalid("peer %s is given twice", id)
		}
		canonical = append(canonical, PeerToken{PeerID: id, Token: p.Token})
	}
	var tenantID string
	err = s.db.InTx(ctx, func(tx *sql.Tx) error {
		t, err := tenantByRef(ctx, tx, tenant)
		if err != nil {
			return err
		}
		tenantID = t.ID
		now := sqldb.NowMillis()
		_, err = tx.ExecContext(ctx, `INSERT INTO upstream_links
			(tenant_id, url, worker_id, enabled, state, failure_reason, state_since, updated_at)
			VALUES ($1, $2, $3, TRUE, 'ok', '', $4, $4)
			ON CONFLICT (tenant_id) DO UPDATE SET url = excluded.url, worker_id = excluded.worker_id,
				state = 'ok', failure_reason = '', state_since = excluded.state_since, updated_at = excluded.updated_at`,
			t.ID, serverURL, workerID, now)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM upstream_link_tokens WHERE tenant_id = $1`, t.ID); err != nil {
			return err
		}
		for _, p := range canonical {
			sealed := s.box.Seal([]byte(p.Token), tokenOwner(t.ID, p.PeerID))
			if _, err := tx.ExecContext(ctx, `INSERT INTO upstream_link_tokens (tenant_id, peer_id, sealed_token) VALUES ($1, $2, $3)`,
				t.ID, p.PeerID, base64.StdEncoding.EncodeToString(sealed)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Link{}, err
	}
	return s.Link(ctx, tenantID)
}

// tokenOwner binds a sealed token to its row, so a sealed value copied to
// another tenant's or peer's row does not open.
func tokenOwner(tenantID, peerID string) []byte {
	return []byte("proxy-upstream-token\x00" + tenantID + "\x00" + peerID)
}

// checkServerURL accepts a ws:// or wss:// URL with a host and without
// user info (credentials travel as peer tokens, never in the URL).
func checkServerURL(raw string) error {
	if len(raw) > maxURLLen {
		return sqldb.Invalid("server URL is longer than %d characters", maxURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return sqldb.Invalid("server URL is malformed")
	}
	switch {
	case u.Scheme != "ws" && u.Scheme != "wss":
		return sqldb.Invalid("server URL %q: want ws:// or wss:// (the server's /proto URL)", u.Redacted())
	case u.Host == "" || u.Hostname() == "":
		return sqldb.Invalid("server URL %q has no host", u.Redacted())
	case u.User != nil:
		return sqldb.Invalid("server URL %q may not hold user info", u.Redacted())
	case u.Fragment != "" || u.RawQuery != "":
		return sqldb.Invalid("server URL %q may not hold a query or fragment", u.Redacted())
	}
	return nil
}

const linkSelect = `SELECT l.tenant_id, t.name, t.may_run, l.url, l.worker_id, l.enabled, l.state,
	l.failure_reason, l.state_since, l.updated_at
	FROM upstream_links l JOIN tenants t ON t.id = l.tenant_id`

func scanLink(row interface{ Scan(...any) error }) (Link, error) {
	var l Link
	var since, updated int64
	err := row.Scan(&l.TenantID, &l.TenantName, &l.TenantMayRun, &l.URL, &l.WorkerID, &l.Enabled, &l.State,
		&l.FailureReason, &since, &updated)
	l.StateSince, l.UpdatedAt = sqldb.FromMillis(since), sqldb.FromMillis(updated)
	return l, err
}

// Link returns the tenant's upstream link.
func (s *Store) Link(ctx context.Context, tenant string) (Link, error) {
	t, err := s.Tenant(ctx, tenant)
	if err != nil {
		return Link{}, err
	}
	l, err := scanLink(s.sql.QueryRowContext(ctx, linkSelect+` WHERE l.tenant_id = $1`, t.ID))
	if errors.Is(err, sql.ErrNoRows) {
		return Link{}, sqldb.NotFound("tenant %q has no upstream link", t.Name)
	}
	if err != nil {
		return Link{}, err
	}
	if err := s.addPeers(ctx, []*Link{&l}, t.ID); err != nil {
		return Link{}, err
	}
	return l, nil
}

// Links lists every tenant's link, by tenant name.
func (s *Store) Links(ctx context.Context) ([]Link, error) {
	rows, err := s.sql.QueryContext(ctx, linkSelect+` ORDER BY t.name`)
	links, err := sqldb.Collect(rows, err, func(r *sql.Rows) (Link, error) { return scanLink(r) })
	if err != nil {
		return nil, err
	}
	ptrs := make([]*Link, len(links))
	for i := range links {
		ptrs[i] = &links[i]
	}
	if err := s.addPeers(ctx, ptrs, ""); err != nil {
		return nil, err
	}
	return links, nil
}

// addPeers fills in the links' peer IDs: those of one tenant, or of
// every tenant when tenantID is "".
func (s *Store) addPeers(ctx context.Context, links []*Link, tenantID string) error {
	if len(links) == 0 {
		return nil
	}
	byTenant := map[string]*Link{}
	for _, l := range links {
		byTenant[l.TenantID] = l
		l.Peers = []string{}
	}
	rows, err := s.sql.QueryContext(ctx, `SELECT tenant_id, peer_id FROM upstream_link_tokens
		WHERE $1 = '' OR tenant_id = $1 ORDER BY peer_id`, tenantID)
	type pair struct{ tenant, peer string }
	pairs, err := sqldb.Collect(rows, err, func(r *sql.Rows) (pair, error) {
		var p pair
		return p, r.Scan(&p.tenant, &p.peer)
	})
	for _, p := range pairs {
		if l := byTenant[p.tenant]; l != nil {
			l.Peers = append(l.Peers, p.peer)
		}
	}
	return err
}

// EnableLink lets the tenant's upstream session run (while the tenant
// may run and the link is not failing).
func (s *Store) EnableLink(ctx context.Context, tenant string) (Link, error) {
	return s.updateLink(ctx, tenant, `enabled = TRUE`)
}

// DisableLink stops the tenant's upstream session and keeps the link.
func (s *Store) DisableLink(ctx context.Context, tenant string) (Link, error) {
	return s.updateLink(ctx, tenant, `enabled = FALSE`)
}

// MarkLinkFailing records that the tenant's server rejected the proxy's
// credentials, with the server's reason; since when is kept while it
// stays failing. Only SetLink (new credentials) or MarkLinkOK clears it.
func (s *Store) MarkLinkFailing(ctx context.Context, tenant, reason string) (Link, error) {
	return s.updateLink(ctx, tenant, `failure_reason = $2,
		state_since = CASE WHEN state = 'failing' THEN state_since ELSE $3 END, state = 'failing'`,
		cleanReason(reason), sqldb.NowMillis())
}

// MarkLinkOK records that an upstream session authenticated.
func (s *Store) MarkLinkOK(ctx context.Context, tenant string) (Link, error) {
	return s.updateLink(ctx, tenant, `failure_reason = '',
		state_since = CASE WHEN state = 'ok' THEN state_since ELSE $2 END, state = 'ok'`, sqldb.NowMillis())
}

// updateLink applies set ($1 is the tenant's ID, args follow) to the
// tenant's link and returns the link.
func (s *Store) updateLink(ctx context.Context, tenant, set string, args ...any) (Link, error) {
	var tenantID string
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		t, err := tenantByRef(ctx, tx, tenant)
		if err != nil {
			return err
		}
		tenantID = t.ID
		res, err := tx.ExecContext(ctx, `UPDATE upstream_links SET `+set+`, updated_at = `+
			fmt.Sprintf("$%d", len(args)+2)+` WHERE tenant_id = $1`,
			append(append([]any{t.ID}, args...), sqldb.NowMillis())...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return sqldb.NotFound("tenant %q has no upstream link", t.Name)
		}
		return nil
	})
	if err != nil {
		return Link{}, err
	}
	return s.Link(ctx, tenantID)
}

// cleanReason keeps a server's rejection reason printable and short: it
// crossed a boundary and ends up in the admin API and the logs.
func cleanReason(reason string) string {
	reason = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(reason, " "))
	reason = strings.TrimSpace(reason)
	if len(reason) > maxReasonLen {
		cut := maxReasonLen
		for cut > 0 && !utf8RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut] + "…"
	}
	if reason == "" {
		reason = "rejected without a reason"
	}
	return reason
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// LinkTokens opens the tenant's tokens, for its upstream session alone:
// nothing else returns them, and they must never be logged.
func (s *Store) LinkTokens(ctx context.Context, tenant string) ([]PeerToken, error) {
	t, err := s.Tenant(ctx, tenant)
	if err != nil {
		return nil, err
	}
	rows, err := s.sql.QueryContext(ctx, `SELECT peer_id, sealed_token FROM upstream_link_tokens WHERE tenant_id = $1 ORDER BY peer_id`, t.ID)
	type sealedRow struct{ peer, sealed string }
	sealed, err := sqldb.Collect(rows, err, func(r *sql.Rows) (sealedRow, error) {
		var row sealedRow
		return row, r.Scan(&row.peer, &row.sealed)
	})
	if err != nil {
		return nil, err
	}
	if len(sealed) == 0 {
		return nil, sqldb.NotFound("tenant %q has no upstream link", t.Name)
	}
	out := make([]PeerToken, 0, len(sealed))
	for _, row := range sealed {
		raw, err := base64.StdEncoding.DecodeString(row.sealed)
		if err == nil {
			var plain []byte
			plain, err = s.box.Open(raw, tokenOwner(t.ID, row.peer))
			out = append(out, PeerToken{PeerID: row.peer, Token: string(plain)})
		}
		if err != nil {
			return nil, fmt.Errorf("tenant %q, peer %s: the sealed upstream token does not open with this proxy's encryption key (set the link again): %w", t.Name, row.peer, err)
		}
	}
	return out, nil
}
