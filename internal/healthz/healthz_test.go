package healthz

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// A reachable database answers 200 "ok"; an unreachable one 503 with the
// reason, so a load balancer takes the instance out.
func TestHandler(t *testing.T) {
	for _, tc := range []struct {
		ping       error
		code       int
		body, ctyp string
	}{
		{nil, http.StatusOK, "ok\n", "text/plain; charset=utf-8"},
		{errors.New("connection refused"), http.StatusServiceUnavailable, "database unreachable: connection refused\n", "text/plain; charset=utf-8"},
	} {
		srv := httptest.NewServer(Handler(func(context.Context) error { return tc.ping }))
		resp, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != tc.code || string(b) != tc.body || resp.Header.Get("Content-Type") != tc.ctyp {
			t.Errorf("ping %v: %d %q (%s), want %d %q", tc.ping, resp.StatusCode, b, resp.Header.Get("Content-Type"), tc.code, tc.body)
		}
	}
}
