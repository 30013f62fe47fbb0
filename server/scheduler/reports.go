package scheduler

import (
	"context"
	"errors"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/wire"
)

// assignResponse handles AssignJobResponse: a declined job goes back to
// the queue for another worker (docs/protocol/jobs.md §5.3).
func (s *Scheduler) assignResponse(ctx context.Context, w *authority.LiveWorker, m *wire.AssignJobResponse) {
	if m.Accepted {
		return
	}
	a := s.ownedJob(w, m.JobID)
	if a == nil {
		return
	}
	reason := ""
	if m.Reason != nil {
		reason = *m.Reason
	}
	s.log.Info("worker declined job", "job", m.JobID, "worker", w.WorkerID, "reason", reason)
	s.forget(a)
	s.release(ctx, a, jobqueue.OutcomeDeclined)
}

// forget drops a finished assignment from the running set.
func (s *Scheduler) forget(a *assignment) {
	s.mu.Lock()
	s.untrack(a)
	s.mu.Unlock()
}

// untrack drops a running assignment and its build's progress; nothing
// when a is not its job's running assignment. Called with s.mu held.
func (s *Scheduler) untrack(a *assignment) {
	if s.jobs.stop(a) {
		delete(s.progress, a.job.BuildID)
	}
}

// progressTTL is how long a BuildProgress is shown without a newer one
// (docs/protocol/jobs.md §9.2).
var progressTTL = 15 * time.Second

// keepProgress records the progress of a build the session runs.
func (s *Scheduler) keepProgress(a *assignment, m *wire.BuildProgress) {
	if a.job.Kind != storage.JobBuild {
		return
	}
	s.mu.Lock()
	s.progress[a.job.BuildID] = buildProgress{jobID: a.job.JobID, at: time.Now(), m: *m}
	s.mu.Unlock()
}

// BuildProgress returns the latest progress of a running build, if its
// worker reported one in the last 15 s.
func (s *Scheduler) BuildProgress(buildID string) (wire.BuildProgress, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.progress[buildID]
	if !ok || s.jobs.assignment(p.jobID) == nil || time.Since(p.at) > progressTTL {
		return wire.BuildProgress{}, false
	}
	return p.m, true
}

// update applies a JobUpdate of an owned job.
func (s *Scheduler) update(ctx context.Context, a *assignment, u wire.JobUpdateKind) {
	var err error
	switch u := u.(type) {
	case *wire.JobUpdateFetchResult:
		if u.FlakeSource != nil {
			err = s.queue.SetFlakeSource(ctx, a.job.EvaluationID, *u.FlakeSource)
		}
	case *wire.JobUpdateEvaluatingFlake, *wire.JobUpdateEvaluatingDerivations:
		err = s.queue.SetEvaluationStatus(ctx, a.job.EvaluationID, storage.EvaluationEvaluating)
	case *wire.JobUpdateEvalResult:
		err = s.evalResult(ctx, a, u)
	case *wire.JobUpdateBuildOutput:
		outputs := make([]storage.BuildOutputInfo, 0, len(u.Outputs))
		for _, o := range u.Outputs {
			info := storage.BuildOutputInfo{Name: o.Name, StorePath: o.StorePath}
			if o.NarSize != nil && *o.NarSize > 0 {
				info.NarSize = uint64(*o.NarSize)
			}
			if o.NarHash != nil {
				info.NarHash = *o.NarHash
			}
			outputs = append(outputs, info)
		}
		s.mu.Lock()
		a.outputs = outputs
		s.mu.Unlock()
	}
	if err != nil {
		s.log.Warn("applying a job update failed", "job", a.job.JobID, "update", describeUpdate(u), "error", err)
	}
}

