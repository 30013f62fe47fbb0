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
//
// A job added out of order (a retry, a declined job, one read again) is
// inserted at its place, so a group stays sorted and a pick never sorts
// a large group.
//
// It has no lock of its own: every method is called with Scheduler.mu held.
type jobQueue struct {
	byID   map[string]*queuedJob
	groups map[groupKey]*jobGroup
	order  []*jobGroup // the groups in creation order, for stable merges
	// perEval counts the queued jobs of each evaluation.
	perEval map[string]int
	// seq numbers the adds, so a resync with the database can tell the
	// jobs queued before it read from those queued since.
	seq uint64
}

type queuedJob struct {
	job   *storage.PendingJob
	group *jobGroup
	seq   uint64
	dead  bool
}

type groupKey struct {
	kind                    storage.JobKind
	project, arch, features string
	fetched                 bool
	// foreign: jobs another server instance made pending and told this
	// one about (notify.go); picked after this instance's own, newest
	// first (see Scheduler.take).
	foreign bool
}

type jobGroup struct {
	key    groupKey
	sample *storage.PendingJob // any member: they share the requirements
	jobs   []*queuedJob        // sorted by ready time (dead ones too)
	live   int
}

func newJobQueue() *jobQueue {
	return &jobQueue{byID: map[string]*queuedJob{}, groups: map[groupKey]*jobGroup{}, perEval: map[string]int{}}
}

// evalJobs is the number of queued jobs of an evaluation.
func (q *jobQueue) evalJobs(evalID string) int { return q.perEval[evalID] }

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
func (q *jobQueue) add(job *storage.PendingJob) bool { return q.addAs(job, false) }

// addAs queues a job, foreign when another instance made it pending.
func (q *jobQueue) addAs(job *storage.PendingJob, foreign bool) bool {
	if q.byID[job.JobID] != nil {
		return false
	}
	key := groupKey{job.Kind, job.ProjectID, job.Architecture, strings.Join(job.RequiredFeatures, " "), job.FlakeSource != "", foreign}
	g := q.groups[key]
	if g == nil {
		g = &jobGroup{key: key, sample: job}
		q.groups[key] = g
		q.order = append(q.order, g)
	}
	q.seq++
	e := &queuedJob{job: job, group: g, seq: q.seq}
	if n := len(g.jobs); n > 0 && olderThan(job, g.jobs[n-1].job) {
		i, _ := slices.BinarySearchFunc(g.jobs, job, func(e *queuedJob, j *storage.PendingJob) int {
			if olderThan(e.job, j) {
				return -1
			}
			return 1
		})
		g.jobs = slices.Insert(g.jobs, i, e)
	} else {
		g.jobs = append(g.jobs, e)
	}
	g.live++
	q.byID[job.JobID] = e
	q.perEval[job.EvaluationID]++
	return true
}

// remove takes a job out of the queue and returns it, or nil.
func (q *jobQueue) remove(id string) *storage.PendingJob {
	e := q.byID[id]
	if e == nil {
		return nil
	}
	delete(q.byID, id)
	if q.perEval[e.job.EvaluationID]--; q.perEval[e.job.EvaluationID] <= 0 {
		delete(q.perEval, e.job.EvaluationID)
	}
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
// jobqueue.PendingJobs).
func olderThan(a, b *storage.PendingJob) bool {
	if c := a.ReadyAt.Compare(b.ReadyAt); c != 0 {
		return c < 0
	}
	return a.JobID < b.JobID
}

// each visits, oldest first, the jobs of the groups whose sample
// eligible accepts, until visit returns false.
func (q *jobQueue) each(eligible func(sample *storage.PendingJob) bool, visit func(*storage.PendingJob) bool) {
	q.eachIn(func(g *jobGroup) bool { return eligible(g.sample) }, visit)
}

// eachIn is each over the groups eligible accepts.
func (q *jobQueue) eachIn(eligible func(g *jobGroup) bool, visit func(*storage.PendingJob) bool) {
	// A cursor per eligible group; each step takes the oldest head.
	type cursor struct {
		g *jobGroup
		i int
	}
	var cursors []cursor
	for _, g := range q.order {
		if !eligible(g) {
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

// prepare drops the dead jobs at the group's front.
func (g *jobGroup) prepare() {
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

// prepareBack drops the dead jobs at the group's back (the newest, taken
// first by eachNewest's callers), so a walk from the back does not step
// over them again.
func (g *jobGroup) prepareBack() {
	n := len(g.jobs)
	for n > 0 && g.jobs[n-1].dead {
		n--
		g.jobs[n] = nil
	}
	g.jobs = g.jobs[:n]
}

// staleSince returns the IDs of the jobs queued up to mark (a value of
// q.seq) that pending does not hold: jobs the database no longer has
// pending, where a job queued after mark may be newer than the read.
func (q *jobQueue) staleSince(mark uint64, pending map[string]struct{}) []string {
	var stale []string
	for id, e := range q.byID {
		if _, ok := pending[id]; !ok && e.seq <= mark {
			stale = append(stale, id)
		}
	}
	return stale
}

// eachNewest visits, newest first, the jobs of the groups eligible
// accepts, until visit returns false.
func (q *jobQueue) eachNewest(eligible func(g *jobGroup) bool, visit func(*storage.PendingJob) bool) {
	type cursor struct {
		g *jobGroup
		i int // the next candidate, counting down
	}
	var cursors []cursor
	for _, g := range q.order {
		if eligible(g) {
			g.prepareBack()
			cursors = append(cursors, cursor{g, len(g.jobs) - 1})
		}
	}
	for {
		best := -1
		for c := range cursors {
			cur := &cursors[c]
			for cur.i >= 0 && cur.g.jobs[cur.i].dead {
				cur.i--
			}
			if cur.i < 0 {
				continue
			}
			if best < 0 || olderThan(cursors[best].g.jobs[cursors[best].i].job, cur.g.jobs[cur.i].job) {
				best = c
			}
		}
		if best < 0 {
			return
		}
		b := &cursors[best]
		job := b.g.jobs[b.i].job
		b.i--
		if !visit(job) {
			return
		}
	}
}
