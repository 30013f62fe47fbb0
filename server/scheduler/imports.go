package scheduler

import (
	"context"
	"slices"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// Import from derivation (docs/protocol/jobs.md §14): an evaluating worker asks for
// derivations it reported to be built now; the scheduler queues them
// (jobqueue.RequestImports) and answers ImportResult once every one has
// succeeded, or as soon as one failed. Requests live in memory: they
// belong to the evaluating session, and a new session re-evaluates.

// importRequest is one ImportRequest waiting for its builds.
type importRequest struct {
	w         *authority.LiveWorker
	jobID     string
	requestID string
	evalID    string
	drvs      []string
}

// importRequest handles an ImportRequest of the flake job a.
func (s *Scheduler) importRequest(ctx context.Context, w *authority.LiveWorker, a *assignment, m *wire.ImportRequest) {
	if a.job.Kind != storage.JobFlake {
		w.Send(authority.RefuseImport(m))
		return
	}
	ready, unknown, err := s.queue.RequestImports(ctx, a.job.EvaluationID, m.DrvPaths)
	if err != nil {
		s.log.Warn("queueing an import from derivation failed", "job", m.JobID, "error", err)
		w.Send(authority.RefuseImport(m))
		return
	}
	if len(unknown) > 0 {
		// Not reported by this evaluation: fine if built before (its
		// outputs are in the cache), else unknown.
		built, err := s.queue.BuiltDerivations(ctx, unknown)
		if err != nil {
			s.log.Warn("looking up imported derivations failed", "job", m.JobID, "error", err)
		}
		for _, drv := range unknown {
			if _, ok := built[drv]; !ok {
				w.Send(&wire.ImportResult{JobID: m.JobID, RequestID: m.RequestID, Outcome: &wire.ImportUnknown{DrvPath: drv}})
				return
			}
		}
	}
	drvs := slices.DeleteFunc(slices.Clone(m.DrvPaths), func(d string) bool { return slices.Contains(unknown, d) })
	s.log.Info("building imports for an evaluation", "job", m.JobID, "derivations", len(drvs), "queued_now", len(ready))
	s.mu.Lock()
	s.imports = append(s.imports, &importRequest{w: w, jobID: m.JobID, requestID: m.RequestID, evalID: a.job.EvaluationID, drvs: drvs})
	s.mu.Unlock()
	s.addPending(ctx, ready)
	s.dispatch(ready)
	s.answerImports(ctx, a.job.EvaluationID)
}

// answerImports answers the import requests of evalID whose builds have
// all succeeded, or of which one failed.
func (s *Scheduler) answerImports(ctx context.Context, evalID string) {
	s.mu.Lock()
	var waiting []*importRequest
	for _, r := range s.imports {
		if r.evalID == evalID {
			waiting = append(waiting, r)
		}
	}
	s.mu.Unlock()
	for _, r := range waiting {
		builds, err := s.queue.ImportBuilds(ctx, evalID, r.drvs)
		if err != nil {
			s.log.Warn("checking imported builds failed", "job", r.jobID, "error", err)
			continue
		}
		var outcome wire.ImportOutcome = &wire.ImportCompleted{}
		for _, drv := range r.drvs {
			b := builds[drv]
			switch {
			case b.Status == storage.BuildSucceeded:
				continue
			case b.Status.Terminal():
				outcome = &wire.ImportFailed{DrvPath: drv, BuildID: b.ID, Status: b.StatusText()}
			default:
				outcome = nil // still to build
			}
			break
		}
		if outcome == nil {
			continue
		}
		s.dropImport(r)
		r.w.Send(&wire.ImportResult{JobID: r.jobID, RequestID: r.requestID, Outcome: outcome})
	}
}

func (s *Scheduler) dropImport(r *importRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.imports = slices.DeleteFunc(s.imports, func(x *importRequest) bool { return x == r })
}

// importsPending reports whether evalID has requests waiting.
func (s *Scheduler) importsPending(evalID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.imports {
		if r.evalID == evalID {
			return true
		}
	}
	return false
}
