package scheduler

import (
	"fmt"

	"gradient.dev/gradient/storage"
)

// jobStates is where the scheduler holds each job it knows of between the
// database's rows and a worker. A job that is pending in the database is
// in queue; once a session takes it, claiming, while its claim (one
// transaction) runs; once claimed, running, with its assignment, until
// the worker reports its end, declines it or the session ends.
//
// Invariants, kept by the methods and checked by check in tests:
//   - a job ID is in at most one of queue, claiming and running;
//   - a job enters the queue only when it is neither claiming nor running
//     (a resync or a readied job read again never duplicates a taken one);
//   - running holds an assignment under its own job's ID;
//   - completing counts, per evaluation, the build completions being
//     recorded after their assignment left running: an evaluation with
//     a queued, running or completing job is not over (busy).
//
// It has no lock of its own: every method is called with Scheduler.mu
// held.
type jobStates struct {
	queue    *jobQueue              // pending, not taken
	claiming map[string]bool        // taken, claim under way
	running  map[string]*assignment // claimed, by job ID
	// completing counts, by evaluation, the build completions being
	// recorded (see endIfLast).
	completing map[string]int
}

func newJobStates() jobStates {
	return jobStates{queue: newJobQueue(), claiming: map[string]bool{}, running: map[string]*assignment{}, completing: map[string]int{}}
}

// known: the job is queued, being claimed or running.
func (t *jobStates) known(id string) bool {
	return t.queue.get(id) != nil || t.claiming[id] || t.running[id] != nil
}

// taken: the job is being claimed or running.
func (t *jobStates) taken(id string) bool { return t.claiming[id] || t.running[id] != nil }

// enqueue queues a pending job unless it is queued or taken already; it
// reports whether the job is new to the queue.
func (t *jobStates) enqueue(j *storage.PendingJob) bool {
	if t.taken(j.JobID) {
		return false
	}
	return t.queue.add(j)
}

// enqueueForeign is enqueue for a job another instance made pending
// (notify.go).
func (t *jobStates) enqueueForeign(j *storage.PendingJob) bool {
	if t.taken(j.JobID) {
		return false
	}
	return t.queue.addAs(j, true)
}

// take moves a queued job to claiming.
func (t *jobStates) take(id string) *storage.PendingJob {
	j := t.queue.remove(id)
	if j != nil {
		t.claiming[id] = true
	}
	return j
}

// unclaim ends a claim that did not make the job running; requeue puts it
// back in the queue (the claim failed, the job is still pending).
func (t *jobStates) unclaim(j *storage.PendingJob, requeue bool) {
	delete(t.claiming, j.JobID)
	if requeue {
		t.enqueue(j)
	}
}

// run makes a claimed job running under a.
func (t *jobStates) run(a *assignment) {
	delete(t.claiming, a.job.JobID)
	t.running[a.job.JobID] = a
}

// assignment is the running assignment of a job, nil when none.
func (t *jobStates) assignment(id string) *assignment { return t.running[id] }

// stop drops a running assignment; false when a is not the job's running
// one (a newer assignment holds it, or none).
func (t *jobStates) stop(a *assignment) bool {
	if t.running[a.job.JobID] != a {
		return false
	}
	delete(t.running, a.job.JobID)
	return true
}

// runningOn lists the assignments of a session.
func (t *jobStates) runningOn(session uint64) []*assignment {
	var out []*assignment
	for _, a := range t.running {
		if a.session == session {
			out = append(out, a)
		}
	}
	return out
}

// beginCompleting and endCompleting bracket the recording of a build's
// completion of evalID.
func (t *jobStates) beginCompleting(evalID string) { t.completing[evalID]++ }

func (t *jobStates) endCompleting(evalID string) {
	if t.completing[evalID]--; t.completing[evalID] <= 0 {
		delete(t.completing, evalID)
	}
}

// busy: the evaluation has a job queued, running or completing.
func (t *jobStates) busy(evalID string) bool {
	if t.queue.evalJobs(evalID) > 0 || t.completing[evalID] > 0 {
		return true
	}
	for _, a := range t.running {
		if a.job.EvaluationID == evalID {
			return true
		}
	}
	return false
}

// check reports the first broken invariant (tests).
func (t *jobStates) check() error {
	for id := range t.claiming {
		if t.queue.get(id) != nil {
			return fmt.Errorf("job %s is queued and being claimed", id)
		}
		if t.running[id] != nil {
			return fmt.Errorf("job %s is being claimed and running", id)
		}
	}
	for id, a := range t.running {
		if a == nil || a.job.JobID != id {
			return fmt.Errorf("job %s runs under another job's assignment", id)
		}
		if t.queue.get(id) != nil {
			return fmt.Errorf("job %s is queued and running", id)
		}
	}
	for evalID, n := range t.completing {
		if n <= 0 {
			return fmt.Errorf("evaluation %s counts %d completions", evalID, n)
		}
	}
	return nil
}
