package admin_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/proxy/admin/admintest"
	"gradient.dev/gradient/proxy/downstream"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
	"gradient.dev/gradient/workersession"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(sqldbtest.Main(m))
}

// client calls one proxy's admin API with its token.
type client struct {
	t     *testing.T
	p     *admintest.Proxy
	token string
	// secrets must never appear in an answer (link tokens).
	secrets []string
}

func newClient(t *testing.T, p *admintest.Proxy) *client { return &client{t: t, p: p, token: p.Token} }

func (c *client) do(method, path, body string) (int, []byte) {
	c.t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(c.t.Context(), method, c.p.URL+path, r)
	if err != nil {
		c.t.Fatal(err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, s := range c.secrets {
		if strings.Contains(string(raw), s) {
			c.t.Fatalf("%s %s: the answer holds a link token: %s", method, path, raw)
		}
	}
	return resp.StatusCode, raw
}

// ok calls and decodes a successful answer into out (unless nil).
func (c *client) ok(want int, method, path, body string, out any) {
	c.t.Helper()
	status, raw := c.do(method, path, body)
	if status != want {
		c.t.Fatalf("%s %s: %d %s, want %d", method, path, status, raw, want)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			c.t.Fatalf("%s %s: %v in %s", method, path, err, raw)
		}
	}
}

// fails expects an error answer with status whose message holds msg.
func (c *client) fails(status int, msg, method, path, body string) {
	c.t.Helper()
	got, raw := c.do(method, path, body)
	var e struct {
		Error string `json:"error"`
	}
	if got != status || json.Unmarshal(raw, &e) != nil || !strings.Contains(e.Error, msg) {
		c.t.Fatalf("%s %s %s: %d %s, want %d with %q", method, path, body, got, raw, status, msg)
	}
}

type tenant struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	MayRun    bool      `json:"may_run"`
	CreatedAt time.Time `json:"created_at"`
}

type link struct {
	URL      string   `json:"url"`
	WorkerID string   `json:"worker_id"`
	Peers    []string `json:"peers"`
	Enabled  bool     `json:"enabled"`
	State    string   `json:"state"`
	Reason   string   `json:"reason"`
	Since    time.Time
	Session  struct {
		Active      bool      `json:"active"`
		Live        bool      `json:"live"`
		ConnectedAt time.Time `json:"connected_at"`
	} `json:"session"`
}

type workerRow struct {
	ID            string    `json:"id"`
	Name          string    `json:"name"`
	Tenant        string    `json:"tenant"`
	Capabilities  []string  `json:"capabilities"`
	Token         string    `json:"token"`
	CreatedAt     time.Time `json:"created_at"`
	Live          bool      `json:"live"`
	ConnectedAt   time.Time `json:"connected_at"`
	Negotiated    []string  `json:"negotiated"`
	Draining      bool      `json:"draining"`
	OfflineReason string    `json:"offline_reason"`
}

type sessions struct {
	Upstream []struct {
		Tenant   string   `json:"tenant"`
		URL      string   `json:"url"`
		WorkerID string   `json:"worker_id"`
		Live     bool     `json:"live"`
		Peers    []string `json:"peers"`
	} `json:"upstream"`
	Downstream []struct {
		WorkerID     string   `json:"worker_id"`
		Tenant       string   `json:"tenant"`
		Capabilities []string `json:"capabilities"`
		Draining     bool     `json:"draining"`
	} `json:"downstream"`
}

// runWorker runs a real worker behind the proxy, as gradient-worker with
// --server-url ws://PROXY/proto and the peers line WORKER_ID:TOKEN.
func runWorker(t *testing.T, p *admintest.Proxy, id, token string) {
	testworld.RunWorker(t, worker.Config{
		Session: workersession.Config{
			ServerURL: p.ProtoURL, WorkerID: id, Peers: id + ":" + token,
			Capabilities:   wire.GradientCapabilities{Fetch: true, Eval: true, Build: true},
			BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Heartbeat: time.Hour,
		},
		Architectures: []string{"x86_64-linux"}, MaxBuilds: 2,
	})
}

