package proxyworld

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testworld"
)

// randomToken is a fresh admin token.
func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// service is what a server and a proxy share: a process serving HTTP
// with an admin API behind a bearer token.
type service struct {
	*Process
	// URL is http://HOST:PORT; ProtoURL its ws://…/proto.
	URL, ProtoURL string
	AdminToken    string
}

func (s *service) listened(tb testing.TB) {
	tb.Helper()
	addr := s.listenAddress(tb)
	s.URL, s.ProtoURL = "http://"+addr, "ws://"+addr+"/proto"
	waitHealthy(tb, s.Name, s.URL)
}

// waitHealthy waits for GET /healthz to answer 200.
func waitHealthy(tb testing.TB, name, base string) {
	tb.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s at %s not healthy within 60 s (last: %v)", name, base, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Call sends an admin API request (body marshalled as JSON unless nil)
// and returns the status and the raw answer.
func (s *service) Call(tb testing.TB, method, path string, body any) (int, []byte) {
	tb.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			tb.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, r)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.AdminToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s %s: %v", s.Name, method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s %s: %v", s.Name, method, path, err)
	}
	return resp.StatusCode, data
}

// API is Call that requires a 2xx answer and decodes it into out (nil:
// ignore it).
func (s *service) API(tb testing.TB, method, path string, body, out any) []byte {
	tb.Helper()
	code, data := s.Call(tb, method, path, body)
	if code/100 != 2 {
		tb.Fatalf("%s %s %s: %d %s", s.Name, method, path, code, data)
	}
	decode(tb, s.Name+" "+method+" "+path, data, out)
	return data
}

// Metrics scrapes the service's /metrics.
func (s *service) Metrics(tb testing.TB) testworld.Metrics {
	tb.Helper()
	return testworld.Scrape(tb, s.URL+"/metrics")
}

// CLI runs the gradient command with env (plus the test's environment)
// and returns its exit code, stdout and stderr.
func CLI(tb testing.TB, env []string, args ...string) (int, string, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, Binary(tb, "gradient"), args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		exit, ok := err.(*exec.ExitError)
		if !ok {
			tb.Fatalf("gradient %s: %v", strings.Join(args, " "), err)
		}
		code = exit.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

// Server is a gradient-server process on loopback.
type Server struct {
	service
	Database string
	// Previous are the processes of this server Restart replaced.
	Previous []*Process
	// args and env start it again (Restart).
	args, env []string
}

// ServerOptions configure StartServer.
type ServerOptions struct {
	// Database is a postgres:// URL or a SQLite data directory; empty
	// is SQLite in a temporary directory.
	Database string
	// Args are more flags, after those StartServer sets.
	Args []string
	Env  []string
	// AdminToken is the admin token (empty: a fresh one) and NarDir the
	// NAR directory (empty: one of its own): instances sharing a
	// database share both (StartCluster).
	AdminToken, NarDir string
}

// StartServer runs a gradient-server on a free loopback port with an
// admin token and waits until it is healthy.
func StartServer(tb testing.TB, name string, opts ServerOptions) *Server {
	tb.Helper()
	dir := tb.TempDir()
	if opts.Database == "" {
		opts.Database = filepath.Join(dir, "data")
	}
	if opts.NarDir == "" {
		opts.NarDir = filepath.Join(dir, "nars")
	}
	token := opts.AdminToken
	if token == "" {
		token = randomToken()
	}
	args := append([]string{"--listen", "127.0.0.1:0", "--database", opts.Database, "--nar-dir", opts.NarDir,
		"--admin-token-file", writeSecret(tb, dir, "admin-token", token), "--poll-interval", "0"}, opts.Args...)
	s := &Server{service: service{Process: Start(tb, name, "gradient-server", opts.Env, args...), AdminToken: token}, Database: opts.Database,
		args: args, env: opts.Env}
	s.listened(tb)
	return s
}

// Restart starts the server again after it ended (Stop, Kill): the same
// database, NAR directory, admin token and address. The old process's
// output stays in Previous.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	if !s.Exited() {
		tb.Fatalf("%s: Restart while it runs", s.Name)
	}
	addr := strings.TrimPrefix(s.URL, "http://")
	args := slices.Clone(s.args)
	args[slices.Index(args, "--listen")+1] = addr
	s.Previous = append(s.Previous, s.Process)
	s.Process = Start(tb, s.Name, "gradient-server", s.env, args...)
	if got := s.listenAddress(tb); got != addr {
		tb.Fatalf("%s restarted on %s, want %s", s.Name, got, addr)
	}
	waitHealthy(tb, s.Name, s.URL)
}

