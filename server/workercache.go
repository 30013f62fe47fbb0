package server

import (
	"context"
	"errors"
	"slices"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/server/cache"
	"gradient.dev/gradient/storage"
)

// workerCache is the authority's CacheFactory: the binary cache answers
// each worker session's cache messages within the session's grant.
func (s *Server) workerCache(cs authority.CacheSession) authority.CacheHandler {
	return s.cache.NewConn(cs.Ctx, cs.Log, cs.Worker.Send, workerCacheScope{db: s.db, subscriptions: s.cache, jobs: s.cfg.Jobs, live: cs.Worker})
}

// workerCacheScope is a worker session's cache.Scope, derived from a copy
// of the session's grant on every request, so a reauth that adds a project
// takes effect at once.
type workerCacheScope struct {
	db *storage.DB
	// subscriptions answers ProjectCaches from the cache's memo, which
	// the admin API invalidates on every subscription change.
	subscriptions *cache.Cache
	// jobs and live resolve a job to its project.
	jobs authority.JobLoop
	live *authority.LiveWorker
}

func (w workerCacheScope) Readable(ctx context.Context) ([]storage.Cache, error) {
	g := w.live.Grant()
	var out []storage.Cache
	for _, p := range g.Projects {
		cs, err := w.subscriptions.ProjectCaches(ctx, p)
		if err != nil {
			return nil, err
		}
		out = append(out, cs...)
	}
	peered, err := w.peerCaches(ctx, g.Caches)
	if err != nil {
		return nil, err
	}
	out = append(out, peered...)
	seen := map[string]bool{}
	return slices.DeleteFunc(out, func(c storage.Cache) bool {
		dup := seen[c.ID]
		seen[c.ID] = true
		return dup
	}), nil
}

// peerCaches are the caches of ids (the grant's: those the worker is a
// cache peer of) that still exist.
func (w workerCacheScope) peerCaches(ctx context.Context, ids []string) ([]storage.Cache, error) {
	var out []storage.Cache
	for _, id := range ids {
		c, err := w.db.Cache(ctx, id)
		if errors.Is(err, storage.ErrNotFound) {
			continue // deleted since the grant
		}
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// Writable is, for a job the session holds (docs/protocol/cache.md §4.1: the job scopes
// an upload), the caches of the job's project and what the job produces,
// so a worker serving several projects can put neither another project's
// outputs nor paths its job does not make into a project's caches.
// Without a held job only the caches the worker is a cache peer of are
// writable, with any path: their owner registered the worker for them.
func (w workerCacheScope) Writable(ctx context.Context, jobID string) (cache.WriteScope, error) {
	if r, ok := w.jobs.(authority.JobUploads); ok && jobID != "" {
		if products, ok := r.JobProducts(w.live, jobID); ok {
			scope := cache.WriteScope{JobID: jobID, Job: &cache.JobProducts{
				What: products.What, Outputs: products.Outputs, ContentAddressed: products.ContentAddressed,
			}}
			if !w.live.Authorized(products.Project) {
				return scope, nil
			}
			var err error
			scope.Caches, err = w.subscriptions.ProjectCaches(ctx, products.Project)
			return scope, err
		}
	}
	caches, err := w.peerCaches(ctx, w.live.Grant().Caches)
	return cache.WriteScope{JobID: jobID, Caches: caches}, err
}