// evalResult records a batch of discovered derivations; the evaluation's
// errors and warnings go to its log.
func (s *Scheduler) evalResult(ctx context.Context, a *assignment, r *wire.JobUpdateEvalResult) error {
	if len(r.Derivations) > 0 {
		builds := make([]storage.DiscoveredBuild, len(r.Derivations))
		for i, d := range r.Derivations {
			outputs := make([]storage.BuildOutputPath, len(d.Outputs))
			for k, o := range d.Outputs {
				outputs[k] = storage.BuildOutputPath{Name: o.Name, Path: o.Path}
			}
			builds[i] = storage.DiscoveredBuild{
				Attr: d.Attr, DrvPath: d.DrvPath, Outputs: outputs, Dependencies: d.Dependencies,
				Architecture: d.Architecture, RequiredFeatures: d.RequiredFeatures,
				TimeoutSecs: d.TimeoutSecs, MaxSilentSecs: d.MaxSilentSecs,
				IsFixedOutput: d.IsFixedOutput, PreferLocalBuild: d.PreferLocalBuild,
			}
		}
		if err := s.queue.AddDiscoveredDerivations(ctx, a.job.EvaluationID, builds); err != nil {
			return err
		}
		s.streamBuilds(ctx, a, r.Derivations)
	}
	if err := s.queue.AddEvaluationErrors(ctx, a.job.EvaluationID, r.Errors); err != nil {
		return err
	}
	var text []byte
	for _, e := range r.Errors {
		text = append(text, "[error] evaluation: "+e+"\n"...)
	}
	for _, w := range r.Warnings {
		text = append(text, "[warning] evaluation: "+w+"\n"...)
	}
	if len(text) > 0 {
		s.logs.add(ctx, a.job.JobID, text)
	}
	return nil
}

// completed handles JobCompleted: the evaluation's builds or the build's
// dependents become ready.
func (s *Scheduler) completed(ctx context.Context, a *assignment) {
	s.forget(a)
	s.logs.flush(ctx, a.job.JobID) // a finished job's log is complete
	if a.fetchOnly {
		s.fetched(ctx, a)
		return
	}
	if a.job.Kind == storage.JobFlake {
		s.completedFlake(ctx, a)
		return
	}
	evalID := a.job.EvaluationID
	s.mu.Lock()
	outputs := a.outputs
	s.jobs.beginCompleting(evalID)
	s.mu.Unlock()
	ready, err := s.queue.CompleteBuildDeferEnd(ctx, a.id, outputs)
	s.mu.Lock()
	s.jobs.endCompleting(evalID)
	s.mu.Unlock()
	if err != nil {
		s.log.Warn("recording a completed job failed", "job", a.job.JobID, "error", err)
		// The build may be recorded with its dependents not yet readied:
		// the next pass readies whatever is stranded.
		s.strandedCheck.Store(true)
		return
	}
	s.m.finished.WithLabelValues("completed").Inc()
	if s.importsPending(evalID) {
		s.answerImports(ctx, evalID)
	}
	s.log.Info("job completed", "job", a.job.JobID, "what", describe(a.job), "worker", a.workerID, "newly_ready", len(ready))
	if len(ready) == 0 {
		s.endIfLast(ctx, evalID)
		return
	}
	s.addPending(ctx, ready)
	s.dispatch(ready)
}

// endIfLast ends a building evaluation when the scheduler holds none of
// its jobs: none queued, none running, no completion being recorded.
// The database decides (EndEvaluationIfDone); this only spares the
// question to every completion but the last. Of completions recorded at
// once, the last to finish sees the others' counts gone, and asks after
// all of them committed. A job the queue holds that the database no
// longer has pending delays the end until the next pass
// (FinishDoneEvaluations).
func (s *Scheduler) endIfLast(ctx context.Context, evalID string) {
	s.mu.Lock()
	busy := s.jobs.busy(evalID)
	s.mu.Unlock()
	if busy {
		return
	}
	if ended, err := s.queue.EndEvaluationIfDone(ctx, evalID); err != nil {
		s.log.Warn("ending a finished evaluation failed; the next pass retries", "evaluation", evalID, "error", err)
	} else if ended {
		s.log.Info("evaluation finished", "evaluation", evalID)
	}
}