// FlakeProject creates team/name building the flake repository (a local
// git repository: the server needs --allow-local-repositories) with a
// public cache of the same name plus "-cache", and returns "team/name".
// wildcards empty is the server's default.
func (s *Server) FlakeProject(tb testing.TB, team, name, repository, wildcards string) string {
	tb.Helper()
	s.CLI(tb, "team", "create", team)
	project := team + "/" + name
	args := []string{"project", "create", project, "--repository", repository}
	if wildcards != "" {
		args = append(args, "--wildcards", wildcards)
	}
	s.CLI(tb, args...)
	s.CLI(tb, "cache", "create", name+"-cache", "--public")
	s.CLI(tb, "project", "subscribe", project, name+"-cache")
	return project
}

// Env is the gradient CLI's environment for this server's admin API.
func (s *Server) Env() []string {
	return []string{"GRADIENT_SERVER=" + s.URL, "GRADIENT_ADMIN_TOKEN=" + s.AdminToken}
}

// CLI runs `gradient args…` against the server and requires exit 0; it
// returns stdout.
func (s *Server) CLI(tb testing.TB, args ...string) string {
	tb.Helper()
	code, stdout, stderr := CLI(tb, s.Env(), args...)
	if code != 0 {
		tb.Fatalf("%s: gradient %s: exit %d\nstdout: %s\nstderr: %s", s.Name, strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// Project creates team/name with a cache it subscribes to (a worker's
// registration needs one) through the CLI, and returns "team/name".
func (s *Server) Project(tb testing.TB, team, name string) string {
	tb.Helper()
	s.CLI(tb, "team", "create", team)
	project := team + "/" + name
	s.CLI(tb, "project", "create", project, "--repository", "https://example.invalid/"+name+".git")
	s.CLI(tb, "cache", "create", name+"-cache")
	s.CLI(tb, "project", "subscribe", project, name+"-cache")
	return project
}

var (
	uuidPattern = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	peersLine   = regexp.MustCompile(`(?m)^\s*([0-9a-f-]{36}:\S+)$`)
)

// Register registers a new worker ID for project with `gradient worker
// register --project` (args add flags) and returns the ID and the peers
// line PEER:TOKEN the command prints once.
func (s *Server) Register(tb testing.TB, project string, args ...string) (workerID, peers string) {
	tb.Helper()
	out := s.CLI(tb, append([]string{"worker", "register", "--project", project}, args...)...)
	m := peersLine.FindStringSubmatch(out)
	workerID = uuidPattern.FindString(out)
	if m == nil || workerID == "" {
		tb.Fatalf("%s: no worker ID and peers line in:\n%s", s.Name, out)
	}
	return workerID, m[1]
}

// Proxy is a gradient-proxy process on loopback.
type Proxy struct {
	service
	// DataDir is the SQLite data directory when the proxy runs on the
	// default engine.
	DataDir  string
	Database string
}

// ProxyOptions configure StartProxy.
type ProxyOptions struct {
	// Database is a postgres:// URL; empty is SQLite in DataDir.
	Database string
	Args     []string
	Env      []string
	// OpenFiles, when set, runs the proxy under prlimit with this
	// RLIMIT_NOFILE (soft and hard).
	OpenFiles int
}

// StartProxy runs a gradient-proxy on a free loopback port with a fresh
// encryption key and admin token and waits until it is healthy.
func StartProxy(tb testing.TB, name string, opts ProxyOptions) *Proxy {
	tb.Helper()
	dir := tb.TempDir()
	p := &Proxy{DataDir: filepath.Join(dir, "data"), Database: opts.Database}
	if p.Database == "" {
		p.Database = p.DataDir
	}
	key := make([]byte, 32)
	rand.Read(key)
	p.AdminToken = randomToken()
	args := append([]string{"--listen", "127.0.0.1:0", "--database", p.Database,
		"--encryption-key-file", writeSecret(tb, dir, "encryption-key", base64.StdEncoding.EncodeToString(key)),
		"--admin-token-file", writeSecret(tb, dir, "admin-token", p.AdminToken)}, opts.Args...)
	var wrapper []string
	if opts.OpenFiles > 0 {
		wrapper = []string{"prlimit", "--nofile=" + strconv.Itoa(opts.OpenFiles), "--"}
	}
	p.Process = startWrapped(tb, "", name, wrapper, "gradient-proxy", opts.Env, args...)
	p.listened(tb)
	return p
}

// Env is the gradient CLI's environment for this proxy's admin API
// (`gradient proxy …`).
func (p *Proxy) Env() []string {
	return []string{"GRADIENT_PROXY_URL=" + p.URL, "GRADIENT_PROXY_ADMIN_TOKEN=" + p.AdminToken}
}

// CLI runs `gradient proxy args…` against the proxy and requires exit 0;
// it returns stdout.
func (p *Proxy) CLI(tb testing.TB, args ...string) string {
	tb.Helper()
	args = append([]string{"proxy"}, args...)
	code, stdout, stderr := CLI(tb, p.Env(), args...)
	if code != 0 {
		tb.Fatalf("%s: gradient %s: exit %d\nstdout: %s\nstderr: %s", p.Name, strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// Worker is a gradient-worker process.
type Worker struct {
	*Process
	ID        string
	PeersFile string
}

// WorkerOptions configure StartWorker.
type WorkerOptions struct {
	// ServerURL is the /proto the worker dials (a server's or a proxy's).
	ServerURL string
	// ID is the worker's UUID; Peers its peers-file text (PEER:TOKEN
	// lines; behind a proxy, WORKER_ID:TOKEN).
	ID, Peers string
	// Architectures, Features, Slots and CoreScore describe the host
	// (slots default to 1, the core score to 100: never measured).
	Architectures, Features []string
	Slots                   int
	CoreScore               int
	Args                    []string
	Env                     []string
}

// StartWorker runs a gradient-worker with its own base directory and
// peers file.
func StartWorker(tb testing.TB, name string, opts WorkerOptions) *Worker {
	tb.Helper()
	dir := tb.TempDir()
	if opts.Slots == 0 {
		opts.Slots = 1
	}
	if opts.CoreScore == 0 {
		opts.CoreScore = 100
	}
	w := &Worker{ID: opts.ID, PeersFile: writeSecret(tb, dir, "peers", opts.Peers+"\n")}
	args := []string{"--server-url", opts.ServerURL, "--id", opts.ID, "--peers-file", w.PeersFile,
		"--base-dir", dir, "--gcroots-dir", "",
		"--build-max-concurrent", strconv.Itoa(opts.Slots), "--system-cpu-core-score", strconv.Itoa(opts.CoreScore),
		// A stopped worker drains its running jobs for 60 s by default;
		// tests stop workers mid-job and should not wait that long.
		"--drain-timeout-secs", "2"}
	// Unset, the worker asks the local Nix.
	if len(opts.Architectures) > 0 {
		args = append(args, "--system-architectures", strings.Join(opts.Architectures, ","))
	}
	if len(opts.Features) > 0 {
		args = append(args, "--system-features", strings.Join(opts.Features, ","))
	}
	args = append(args, opts.Args...)
	w.Process = Start(tb, name, "gradient-worker", opts.Env, args...)
	return w
}
