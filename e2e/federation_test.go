package e2e

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/proxyworld"
	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

func TestMain(m *testing.M) { os.Exit(proxyworld.Main(m)) }

// federation is two tenants' servers (A on SQLite, B on PostgreSQL), each
// with a project that registered a worker ID for the proxy, and one
// proxy with a tenant per server.
type federation struct {
	serverA, serverB   *proxyworld.Server
	projectA, projectB string
	// proxyIDA and proxyIDB are the proxy's worker IDs on each server,
	// peersA and peersB the peers lines the tenants handed over.
	proxyIDA, proxyIDB string
	peersA, peersB     string
	proxy              *proxyworld.Proxy
}

// hostOnServer is a worker as `gradient worker list --project --json`
// shows it.
type hostOnServer struct {
	WorkerID string `json:"worker_id"`
	Live     bool   `json:"live"`
	Host     *struct {
		Architectures       []string `json:"architectures"`
		MaxConcurrentBuilds uint32   `json:"max_concurrent_builds"`
		CPUCount            int      `json:"cpu_count"`
		RAMTotalMB          uint64   `json:"ram_total_mb"`
		CPUCoreScore        uint32   `json:"cpu_core_score"`
	} `json:"host"`
}

// listed is the proxy's row in the project's worker list on s.
func listed(t *testing.T, s *proxyworld.Server, project, workerID string) hostOnServer {
	t.Helper()
	var workers []hostOnServer
	if err := json.Unmarshal([]byte(s.CLI(t, "worker", "list", "--project", project, "--json")), &workers); err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		if w.WorkerID == workerID {
			return w
		}
	}
	t.Fatalf("%s: worker %s not in the worker list of %s", s.Name, workerID, project)
	return hostOnServer{}
}

// showsAggregate: the proxy is live on s with exactly these architectures
// and slots.
func showsAggregate(t *testing.T, s *proxyworld.Server, project, workerID string, archs []string, slots uint32) func() bool {
	return func() bool {
		w := listed(t, s, project, workerID)
		return w.Live && w.Host != nil && slices.Equal(w.Host.Architectures, archs) && w.Host.MaxConcurrentBuilds == slots
	}
}

type linkStatus struct {
	State   string `json:"state"`
	Reason  string `json:"reason"`
	Since   string `json:"since"`
	Session struct {
		Live bool `json:"live"`
	} `json:"session"`
}

func (f *federation) link(t *testing.T, tenant string) linkStatus {
	t.Helper()
	var l linkStatus
	f.proxy.API(t, "GET", "/api/v1/tenants/"+tenant+"/link", nil, &l)
	return l
}

type createdWorker struct {
	ID    string `json:"id"`
	Token string `json:"token"`
}

// createWorker creates a proxy worker for tenant through the API.
func (f *federation) createWorker(t *testing.T, tenant, name string) createdWorker {
	t.Helper()
	var w createdWorker
	f.proxy.API(t, "POST", "/api/v1/tenants/"+tenant+"/workers", map[string]any{"name": name}, &w)
	if w.ID == "" || w.Token == "" {
		t.Fatalf("created worker %+v lacks its ID or token", w)
	}
	return w
}

func newFederation(t *testing.T) *federation {
	t.Helper()
	return newFederationWith(t, federationOptions{})
}

// federationOptions change newFederation's world.
type federationOptions struct {
	// ServerArgs are both servers' extra flags.
	ServerArgs []string
	// Project creates the tenant's project on its server (team alpha on
	// A, beta on B) and returns TEAM/NAME; nil is Server.Project's
	// project named app.
	Project func(s *proxyworld.Server, team string) string
	Proxy   proxyworld.ProxyOptions
}