// Every request needs the admin token: none or a wrong one is 401, a
// proxy without one answers 503, and an address with too many wrong
// tokens is held back with 429.
func TestAdminAuth(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		p := admintest.Start(t, dbURL, admintest.Options{AuthFailuresPerMinute: 2})
		c := newClient(t, p)
		c.ok(200, "GET", "/api/v1/tenants", "", nil)
		c.fails(404, "no such admin endpoint", "GET", "/api/v1/no-such-endpoint", "")
		c.token = ""
		c.fails(401, "missing admin token", "GET", "/api/v1/tenants", "")
		c.fails(401, "missing admin token", "GET", "/api/v1/no-such-endpoint", "")
		c.token = "wrong"
		c.fails(401, "wrong admin token", "GET", "/api/v1/tenants", "")
		c.fails(401, "wrong admin token", "POST", "/api/v1/tenants", `{"name":"acme"}`)
		c.fails(429, "too many failed authentications", "GET", "/api/v1/tenants", "")
		c.token = p.Token // held back too, without a check
		c.fails(429, "too many failed authentications", "GET", "/api/v1/tenants", "")

		off := admintest.Start(t, dbURL, admintest.Options{NoAdminToken: true})
		oc := newClient(t, off)
		oc.token = "anything"
		oc.fails(503, "admin API disabled", "GET", "/api/v1/tenants", "")
	})
}

func TestAdminTenants(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		c := newClient(t, admintest.Start(t, dbURL, admintest.Options{}))
		var acme tenant
		c.ok(201, "POST", "/api/v1/tenants", `{"name":"acme"}`, &acme)
		if acme.Name != "acme" || !acme.MayRun || len(acme.ID) != 36 || acme.CreatedAt.IsZero() {
			t.Fatalf("created %+v", acme)
		}
		c.fails(409, `tenant "acme" already exists`, "POST", "/api/v1/tenants", `{"name":"acme"}`)
		c.fails(400, "tenant name is empty", "POST", "/api/v1/tenants", `{}`)
		c.fails(400, "use letters, digits", "POST", "/api/v1/tenants", `{"name":"a b"}`)
		c.fails(400, "request body is empty", "POST", "/api/v1/tenants", "")
		c.fails(400, "unknown field", "POST", "/api/v1/tenants", `{"name":"x","nmae":"y"}`)
		c.ok(201, "POST", "/api/v1/tenants", `{"name":"beta"}`, nil)

		var list []tenant
		c.ok(200, "GET", "/api/v1/tenants", "", &list)
		if len(list) != 2 || list[0].Name != "acme" || list[1].Name != "beta" {
			t.Fatalf("list %+v", list)
		}
		for _, ref := range []string{"acme", acme.ID} {
			var shown struct {
				tenant
				Link    *link `json:"link"`
				Workers *int  `json:"workers"`
			}
			c.ok(200, "GET", "/api/v1/tenants/"+ref, "", &shown)
			if shown.ID != acme.ID || shown.Link != nil || shown.Workers == nil || *shown.Workers != 0 {
				t.Fatalf("show %s: %+v", ref, shown)
			}
		}
		c.fails(404, `tenant "nope"`, "GET", "/api/v1/tenants/nope", "")

		c.fails(400, `send {"may_run": true}`, "PUT", "/api/v1/tenants/acme/may-run", `{}`)
		c.fails(400, "not valid JSON", "PUT", "/api/v1/tenants/acme/may-run", `{"may_run":"no"}`)
		var off tenant
		c.ok(200, "PUT", "/api/v1/tenants/acme/may-run", `{"may_run":false}`, &off)
		if off.MayRun {
			t.Fatalf("may-run off: %+v", off)
		}
		c.fails(404, "not found", "PUT", "/api/v1/tenants/nope/may-run", `{"may_run":true}`)

		c.ok(204, "DELETE", "/api/v1/tenants/beta", "", nil)
		c.fails(404, `tenant "beta"`, "DELETE", "/api/v1/tenants/beta", "")
		c.ok(200, "GET", "/api/v1/tenants", "", &list)
		if len(list) != 1 {
			t.Fatalf("after delete: %+v", list)
		}
	})
}

