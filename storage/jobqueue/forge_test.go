package jobqueue

import (
	"errors"
	"testing"
	"time"

	"gradient.dev/gradient/storage"
)

// The outbox follows an evaluation from its queueing to its end in the
// same transactions, coalesced per commit and context.
func TestForgeStatusOutbox(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		// No link yet: nothing to post.
		if list, err := db.ForgeStatuses(ctx, e.ProjectID); err != nil || len(list) != 0 {
			t.Fatalf("statuses without a link: %+v, %v", list, err)
		}
		if err := db.SetForgeLink(ctx, testForgeLink(e.ProjectID)); err != nil {
			t.Fatal(err)
		}
		e = newEvaluationIn(t, db, e.ProjectID)
		s := onlyStatus(t, db, e.ProjectID, "gradient/p")
		if s.State != "pending" || s.Description != "queued" || s.EvaluationID != e.ID || s.Commit != "c" || s.Version != 1 {
			t.Fatalf("queued status %+v", s)
		}
		due, err := db.DueForgeStatuses(ctx, time.Now(), 10)
		if err != nil || len(due) != 1 {
			t.Fatalf("due %+v, %v", due, err)
		}
		ready := startEvaluation(t, db, e.ID, storage.NewID(), discovered("a", "packages.x.a"), discovered("b", "packages.x.b"))
		buildOK(t, db, ready[drvPath("a")], storage.NewID())
		// A post of version 1 in flight while the evaluation ends.
		a := mustClaim(t, db, ready[drvPath("b")].JobID, storage.NewID())
		if _, _, err := db.FailJob(ctx, a, storage.FailurePermanent, "boom", 1); err != nil {
			t.Fatal(err)
		}
		wantEvalStatus(t, db, e.ID, storage.EvaluationFailed)
		if done, err := db.MarkForgeStatusPosted(ctx, due[0]); err != nil || done {
			t.Fatalf("posting version 1 marked the newest done: %v, %v", done, err)
		}
		s = onlyStatus(t, db, e.ProjectID, "gradient/p")
		if s.State != "failure" || s.Description != "1 built, 1 failed" || s.Version != 2 || s.PostedVersion != 1 {
			t.Fatalf("final status %+v", s)
		}
		// A failed post waits; a retry of it is due later.
		if err := db.DeferForgeStatus(ctx, s, time.Now().Add(time.Hour), "HTTP 502"); err != nil {
			t.Fatal(err)
		}
		if due, err := db.DueForgeStatuses(ctx, time.Now(), 10); err != nil || len(due) != 0 {
			t.Fatalf("deferred status due: %+v, %v", due, err)
		}
		if n, err := db.ForgeStatusDepth(ctx); err != nil || n != 1 {
			t.Fatalf("depth %d, %v", n, err)
		}
		if done, err := db.MarkForgeStatusPosted(ctx, s); err != nil || !done {
			t.Fatalf("posting the newest: %v, %v", done, err)
		}
		if n, err := db.ForgeStatusDepth(ctx); err != nil || n != 0 {
			t.Fatalf("depth after posting %d, %v", n, err)
		}
	})
}

