package forgehook_test

import (
	"bytes"
	"net/http"
	"testing"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/server/forge/forgetest"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/storage/storagetest"
)

var kinds = []forge.Kind{forge.GitHub, forge.Gitea, forge.GitLab}

// A push to the project's branch evaluates exactly that commit, once
// however often the forge delivers it, and the forge hears "pending";
// a bad signature, another branch and a ping start nothing.
func TestPushDeliveries(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, kind, worldOptions{})
			repo := w.forge.Repository

			h, body := forgetest.PushDelivery(kind, []byte("not the secret"), repo, "master", w.commit)
			if code := w.deliver(h, body); code != http.StatusUnauthorized {
				t.Fatalf("badly signed delivery: %d, want 401", code)
			}
			h, body = forgetest.PushDelivery(kind, w.secret, repo, "master", w.commit)
			h2 := h.Clone()
			for _, name := range []string{"X-Hub-Signature-256", "X-Gitea-Signature", "X-Forgejo-Signature", "X-Gitlab-Token"} {
				h2.Del(name)
			}
			if code := w.deliver(h2, body); code != http.StatusUnauthorized {
				t.Fatalf("unsigned delivery: %d, want 401", code)
			}
			if n := len(w.evaluations()); n != 0 {
				t.Fatalf("%d evaluations after refused deliveries", n)
			}
			if code := w.deliverTo("/api/v1/forge/"+string(kind)+"/ops/nosuch", h, body); code != http.StatusUnauthorized {
				t.Fatalf("delivery to an unknown project: %d, want 401", code)
			}

			if code := w.deliver(forgetest.PingDelivery(kind, w.secret, repo)); code != http.StatusOK {
				t.Fatalf("ping: %d", code)
			}
			if code := w.deliver(forgetest.PushDelivery(kind, w.secret, repo, "feature", w.commit)); code != http.StatusOK {
				t.Fatalf("push to another branch: %d", code)
			}
			if n := len(w.evaluations()); n != 0 {
				t.Fatalf("%d evaluations after a ping and another branch's push", n)
			}

			for i := range 2 { // the forge retries the same delivery
				if code := w.deliver(h, body); code != http.StatusOK {
					t.Fatalf("delivery %d: %d", i, code)
				}
			}
			evals := w.evaluations()
			if len(evals) != 1 || evals[0].Commit != w.commit || evals[0].Source != storage.SourcePush {
				t.Fatalf("evaluations %+v, want one push evaluation of %s", evals, w.commit)
			}
			waitfor.True(t, "the forge receives pending", func() bool {
				return len(w.states(w.commit, w.context())) > 0
			})
			got := w.forge.Statuses(w.commit, w.context())[0]
			if got.State != "pending" || got.TargetURL != "https://ci.example.com/evaluations/"+evals[0].ID {
				t.Fatalf("status %+v", got)
			}
		})
	}
}

// A delivery larger than forge.MaxPayload is 413, and starts nothing.
func TestOversizedDelivery(t *testing.T) {
	t.Parallel()
	w := newWorld(t, forge.GitHub, worldOptions{})
	h, _ := forgetest.PushDelivery(forge.GitHub, w.secret, w.forge.Repository, "master", w.commit)
	if code := w.deliver(h, bytes.Repeat([]byte{' '}, forge.MaxPayload+1)); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized delivery: %d, want 413", code)
	}
	if n := len(w.evaluations()); n != 0 {
		t.Fatalf("%d evaluations", n)
	}
}

// Bad signatures count against the address's failed authentications:
// a flood gets 429, even with a good signature.
func TestSignatureFloodHeldBack(t *testing.T) {
	t.Parallel()
	w := newWorld(t, forge.Gitea, worldOptions{authFailures: 3})
	repo := w.forge.Repository
	for i := range 3 {
		if code := w.deliver(forgetest.PushDelivery(forge.Gitea, []byte("wrong"), repo, "master", w.commit)); code != http.StatusUnauthorized {
			t.Fatalf("bad delivery %d: %d", i, code)
		}
	}
	if code := w.deliver(forgetest.PushDelivery(forge.Gitea, w.secret, repo, "master", w.commit)); code != http.StatusTooManyRequests {
		t.Fatalf("after the flood: %d, want 429", code)
	}
	if n := len(w.evaluations()); n != 0 {
		t.Fatalf("%d evaluations", n)
	}
}