func newFederationWith(t *testing.T, opts federationOptions) *federation {
	t.Helper()
	if opts.Project == nil {
		opts.Project = func(s *proxyworld.Server, team string) string { return s.Project(t, team, "app") }
	}
	f := &federation{}
	f.serverA = proxyworld.StartServer(t, "server-a", proxyworld.ServerOptions{Args: opts.ServerArgs})
	f.serverB = proxyworld.StartServer(t, "server-b", proxyworld.ServerOptions{Database: sqldbtest.PostgresURL(t), Args: opts.ServerArgs})
	f.projectA = opts.Project(f.serverA, "alpha")
	f.projectB = opts.Project(f.serverB, "beta")
	// How a tenant registers the proxy: the worker ID and the peers
	// line it prints go to the proxy's operator.
	f.proxyIDA, f.peersA = f.serverA.Register(t, f.projectA)
	f.proxyIDB, f.peersB = f.serverB.Register(t, f.projectB)
	f.proxy = proxyworld.StartProxy(t, "proxy", opts.Proxy)

	// Tenant A through the CLI, B through the API.
	f.proxy.CLI(t, "tenant", "create", "tenant-a")
	peersFile := filepath.Join(t.TempDir(), "peers-a")
	if err := os.WriteFile(peersFile, []byte(f.peersA+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.proxy.CLI(t, "link", "set", "tenant-a", "--url", f.serverA.ProtoURL, "--worker-id", f.proxyIDA, "--peers-file", peersFile)
	f.proxy.API(t, "POST", "/api/v1/tenants", map[string]any{"name": "tenant-b"}, nil)
	f.proxy.API(t, "PUT", "/api/v1/tenants/tenant-b/link", map[string]any{"url": f.serverB.ProtoURL, "worker_id": f.proxyIDB, "peers": f.peersB + "\n"}, nil)
	return f
}

// downstream runs a gradient-worker behind the proxy for a created
// worker row.
func (f *federation) downstream(t *testing.T, name string, w createdWorker, arch string, slots int) *proxyworld.Worker {
	t.Helper()
	return proxyworld.StartWorker(t, name, proxyworld.WorkerOptions{ServerURL: f.proxy.ProtoURL, ID: w.ID, Peers: w.ID + ":" + w.Token,
		Architectures: []string{arch}, Features: []string{"big-parallel"}, Slots: slots, CoreScore: coreScores[arch]})
}

// coreScores are the workers' single-core speeds by architecture: the
// aggregate's is the fastest.
var coreScores = map[string]int{"x86_64-linux": 100, "aarch64-linux": 300, "riscv64-linux": 50}

// The federation end to end with real processes: two tenants' servers,
// one proxy, real workers behind it (issue 17's Tests).
func TestFederation(t *testing.T) {
	t.Parallel()
	f := newFederation(t)

	// A's workers: one created through the CLI, one through the API.
	out := f.proxy.CLI(t, "worker", "create", "tenant-a", "--name", "a1")
	a1 := createdWorker{ID: regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f-]{27}`).FindString(out)}
	if m := regexp.MustCompile(`(?m)^\s*` + a1.ID + `:(\S+)\s*$`).FindStringSubmatch(out); m != nil {
		a1.Token = m[1]
	}
	if a1.ID == "" || a1.Token == "" {
		t.Fatalf("gradient proxy worker create printed no ID and token line:\n%s", out)
	}
	a2 := f.createWorker(t, "tenant-a", "a2")
	b1 := f.createWorker(t, "tenant-b", "b1")
	workerA1 := f.downstream(t, "worker-a1", a1, "x86_64-linux", 2)
	workerA2 := f.downstream(t, "worker-a2", a2, "aarch64-linux", 3)
	f.downstream(t, "worker-b1", b1, "riscv64-linux", 4)
	// Processes a subtest starts for later ones run under the test.
	test := t

	t.Run("each server sees its own pool's aggregate", func(t *testing.T) {
		waitfor.True(t, "A's aggregate on server A", showsAggregate(t, f.serverA, f.projectA, f.proxyIDA, []string{"aarch64-linux", "x86_64-linux"}, 5))
		waitfor.True(t, "B's aggregate on server B", showsAggregate(t, f.serverB, f.projectB, f.proxyIDB, []string{"riscv64-linux"}, 4))
		// CPUs and RAM summed, the fastest core: all three workers run on
		// this machine.
		a, b := listed(t, f.serverA, f.projectA, f.proxyIDA).Host, listed(t, f.serverB, f.projectB, f.proxyIDB).Host
		if a.CPUCount != 2*runtime.NumCPU() || a.RAMTotalMB != 2*b.RAMTotalMB || a.CPUCoreScore != 300 {
			t.Errorf("A's aggregate %+v, want two workers' CPUs (%d) and RAM (%d MB) and core score 300", *a, 2*runtime.NumCPU(), 2*b.RAMTotalMB)
		}
		if b.CPUCount != runtime.NumCPU() || b.CPUCoreScore != 50 {
			t.Errorf("B's aggregate %+v, want one worker's CPUs and core score 50", *b)
		}
		// The operator's text: the proxy's ID, live, architectures, slots.
		text := f.serverA.CLI(t, "worker", "list", "--project", f.projectA)
		if !regexp.MustCompile(`(?m)^` + f.proxyIDA + `\s+yes\s+\S+\s+\S+\s+aarch64-linux,x86_64-linux\s+5\s`).MatchString(text) {
			t.Errorf("server A's worker list does not show the proxy's aggregate:\n%s", text)
		}
		if strings.Contains(text, "riscv64-linux") {
			t.Errorf("server A's worker list shows B's worker:\n%s", text)
		}

		// Leaving and joining change the aggregate.
		workerA2.Stop()
		waitfor.True(t, "A's aggregate without a2", showsAggregate(t, f.serverA, f.projectA, f.proxyIDA, []string{"x86_64-linux"}, 2))
		workerA2 = f.downstream(test, "worker-a2-again", a2, "aarch64-linux", 3)
		waitfor.True(t, "A's aggregate with a2 back", showsAggregate(t, f.serverA, f.projectA, f.proxyIDA, []string{"aarch64-linux", "x86_64-linux"}, 5))
		if w := listed(t, f.serverB, f.projectB, f.proxyIDB); w.Host == nil || w.Host.MaxConcurrentBuilds != 4 {
			t.Errorf("B's aggregate %+v changed with A's pool", w.Host)
		}
	})

	t.Run("a bad upstream token fails the link without redialing", func(t *testing.T) {
		// Tenant C is another registration on server B; its link gets a
		// wrong token for the right peer.
		proxyIDC, peersC := f.serverB.Register(t, f.projectB)
		peer, goodToken, _ := strings.Cut(peersC, ":")
		badToken := strings.Repeat("0", len(goodToken))
		rejectedBefore := f.serverB.Metrics(t).Value("gradient_server_handshakes_total", map[string]string{"outcome": "rejected"})
		f.proxy.API(t, "POST", "/api/v1/tenants", map[string]any{"name": "tenant-c"}, nil)
		f.proxy.API(t, "PUT", "/api/v1/tenants/tenant-c/link", map[string]any{"url": f.serverB.ProtoURL, "worker_id": proxyIDC, "peers": peer + ":" + badToken}, nil)
		waitfor.True(t, "tenant C's link failing", func() bool { return f.link(t, "tenant-c").State == "failing" })
		l := f.link(t, "tenant-c")
		if !strings.Contains(l.Reason, "401") || !strings.Contains(l.Reason, "no valid peer tokens provided") || l.Session.Live {
			t.Errorf("link %+v, want failing with the server's 401 reason and no session", l)
		}
		// The operator's text says so too.
		if text := f.proxy.CLI(t, "link", "status", "tenant-c"); !strings.Contains(text, "failing") || !strings.Contains(text, "no valid peer tokens provided") {
			t.Errorf("gradient proxy link status does not show the failing link with the server's reason:\n%s", text)
		}
		rejected := func() float64 {
			return f.serverB.Metrics(t).Value("gradient_server_handshakes_total", map[string]string{"outcome": "rejected"}) - rejectedBefore
		}
		// Several of the worker's backoff steps (1 s, 2 s, …) and more
		// than one of the supervisor's link polls (5 s): a redial loop
		// would be refused again meanwhile.
		time.Sleep(7 * time.Second)
		if n := rejected(); n != 1 {
			t.Errorf("server B refused the proxy %v times, want once: the failing link was dialed again", n)
		}
		if lines := f.proxy.Lines("rejected the proxy", "tenant-c"); len(lines) != 1 {
			t.Errorf("the proxy logged %d rejections of tenant C, want 1:\n%s", len(lines), strings.Join(lines, "\n"))
		}
		if w := listed(t, f.serverB, f.projectB, proxyIDC); w.Live {
			t.Error("the proxy's session for tenant C is live with a wrong token")
		}

		// Set again with the good token: the link recovers.
		answer := f.proxy.API(t, "PUT", "/api/v1/tenants/tenant-c/link", map[string]any{"url": f.serverB.ProtoURL, "worker_id": proxyIDC, "peers": peersC}, nil)
		if bytes.Contains(answer, []byte(goodToken)) {
			t.Errorf("setting the link answers with its token: %s", answer)
		}
		waitfor.True(t, "tenant C's link ok and live", func() bool {
			l := f.link(t, "tenant-c")
			return l.State == "ok" && l.Session.Live
		})
		waitfor.True(t, "the proxy live for C on server B", func() bool { return listed(t, f.serverB, f.projectB, proxyIDC).Live })
		if n := rejected(); n != 1 {
			t.Errorf("%v refusals after the good token, want still 1", n)
		}
	})

	t.Run("revoking closes the session; wrong tokens and unknown IDs are refused", func(t *testing.T) {
		liveDownstream := func(id string) bool {
			var s struct {
				Downstream []struct {
					WorkerID string `json:"worker_id"`
				} `json:"downstream"`
			}
			f.proxy.API(t, "GET", "/api/v1/sessions", nil, &s)
			return slices.ContainsFunc(s.Downstream, func(d struct {
				WorkerID string `json:"worker_id"`
			}) bool {
				return d.WorkerID == id
			})
		}
		waitfor.True(t, "a2 live at the proxy", func() bool { return liveDownstream(a2.ID) })
		f.proxy.CLI(t, "worker", "revoke", a2.ID)
		// The requirement itself: closed within a second of the revoke.
		waitfor.Within(t, time.Second, "a2's session closed within a second of its revoke", func() bool { return !liveDownstream(a2.ID) })
		waitfor.True(t, "a2 told why its session ended", func() bool { return len(workerA2.Lines("worker revoked")) > 0 })
		waitfor.True(t, "a2's redial refused as unknown", func() bool { return len(workerA2.Lines("handshake failed", "code=403")) > 0 })
		waitfor.True(t, "A's aggregate without the revoked a2", showsAggregate(t, f.serverA, f.projectA, f.proxyIDA, []string{"x86_64-linux"}, 2))

		wrong := f.downstream(t, "worker-wrong-token", createdWorker{ID: a1.ID, Token: strings.Repeat("f", 64)}, "x86_64-linux", 1)
		unknown := f.downstream(t, "worker-unknown", createdWorker{ID: storage.NewID(), Token: a1.Token}, "x86_64-linux", 1)
		waitfor.True(t, "the wrong token refused with 401", func() bool { return len(wrong.Lines("handshake failed", "code=401")) > 0 })
		waitfor.True(t, "the unknown ID refused with 403", func() bool { return len(unknown.Lines("handshake failed", "code=403")) > 0 })
		// The real a1 is still the one session of its ID.
		if !liveDownstream(a1.ID) || workerA1.Exited() {
			t.Error("a1 lost its session to a worker with a wrong token")
		}
	})

	t.Run("the proxy keeps no plaintext token and never returns one", func(t *testing.T) {
		secrets := map[string]string{"A's peer token": tokenOf(f.peersA), "B's peer token": tokenOf(f.peersB),
			"a1's token": a1.Token, "a2's token": a2.Token, "b1's token": b1.Token}
		// Every byte of the proxy's SQLite database: the file, its WAL,
		// its shared memory.
		files, control := 0, false
		err := filepath.WalkDir(f.proxy.DataDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files++
			// The scan sees what the proxy stored in the clear.
			control = control || bytes.Contains(data, []byte(f.proxyIDA))
			for what, secret := range secrets {
				if bytes.Contains(data, []byte(secret)) {
					t.Errorf("%s holds %s in plaintext", path, what)
				}
			}
			return nil
		})
		if err != nil || files == 0 || !control {
			t.Fatalf("reading the proxy's data directory %s: %d files, the link's worker ID found: %v, %v", f.proxy.DataDir, files, control, err)
		}
		for _, path := range []string{"/api/v1/tenants", "/api/v1/tenants/tenant-a", "/api/v1/tenants/tenant-b",
			"/api/v1/tenants/tenant-a/link", "/api/v1/tenants/tenant-b/link", "/api/v1/workers", "/api/v1/sessions"} {
			code, body := f.proxy.Call(t, "GET", path, nil)
			if code != http.StatusOK {
				t.Errorf("GET %s: %d %s", path, code, body)
			}
			for what, secret := range secrets {
				if bytes.Contains(body, []byte(secret)) {
					t.Errorf("GET %s returns %s", path, what)
				}
			}
		}
		for what, secret := range secrets {
			if lines := f.proxy.Lines(secret); len(lines) > 0 {
				t.Errorf("the proxy logged %s: %s", what, lines[0])
			}
		}
	})
}

// tokenOf is the token of a PEER:TOKEN line.
func tokenOf(peers string) string {
	_, token, _ := strings.Cut(peers, ":")
	return token
}
