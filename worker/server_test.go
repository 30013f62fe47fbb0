package worker

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testlog"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

func TestPeersFileChangeReauthorizesLiveSession(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		r := newRealServer(t, db, server.Config{})
		cfg := testConfig(t, r.url, newBlockingExecutor())
		cfg.Session.PeersFile = filepath.Join(t.TempDir(), "peers")
		cfg.Session.PeersPollInterval = 20 * time.Millisecond
		var workerLogs *testlog.Buffer
		cfg.Session.Logger, workerLogs = testlog.New(t, "worker")
		first := r.register(r.project.ID, cfg.Session.WorkerID)
		if err := os.WriteFile(cfg.Session.PeersFile, []byte("# first project\n"+r.project.ID+":"+first+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		startWorker(t, cfg)
		waitfor.True(t, "the worker live for the first project", func() bool {
			st := r.srv.WorkerStatus(cfg.Session.WorkerID)
			return st.Live && slices.Equal(st.Projects, []string{r.project.ID})
		})
		connectedAt := r.srv.WorkerStatus(cfg.Session.WorkerID).ConnectedAt

		second := r.register(r.second.ID, cfg.Session.WorkerID)
		content := "# both projects\n" + r.project.ID + ":" + first + "\n" + r.second.ID + ":" + second + "\n"
		if err := os.WriteFile(cfg.Session.PeersFile, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		waitfor.True(t, "the second project on the live session", func() bool {
			st := r.srv.WorkerStatus(cfg.Session.WorkerID)
			return slices.Contains(st.Projects, r.second.ID)
		})
		if st := r.srv.WorkerStatus(cfg.Session.WorkerID); !st.ConnectedAt.Equal(connectedAt) {
			t.Fatalf("the worker reconnected (%v, then %v): the reauth must use the live session", connectedAt, st.ConnectedAt)
		}
		for _, logs := range []string{r.logs.String(), workerLogs.String()} {
			if strings.Contains(logs, first) || strings.Contains(logs, second) {
				t.Fatal("a token reached a log")
			}
		}
		if !strings.Contains(workerLogs.String(), "peers changed: requesting reauth") {
			t.Fatal("the reauth was not requested by the worker")
		}
	})
}

// Admin reauths in a burst while the peers file changes: the worker
// answers every challenge, and the session survives with both projects.
func TestOverlappingReauthsKeepTheSession(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		r := newRealServer(t, db, server.Config{})
		cfg := testConfig(t, r.url, newBlockingExecutor())
		cfg.Session.PeersFile = filepath.Join(t.TempDir(), "peers")
		cfg.Session.PeersPollInterval = 5 * time.Millisecond
		var workerLogs *testlog.Buffer
		cfg.Session.Logger, workerLogs = testlog.New(t, "worker")
		first := r.register(r.project.ID, cfg.Session.WorkerID)
		if err := os.WriteFile(cfg.Session.PeersFile, []byte(r.project.ID+":"+first+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		startWorker(t, cfg)
		waitfor.True(t, "the worker live", func() bool { return r.srv.WorkerStatus(cfg.Session.WorkerID).Live })
		connectedAt := r.srv.WorkerStatus(cfg.Session.WorkerID).ConnectedAt

		second := r.register(r.second.ID, cfg.Session.WorkerID)
		if err := os.WriteFile(cfg.Session.PeersFile, []byte(r.project.ID+":"+first+"\n"+r.second.ID+":"+second+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if !r.srv.Reauth(cfg.Session.WorkerID) {
				t.Fatal("no live session to reauth")
			}
		}
		waitfor.True(t, "the second project on the live session", func() bool {
			return slices.Contains(r.srv.WorkerStatus(cfg.Session.WorkerID).Projects, r.second.ID)
		})
		// Every challenge the worker saw was answered by an AuthUpdate.
		waitfor.True(t, "every challenge answered", func() bool {
			logs := workerLogs.String()
			updates := strings.Count(logs, "authorization updated")
			return updates >= 2 && updates == strings.Count(logs, "server challenged the session")
		})
		if st := r.srv.WorkerStatus(cfg.Session.WorkerID); !st.Live || !st.ConnectedAt.Equal(connectedAt) {
			t.Fatalf("the session did not survive the reauths: %+v (connected at %v before)", st, connectedAt)
		}
		if strings.Contains(workerLogs.String(), "server reported an error") {
			t.Fatal("a reauth ended in a protocol error")
		}
	})
}

func TestReconnectsAfterServerRestart(t *testing.T) {
	t.Parallel()
	r := newRealServer(t, openSQLite(t), server.Config{})
	cfg := testConfig(t, r.url, newBlockingExecutor())
	cfg.Session.Peers = r.project.ID + ":" + r.register(r.project.ID, cfg.Session.WorkerID)
	var logs *testlog.Buffer
	cfg.Session.Logger, logs = testlog.New(t, "worker")
	startWorker(t, cfg)
	waitfor.True(t, "the worker live", func() bool { return r.srv.WorkerStatus(cfg.Session.WorkerID).Live })

	addr := r.addr
	r.stop()
	// While the server is down the worker retries with a delay that
	// doubles (less up to a fifth of jitter) up to the maximum.
	waitfor.True(t, "four failed reconnects", func() bool { return len(retryDelays(logs.String())) >= 4 })
	delays := retryDelays(logs.String())
	for i := 1; i < 4; i++ {
		if lo, hi := delays[i-1]*2*8/10, delays[i-1]*2*100/80; delays[i] < min(lo, cfg.Session.BackoffMax*8/10) || delays[i] > min(hi, cfg.Session.BackoffMax) {
			t.Fatalf("reconnect delays %v: #%d does not double the one before (capped at %v)", delays, i, cfg.Session.BackoffMax)
		}
	}
	r.start(addr)
	waitfor.True(t, "the worker live on the restarted server", func() bool { return r.srv.WorkerStatus(cfg.Session.WorkerID).Live })
}

// retryDelays are the retry_in delays of a worker's failed connects.
func retryDelays(log string) []time.Duration {
	var out []time.Duration
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "connection failed") {
			continue
		}
		_, rest, ok := strings.Cut(line, "retry_in=")
		if !ok {
			continue
		}
		field, _, _ := strings.Cut(rest, " ")
		if d, err := time.ParseDuration(field); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// dialedWorkerSetup is a real server that dials workers, and a worker
// listening on loopback without TLS (the explicit insecure listen).
func dialedWorkerSetup(t *testing.T, db *storage.DB) (*realServer, Config, string) {
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	r := newRealServer(t, db, server.Config{DialKey: box, DialBackoff: 20 * time.Millisecond, DialMaxBackoff: 100 * time.Millisecond, DialRescan: time.Minute})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "", newBlockingExecutor())
	cfg.Session.Listener = ln
	cfg.Session.InsecureListen = true
	return r, cfg, "ws://" + ln.Addr().String() + "/proto"
}

func (r *realServer) registerDialed(projectID, workerID, url string) string {
	r.t.Helper()
	settings := storage.DefaultWorkerSettings()
	settings.URL = url
	_, token, err := r.srv.CreateRegistration(r.t.Context(), storage.Peer{Kind: storage.PeerProject, ID: projectID}, workerID, settings)
	if err != nil {
		r.t.Fatal(err)
	}
	return token
}

func writeAcceptedTokens(t *testing.T, lines ...string) string {
	path := filepath.Join(t.TempDir(), "accepted-server-tokens")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestServerDialedWorkerAccepted(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		r, cfg, url := dialedWorkerSetup(t, db)
		// The server dials at once and retries: the worker is not up yet.
		token := r.registerDialed(r.project.ID, cfg.Session.WorkerID, url)
		file := writeAcceptedTokens(t, "# the server's token, as hex SHA-256", r.project.ID+":"+sha256Hex(token))
		cfg.Session.ServerTokens = LoadServerTokens(file, cfg.Session.WorkerID, cfg.Session.Logger)
		startWorker(t, cfg)
		waitfor.True(t, "the dialed session", func() bool {
			st := r.srv.WorkerStatus(cfg.Session.WorkerID)
			return st.Live && st.DialedURL == url && slices.Equal(st.Projects, []string{r.project.ID})
		})
	})
}

