package hub

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"gradient.dev/gradient/wire"
)

// scanPick is the selection written as a scan of every worker of the
// hub, as pick was before it looked at the index of waiters: the
// reference the indexed pick must agree with. The order itself is pinned
// by TestPickPrefersScoreThenFewerJobsThenTheOlderSession.
func scanPick(h *Hub, kind wire.JobKind, m *wire.AssignJob) *member {
	var best *member
	for _, w := range h.workers {
		if w.d.Draining() || !canRun(w.d, m.Job) {
			continue
		}
		if m.Cluster == nil && !w.waiting[kind] {
			continue
		}
		if m.Cluster != nil && h.holdsAttempt(w, m.Cluster.Attempt) {
			continue
		}
		if best == nil || ranksBefore(kind, m.JobID, w, best) {
			best = w
		}
	}
	return best
}

// checkWaiters fails unless the hub's index of waiters holds exactly
// the members whose RequestJob of that kind is unanswered.
func checkWaiters(t testing.TB, h *Hub) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for kind := range h.waiters {
		for i, w := range h.waiters[kind] {
			s := w.d.Session()
			if h.workers[s] != w || !w.waiting[kind] || w.waitAt[kind] != i {
				t.Fatalf("session %d is indexed at %d as waiting for kind %d but is not (member held: %v, waiting: %v, at %d)",
					s, i, kind, h.workers[s] == w, w.waiting[kind], w.waitAt[kind])
			}
		}
		n := 0
		for _, w := range h.workers {
			if w.waiting[kind] {
				n++
			}
		}
		if n != len(h.waiters[kind]) {
			t.Fatalf("%d members wait for kind %d, %d are indexed", n, kind, len(h.waiters[kind]))
		}
	}
}

// With fifty workers of mixed architectures and kinds, some waiting,
// some draining, some scoring the job and some busy, every AssignJob
// (build, flake, cluster member) goes to the worker a scan of every
// worker by the same rule chooses, and is declined where the scan finds
// none.
func TestPickAgreesWithAScanOfEveryWorker(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 7))
		h := newHub()
		u := attach(t, h)
		var workers []*fakeWorker
		for i := range 50 {
			var w *fakeWorker
			switch rng.IntN(4) {
			case 0:
				w = flakeWorker(fmt.Sprint("f", i), rng.IntN(2) == 0)
			case 1:
				w = buildWorker(fmt.Sprint("arm", i), "aarch64-linux")
			default:
				w = buildWorker(fmt.Sprint("x", i), "x86_64-linux")
			}
			workers = append(workers, w)
			h.Join(w)
		}
		for n := range 200 {
			id := fmt.Sprintf("j%d-%d", seed, n)
			var m *wire.AssignJob
			switch rng.IntN(5) {
			case 0:
				m = flakeAssign(id, wire.FlakeStepFetchFlake, wire.FlakeStepEvaluateFlake)
			case 1:
				m = buildAssign(id, "aarch64-linux")
				m.Cluster = &wire.ClusterMembership{Attempt: fmt.Sprint("at", rng.IntN(3)), Role: "r", Index: uint32(rng.IntN(4))}
			default:
				m = buildAssign(id, "x86_64-linux")
			}
			u.h.Handle(&wire.JobOffer{Candidates: []wire.JobCandidate{buildCand(id, "x86_64-linux")}})
			for _, w := range workers {
				switch rng.IntN(6) {
				case 0:
					h.FromWorker(w, &wire.RequestJob{Kind: wire.JobKind(rng.IntN(2))})
				case 1:
					h.FromWorker(w, &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: id,
						MissingNarSize: rng.Uint64N(3), MissingCount: uint32(rng.IntN(2)), OutputsPresent: rng.IntN(4) == 0}}, IsFinal: true})
				}
			}
			if rng.IntN(20) == 0 {
				w := workers[rng.IntN(len(workers))]
				w.mu.Lock()
				w.draining = !w.draining
				w.mu.Unlock()
			}
			if rng.IntN(25) == 0 {
				h.FromWorker(workers[rng.IntN(len(workers))], &wire.ClientDraining{})
			}
			checkWaiters(t, h)
			kind, _ := jobKind(m.Job)
			h.mu.Lock()
			want := scanPick(h, kind, m)
			got := h.pick(kind, m)
			h.mu.Unlock()
			if got != want {
				t.Fatalf("seed %d job %s: pick chose %v, the scan of every worker %v", seed, id, who(got), who(want))
			}
			u.h.Handle(m)
			u.take()
			for _, w := range workers {
				for _, a := range of[*wire.AssignJob](w.take()) {
					// Most jobs are accepted and some end, so the
					// workers' job counts differ.
					switch rng.IntN(3) {
					case 0:
						h.FromWorker(w, &wire.AssignJobResponse{JobID: a.JobID, Accepted: false})
					case 1:
						h.FromWorker(w, &wire.AssignJobResponse{JobID: a.JobID, Accepted: true})
						h.FromWorker(w, &wire.JobCompleted{JobID: a.JobID})
					default:
						h.FromWorker(w, &wire.AssignJobResponse{JobID: a.JobID, Accepted: true})
					}
				}
			}
		}
		for _, w := range workers[:10] {
			h.Leave(w, "gone")
		}
		checkWaiters(t, h)
	}
}