// A fork's pull request waits for approval with a pending status saying
// so; a comment by a user without write access changes nothing, one by a
// maintainer queues it.
func TestForkPullRequestApprovedByComment(t *testing.T) {
	t.Parallel()
	w := newWorld(t, forge.GitHub, worldOptions{dbURL: storagetest.PostgresURL(t)})
	repo := w.forge.Repository
	head := w.commit
	if code := w.deliver(forgetest.PRDelivery(forge.GitHub, w.secret, repo, 5, forge.PROpened, head, "master", true)); code != http.StatusOK {
		t.Fatalf("PR delivery: %d", code)
	}
	evals := w.evaluations()
	if len(evals) != 1 || evals[0].Status != storage.EvaluationWaiting || evals[0].PRNumber != 5 || evals[0].TargetBranch != "master" {
		t.Fatalf("evaluations %+v, want one waiting for approval", evals)
	}
	if jobs, err := jobqueue.New(w.db).PendingJobs(t.Context()); err != nil || len(jobs) != 0 {
		t.Fatalf("jobs queued before approval: %d, %v", len(jobs), err)
	}
	waitfor.True(t, "the forge shows the wait", func() bool {
		st := w.forge.Statuses(head, w.context())
		return len(st) > 0 && st[len(st)-1].Description == "waiting for approval"
	})
	if code := w.deliver(forgetest.CommentDelivery(forge.GitHub, w.secret, repo, 5, "reader", "/gradient approve")); code != http.StatusOK {
		t.Fatalf("comment: %d", code)
	}
	if code := w.deliver(forgetest.CommentDelivery(forge.GitHub, w.secret, repo, 5, "maintainer", "looks good")); code != http.StatusOK {
		t.Fatalf("comment: %d", code)
	}
	if code := w.deliver(forgetest.CommentDelivery(forge.GitHub, w.secret, repo, 5, "maintainer", "/gradient approve\nthanks")); code != http.StatusOK {
		t.Fatalf("comment: %d", code)
	}
	waitfor.True(t, "the maintainer's comment approves", func() bool {
		e, err := jobqueue.New(w.db).Evaluation(t.Context(), evals[0].ID)
		return err == nil && e.Status == storage.EvaluationQueued
	})
	if v := w.metricValue("gradient_server_forge_comment_approvals_total", "result", "refused"); v != 1 {
		t.Fatalf("refused approvals %v, want 1 (the reader's)", v)
	}
}

// A pull request's new head cancels the old head's evaluation; closing
// it cancels the rest; a project that trusts no pull request runs none.
func TestPullRequestHeadsAndClose(t *testing.T) {
	t.Parallel()
	w := newWorld(t, forge.GitLab, worldOptions{trust: "all"})
	repo := w.forge.Repository
	a, b := w.commit, w.commitFile("a", "1")
	w.deliver(forgetest.PRDelivery(forge.GitLab, w.secret, repo, 3, forge.PROpened, a, "master", true))
	w.deliver(forgetest.PRDelivery(forge.GitLab, w.secret, repo, 3, forge.PRSynchronized, b, "master", true))
	evals := w.evaluations()
	if len(evals) != 2 || evals[0].Commit != a || evals[0].Status != storage.EvaluationCancelled ||
		evals[1].Commit != b || evals[1].Status != storage.EvaluationQueued {
		t.Fatalf("evaluations %+v: want a cancelled, b queued (a trusted fork)", evals)
	}
	w.deliver(forgetest.PRDelivery(forge.GitLab, w.secret, repo, 3, forge.PRClosed, b, "master", true))
	if e := w.evaluations()[1]; e.Status != storage.EvaluationCancelled {
		t.Fatalf("after close: %+v", e)
	}

	none := newWorld(t, forge.Gitea, worldOptions{trust: "none"})
	none.deliver(forgetest.PRDelivery(forge.Gitea, none.secret, none.forge.Repository, 1, forge.PROpened, none.commit, "master", false))
	if n := len(none.evaluations()); n != 0 {
		t.Fatalf("a project trusting no PR evaluated %d", n)
	}
}

func (w *world) metricValue(name, label, value string) float64 {
	w.t.Helper()
	families, err := w.metrics.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
