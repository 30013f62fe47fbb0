package scheduler

import (
	"context"

	"gradient.dev/gradient/storage"
)

// skipCached marks the builds of an evaluation whose outputs are all in
// the project's caches already (pushed there, or built elsewhere) as
// succeeded, so no worker rebuilds them, and returns the jobs that made
// runnable. A failed lookup only costs the rebuild.
func (s *Scheduler) skipCached(ctx context.Context, evalID, projectID string) (marked int, ready []string) {
	builds, err := s.db.EvaluationBuilds(ctx, evalID)
	if err != nil {
		s.log.Warn("looking for cached outputs failed", "evaluation", evalID, "error", err)
		return 0, nil
	}
	caches, err := s.db.ProjectCaches(ctx, projectID)
	if err != nil || len(caches) == 0 {
		return 0, nil
	}
	cacheIDs := make([]string, len(caches))
	for i, c := range caches {
		cacheIDs[i] = c.ID
	}
	var hashes []string
	for _, b := range builds {
		if b.Status == storage.BuildWaiting || b.Status == storage.BuildQueued {
			for _, o := range b.Outputs {
				if h, err := storage.StorePathHash(o.Path); err == nil {
					hashes = append(hashes, h)
				}
			}
		}
	}
	if len(hashes) == 0 {
		return 0, nil
	}
	cached := map[string]storage.CachePath{}
	for len(hashes) > 0 {
		// In slices: a query has at most a few thousand parameters.
		n := min(len(hashes), 1000)
		found, err := s.db.FindCachePaths(ctx, cacheIDs, hashes[:n])
		if err != nil {
			s.log.Warn("looking for cached outputs failed", "evaluation", evalID, "error", err)
			return 0, nil
		}
		for _, p := range found {
			cached[p.StorePath] = p
		}
		hashes = hashes[n:]
	}
	outputs := map[string][]storage.BuildOutputInfo{}
	for _, b := range builds {
		if (b.Status != storage.BuildWaiting && b.Status != storage.BuildQueued) || len(b.Outputs) == 0 {
			continue
		}
		var infos []storage.BuildOutputInfo
		for _, o := range b.Outputs {
			p, ok := cached[o.Path]
			if !ok {
				infos = nil
				break
			}
			infos = append(infos, storage.BuildOutputInfo{Name: o.Name, StorePath: o.Path, NarSize: uint64(p.NarSize), NarHash: p.NarHash})
		}
		if infos != nil {
			outputs[b.ID] = infos
		}
	}
	if len(outputs) == 0 {
		return 0, nil
	}
	ready, err = s.db.MarkBuildsCached(ctx, evalID, outputs)
	if err != nil {
		s.log.Warn("recording cached builds failed; they will be built", "evaluation", evalID, "error", err)
		return 0, nil
	}
	s.log.Info("builds already in the cache: not rebuilt", "evaluation", evalID, "builds", len(outputs))
	return len(outputs), ready
}