func who(m *member) string {
	if m == nil {
		return "nobody"
	}
	return m.d.WorkerID()
}

// The rule pinned by hand: of workers able to run an x86_64 build, the
// busy, draining and not waiting ones are passed over; of the rest the
// best score wins, then fewer jobs, then the older session.
func TestPickPrefersScoreThenFewerJobsThenTheOlderSession(t *testing.T) {
	h := newHub()
	u := attach(t, h)
	var ws []*fakeWorker
	for i := range 8 {
		w := buildWorker(fmt.Sprint("x", i), "x86_64-linux")
		ws = append(ws, w)
		h.Join(w)
	}
	arm := buildWorker("arm", "aarch64-linux")
	h.Join(arm)
	u.h.Handle(&wire.JobOffer{Candidates: []wire.JobCandidate{buildCand("j1", "x86_64-linux"), buildCand("j2", "x86_64-linux")}})
	// x0 scores j1 best but does not wait; x1 waits but drains.
	h.FromWorker(ws[0], &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: "j1", OutputsPresent: true}}, IsFinal: true})
	ws[1].draining = true
	for _, w := range append(ws[1:], arm) {
		h.FromWorker(w, &wire.RequestJob{Kind: wire.JobKindBuild})
	}
	h.FromWorker(arm, &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: "j1", OutputsPresent: true}}, IsFinal: true})
	h.FromWorker(ws[1], &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: "j1", OutputsPresent: true}}, IsFinal: true})
	// x5 and x6 score j1 equally: fewer jobs, then the older session win.
	for _, w := range ws[5:7] {
		h.FromWorker(w, &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: "j1", MissingNarSize: 5}}, IsFinal: true})
	}
	h.FromWorker(ws[4], &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: "j1", MissingNarSize: 6}}, IsFinal: true})
	u.h.Handle(buildAssign("j1", "x86_64-linux"))
	if got := of[*wire.AssignJob](ws[5].take()); len(got) != 1 {
		t.Fatalf("x5 (best waiting score, older than x6) got %v", got)
	}
	// j2: nobody scored it; x2, the oldest waiting idle session, gets it.
	u.h.Handle(buildAssign("j2", "x86_64-linux"))
	if got := of[*wire.AssignJob](ws[2].take()); len(got) != 1 {
		t.Fatalf("x2 (oldest waiting, no score) got %v", got)
	}
	for _, w := range []*fakeWorker{ws[0], ws[1], ws[3], ws[4], ws[6], ws[7], arm} {
		if got := of[*wire.AssignJob](w.take()); len(got) != 0 {
			t.Fatalf("%s got %v", w.workerID, got[0].JobID)
		}
	}
	checkWaiters(t, h)
}

// Each AssignJob is counted once by its outcome (counted after the
// hub's lock is released); a re-sent one is not counted again.
func TestAssignmentsAreCountedByOutcome(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h := New("tenant-a", slog.New(slog.DiscardHandler), m)
	w := buildWorker("x", "x86_64-linux")
	h.Join(w)
	u := attach(t, h)
	h.FromWorker(w, &wire.RequestJob{Kind: wire.JobKindBuild})
	u.h.Handle(buildAssign("j1", "x86_64-linux"))
	u.h.Handle(buildAssign("j1", "x86_64-linux")) // re-sent: the owner re-adopts it
	u.h.Handle(buildAssign("j2", "x86_64-linux")) // nobody waits
	u.h.Handle(buildAssign("j3", "aarch64-linux"))
	for outcome, want := range map[string]float64{"forwarded": 1, "declined": 2} {
		if got := testutil.ToFloat64(m.assignments.WithLabelValues("tenant-a", outcome)); got != want {
			t.Errorf("%s: %v assignments counted, want %v", outcome, got, want)
		}
	}
	if got := of[*wire.AssignJob](w.take()); len(got) != 2 {
		t.Fatalf("the worker got %d AssignJobs, want j1 and its re-send", len(got))
	}
}
