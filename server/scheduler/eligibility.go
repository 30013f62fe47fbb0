package scheduler

import (
	"slices"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// eligibility is a snapshot of what one worker may run (docs/protocol/jobs.md §6),
// taken once per pick so the session's locks are not taken per job.
type eligibility struct {
	projects    map[string]authority.Abilities // what each authorized project allows
	caps        wire.GradientCapabilities
	hasHostCaps bool
	arches      []string
	features    []string
	draining    bool
}

// newEligibility reads what w may run now. It takes w's session lock (a
// leaf) through the LiveWorker getters; take, offer, sendJobList and
// splitFetch call it with s.mu held (Scheduler.mu → the session's mu).
func newEligibility(w *authority.LiveWorker) eligibility {
	e := eligibility{projects: w.ProjectAbilities(), caps: w.Capabilities(), draining: w.Draining()}
	if hc := w.WorkerCapabilities(); hc != nil {
		e.hasHostCaps = true
		e.arches, e.features = hc.Architectures, hc.SystemFeatures
	}
	return e
}

// may reports whether the worker may take job as a job of kind.
func (e eligibility) may(job *storage.PendingJob, kind wire.JobKind) bool {
	allowed, ok := e.projects[job.ProjectID]
	if e.draining || !ok {
		return false
	}
	switch job.Kind {
	case storage.JobFlake:
		if kind != wire.JobKindFlake {
			return false
		}
		if job.FlakeSource != "" {
			// Fetched already (the follow-up of a fetch-only job, or a
			// retry): the evaluation steps are left, from the cache.
			return e.mayEvaluate(job.ProjectID)
		}
		// Fetching first; a worker that may not evaluate gets the
		// fetch step alone (docs/protocol/jobs.md §6, flake-job splitting).
		return e.mayFetch(job.ProjectID)
	case storage.JobBuild:
		if kind != wire.JobKindBuild || !e.caps.Build || !allowed.Build || !e.hasHostCaps {
			return false
		}
		if job.Architecture != "builtin" && !slices.Contains(e.arches, job.Architecture) {
			return false
		}
		for _, f := range job.RequiredFeatures {
			if !slices.Contains(e.features, f) {
				return false
			}
		}
		return true
	}
	return false
}

// mayEvaluate reports whether the worker may run the evaluation steps of
// the project's flake jobs.
func (e eligibility) mayEvaluate(projectID string) bool {
	allowed, ok := e.projects[projectID]
	return ok && !e.draining && e.caps.Eval && allowed.Eval
}

// mayFetch reports whether the worker may fetch the project's flakes.
func (e eligibility) mayFetch(projectID string) bool {
	allowed, ok := e.projects[projectID]
	return ok && !e.draining && e.caps.Fetch && allowed.Fetch
}

// mayAny reports whether the worker may take job as a job of either kind.
func (e eligibility) mayAny(job *storage.PendingJob) bool {
	return e.may(job, wire.JobKindFlake) || e.may(job, wire.JobKindBuild)
}
