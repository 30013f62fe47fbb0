package forgehook_test

import (
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/server/forge/forgetest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
)

// End to end with a real worker on real Nix: each test delivers a signed
// webhook and waits for what the fake forge receives.

// finalState waits until the fake's newest status of (commit, context)
// is not pending and returns the states in order.
func (w *world) finalState(commit string) []forgetest.Received {
	w.t.Helper()
	waitfor.Within(w.t, 3*time.Minute, "the final status reaches the forge", func() bool {
		st := w.forge.Statuses(commit, w.context())
		return len(st) > 0 && st[len(st)-1].State != "pending" && st[len(st)-1].State != "running"
	})
	return w.forge.Statuses(commit, w.context())
}

func statesOf(list []forgetest.Received) []string {
	var out []string
	for _, r := range list {
		out = append(out, r.State)
	}
	return out
}

// A signed push → an evaluation of that commit → pending, then success
// with what was built, on each forge.
func TestPushReportsSuccess(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, kind, worldOptions{})
			w.startWorker()
			if code := w.deliver(forgetest.PushDelivery(kind, w.secret, w.forge.Repository, "master", w.commit)); code != http.StatusOK {
				t.Fatalf("push: %d", code)
			}
			got := w.finalState(w.commit)
			states := statesOf(got)
			if states[0] != "pending" || states[len(states)-1] != "success" || got[len(got)-1].Description != "1 built" {
				t.Fatalf("statuses %+v: want pending, then success \"1 built\"", got)
			}
			if n := len(w.evaluations()); n != 1 {
				t.Fatalf("%d evaluations", n)
			}
		})
	}
}

// A failing build reports failure.
func TestFailingBuildReportsFailure(t *testing.T) {
	t.Parallel()
	w := newWorld(t, forge.Gitea, worldOptions{wildcards: []string{"checks.x86_64-linux.*"}})
	w.startWorker()
	w.deliver(forgetest.PushDelivery(forge.Gitea, w.secret, w.forge.Repository, "master", w.commit))
	got := w.finalState(w.commit)
	if last := got[len(got)-1]; last.State != "failure" || last.Description != "0 built, 1 failed" {
		t.Fatalf("statuses %+v: want failure \"0 built, 1 failed\"", got)
	}
}

// A fork's pull request, whose head only the pull request's ref reaches,
// waits until an operator approves it, then builds and reports.
func TestForkPullRequestApprovedByOperator(t *testing.T) {
	t.Parallel()
	w := newWorld(t, forge.GitHub, worldOptions{})
	w.startWorker()
	head := w.pullRequestHead(7, "extra", "from a fork")
	w.deliver(forgetest.PRDelivery(forge.GitHub, w.secret, w.forge.Repository, 7, forge.PROpened, head, "master", true))
	evals := w.evaluations()
	if len(evals) != 1 || evals[0].Status != storage.EvaluationWaiting {
		t.Fatalf("evaluations %+v", evals)
	}
	waitfor.True(t, "the forge shows the wait", func() bool {
		st := w.forge.Statuses(head, w.context())
		return len(st) == 1 && st[0].Description == "waiting for approval"
	})
	// Nothing runs while it waits, workers or not.
	time.Sleep(500 * time.Millisecond)
	if e, _ := jobqueue.New(w.db).Evaluation(t.Context(), evals[0].ID); e.Status != storage.EvaluationWaiting {
		t.Fatalf("before approval: %s", e.Status)
	}
	var view admin.EvaluationView
	w.api("POST", "/api/v1/evaluations/"+evals[0].ID+"/approve", nil, http.StatusOK, &view)
	w.api("POST", "/api/v1/evaluations/"+evals[0].ID+"/approve", nil, http.StatusConflict, nil)
	got := w.finalState(head)
	if last := got[len(got)-1]; last.State != "success" {
		t.Fatalf("statuses %+v", got)
	}
	if e, _ := jobqueue.New(w.db).Evaluation(t.Context(), evals[0].ID); e.PRNumber != 7 || e.Commit != head {
		t.Fatalf("evaluation %+v", e)
	}
}

