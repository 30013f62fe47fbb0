package proxyworld

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/tcplb"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage/sqldb/sqldbtest"
)

// ClusterOptions configure StartCluster.
type ClusterOptions struct {
	// Instances is how many gradient-server processes run (default 2).
	Instances int
	// Database is the postgres:// URL they share; empty is a fresh
	// schema of the test run's PostgreSQL database.
	Database string
	// Lease and Renew are --instance-lease and --instance-renew, short
	// so a killed instance counts as dead soon (default 6 s and 1 s).
	Lease, Renew time.Duration
	// Args are every instance's extra flags, Env its environment.
	Args []string
	Env  []string
}

// Cluster is several gradient-server instances on one PostgreSQL
// database behind a TCP load balancer, as README "Several instances"
// deploys them: they share the admin token, the dial key file and the
// NAR directory; each has its own --instance-id (its Name), address
// and log.
type Cluster struct {
	Servers []*Server
	// LB forwards each connection to the next live instance.
	LB *tcplb.LB
	// Front is the load balancer's address as a Server for the admin
	// API, the CLI and workers' ProtoURL; it is no process of its own
	// (not for Kill, Restart or Lines).
	Front *Server
	// Database, NarDir and DialKeyFile are what the instances share.
	Database, NarDir, DialKeyFile string
	AdminToken                    string
}

// StartCluster starts opts.Instances servers named NAME-1, NAME-2, …
// (also their instance IDs) on one database and a load balancer in
// front of them, and waits until each is healthy.
func StartCluster(tb testing.TB, name string, opts ClusterOptions) *Cluster {
	tb.Helper()
	if opts.Instances <= 0 {
		opts.Instances = 2
	}
	if opts.Database == "" {
		opts.Database = sqldbtest.PostgresURL(tb)
	}
	if opts.Lease == 0 {
		opts.Lease = 6 * time.Second
	}
	if opts.Renew == 0 {
		opts.Renew = time.Second
	}
	dir := tb.TempDir()
	c := &Cluster{Database: opts.Database, NarDir: filepath.Join(dir, "nars"), AdminToken: randomToken(),
		DialKeyFile: filepath.Join(dir, "dial-key")}
	if err := os.WriteFile(c.DialKeyFile, []byte(sealbox.EncodeKey(sealbox.NewKey())), 0o600); err != nil {
		tb.Fatal(err)
	}
	// The first instance migrates the database before the others start:
	// they would only wait for its lock.
	for i := 1; i <= opts.Instances; i++ {
		id := fmt.Sprintf("%s-%d", name, i)
		args := append([]string{"--instance-id", id, "--dial-key-file", c.DialKeyFile,
			"--instance-lease", seconds(opts.Lease), "--instance-renew", seconds(opts.Renew)}, opts.Args...)
		c.Servers = append(c.Servers, StartServer(tb, id, ServerOptions{Database: c.Database, NarDir: c.NarDir,
			AdminToken: c.AdminToken, Args: args, Env: opts.Env}))
	}
	var backends []string
	for _, s := range c.Servers {
		backends = append(backends, strings.TrimPrefix(s.URL, "http://"))
	}
	lb, err := tcplb.New(backends...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { lb.Close() })
	c.LB = lb
	c.Front = c.Behind(name+"-lb", lb.Addr())
	return c
}

// Behind is a front of the cluster at addr (HOST:PORT: another load
// balancer in front of the instances) as a Server for the admin API,
// the CLI and workers' ProtoURL; like Front, no process of its own.
func (c *Cluster) Behind(name, addr string) *Server {
	return &Server{service: service{Process: &Process{Name: name, done: make(chan struct{})},
		URL: "http://" + addr, ProtoURL: "ws://" + addr + "/proto", AdminToken: c.AdminToken}, Database: c.Database}
}

// seconds is a duration as the servers' flags take it (plain seconds,
// fractions allowed).
func seconds(d time.Duration) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.3f", d.Seconds()), "0"), ".")
}

// Instance is the server whose instance ID is id.
func (c *Cluster) Instance(tb testing.TB, id string) *Server {
	tb.Helper()
	for _, s := range c.Servers {
		if s.Name == id {
			return s
		}
	}
	tb.Fatalf("no instance %q in the cluster", id)
	return nil
}

// Kill ends instance i (0-based) with SIGKILL. The load balancer keeps
// it in its rotation, as one whose health check has not failed yet
// would: a connection to it fails to dial and goes to the next.
func (c *Cluster) Kill(i int) { c.Servers[i].Kill() }

// Restart starts instance i again after Kill or Stop: the same
// instance ID, address, database, dial key and NAR directory.
func (c *Cluster) Restart(tb testing.TB, i int) {
	tb.Helper()
	c.Servers[i].Restart(tb)
}
