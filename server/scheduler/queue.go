package scheduler

import (
	"slices"
	"strings"

	"gradient.dev/gradient/storage"
)

// jobQueue is the in-memory copy of the pending jobs, oldest ready first.
//
// Jobs are grouped by what a worker needs to run them (kind, project,
// architecture, system features; for flake jobs whether the source is
// fetched already): every job of a group is eligible for
// the same workers, so a pick checks eligibility once per group, not once
// per job. A worker that may run nothing queued (an evaluator while only
// builds wait, a worker of another architecture) then costs a pass over
// a handful of groups instead of the whole queue, which at thousands of
// queued builds was most of the scheduler's time.
//
// Removal is lazy: a removed job is marked dead and skipped, and a
// group's slice is compacted once most of it is dead, so taking jobs off
// the front costs no copying of the rest.
type jobQueue struct {
	byID   map[string]*queuedJob
	groups map[groupKey]*jobGroup
	order  []*jobGroup // the groups in creation order, for stable merges
}

type queuedJob struct {
	job   *storage.PendingJob
	group *jobGroup
	dead  bool
}

type groupKey struct {
	kind                    storage.JobKind
	project, arch, features string
	fetched                 bool
}

type jobGroup struct {
	key    groupKey
	sample *storage.PendingJob // any member: they share the requirements
	jobs   []*queuedJob        // sorted by ready time when sorted is set
	live   int
	sorted bool
}

func newJobQueue() *jobQueue {
	return &jobQueue{byID: map[string]*queuedJob{}, groups: map[groupKey]*jobGroup{}}
}

// len is the number of pending jobs.
func (q *jobQueue) len() int { return len(q.byID) }

// get returns the pending job with the ID, or nil.
func (q *jobQueue) get(id string) *storage.PendingJob {
	if e := q.byID[id]; e != nil {
		return e.job
	}
	return nil
}

// add queues a job; false if a job of that ID is queued already.
func (q *jobQueue) add(job *storage.PendingJob) bool {
	if q.byID[job.JobID] != nil {
		return false
	}
	key := groupKey{job.Kind, job.ProjectID, job.Architecture, strings.Join(job.RequiredFeatures, " "), job.FlakeSource != ""}
	g := q.groups[key]
	if g == nil {
		g = &jobGroup{key: key, sample: job, sorted: true}
		q.groups[key] = g
		q.order = append(q.order, g)
	}
	e := &queuedJob{job: job, group: g}
	if n := len(g.jobs); n > 0 && g.sorted && olderThan(job, g.jobs[n-1].job) {
		g.sorted = false
	}
	g.jobs = append(g.jobs, e)
	g.live++
	q.byID[job.JobID] = e
	return true
}

// remove takes a job out of the queue and returns it, or nil.
func (q *jobQueue) remove(id string) *storage.PendingJob {
	e := q.byID[id]
	if e == nil {
		return nil
	}
	delete(q.byID, id)
	e.dead = true
	g := e.group
	g.live--
	switch {
	case g.live == 0:
		delete(q.groups, g.key)
		q.order = slices.DeleteFunc(q.order, func(o *jobGroup) bool { return o == g })
	case len(g.jobs) > 64 && g.live < len(g.jobs)/2:
		g.jobs = slices.DeleteFunc(g.jobs, func(e *queuedJob) bool { return e.dead })
	}
	return e.job
}

// olderThan orders jobs by ready time, then ID (the order of
// storage.PendingJobs).
func olderThan(a, b *storage.PendingJob) bool {
	if c := a.ReadyAt.Compare(b.ReadyAt); c != 0 {
		return c < 0
	}
	return a.JobID < b.JobID
}

// each visits, oldest first, the jobs of the groups whose sample
// eligible accepts, until visit returns false.
func (q *jobQueue) each(eligible func(sample *storage.PendingJob) bool, visit func(*storage.PendingJob) bool) {
	// A cursor per eligible group; each step takes the oldest head.
	type cursor struct {
		g *jobGroup
		i int
	}
	var cursors []cursor
	for _, g := range q.order {
		if !eligible(g.sample) {
			continue
		}
		g.prepare()
		cursors = append(cursors, cursor{g, 0})
	}
	for {
		best := -1
		for c := range cursors {
			cur := &cursors[c]
			for cur.i < len(cur.g.jobs) && cur.g.jobs[cur.i].dead {
				cur.i++
			}
			if cur.i == len(cur.g.jobs) {
				continue
			}
			if best < 0 || olderThan(cur.g.jobs[cur.i].job, cursors[best].g.jobs[cursors[best].i].job) {
				best = c
			}
		}
		if best < 0 {
			return
		}
		b := &cursors[best]
		job := b.g.jobs[b.i].job
		b.i++
		if !visit(job) {
			return
		}
	}
}

// prepare sorts the group if it is out of order and drops the dead jobs
// at its front.
func (g *jobGroup) prepare() {
	if !g.sorted {
		g.jobs = slices.DeleteFunc(g.jobs, func(e *queuedJob) bool { return e.dead })
		slices.SortFunc(g.jobs, func(a, b *queuedJob) int {
			switch {
			case olderThan(a.job, b.job):
				return -1
			case olderThan(b.job, a.job):
				return 1
			}
			return 0
		})
		g.sorted = true
	}
	front := 0
	for front < len(g.jobs) && g.jobs[front].dead {
		front++
	}
	if front > 0 {
		// Clear the dropped entries so the array does not keep them alive.
		clear(g.jobs[:front])
		g.jobs = g.jobs[front:]
	}
}
