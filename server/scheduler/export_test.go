package scheduler

import "time"

// WaitRecorded waits for the completions being recorded beside their
// sessions, so a test that sends a report can look at the database next.
func (s *Scheduler) WaitRecorded() { s.recording.Wait() }

// SetProgressTTL shortens how long a BuildProgress is shown.
func SetProgressTTL(d time.Duration) (restore func()) {
	old := progressTTL
	progressTTL = d
	return func() { progressTTL = old }
}