// completedFlake records a completed flake job and streams its
// evaluation's ready builds into the queue: the first chunk is readied
// with the completion, the rest in chunks of jobqueue.ReadyChunk, each
// assignable as soon as it commits, so the first assignment does not
// wait for a large evaluation's last build. Builds whose outputs the
// project's caches hold already are marked built on the way instead
// (admit). A crash part-way leaves the rest to ReadyStrandedBuilds at
// start; an error, to the next pass.
func (s *Scheduler) completedFlake(ctx context.Context, a *assignment) {
	ready, evalID, more, err := s.queue.CompleteFlakeJobChunk(ctx, a.id, jobqueue.ReadyChunk)
	if err != nil {
		s.log.Warn("recording a completed job failed", "job", a.job.JobID, "error", err)
		s.strandedCheck.Store(true)
		return
	}
	s.m.finished.WithLabelValues("completed").Inc()
	s.log.Info("job completed", "job", a.job.JobID, "what", describe(a.job), "worker", a.workerID, "newly_ready", len(ready), "more", more)
	caches := s.projectCaches(ctx, a.job.ProjectID)
	total := s.admit(ctx, evalID, caches, ready)
	if more {
		rest, err := s.queue.ReadyCandidates(ctx, evalID)
		if err != nil {
			s.log.Warn("reading the evaluation's ready builds failed; the next pass queues them", "evaluation", evalID, "error", err)
			s.strandedCheck.Store(true)
		}
		for len(rest) > 0 {
			n := min(len(rest), jobqueue.ReadyChunk)
			ids, err := s.queue.QueueReadyBuilds(ctx, evalID, rest[:n])
			if err != nil {
				s.log.Warn("queueing the evaluation's ready builds failed; the next pass does", "evaluation", evalID, "error", err)
				s.strandedCheck.Store(true)
				break
			}
			rest = rest[n:]
			total += s.admit(ctx, evalID, caches, ids)
		}
		s.log.Info("evaluation's ready builds queued", "evaluation", evalID, "jobs", total)
	}
	// Builds still waiting for inputs whose outputs are cached need no
	// run either.
	if more := s.skipCachedWaiting(ctx, evalID, caches); len(more) > 0 {
		s.admit(ctx, evalID, caches, more)
	}
}

// fetched handles the completion of a fetch-only flake job: the job is
// queued again, now for a worker to evaluate the fetched source.
func (s *Scheduler) fetched(ctx context.Context, a *assignment) {
	err := s.queue.CompleteFetch(ctx, a.id)
	if errors.Is(err, storage.ErrInvalid) {
		// No FetchResult: nothing to evaluate. The job fails as a
		// permanent failure would, ending the evaluation with the reason.
		s.log.Warn("fetch-only job completed without its source", "job", a.job.JobID, "worker", a.workerID, "error", err)
		if _, _, err := s.queue.FailJob(ctx, a.id, storage.FailurePermanent, err.Error(), s.cfg.MaxAttempts); err != nil {
			s.log.Warn("recording a failed job failed", "job", a.job.JobID, "error", err)
		}
		return
	}
	if err != nil {
		s.log.Warn("recording a completed fetch failed", "job", a.job.JobID, "error", err)
		return
	}
	s.m.finished.WithLabelValues("fetched").Inc()
	s.log.Info("flake fetched; the job is queued again for its evaluation", "job", a.job.JobID, "what", describe(a.job), "worker", a.workerID)
	ids := []string{a.job.JobID}
	s.addPending(ctx, ids)
	s.dispatch(ids)
}

// failed handles JobFailed by the kind's meaning (docs/protocol/jobs.md §10).
func (s *Scheduler) failed(ctx context.Context, a *assignment, m *wire.JobFailed) {
	s.forget(a)
	s.logs.flush(ctx, a.job.JobID)
	kind := failureKind(m.Kind)
	msg := m.Error
	if len(m.MissingPaths) > 0 {
		msg += " (missing: " + joinPaths(m.MissingPaths) + ")"
	}
	out, ready, err := s.queue.FailJob(ctx, a.id, kind, msg, s.cfg.MaxAttempts)
	if err != nil {
		if !errors.Is(err, storage.ErrConflict) {
			s.log.Warn("recording a failed job failed", "job", a.job.JobID, "error", err)
		}
		return
	}
	s.m.finished.WithLabelValues(string(kind)).Inc()
	s.log.Info("job failed", "job", a.job.JobID, "what", describe(a.job), "kind", kind, "error", m.Error,
		"requeued", out.Requeued, "attempts", out.Attempts)
	if out.Requeued {
		ready = append(ready, a.job.JobID)
	} else if a.job.Kind == storage.JobFlake {
		s.stopStreamedBuilds(ctx, a.job.EvaluationID)
	} else if a.job.Kind == storage.JobBuild && s.importsPending(a.job.EvaluationID) {
		s.answerImports(ctx, a.job.EvaluationID)
	}
	s.addPending(ctx, ready)
	s.dispatch(ready)
}