// A link is set from the peers-file text the tenant handed over; the
// proxy's session to the tenant's server goes live, shows in /sessions,
// stops while disabled, and a rejected token marks the link failing
// until it is set again. No answer and no log holds a link token.
func TestAdminLinkAndUpstreamSession(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		p := admintest.Start(t, dbURL, admintest.Options{})
		ten := admintest.TenantServer(t, dbURL)
		_, token, _ := strings.Cut(ten.Peers, ":")
		c := newClient(t, p)
		c.secrets = []string{token}
		c.ok(201, "POST", "/api/v1/tenants", `{"name":"acme"}`, nil)
		c.fails(404, "not found", "GET", "/api/v1/tenants/acme/link", "")

		body := func(url, workerID, peers string) string {
			b, _ := json.Marshal(map[string]string{"url": url, "worker_id": workerID, "peers": peers})
			return string(b)
		}
		put := "/api/v1/tenants/acme/link"
		c.fails(400, "url is required", "PUT", put, body("", ten.WorkerID, ten.Peers))
		c.fails(400, "want ws:// or wss://", "PUT", put, body("http://example.invalid/proto", ten.WorkerID, ten.Peers))
		c.fails(400, "has no host", "PUT", put, body("ws:///proto", ten.WorkerID, ten.Peers))
		c.fails(400, "worker_id is required", "PUT", put, body(ten.ProtoURL, "", ten.Peers))
		c.fails(400, "worker ID", "PUT", put, body(ten.ProtoURL, "not-a-uuid", ten.Peers))
		c.fails(400, "peers is required", "PUT", put, body(ten.ProtoURL, ten.WorkerID, ""))
		c.fails(400, "line 2", "PUT", put, body(ten.ProtoURL, ten.WorkerID, ten.Peers+"\nnot-a-peer:"+token+"\n"))
		c.fails(400, "token must be", "PUT", put, body(ten.ProtoURL, ten.WorkerID, ten.ProjectID+":short"))
		c.fails(404, "not found", "PUT", "/api/v1/tenants/nope/link", body(ten.ProtoURL, ten.WorkerID, ten.Peers))

		var l link
		c.ok(200, "PUT", put, body(ten.ProtoURL, ten.WorkerID, "# from the tenant\n"+ten.Peers+"\n"), &l)
		if l.URL != ten.ProtoURL || l.WorkerID != ten.WorkerID || !slices.Equal(l.Peers, []string{ten.ProjectID}) || !l.Enabled || l.State != "ok" {
			t.Fatalf("link %+v", l)
		}
		live := func() bool { c.ok(200, "GET", put, "", &l); return l.Session.Live }
		waitfor.True(t, "the upstream session live", live)
		if l.Session.ConnectedAt.IsZero() || !l.Session.Active {
			t.Fatalf("session %+v", l.Session)
		}
		var s sessions
		c.ok(200, "GET", "/api/v1/sessions", "", &s)
		if len(s.Upstream) != 1 || s.Upstream[0].Tenant != "acme" || !s.Upstream[0].Live || s.Upstream[0].WorkerID != ten.WorkerID ||
			!slices.Equal(s.Upstream[0].Peers, []string{ten.ProjectID}) || len(s.Downstream) != 0 {
			t.Fatalf("sessions %+v", s)
		}

		c.ok(200, "POST", put+"/disable", "", &l)
		if l.Enabled {
			t.Fatalf("disabled link %+v", l)
		}
		waitfor.True(t, "no upstream session while disabled", func() bool { c.ok(200, "GET", put, "", &l); return !l.Session.Active })
		c.ok(200, "POST", put+"/enable", "", &l)
		waitfor.True(t, "the upstream session back", live)

		// The tenant's server rejects a wrong token: failing, with its
		// reason, until the link is set again. (New tokens on a live
		// session reauth it; a fresh session sees the Reject.)
		c.ok(200, "POST", put+"/disable", "", nil)
		waitfor.True(t, "no upstream session while disabled", func() bool { c.ok(200, "GET", put, "", &l); return !l.Session.Active })
		wrong := ten.ProjectID + ":" + strings.Repeat("x", len(token))
		c.ok(200, "PUT", put, body(ten.ProtoURL, ten.WorkerID, wrong), &l)
		if l.Enabled {
			t.Fatalf("a link set again keeps its enabled flag: %+v", l)
		}
		c.ok(200, "POST", put+"/enable", "", nil)
		// The Reject marks the link failing just before the session ends.
		waitfor.True(t, "the link failing, its session gone", func() bool {
			c.ok(200, "GET", put, "", &l)
			return l.State == "failing" && !l.Session.Active
		})
		if !strings.Contains(l.Reason, "401") || l.Since.IsZero() {
			t.Fatalf("failing link %+v", l)
		}
		c.ok(200, "PUT", put, body(ten.ProtoURL, ten.WorkerID, ten.Peers), &l)
		if l.State != "ok" || l.Reason != "" {
			t.Fatalf("link set again: %+v", l)
		}
		waitfor.True(t, "the upstream session live after the link was set again", live)

		var shown struct {
			Link *link `json:"link"`
		}
		c.ok(200, "GET", "/api/v1/tenants/acme", "", &shown)
		if shown.Link == nil || !shown.Link.Session.Live {
			t.Fatalf("tenant's link %+v", shown.Link)
		}
		if strings.Contains(p.Logs.String(), token) {
			t.Fatal("a link token reached the proxy's log")
		}
	})
}

