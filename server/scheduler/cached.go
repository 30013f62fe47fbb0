package scheduler

import (
	"context"

	"gradient.dev/gradient/storage"
)

// Builds whose outputs are all in the project's caches already (pushed
// there, or built elsewhere) are marked succeeded without a run, so no
// worker rebuilds them: the ready ones as each chunk of an evaluation's
// builds joins the queue (admit), the waiting ones once its flake job
// completed (skipCachedWaiting). A failed lookup only costs the rebuild.

// projectCaches returns the IDs of the caches the project is subscribed
// to; none when the lookup fails.
func (s *Scheduler) projectCaches(ctx context.Context, projectID string) []string {
	caches, err := s.db.ProjectCaches(ctx, projectID)
	if err != nil {
		s.log.Warn("looking for cached outputs failed", "project", projectID, "error", err)
		return nil
	}
	ids := make([]string, len(caches))
	for i, c := range caches {
		ids[i] = c.ID
	}
	return ids
}

// cachedBuild is what the cache check needs of a build.
type cachedBuild struct {
	id      string
	outputs []storage.BuildOutputPath
}

// cachedOutputs returns, by build ID, the outputs of those of the builds
// whose outputs are all in the caches.
func (s *Scheduler) cachedOutputs(ctx context.Context, cacheIDs []string, builds []cachedBuild) map[string][]storage.BuildOutputInfo {
	if len(cacheIDs) == 0 {
		return nil
	}
	var hashes []string
	for _, b := range builds {
		for _, o := range b.outputs {
			if h, err := storage.StorePathHash(o.Path); err == nil {
				hashes = append(hashes, h)
			}
		}
	}
	cached := map[string]storage.CachePath{}
	for len(hashes) > 0 {
		// In slices: a query has at most a few thousand parameters.
		n := min(len(hashes), 1000)
		found, err := s.db.FindCachePaths(ctx, cacheIDs, hashes[:n])
		if err != nil {
			s.log.Warn("looking for cached outputs failed", "error", err)
			return nil
		}
		for _, p := range found {
			cached[p.StorePath] = p
		}
		hashes = hashes[n:]
	}
	if len(cached) == 0 {
		return nil
	}
	outputs := map[string][]storage.BuildOutputInfo{}
	for _, b := range builds {
		if len(b.outputs) == 0 {
			continue
		}
		var infos []storage.BuildOutputInfo
		for _, o := range b.outputs {
			p, ok := cached[o.Path]
			if !ok {
				infos = nil
				break
			}
			infos = append(infos, storage.BuildOutputInfo{Name: o.Name, StorePath: o.Path, NarSize: uint64(p.NarSize), NarHash: p.NarHash})
		}
		if infos != nil {
			outputs[b.id] = infos
		}
	}
	return outputs
}

// admit puts jobs an evaluation's readying made pending into the queue
// and dispatches them, except the builds whose outputs are cached: those
// are marked built, and the jobs that readies are admitted in turn. It
// returns how many jobs joined the queue.
func (s *Scheduler) admit(ctx context.Context, evalID string, cacheIDs []string, ids []string) int {
	queued := 0
	for len(ids) > 0 {
		jobs, err := s.queue.PendingJobsByID(ctx, ids)
		if err != nil {
			s.log.Warn("reading newly ready jobs failed; the next pass picks them up", "error", err)
			return queued
		}
		builds := make([]cachedBuild, 0, len(jobs))
		for _, j := range jobs {
			if j.Kind == storage.JobBuild {
				builds = append(builds, cachedBuild{j.BuildID, j.Outputs})
			}
		}
		var next []string
		cached := s.cachedOutputs(ctx, cacheIDs, builds)
		if len(cached) > 0 {
			if next, err = s.queue.MarkBuildsCached(ctx, evalID, cached); err != nil {
				s.log.Warn("recording cached builds failed; they will be built", "evaluation", evalID, "error", err)
				cached, next = nil, nil
			} else {
				s.log.Info("builds already in the cache: not rebuilt", "evaluation", evalID, "builds", len(cached))
			}
		}
		var added []string
		s.mu.Lock()
		for i := range jobs {
			j := &jobs[i]
			if _, ok := cached[j.BuildID]; ok && j.Kind == storage.JobBuild {
				continue
			}
			if s.jobs.enqueue(j) {
				added = append(added, j.JobID)
			}
		}
		s.m.pending.Set(float64(s.jobs.queue.len()))
		s.mu.Unlock()
		s.reoffer(added)
		s.dispatch(added)
		s.announce(added)
		if s.admitted != nil {
			s.admitted(added)
		}
		queued += len(added)
		ids = next
	}
	return queued
}

// skipCachedWaiting marks the evaluation's waiting builds whose outputs
// are cached as succeeded and returns the jobs that made pending.
func (s *Scheduler) skipCachedWaiting(ctx context.Context, evalID string, cacheIDs []string) []string {
	if len(cacheIDs) == 0 {
		return nil
	}
	waiting, err := s.queue.WaitingBuilds(ctx, evalID)
	if err != nil {
		s.log.Warn("looking for cached outputs failed", "evaluation", evalID, "error", err)
		return nil
	}
	builds := make([]cachedBuild, len(waiting))
	for i, b := range waiting {
		builds[i] = cachedBuild{b.ID, b.Outputs}
	}
	cached := s.cachedOutputs(ctx, cacheIDs, builds)
	if len(cached) == 0 {
		return nil
	}
	ready, err := s.queue.MarkBuildsCached(ctx, evalID, cached)
	if err != nil {
		s.log.Warn("recording cached builds failed; they will be built", "evaluation", evalID, "error", err)
		return nil
	}
	s.log.Info("builds already in the cache: not rebuilt", "evaluation", evalID, "builds", len(cached))
	return ready
}
