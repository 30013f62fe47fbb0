// Package s3test starts a real S3-compatible server for tests: versitygw
// with its POSIX backend in a temporary directory, on a free loopback port,
// with one bucket. A test without the binary is skipped, except under CI
// (CI=true or GRADIENT_REQUIRE_S3=1), where .ci/run installs it and its
// absence fails the test instead of silently skipping it.
package s3test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Version is the versitygw release .ci/run installs.
const Version = "v1.8.0"

// Server is a running versitygw.
type Server struct {
	Endpoint  string // http://127.0.0.1:PORT
	Bucket    string
	Region    string
	AccessKey string
	SecretKey string
	Dir       string // the POSIX backend's root; the bucket is a directory in it

	bin           string
	addr          string
	virtualDomain string
	t             testing.TB

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	out  *tailBuffer
}

// required reports whether the environment forbids skipping.
func required() bool {
	return os.Getenv("CI") == "true" || os.Getenv("GRADIENT_REQUIRE_S3") == "1"
}

// Binary finds versitygw: $VERSITYGW (.ci/run sets it), $GOPATH/bin (or
// ~/go/bin), then PATH. It returns "" when there is none.
func Binary() string {
	var candidates []string
	if p := os.Getenv("VERSITYGW"); p != "" {
		candidates = append(candidates, p)
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if home, err := os.UserHomeDir(); err == nil {
			gopath = filepath.Join(home, "go")
		}
	}
	for _, dir := range filepath.SplitList(gopath) {
		candidates = append(candidates, filepath.Join(dir, "bin", "versitygw"))
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return c
		}
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	return ""
}

// Require skips t (or fails it under CI) unless versitygw is installed, and
// returns its path.
func Require(t testing.TB) string {
	t.Helper()
	bin := Binary()
	if bin == "" {
		msg := "versitygw is not installed (go install github.com/versity/versitygw/cmd/versitygw@" + Version + "; .ci/run does it)"
		if required() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return bin
}

// Start runs a versitygw with bucket "gradient-test" and stops it when the
// test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, "")
}

// StartVirtualHost is Start with virtual-host addressing under domain
// (BUCKET.domain); path-style requests keep working. Clients must resolve
// BUCKET.domain to the server (see DialAnyHost).
func StartVirtualHost(t testing.TB, domain string) *Server {
	t.Helper()
	return start(t, domain)
}

// DialAnyHost is an http.Client that connects every request to the
// server, whatever host the URL names (virtual-host buckets need no DNS).
func (s *Server) DialAnyHost() *http.Client {
	var d net.Dialer
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, s.addr)
	}}}
}

func start(t testing.TB, virtualDomain string) *Server {
	t.Helper()
	bin := Require(t)
	s := &Server{
		Bucket:    "gradient-test",
		Region:    "us-east-1",
		AccessKey: "gradienttestroot",
		SecretKey: "gradient-test-secret-key-0123456789",
		Dir:       t.TempDir(),
		bin:       bin,
		t:         t,

		virtualDomain: virtualDomain,
	}
	t.Cleanup(s.Stop)
	// A free port can be taken by another process between our probe and
	// versitygw's listen: try a few.
	var err error
	for range 5 {
		s.addr, err = freePort()
		if err != nil {
			t.Fatalf("s3test: %v", err)
		}
		if err = s.start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("s3test: versitygw did not start: %v", err)
	}
	s.Endpoint = "http://" + s.addr
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(s.Bucket)}); err != nil {
		t.Fatalf("s3test: create bucket: %v\n%s", err, s.out.String())
	}
	return s
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	l.Close()
	return addr, nil
}

// start launches the process on s.addr and waits until it answers HTTP.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("already running")
	}
	args := []string{"--port", s.addr, "--access", s.AccessKey, "--secret", s.SecretKey, "--region", s.Region, "--quiet"}
	if s.virtualDomain != "" {
		args = append(args, "--virtual-domain", s.virtualDomain)
	}
	cmd := exec.Command(s.bin, append(args, "posix", s.Dir)...)
	// Keep the variables that would change its behaviour out of its way.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + s.Dir}
	out := &tailBuffer{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-done:
			return fmt.Errorf("exited: %s", out.String())
		default:
		}
		resp, err := client.Get("http://" + s.addr + "/")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("not answering on %s: %v\n%s", s.addr, err, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.cmd, s.done, s.out = cmd, done, out
	return nil
}

// Stop ends the server (the objects stay in Dir). Safe to call twice.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// Restart starts a stopped server again on the same address with the same
// bucket and objects: for tests of a store that goes down and comes back.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatalf("s3test: restart: %v", err)
	}
}

// Client is an S3 client for the server (path-style, root credentials), for
// tests that look at the bucket behind the code under test.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(s.Endpoint),
		Region:       s.Region,
		Credentials:  credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		UsePathStyle: true,
	})
}

// Keys lists every object key in the bucket, for tests asserting what is
// (or is no longer) stored.
func (s *Server) Keys(t testing.TB) []string {
	t.Helper()
	var keys []string
	p := s3.NewListObjectsV2Paginator(s.Client(), &s3.ListObjectsV2Input{Bucket: aws.String(s.Bucket)})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatalf("s3test: list objects: %v", err)
		}
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	return keys
}

// Log is the tail of versitygw's output, for failure messages.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if over := b.buf.Len() - b.max; over > 0 {
		b.buf.Next(over)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(b.buf.String())
}
