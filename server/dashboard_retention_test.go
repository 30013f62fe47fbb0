package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"gradient.dev/gradient/server/servertest"
)

// A build whose evaluation's logs retention deleted says so on its page
// and in its plain-text log, instead of showing an empty log.
func TestDashboardSaysLogRemovedByRetention(t *testing.T) {
	t.Parallel()
	e := servertest.NewAdminEnv(t, servertest.SHA256Hex(servertest.AdminToken))
	_, p, _ := e.Seed()
	e.Must(200, "PUT", servertest.ProjectPath(p.ID)+"/public", nil, nil)
	evalID, failed, _, _ := failedBuildWithLog(t, e.DB, p.ID, "the failing build's own words\n")
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(e.Base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		return string(body)
	}
	if page := get("/builds/" + failed); !strings.Contains(page, "the failing build&#39;s own words") || strings.Contains(page, "removed by retention") {
		t.Fatalf("before pruning the page shows no log or says it was removed:\n%s", page)
	}
	if _, err := e.DB.PruneEvaluationLogs(t.Context(), evalID); err != nil {
		t.Fatal(err)
	}
	if page := get("/builds/" + failed); !strings.Contains(page, "Log removed by retention") {
		t.Errorf("the page of a build whose log was pruned does not say so:\n%s", page)
	}
	if text := get("/builds/" + failed + "/log"); text != "log removed by retention\n" {
		t.Errorf("plain-text log %q", text)
	}
}
