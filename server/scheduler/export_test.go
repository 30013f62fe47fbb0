package scheduler

// WaitRecorded waits for the completions being recorded beside their
// sessions, so a test that sends a report can look at the database next.
func (s *Scheduler) WaitRecorded() { s.recording.Wait() }
