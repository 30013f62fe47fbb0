package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
)

// lockedBuffer is a buffer the run writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

var dashboardLine = regexp.MustCompile(`dashboard:\s+(http://\S+/) \(log in with (gradt_\S+),`)

// gradient up --serve prints the dashboard's URL and a token that logs in.
func TestUpServePrintsTheDashboard(t *testing.T) {
	upRequireNix(t)
	ctx, cancel := context.WithCancel(t.Context())
	var out, errOut lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- runUpContext(ctx, []string{"--data-dir", t.TempDir(), "--store", t.TempDir() + "/store",
			"--workers", "1", "--timeout", "55s", "--serve"}, &out, &errOut)
	}()
	defer func() {
		cancel()
		<-done
	}()
	var m []string
	waitfor.Within(t, 3*time.Minute, "the dashboard line", func() bool {
		m = dashboardLine.FindStringSubmatch(out.String())
		return m != nil
	})
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.PostForm(m[1]+"login", url.Values{"token": {m[2]}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = c.Get(m[1] + "projects")
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(body.String(), "<h1>Projects</h1>") {
		t.Fatalf("projects page after logging in with the printed token: %d\n%s\nstdout:\n%s", resp.StatusCode, body.String(), out.String())
	}
}
