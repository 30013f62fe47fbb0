package jobqueue

// What a build job needs in the worker's store before it can run: the
// outputs of its derivation's direct input derivations (docs/protocol/jobs.md §3.1,
// JobCandidate.required_paths). Workers score offers by how many of them
// they miss, and how much it would cost to download them.

import (
	"context"
	"database/sql"
	"slices"
	"strings"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// requiredOutputsQuery lists (build ID, outputs JSON) of each direct input
// derivation of the builds: builds of the same evaluation, and, for an
// input the evaluation did not report (built before, docs/protocol/worker.md §6.3
// KnownDerivations), any succeeded build of that derivation. Input
// sources are not inputs here (docs/protocol/jobs.md §3.1).
const requiredOutputsQuery = `SELECT b.id, d.outputs FROM builds b
	JOIN build_edges e ON e.evaluation_id = b.evaluation_id AND e.drv_path = b.drv_path
	JOIN builds d ON d.evaluation_id = e.evaluation_id AND d.drv_path = e.dependency_drv_path
	WHERE b.id %[1]s
	UNION ALL
	SELECT b.id, d.outputs FROM builds b
	JOIN build_edges e ON e.evaluation_id = b.evaluation_id AND e.drv_path = b.drv_path
	JOIN builds d ON d.drv_path = e.dependency_drv_path AND d.status = 'succeeded'
	WHERE b.id %[1]s AND NOT EXISTS (SELECT 1 FROM builds x
		WHERE x.evaluation_id = e.evaluation_id AND x.drv_path = e.dependency_drv_path)`

// FillRequiredPaths sets RequiredPaths of the build jobs among jobs
// (JobID, Kind, BuildID and ProjectID are what it reads); a build without
// inputs gets an empty, non-nil slice.
func (q *Queue) FillRequiredPaths(ctx context.Context, jobs []storage.PendingJob) error {
	project := map[string]string{} // by build ID
	var ids []string
	for i := range jobs {
		j := &jobs[i]
		j.RequiredPaths = nil
		if j.Kind == storage.JobBuild && j.BuildID != "" && project[j.BuildID] == "" {
			project[j.BuildID] = j.ProjectID
			ids = append(ids, j.BuildID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	type row struct {
		buildID string
		outputs sql.NullString
	}
	rows, err := queryByIDs(ctx, q, requiredOutputsQuery, ids, func(r *sql.Rows) (row, error) {
		var x row
		return x, r.Scan(&x.buildID, &x.outputs)
	})
	if err != nil {
		return err
	}
	required := map[string][]storage.RequiredPath{} // by build ID
	// Many builds share inputs: decode each input's outputs once.
	decoded := map[string][]storage.BuildOutputPath{}
	for _, x := range rows {
		outputs, ok := decoded[x.outputs.String]
		if !ok {
			if outputs, err = sqldb.DecodeJSON[[]storage.BuildOutputPath](x.outputs, "build outputs"); err != nil {
				return err
			}
			decoded[x.outputs.String] = outputs
		}
		for _, o := range outputs {
			if o.Path != "" {
				required[x.buildID] = append(required[x.buildID], storage.RequiredPath{Path: o.Path})
			}
		}
	}
	// Sorted, each path once (an input may be reported by two rows); the
	// paths of each project, for its caches.
	byProject := map[string][]string{}
	for buildID, paths := range required {
		slices.SortFunc(paths, func(a, b storage.RequiredPath) int { return strings.Compare(a.Path, b.Path) })
		paths = slices.CompactFunc(paths, func(a, b storage.RequiredPath) bool { return a.Path == b.Path })
		required[buildID] = paths
		for _, p := range paths {
			byProject[project[buildID]] = append(byProject[project[buildID]], p.Path)
		}
	}
	for p, paths := range byProject {
		cached, err := q.projectCachedPaths(ctx, p, paths)
		if err != nil {
			return err
		}
		for buildID, paths := range required {
			if project[buildID] != p {
				continue
			}
			for k := range paths {
				if c, ok := cached[paths[k].Path]; ok {
					paths[k] = storage.RequiredPath{Path: c.StorePath, Cached: true, FileSize: uint64(max(c.FileSize, 0)), NarSize: uint64(max(c.NarSize, 0))}
				}
			}
		}
	}
	for i := range jobs {
		if j := &jobs[i]; j.Kind == storage.JobBuild {
			j.RequiredPaths = slices.Clone(required[j.BuildID])
			if j.RequiredPaths == nil {
				j.RequiredPaths = []storage.RequiredPath{} // read: none
			}
		}
	}
	return nil
}

// projectCachedPaths returns, by store path, the rows of those of paths
// that a cache the project subscribes to holds.
func (q *Queue) projectCachedPaths(ctx context.Context, projectID string, paths []string) (map[string]storage.CachePath, error) {
	caches, err := q.store.ProjectCaches(ctx, projectID)
	if err != nil || len(caches) == 0 {
		return nil, err
	}
	cacheIDs := make([]string, len(caches))
	for i, c := range caches {
		cacheIDs[i] = c.ID
	}
	var hashes []string
	for _, p := range paths {
		if h, err := storage.StorePathHash(p); err == nil {
			hashes = append(hashes, h)
		}
	}
	slices.Sort(hashes)
	hashes = slices.Compact(hashes)
	out := map[string]storage.CachePath{}
	for len(hashes) > 0 {
		n := min(len(hashes), sqldb.InListMax)
		found, err := q.store.FindCachePaths(ctx, cacheIDs, hashes[:n])
		if err != nil {
			return nil, err
		}
		hashes = hashes[n:]
		for _, c := range found {
			out[c.StorePath] = c
		}
	}
	return out, nil
}
