package scheduler

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"gradient.dev/gradient/storage"
)

func queueJob(id string, readyAt int, project, arch string) *storage.PendingJob {
	return &storage.PendingJob{JobID: id, Kind: storage.JobBuild, ProjectID: project, Architecture: arch,
		ReadyAt: time.Unix(int64(readyAt), 0)}
}

func visitAll(q *jobQueue, eligible func(*storage.PendingJob) bool) []string {
	var ids []string
	q.each(eligible, func(j *storage.PendingJob) bool {
		ids = append(ids, j.JobID)
		return true
	})
	return ids
}

func anyJob(*storage.PendingJob) bool { return true }

// Jobs of different groups come out in one order: oldest ready first,
// ties by ID, whatever order they were added in.
func TestJobQueueOrderAcrossGroups(t *testing.T) {
	q := newJobQueue()
	q.add(queueJob("c", 3, "p1", "x86_64-linux"))
	q.add(queueJob("a", 1, "p2", "aarch64-linux"))
	q.add(queueJob("e", 5, "p1", "x86_64-linux"))
	q.add(queueJob("b", 2, "p1", "x86_64-linux")) // out of order in its group
	q.add(queueJob("d", 3, "p2", "aarch64-linux"))
	if got, want := visitAll(q, anyJob), []string{"a", "b", "c", "d", "e"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	armOnly := func(j *storage.PendingJob) bool { return j.Architecture == "aarch64-linux" }
	if got, want := visitAll(q, armOnly), []string{"a", "d"}; !slices.Equal(got, want) {
		t.Fatalf("eligible order %v, want %v", got, want)
	}
	if q.add(queueJob("a", 9, "p2", "aarch64-linux")) {
		t.Fatal("a job queued twice")
	}
}

// A removed job is not visited; queued again it is visited once, at its
// new place.
func TestJobQueueRemoveAndRequeue(t *testing.T) {
	q := newJobQueue()
	for i, id := range []string{"a", "b", "c"} {
		q.add(queueJob(id, i, "p", "x86_64-linux"))
	}
	if j := q.remove("b"); j == nil || j.JobID != "b" {
		t.Fatalf("remove b = %v", j)
	}
	if q.remove("b") != nil || q.get("b") != nil {
		t.Fatal("b still queued after removal")
	}
	q.add(queueJob("b", 10, "p", "x86_64-linux"))
	if got, want := visitAll(q, anyJob), []string{"a", "c", "b"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	for _, id := range []string{"a", "b", "c"} {
		q.remove(id)
	}
	if q.len() != 0 || len(q.groups) != 0 || len(q.order) != 0 {
		t.Fatalf("empty queue keeps %d jobs, %d groups", q.len(), len(q.groups))
	}
}

// The queue agrees with a plain sorted list under random adds, removals
// and requeues, across groups, with compaction along the way.
func TestJobQueueMatchesSortedList(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	q := newJobQueue()
	ref := map[string]*storage.PendingJob{}
	arches := []string{"x86_64-linux", "aarch64-linux", "builtin"}
	for step := range 20000 {
		id := fmt.Sprint("job", rng.IntN(500))
		if rng.IntN(3) == 0 {
			if (q.remove(id) != nil) != (ref[id] != nil) {
				t.Fatalf("step %d: remove %s disagrees", step, id)
			}
			delete(ref, id)
		} else {
			j := queueJob(id, rng.IntN(1000), fmt.Sprint("p", rng.IntN(3)), arches[rng.IntN(3)])
			if q.add(j) != (ref[id] == nil) {
				t.Fatalf("step %d: add %s disagrees", step, id)
			}
			if ref[id] == nil {
				ref[id] = j
			}
		}
		if step%97 != 0 {
			continue
		}
		arch := arches[rng.IntN(3)]
		eligible := func(j *storage.PendingJob) bool { return j.Architecture != arch }
		var want []*storage.PendingJob
		for _, j := range ref {
			if eligible(j) {
				want = append(want, j)
			}
		}
		slices.SortFunc(want, func(a, b *storage.PendingJob) int {
			if olderThan(a, b) {
				return -1
			}
			return 1
		})
		var wantIDs []string
		for _, j := range want {
			wantIDs = append(wantIDs, j.JobID)
		}
		if got := visitAll(q, eligible); !slices.Equal(got, wantIDs) {
			t.Fatalf("step %d: queue visits\n%v\nwant\n%v", step, got, wantIDs)
		}
		if q.len() != len(ref) {
			t.Fatalf("step %d: len %d, want %d", step, q.len(), len(ref))
		}
	}
}

// Visiting stops when asked to.
func TestJobQueueEachStops(t *testing.T) {
	q := newJobQueue()
	for i := range 10 {
		q.add(queueJob(fmt.Sprint(i), i, "p", "x86_64-linux"))
	}
	n := 0
	q.each(anyJob, func(*storage.PendingJob) bool { n++; return n < 3 })
	if n != 3 {
		t.Fatalf("visited %d jobs, want 3", n)
	}
}

// Jobs other instances told of (foreign) are walked newest first, apart
// from this instance's own, with removed ones skipped.
func TestJobQueueForeignNewestFirst(t *testing.T) {
	q := newJobQueue()
	q.add(queueJob("own1", 1, "p1", "x86_64-linux"))
	q.addAs(queueJob("f1", 2, "p1", "x86_64-linux"), true)
	q.addAs(queueJob("f3", 4, "p2", "aarch64-linux"), true)
	q.addAs(queueJob("f2", 3, "p1", "x86_64-linux"), true)
	q.addAs(queueJob("f4", 5, "p1", "x86_64-linux"), true)
	q.remove("f4")
	var got []string
	q.eachNewest(func(g *jobGroup) bool { return g.key.foreign }, func(j *storage.PendingJob) bool {
		got = append(got, j.JobID)
		return true
	})
	if want := []string{"f3", "f2", "f1"}; !slices.Equal(got, want) {
		t.Fatalf("foreign newest first %v, want %v", got, want)
	}
	var own []string
	q.eachIn(func(g *jobGroup) bool { return !g.key.foreign }, func(j *storage.PendingJob) bool {
		own = append(own, j.JobID)
		return true
	})
	if !slices.Equal(own, []string{"own1"}) {
		t.Fatalf("own jobs %v", own)
	}
	if got, want := visitAll(q, anyJob), []string{"own1", "f1", "f2", "f3"}; !slices.Equal(got, want) {
		t.Fatalf("all jobs %v, want %v (offers and lists see both)", got, want)
	}
}