// A pull request's evaluation that waits for approval has no job and a
// pending status saying so; approval queues its flake job; an older
// evaluation of the same commit never overwrites a newer one's state.
func TestForgeApprovalAndOrder(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		p := mustProject(t, db, mustTeam(t, db, "t").ID, "p")
		if err := db.SetForgeLink(ctx, testForgeLink(p.ID)); err != nil {
			t.Fatal(err)
		}
		in := p.EvaluationAt("f00d")
		in.Source, in.PRNumber, in.TargetBranch, in.AwaitApproval = storage.SourcePR, 7, "main", true
		waiting, err := db.CreateEvaluation(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if got := wantEvalStatus(t, db, waiting.ID, storage.EvaluationWaiting); got.PRNumber != 7 || got.TargetBranch != "main" || got.Source != storage.SourcePR {
			t.Fatalf("waiting evaluation %+v", got)
		}
		if n := len(allPending(t, db)); n != 0 {
			t.Fatalf("%d jobs queued before approval", n)
		}
		if s := onlyStatus(t, db, p.ID, "gradient/p"); s.State != "pending" || s.Description != "waiting for approval" {
			t.Fatalf("status while waiting %+v", s)
		}
		prs, err := db.PullRequestEvaluations(ctx, p.ID, 7)
		if err != nil || len(prs) != 1 || prs[0].ID != waiting.ID {
			t.Fatalf("open evaluations of PR 7: %+v, %v", prs, err)
		}
		if _, err := db.LatestBranchEvaluation(ctx, p.ID); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("a PR's evaluation counts as the branch's: %v", err)
		}
		if err := db.ApproveEvaluation(ctx, waiting.ID); err != nil {
			t.Fatal(err)
		}
		if err := db.ApproveEvaluation(ctx, waiting.ID); !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("approving twice: %v", err)
		}
		wantEvalStatus(t, db, waiting.ID, storage.EvaluationQueued)
		flakeJob(t, db, waiting.ID)
		if s := onlyStatus(t, db, p.ID, "gradient/p"); s.State != "pending" || s.Description != "queued" || s.Version != 2 {
			t.Fatalf("status after approval %+v", s)
		}
		// A newer evaluation of the same commit, then the older one ends.
		newer, err := db.CreateEvaluation(ctx, p.EvaluationAt("f00d"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.CancelEvaluation(ctx, waiting.ID); err != nil {
			t.Fatal(err)
		}
		if s := onlyStatus(t, db, p.ID, "gradient/p"); s.EvaluationID != newer.ID || s.State != "pending" {
			t.Fatalf("the older evaluation's end overwrote the newer's state: %+v", s)
		}
		if _, err := db.CancelEvaluation(ctx, newer.ID); err != nil {
			t.Fatal(err)
		}
		if s := onlyStatus(t, db, p.ID, "gradient/p"); s.State != "error" || s.Description != "cancelled" {
			t.Fatalf("cancelled status %+v", s)
		}
	})
}

// Per-build statuses, when the project asks for them.
func TestForgePerBuildStatuses(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, db *testDB) {
		ctx := t.Context()
		e := newEvaluation(t, db)
		l := testForgeLink(e.ProjectID)
		l.PerBuildStatuses = true
		if err := db.SetForgeLink(ctx, l); err != nil {
			t.Fatal(err)
		}
		e = newEvaluationIn(t, db, e.ProjectID)
		ready := startEvaluation(t, db, e.ID, storage.NewID(), discovered("a", "packages.x.a"), discovered("dep", ""))
		buildOK(t, db, ready[drvPath("a")], storage.NewID())
		if s := onlyStatus(t, db, e.ProjectID, "gradient/p/packages.x.a"); s.State != "success" {
			t.Fatalf("per-build status %+v", s)
		}
		buildOK(t, db, ready[drvPath("dep")], storage.NewID())
		list, _ := db.ForgeStatuses(ctx, e.ProjectID)
		if len(list) != 2 {
			t.Fatalf("statuses %+v: want the evaluation's and packages.x.a's only", list)
		}
		if s := onlyStatus(t, db, e.ProjectID, "gradient/p"); s.State != "success" || s.Description != "2 built" {
			t.Fatalf("evaluation status %+v", s)
		}
	})
}

// onlyStatus returns the project's one outbox row of context.
func onlyStatus(t *testing.T, db *testDB, projectID, context string) storage.ForgeStatus {
	t.Helper()
	list, err := db.ForgeStatuses(t.Context(), projectID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.Context == context {
			return s
		}
	}
	t.Fatalf("no status of context %s in %+v", context, list)
	return storage.ForgeStatus{}
}

func testForgeLink(projectID string) storage.ForgeLink {
	return storage.ForgeLink{
		ProjectID: projectID, Kind: "github", APIURL: "https://api.github.com", Repository: "o/r",
		CredentialSealed: []byte{1, 2, 3}, Trust: storage.ForgeTrustApprove, StatusContext: "gradient/p",
	}
}
