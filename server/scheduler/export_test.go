package scheduler

import (
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// WaitRecorded waits for the completions being recorded beside their
// sessions, so a test that sends a report can look at the database next.
func (s *Scheduler) WaitRecorded() { s.recording.Wait() }

// SetProgressTTL shortens how long a BuildProgress is shown.
func SetProgressTTL(d time.Duration) (restore func()) {
	old := progressTTL
	progressTTL = d
	return func() { progressTTL = old }
}

// OnAdmitted calls f with each chunk of an evaluation's ready jobs once
// it joined the queue and idle workers were served. Set it before the
// evaluation completes.
func (s *Scheduler) OnAdmitted(f func(jobIDs []string)) { s.admitted = f }

// QueueLen is the number of jobs in the in-memory queue.
func (s *Scheduler) QueueLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jobs.queue.len()
}

// CheckJobStates reports the first broken invariant of the jobs' states
// (jobStates.check).
func (s *Scheduler) CheckJobStates() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jobs.check()
}

// NotesListening closes once the scheduler listens for other instances'
// notes.
func (s *Scheduler) NotesListening() <-chan struct{} { return s.notes.listening }

// NoteReloads is how many full reads of the queue notes caused (the
// first LISTEN's included), once done.
func (s *Scheduler) NoteReloads() int64 { return s.notes.reloads.Load() }

// ClaimsLost is how many claims the database refused (claimed elsewhere
// or no longer pending).
func (s *Scheduler) ClaimsLost() float64 { return testutil.ToFloat64(s.m.claimsLost) }

// Alone reports whether the last pass found this instance the only live
// one (it sends no notes then).
func (s *Scheduler) Alone() bool { return s.notes.alone.Load() }