// A worker is created with its allowed capabilities and gets its token
// once; it connects, is listed live, and revoking it closes its session.
func TestAdminWorkers(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		p := admintest.Start(t, dbURL, admintest.Options{})
		c := newClient(t, p)
		c.ok(201, "POST", "/api/v1/tenants", `{"name":"acme"}`, nil)
		c.ok(201, "POST", "/api/v1/tenants", `{"name":"beta"}`, nil)

		var all, builder workerRow
		c.ok(201, "POST", "/api/v1/tenants/acme/workers", `{"name":"w1"}`, &all)
		if all.Name != "w1" || all.Tenant != "acme" || !slices.Equal(all.Capabilities, []string{"fetch", "eval", "build"}) ||
			len(all.ID) != 36 || all.Token == "" {
			t.Fatalf("created %+v", all)
		}
		c.ok(201, "POST", "/api/v1/tenants/beta/workers", `{"name":"b1","capabilities":["build"]}`, &builder)
		if !slices.Equal(builder.Capabilities, []string{"build"}) {
			t.Fatalf("created %+v", builder)
		}
		c.secrets = []string{all.Token, builder.Token}
		c.fails(400, "federate is never granted", "POST", "/api/v1/tenants/acme/workers", `{"name":"w2","capabilities":["build","federate"]}`)
		c.fails(400, "capabilities is empty", "POST", "/api/v1/tenants/acme/workers", `{"name":"w2","capabilities":[]}`)
		c.fails(400, `unknown capability "gpu"`, "POST", "/api/v1/tenants/acme/workers", `{"name":"w2","capabilities":["gpu"]}`)
		c.fails(400, "its own list element", "POST", "/api/v1/tenants/acme/workers", `{"name":"w2","capabilities":["fetch,eval"]}`)
		c.fails(400, "worker name is empty", "POST", "/api/v1/tenants/acme/workers", `{}`)
		c.fails(409, `already has a worker named "w1"`, "POST", "/api/v1/tenants/acme/workers", `{"name":"w1"}`)
		c.fails(404, `tenant "nope"`, "POST", "/api/v1/tenants/nope/workers", `{"name":"w1"}`)

		runWorker(t, p, all.ID, all.Token)
		var list []workerRow
		// The worker ID is held (live) from its admission; the negotiated
		// capabilities follow a moment later, when the session is up.
		waitfor.True(t, "w1 listed live with its capabilities", func() bool {
			c.ok(200, "GET", "/api/v1/workers", "", &list)
			return len(list) == 2 && list[0].Live && len(list[0].Negotiated) > 0
		})
		if w := list[0]; w.ID != all.ID || w.Tenant != "acme" || w.ConnectedAt.IsZero() || w.Token != "" ||
			!slices.Contains(w.Negotiated, "build") || slices.Contains(w.Negotiated, "federate") {
			t.Fatalf("live worker %+v", w)
		}
		if w := list[1]; w.ID != builder.ID || w.Live || w.Tenant != "beta" {
			t.Fatalf("offline worker %+v", w)
		}
		c.ok(200, "GET", "/api/v1/workers?tenant=beta", "", &list)
		if len(list) != 1 || list[0].ID != builder.ID {
			t.Fatalf("beta's workers %+v", list)
		}
		c.fails(404, `tenant "nope"`, "GET", "/api/v1/workers?tenant=nope", "")
		c.fails(400, "tenant is empty", "GET", "/api/v1/workers?tenant=", "")
		var s sessions
		c.ok(200, "GET", "/api/v1/sessions", "", &s)
		if len(s.Downstream) != 1 || s.Downstream[0].WorkerID != all.ID || s.Downstream[0].Tenant != "acme" || len(s.Upstream) != 0 {
			t.Fatalf("sessions %+v", s)
		}
		var shown struct {
			Workers int `json:"workers"`
		}
		c.ok(200, "GET", "/api/v1/tenants/acme", "", &shown)
		if shown.Workers != 1 {
			t.Fatalf("acme has %d workers, want 1", shown.Workers)
		}

		c.ok(204, "DELETE", "/api/v1/workers/"+all.ID, "", nil)
		waitfor.True(t, "the revoked worker's session closed", func() bool { return !p.Leg.WorkerStatus(all.ID).Live })
		if st := p.Leg.WorkerStatus(all.ID); !strings.Contains(st.OfflineReason, downstream.RevokedReason) {
			t.Fatalf("offline reason %q, want %q", st.OfflineReason, downstream.RevokedReason)
		}
		c.ok(200, "GET", "/api/v1/workers?tenant=acme", "", &list)
		if len(list) != 0 {
			t.Fatalf("after revoke: %+v", list)
		}
		c.fails(404, "not found", "DELETE", "/api/v1/workers/"+all.ID, "")
		c.fails(400, "worker ID", "DELETE", "/api/v1/workers/not-a-uuid", "")
	})
}

