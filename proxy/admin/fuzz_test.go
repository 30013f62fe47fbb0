package admin_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"gradient.dev/gradient/proxy/admin/admintest"
)

// Any request body to the endpoints that decode one gets an answer the
// operator can read: a JSON object, 2xx or a 4xx with an error sentence,
// never a 500 or a hang.
func FuzzAdminBodies(f *testing.F) {
	p := admintest.Start(f, f.TempDir(), admintest.Options{})
	if _, err := p.Store.CreateTenant(f.Context(), "acme"); err != nil {
		f.Fatal(err)
	}
	endpoints := []struct{ method, path string }{
		{"POST", "/api/v1/tenants"},
		{"PUT", "/api/v1/tenants/acme/may-run"},
		{"PUT", "/api/v1/tenants/acme/link"},
		{"POST", "/api/v1/tenants/acme/workers"},
		{"PUT", "/api/v1/tenants/acme/hetzner"},
	}
	for i, seed := range []string{
		`{"name":"beta"}`, `{"may_run":false}`, `{"may_run":null}`,
		`{"url":"ws://127.0.0.1:1/proto","worker_id":"0b8e3c3e-9a4f-4c43-9b1c-2f7b3d7d2a10","peers":"*:` + strings.Repeat("a", 64) + `"}`,
		`{"url":"wss://[::1/proto","worker_id":"x","peers":"\n\n:"}`,
		`{"name":"w","capabilities":["build","build"]}`, `{"name":"w","capabilities":null}`,
		`[]`, `{"name":1}`, `{} {}`, "\x00", `{"peers":"` + strings.Repeat("#", 2000) + `"}`,
	} {
		f.Add(uint8(i), seed)
	}
	for _, seed := range []string{
		`{"enabled":true,"max_vms":2,"snapshot_label":"gradient-worker","systems":{"x86_64-linux":{"server_type":"cx22","slots":2}},"ssh_keys":[1],"labels":{"a":"b"}}`,
		`{"enabled":true,"max_vms":1e30,"systems":{"":{"slots":-1}},"ssh_keys":[-1],"labels":{"gradient-x":""}}`,
	} {
		f.Add(uint8(4), seed)
	}
	f.Fuzz(func(t *testing.T, which uint8, body string) {
		if len(body) > 4096 {
			return
		}
		e := endpoints[int(which)%len(endpoints)]
		if e.path == "/api/v1/tenants" || strings.HasSuffix(e.path, "/workers") {
			// Creating rows is not what is fuzzed: keep the store small.
			if !strings.Contains(body, `"name"`) {
				return
			}
		}
		req, err := http.NewRequestWithContext(t.Context(), e.method, p.URL+e.path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+p.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var answer map[string]any
		isObject := json.Unmarshal(raw, &answer) == nil
		switch {
		case resp.StatusCode >= 500:
			t.Fatalf("%s %s %q: %d %s", e.method, e.path, body, resp.StatusCode, raw)
		case resp.StatusCode >= 400 && (!isObject || answer["error"] == ""):
			t.Fatalf("%s %s %q: %d without an error sentence: %s", e.method, e.path, body, resp.StatusCode, raw)
		case resp.StatusCode < 300 && !isObject:
			t.Fatalf("%s %s %q: %d not a JSON object: %s", e.method, e.path, body, resp.StatusCode, raw)
		}
	})
}
