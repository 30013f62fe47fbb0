package downstream

import "gradient.dev/gradient/authority"

// WorkerStatus is the live state of one of the proxy's workers, and why
// it last went away (the authority's view, for the admin API).
func (l *Leg) WorkerStatus(workerID string) authority.WorkerStatus {
	return l.auth.WorkerStatus(workerID)
}
