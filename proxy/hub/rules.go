package hub

import (
	"slices"

	"gradient.dev/gradient/wire"
)

// The rules by which a worker sees a candidate or may run a job
// (docs/protocol/jobs.md §6): the proxy hands a worker only what it can run.

// isBuildCandidate: a build candidate names its derivation or its
// requirement; a flake candidate neither.
func isBuildCandidate(c wire.JobCandidate) bool {
	return c.Requirement != nil || len(c.DrvPaths) > 0
}

// canSee: the worker could run the candidate.
func canSee(d Downstream, c wire.JobCandidate) bool {
	caps := d.Capabilities()
	if !isBuildCandidate(c) {
		return caps.Fetch || caps.Eval
	}
	if !caps.Build {
		return false
	}
	host := d.Host()
	if host == nil {
		return false
	}
	return c.Requirement == nil || meets(host, *c.Requirement)
}

// meets: the host builds for the architecture (or it is builtin) and has
// every required feature.
func meets(host *wire.WorkerCapabilities, r wire.BuildRequirement) bool {
	if r.Architecture != "builtin" && !slices.Contains(host.Architectures, r.Architecture) {
		return false
	}
	for _, f := range r.RequiredFeatures {
		if !slices.Contains(host.SystemFeatures, f) {
			return false
		}
	}
	return true
}

// canRun: the worker negotiated what the job's steps need.
func canRun(d Downstream, j wire.Job) bool {
	caps := d.Capabilities()
	switch j := j.(type) {
	case *wire.BuildJob:
		host := d.Host()
		return caps.Build && host != nil && meets(host, j.Requirement)
	case *wire.FlakeJob:
		for _, s := range j.Steps {
			switch s {
			case wire.FlakeStepFetchFlake:
				if !caps.Fetch {
					return false
				}
			case wire.FlakeStepEvaluateFlake, wire.FlakeStepEvaluateDerivations:
				if !caps.Eval {
					return false
				}
			}
		}
		return caps.Fetch || caps.Eval
	}
	return false
}

func jobKind(j wire.Job) (wire.JobKind, bool) {
	switch j.(type) {
	case *wire.BuildJob:
		return wire.JobKindBuild, true
	case *wire.FlakeJob:
		return wire.JobKindFlake, true
	}
	return 0, false
}

// needsFetch: the job fetches, so a Credential before it goes with it.
func needsFetch(j wire.Job) bool {
	f, ok := j.(*wire.FlakeJob)
	return ok && slices.Contains(f.Steps, wire.FlakeStepFetchFlake)
}