func TestServerDialedWorkerRejectsWrongToken(t *testing.T) {
	t.Parallel()
	r, cfg, url := dialedWorkerSetup(t, openSQLite(t))
	r.registerDialed(r.project.ID, cfg.Session.WorkerID, url)
	file := writeAcceptedTokens(t, "*:"+sha256Hex("a token of another server"))
	cfg.Session.ServerTokens = LoadServerTokens(file, cfg.Session.WorkerID, cfg.Session.Logger)
	startWorker(t, cfg)
	want := "worker rejected connection (code 401): unknown worker id or wrong token"
	waitfor.True(t, "the 401 as offline reason", func() bool { return r.srv.WorkerStatus(cfg.Session.WorkerID).OfflineReason == want })
	if r.srv.WorkerStatus(cfg.Session.WorkerID).Live {
		t.Fatal("a rejected server holds a session")
	}
}

func TestServerTokensFile(t *testing.T) {
	t.Parallel()
	log, _ := testlog.New(t, "tokens")
	const id = "0190c3a4-5b6d-7e8f-9a0b-1c2d3e4f5a6b"
	file := writeAcceptedTokens(t, "p1:"+sha256Hex("one"), "malformed", "*:"+sha256Hex("any"))
	st := LoadServerTokens(file, id, log)
	cases := []struct {
		worker, peer, token string
		want                bool
	}{
		{id, "p1", "one", true},
		{id, "p2", "any", true},
		{id, "p1", "wrong", false},
		{"0190c3a4-0000-7e8f-9a0b-1c2d3e4f5a6b", "p1", "one", false},
	}
	for _, c := range cases {
		if got := st.VerifyServer(c.worker, pairs(c.peer, c.token)); got != c.want {
			t.Errorf("%+v: got %v", c, got)
		}
	}
	if LoadServerTokens(file+".missing", id, log).VerifyServer(id, pairs("p1", "one")) {
		t.Fatal("an unreadable file must reject every server")
	}
}