func failureKind(k wire.BuildFailureKind) storage.FailureKind {
	switch k {
	case wire.FailureTransient:
		return storage.FailureTransient
	case wire.FailureTimeout:
		return storage.FailureTimeout
	case wire.FailureSubstituteUnavailable:
		return storage.FailureSubstituteUnavailable
	case wire.FailureInputsUnavailable:
		return storage.FailureInputsUnavailable
	case wire.FailureCorruptEvalCache:
		return storage.FailureCorruptEvalCache
	case wire.FailureAborted:
		return storage.FailureAborted
	case wire.FailureCanceled:
		return storage.FailureCanceled
	}
	return storage.FailurePermanent
}

func joinPaths(paths []string) string {
	out := ""
	for i, p := range paths {
		if i == 5 {
			return out + ", …"
		}
		if i > 0 {
			out += ", "
		}
		out += p
	}
	return out
}

func describeUpdate(u wire.JobUpdateKind) string {
	switch u.(type) {
	case *wire.JobUpdateFetchResult:
		return "FetchResult"
	case *wire.JobUpdateEvalResult:
		return "EvalResult"
	case *wire.JobUpdateBuildOutput:
		return "BuildOutput"
	}
	return "status"
}

// sendJobList answers RequestJobList with the pending jobs the worker may
// run, in pages of at most 1000 candidates and 2 MiB (docs/protocol/jobs.md §3.2); an
// empty list is one empty final page.
//
// The queue is walked under the lock, the candidates built after it: a
// list of a large queue holds up no other session's pick. Takes s.mu,
// and under it w's session lock (newEligibility).
func (s *Scheduler) sendJobList(w *authority.LiveWorker) {
	type listed struct {
		job      *storage.PendingJob
		required []storage.RequiredPath // set under the lock (fillRequiredPaths)
	}
	var jobs []listed
	s.mu.Lock()
	e := newEligibility(w)
	s.jobs.queue.each(e.mayAny, func(job *storage.PendingJob) bool {
		jobs = append(jobs, listed{job, job.RequiredPaths})
		return true
	})
	s.mu.Unlock()
	candidates := make([]wire.JobCandidate, len(jobs))
	for i, l := range jobs {
		candidates[i] = candidateWith(l.job, l.required)
	}
	pages := wire.CandidatePages(candidates)
	if len(pages) == 0 {
		pages = [][]wire.JobCandidate{{}}
	}
	for i, page := range pages {
		if err := w.Send(&wire.JobListChunk{Candidates: page, IsFinal: i == len(pages)-1}); err != nil {
			return
		}
	}
}

func candidate(job *storage.PendingJob) wire.JobCandidate {
	return candidateWith(job, job.RequiredPaths)
}

// candidateWith is the candidate of job with its required paths (read
// under s.mu; the job's other fields do not change once queued).
func candidateWith(job *storage.PendingJob, required []storage.RequiredPath) wire.JobCandidate {
	c := wire.JobCandidate{JobID: job.JobID, RequiredPaths: []wire.RequiredPath{}, DrvPaths: []string{}, OutputPaths: []string{}}
	if job.Kind == storage.JobFlake && job.FlakeSource != "" {
		// Evaluating a fetched source: the source is what it needs.
		c.RequiredPaths = append(c.RequiredPaths, wire.RequiredPath{Path: job.FlakeSource})
	}
	if job.Kind == storage.JobBuild {
		c.DrvPaths = []string{job.DrvPath}
		for _, p := range required {
			r := wire.RequiredPath{Path: p.Path}
			if p.Cached {
				r.CacheInfo = &wire.CacheInfo{FileSize: p.FileSize, NarSize: p.NarSize}
			}
			c.RequiredPaths = append(c.RequiredPaths, r)
		}
		for _, o := range job.Outputs {
			c.OutputPaths = append(c.OutputPaths, o.Path)
		}
		features := job.RequiredFeatures
		if features == nil {
			features = []string{}
		}
		c.Requirement = &wire.BuildRequirement{Architecture: job.Architecture, RequiredFeatures: features}
	}
	return c
}