// The forge failing with 500, then 429 with Retry-After: the statuses
// still arrive, after the backoff.
func TestStatusesRetriedAfterForgeErrors(t *testing.T) {
	t.Parallel()
	w := newWorld(t, forge.GitHub, worldOptions{})
	w.forge.FailNext(1, forgetest.Failure{Code: 500})
	w.forge.FailNext(1, forgetest.Failure{Code: 429, RetryAfter: time.Second})
	w.startWorker()
	w.deliver(forgetest.PushDelivery(forge.GitHub, w.secret, w.forge.Repository, "master", w.commit))
	got := w.finalState(w.commit)
	if !slices.Contains(statesOf(got), "success") {
		t.Fatalf("statuses %+v", got)
	}
	if v := w.metricValue("gradient_server_forge_status_failures_total", "reason", "retryable"); v != 2 {
		t.Fatalf("retryable failures %v, want 2", v)
	}
}

// A pull request's new head cancels the evaluation of the old one while
// its build runs on a real worker, and closing the pull request cancels
// the new head's: both builds end cancelled, not built, and the forge
// shows the old head's status as ended.
func TestPullRequestNewHeadCancelsARunningEvaluation(t *testing.T) {
	t.Parallel()
	w := newWorld(t, forge.GitHub, worldOptions{trust: "all"})
	w.startWorker()
	slowFlake := func(seconds int) string {
		return `{
  outputs = { self }: {
    packages.x86_64-linux.slow = builtins.derivation {
      name = "slow"; system = "x86_64-linux"; builder = "/bin/sh";
      args = [ "-c" "echo started; /bin/sleep ` + strconv.Itoa(seconds) + `; echo > $out" ];
    };
  };
}
`
	}
	building := func(evalID string) func() bool {
		return func() bool {
			builds, err := jobqueue.New(w.db).EvaluationBuilds(t.Context(), evalID)
			return err == nil && len(builds) == 1 && builds[0].Status == storage.BuildBuilding
		}
	}
	a := w.pullRequestHead(9, "flake.nix", slowFlake(300))
	w.deliver(forgetest.PRDelivery(forge.GitHub, w.secret, w.forge.Repository, 9, forge.PROpened, a, "master", true))
	first := w.evaluations()
	if len(first) != 1 {
		t.Fatalf("evaluations %+v", first)
	}
	waitfor.Within(t, 3*time.Minute, "the first head's build runs on the worker", building(first[0].ID))

	b := w.pullRequestHead(9, "flake.nix", slowFlake(301))
	w.deliver(forgetest.PRDelivery(forge.GitHub, w.secret, w.forge.Repository, 9, forge.PRSynchronized, b, "master", true))
	evals := w.evaluations()
	if len(evals) != 2 || evals[0].Commit != a || evals[0].Status != storage.EvaluationCancelled || evals[1].Commit != b {
		t.Fatalf("evaluations %+v: want the first head's cancelled and the new head's", evals)
	}
	builds, err := jobqueue.New(w.db).EvaluationBuilds(t.Context(), evals[0].ID)
	if err != nil || len(builds) != 1 || builds[0].Status != storage.BuildCancelled {
		t.Fatalf("the first head's builds %+v (%v): want its running build cancelled", builds, err)
	}
	if got := w.finalState(a); got[len(got)-1].State == "success" {
		t.Fatalf("the first head's statuses %v", statesOf(got))
	}

	waitfor.Within(t, 3*time.Minute, "the new head's build runs on the worker", building(evals[1].ID))
	w.deliver(forgetest.PRDelivery(forge.GitHub, w.secret, w.forge.Repository, 9, forge.PRClosed, b, "master", true))
	if e := w.evaluations()[1]; e.Status != storage.EvaluationCancelled {
		t.Fatalf("after the pull request closed: %+v", e)
	}
	builds, err = jobqueue.New(w.db).EvaluationBuilds(t.Context(), evals[1].ID)
	if err != nil || len(builds) != 1 || builds[0].Status != storage.BuildCancelled {
		t.Fatalf("the new head's builds %+v (%v): want its running build cancelled", builds, err)
	}
}
