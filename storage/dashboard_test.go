package storage

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// A scoped token is found by its text and nothing else; revoking it ends
// the sessions it opened.
func TestAPITokensAndSessions(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		tok, text, err := db.CreateAPIToken(ctx, "ci reader", ScopeRead)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(text, APITokenPrefix) {
			t.Fatalf("token text %q lacks its prefix", text)
		}
		got, err := db.APITokenByText(ctx, text)
		if err != nil || got.ID != tok.ID || got.Scope != ScopeRead || got.Name != "ci reader" {
			t.Fatalf("lookup: %+v, %v", got, err)
		}
		for _, wrong := range []string{"", text + "x", strings.TrimPrefix(text, APITokenPrefix), APITokenPrefix} {
			if _, err := db.APITokenByText(ctx, wrong); !errors.Is(err, ErrNotFound) {
				t.Fatalf("wrong token %q: %v", wrong, err)
			}
		}
		if _, _, err := db.CreateAPIToken(ctx, "x", "root"); !errors.Is(err, ErrInvalid) {
			t.Fatalf("unknown scope: %v", err)
		}
		var stored string
		if err := db.sql.QueryRowContext(ctx, `SELECT token_digest FROM api_tokens WHERE id = $1`, tok.ID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(text, stored) || len(stored) != 64 {
			t.Fatalf("stored %q: want the SHA-256 only", stored)
		}

		id, s, err := db.CreateDashboardSession(ctx, tok.Scope, tok.ID, time.Hour)
		if err != nil || s.Scope != ScopeRead {
			t.Fatalf("session: %+v, %v", s, err)
		}
		if got, err := db.DashboardSessionByID(ctx, id); err != nil || got.TokenID != tok.ID {
			t.Fatalf("session lookup: %+v, %v", got, err)
		}
		expired, _, err := db.CreateDashboardSession(ctx, ScopeAdmin, "", -time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.DashboardSessionByID(ctx, expired); !errors.Is(err, ErrNotFound) {
			t.Fatalf("expired session: %v", err)
		}
		if err := db.DeleteAPIToken(ctx, tok.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.DashboardSessionByID(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("session of a revoked token: %v", err)
		}
		if _, err := db.APITokenByText(ctx, text); !errors.Is(err, ErrNotFound) {
			t.Fatalf("revoked token: %v", err)
		}
		admin, _, err := db.CreateDashboardSession(ctx, ScopeAdmin, "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.DeleteDashboardSession(ctx, admin); err != nil {
			t.Fatal(err)
		}
		if _, err := db.DashboardSessionByID(ctx, admin); !errors.Is(err, ErrNotFound) {
			t.Fatalf("logged-out session: %v", err)
		}
	})
}

func TestProjectPublic(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		p := newEvaluation(t, db).ProjectID
		for _, on := range []bool{true, true, false} {
			if err := db.SetProjectPublic(ctx, p, on); err != nil {
				t.Fatal(err)
			}
			if got, err := db.ProjectPublic(ctx, p); err != nil || got != on {
				t.Fatalf("public %v, %v; want %v", got, err, on)
			}
		}
		if err := db.SetProjectPublic(ctx, NewID(), true); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown project: %v", err)
		}
	})
}