// Deleting a tenant revokes its workers (their sessions close at once)
// and stops its upstream session; other tenants are untouched.
func TestAdminDeleteTenant(t *testing.T) {
	t.Parallel()
	sqldbtest.ForEachEngineURL(t, func(t *testing.T, _, dbURL string) {
		p := admintest.Start(t, dbURL, admintest.Options{})
		ten := admintest.TenantServer(t, dbURL)
		c := newClient(t, p)
		c.ok(201, "POST", "/api/v1/tenants", `{"name":"acme"}`, nil)
		c.ok(201, "POST", "/api/v1/tenants", `{"name":"beta"}`, nil)
		b, _ := json.Marshal(map[string]string{"url": ten.ProtoURL, "worker_id": ten.WorkerID, "peers": ten.Peers})
		c.ok(200, "PUT", "/api/v1/tenants/acme/link", string(b), nil)
		var wa, wb workerRow
		c.ok(201, "POST", "/api/v1/tenants/acme/workers", `{"name":"a1"}`, &wa)
		c.ok(201, "POST", "/api/v1/tenants/beta/workers", `{"name":"b1"}`, &wb)
		runWorker(t, p, wa.ID, wa.Token)
		runWorker(t, p, wb.ID, wb.Token)
		var s sessions
		waitfor.True(t, "both workers and the upstream session live", func() bool {
			c.ok(200, "GET", "/api/v1/sessions", "", &s)
			return len(s.Downstream) == 2 && len(s.Upstream) == 1 && s.Upstream[0].Live
		})

		c.ok(204, "DELETE", "/api/v1/tenants/acme", "", nil)
		waitfor.True(t, "acme's worker closed", func() bool { return !p.Leg.WorkerStatus(wa.ID).Live })
		waitfor.True(t, "acme's upstream session stopped", func() bool {
			c.ok(200, "GET", "/api/v1/sessions", "", &s)
			return len(s.Upstream) == 0
		})
		if len(s.Downstream) != 1 || s.Downstream[0].WorkerID != wb.ID {
			t.Fatalf("sessions after deleting acme: %+v", s)
		}
		var list []workerRow
		c.ok(200, "GET", "/api/v1/workers", "", &list)
		if len(list) != 1 || list[0].ID != wb.ID {
			t.Fatalf("workers after deleting acme: %+v", list)
		}
		c.fails(404, "not found", "GET", "/api/v1/tenants/acme", "")
	})
}
