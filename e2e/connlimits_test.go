package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/proxyworld"
	"gradient.dev/gradient/internal/waitfor"
)

// A gradient-proxy at 128 open files (prlimit) with 200 idle connections
// from one address (issue 26): the connections it cannot hold wait in
// its accept queue and the rest hold its descriptors, yet /healthz keeps
// answering and a worker still connects, because near the limit the
// proxy closes the oldest connections that hold nothing. The HTTP
// timeouts are set far beyond the test, so no timeout frees a descriptor
// for them.
func TestProxyAnswersAtItsFileLimit(t *testing.T) {
	t.Parallel()
	proxy := proxyworld.StartProxy(t, "proxy", proxyworld.ProxyOptions{OpenFiles: 128,
		Args: []string{"--http-header-timeout", "3600", "--http-body-timeout", "3600", "--http-idle-timeout", "3600"}})
	proxy.API(t, "POST", "/api/v1/tenants", map[string]any{"name": "tenant-a"}, nil)
	var w createdWorker
	proxy.API(t, "POST", "/api/v1/tenants/tenant-a/workers", map[string]any{"name": "w1"}, &w)

	addr := strings.TrimPrefix(proxy.URL, "http://")
	for i := range 200 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
	}

	// Each attempt gives up after a while and a new one queues behind
	// the idle connections again.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	waitfor.Within(t, time.Minute, "/healthz answering past 200 idle connections", func() bool {
		resp, err := client.Get(proxy.URL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	proxyworld.StartWorker(t, "worker", proxyworld.WorkerOptions{ServerURL: proxy.ProtoURL, ID: w.ID, Peers: w.ID + ":" + w.Token,
		Architectures: []string{"x86_64-linux"}})
	waitfor.Within(t, time.Minute, "the worker live at the proxy", func() bool {
		var s struct {
			Downstream []struct {
				WorkerID string `json:"worker_id"`
			} `json:"downstream"`
		}
		resp, err := client.Do(adminRequest(t, proxy, "/api/v1/sessions"))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		if decodeJSON(resp, &s) != nil {
			return false
		}
		return slices.ContainsFunc(s.Downstream, func(d struct {
			WorkerID string `json:"worker_id"`
		}) bool {
			return d.WorkerID == w.ID
		})
	})
	if shed := proxy.Metrics(t).Value("gradient_proxy_http_connections_shed_total", map[string]string{"state": "new"}); shed == 0 {
		t.Fatal("no idle connection counted as shed")
	}
}

// adminRequest is a GET of the proxy's admin API.
func adminRequest(t *testing.T, p *proxyworld.Proxy, path string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("GET", p.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+p.AdminToken)
	return req
}

func decodeJSON(resp *http.Response, out any) error {
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// The proxy and the server close an idle keep-alive connection and a
// POST whose body stalls, with the timeouts their flags set (short here;
// issue 26: both stayed open past 130 s).
func TestServicesCloseIdleAndStalledConnections(t *testing.T) {
	t.Parallel()
	args := []string{"--http-header-timeout", "3600", "--http-body-timeout", "100ms", "--http-idle-timeout", "100ms"}
	proxy := proxyworld.StartProxy(t, "proxy", proxyworld.ProxyOptions{Args: args})
	server := proxyworld.StartServer(t, "server", proxyworld.ServerOptions{Args: args})
	for _, svc := range []struct{ name, url, token, post string }{
		{"proxy", proxy.URL, proxy.AdminToken, "/api/v1/tenants"},
		{"server", server.URL, server.AdminToken, "/api/v1/teams"},
	} {
		closesStalled(t, svc.name, strings.TrimPrefix(svc.url, "http://"), map[string]string{
			"an idle keep-alive connection": "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
			"a POST without its body":       "POST " + svc.post + " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + svc.token + "\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
		})
	}
}

// closesStalled sends each request on its own connection and requires
// the service to close it.
func closesStalled(t *testing.T, service, addr string, requests map[string]string) {
	t.Helper()
	for what, request := range requests {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, request); err != nil {
			t.Fatal(err)
		}
		// A bound far beyond the configured timeouts, only so that a
		// broken service fails the test instead of hanging it.
		c.SetReadDeadline(time.Now().Add(2 * time.Minute))
		_, err = io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: %s kept the connection open", service, what)
		}
	}
}