// Pages of builds: failed first, each build once, in the order the pages
// promise, with or without a status filter.
func TestBuildsPage(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		var drvs []DiscoveredBuild
		for i := range 7 {
			drvs = append(drvs, discovered(string(rune('a'+i)), "p"+string(rune('a'+i))))
		}
		drvs = append(drvs, discovered("z", "pz", "a"))
		ready := startEvaluation(t, db, e.ID, NewID(), drvs...)
		a := mustClaim(t, db, ready[drvPath("a")].JobID, NewID())
		if _, _, err := db.FailJob(ctx, a, FailurePermanent, "boom", 1); err != nil {
			t.Fatal(err)
		}
		buildOK(t, db, ready[drvPath("b")], NewID())
		var all []Build
		cur := BuildCursor{}
		for page := 0; ; page++ {
			builds, next, err := db.BuildsPage(ctx, e.ID, "", cur, 3)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, builds...)
			if next.IsZero() {
				break
			}
			cur = next
			if page > 10 {
				t.Fatal("pages never end")
			}
		}
		if len(all) != 8 {
			t.Fatalf("%d builds over the pages, want 8", len(all))
		}
		if all[0].Status != BuildFailed || all[1].Status != BuildDependencyFailed || all[len(all)-1].Status != BuildSucceeded {
			t.Fatalf("order %v", statuses(all))
		}
		queued, next, err := db.BuildsPage(ctx, e.ID, BuildQueued, BuildCursor{}, 100)
		if err != nil || !next.IsZero() || len(queued) != 5 {
			t.Fatalf("queued page: %d builds, next %+v, %v", len(queued), next, err)
		}
		if !slices.IsSortedFunc(queued, func(x, y Build) int { return strings.Compare(x.ID, y.ID) }) {
			t.Fatal("a status group is not by ID")
		}
		counts, err := db.BuildStatusCounts(ctx, e.ID)
		if err != nil || counts[BuildQueued] != 5 || counts[BuildFailed] != 1 || counts[BuildDependencyFailed] != 1 {
			t.Fatalf("counts %v, %v", counts, err)
		}
		o, err := db.ReadOverview(ctx, time.Now())
		if err != nil || o.EvaluationsRunning != 1 || o.FailedBuildsDay != 1 || o.BuildsLast10Min != 2 || len(o.RecentFailures) != 1 {
			t.Fatalf("overview %+v, %v", o, err)
		}
	})
}

func statuses(bs []Build) []BuildStatus {
	var out []BuildStatus
	for _, b := range bs {
		out = append(out, b.Status)
	}
	return out
}

// Restarting a failed evaluation's failed builds queues them again, lets
// their dependents wait for them, keeps what succeeded, and the
// evaluation ends succeeded once they do.
func TestRestartFailedBuilds(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *DB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		ready := startEvaluation(t, db, e.ID, NewID(), discovered("a", "pa"), discovered("b", "pb", "a"), discovered("c", "pc"))
		if _, err := db.RestartFailedBuilds(ctx, e.ID); !errors.Is(err, ErrConflict) {
			t.Fatalf("nothing failed yet: %v", err)
		}
		buildOK(t, db, ready[drvPath("c")], NewID())
		a := mustClaim(t, db, ready[drvPath("a")].JobID, NewID())
		if err := db.AppendJobLog(ctx, ready[drvPath("a")].JobID, []byte("first try\n")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := db.FailJob(ctx, a, FailurePermanent, "boom", 1); err != nil {
			t.Fatal(err)
		}
		wantEvalStatus(t, db, e.ID, EvaluationFailed)

		jobs, err := db.RestartFailedBuilds(ctx, e.ID)
		if err != nil || len(jobs) != 1 {
			t.Fatalf("restart: %v, %v", jobs, err)
		}
		wantEvalStatus(t, db, e.ID, EvaluationBuilding)
		if b := buildByDrv(t, db, e.ID, "b"); b.Status != BuildWaiting || b.Error != "" {
			t.Fatalf("dependent after restart: %+v", b)
		}
		if c := buildByDrv(t, db, e.ID, "c"); c.Status != BuildSucceeded {
			t.Fatalf("succeeded build after restart: %s", c.Status)
		}
		again := pendingOf(t, db, jobs)
		wantKeys(t, "restarted", again, "a")
		next := buildOK(t, db, again[drvPath("a")], NewID())
		wantKeys(t, "dependent readied", next, "b")
		buildOK(t, db, next[drvPath("b")], NewID())
		if got := wantEvalStatus(t, db, e.ID, EvaluationSucceeded); got.Error != "" {
			t.Fatalf("evaluation error %q after the restart succeeded", got.Error)
		}
		log, err := db.BuildLog(ctx, buildByDrv(t, db, e.ID, "a").ID)
		if err != nil || string(log) != "first try\n" {
			t.Fatalf("log %q, %v: the first attempt's log is kept", log, err)
		}
		chunks, err := db.BuildLogChunks(ctx, buildByDrv(t, db, e.ID, "a").ID, 0, 10)
		if err != nil || len(chunks) != 1 || chunks[0].Seq != 1 {
			t.Fatalf("chunks %+v, %v", chunks, err)
		}
		if _, err := db.RestartFailedBuilds(ctx, e.ID); !errors.Is(err, ErrConflict) {
			t.Fatalf("restart of a succeeded evaluation: %v", err)
		}
	})
}
