package storage

// What a build job needs in the worker's store before it can run: the
// outputs of its derivation's direct input derivations (JOBS.md §3.1,
// JobCandidate.required_paths). Workers score offers by how many of them
// they miss, and how much it would cost to download them.

import (
	"context"
	"database/sql"
	"slices"
	"strings"
)

// RequiredPath is one output of a build's direct input derivation. Cached
// is set, with the NAR's sizes, when a cache of the job's project holds it.
type RequiredPath struct {
	Path     string
	Cached   bool
	FileSize uint64
	NarSize  uint64
}

// requiredOutputsQuery lists (build ID, outputs JSON) of each direct input
// derivation of the builds: builds of the same evaluation, and, for an
// input the evaluation did not report (built before, JOBS.md §2
// KnownDerivations), any succeeded build of that derivation. Input
// sources are not inputs here (JOBS.md §3.1).
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
func (db *DB) FillRequiredPaths(ctx context.Context, jobs []PendingJob) error {
	project := map[string]string{} // by build ID
	var ids []string
	for i := range jobs {
		j := &jobs[i]
		j.RequiredPaths = nil
		if j.Kind == JobBuild && j.BuildID != "" && project[j.BuildID] == "" {
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
	rows, err := queryByIDs(ctx, db, requiredOutputsQuery, ids, func(r *sql.Rows) (row, error) {
		var x row
		return x, r.Scan(&x.buildID, &x.outputs)
	})
	if err != nil {
		return err
	}
	required := map[string][]RequiredPath{} // by build ID
	hashes := map[string][]string{}         // by project, for the cache lookup
	// Many builds share inputs: decode each input's outputs once.
	decoded := map[string][]BuildOutputPath{}
	for _, x := range rows {
		outputs, ok := decoded[x.outputs.String]
		if !ok {
			if outputs, err = decodeJSON[[]BuildOutputPath](x.outputs, "build outputs"); err != nil {
				return err
			}
			decoded[x.outputs.String] = outputs
		}
		for _, o := range outputs {
			if o.Path == "" {
				continue
			}
			required[x.buildID] = append(required[x.buildID], RequiredPath{Path: o.Path})
			if h, err := StorePathHash(o.Path); err == nil {
				hashes[project[x.buildID]] = append(hashes[project[x.buildID]], h)
			}
		}
	}
	// Sorted, each path once (an input may be reported by two rows).
	for buildID, paths := range required {
		slices.SortFunc(paths, func(a, b RequiredPath) int { return strings.Compare(a.Path, b.Path) })
		required[buildID] = slices.CompactFunc(paths, func(a, b RequiredPath) bool { return a.Path == b.Path })
	}
	for p, list := range hashes {
		cached, err := db.projectCachedSizes(ctx, p, list)
		if err != nil {
			return err
		}
		for buildID, paths := range required {
			if project[buildID] != p {
				continue
			}
			for k := range paths {
				h, _ := StorePathHash(paths[k].Path)
				if c, ok := cached[h]; ok {
					paths[k] = RequiredPath{Path: paths[k].Path, Cached: true, FileSize: c.FileSize, NarSize: c.NarSize}
				}
			}
		}
	}
	for i := range jobs {
		if j := &jobs[i]; j.Kind == JobBuild {
			j.RequiredPaths = slices.Clone(required[j.BuildID])
			if j.RequiredPaths == nil {
				j.RequiredPaths = []RequiredPath{} // read: none
			}
		}
	}
	return nil
}

// projectCachedSizes returns the sizes of those of the store hashes that a
// cache the project subscribes to holds.
func (db *DB) projectCachedSizes(ctx context.Context, projectID string, storeHashes []string) (map[string]RequiredPath, error) {
	slices.Sort(storeHashes)
	storeHashes = slices.Compact(storeHashes)
	out := map[string]RequiredPath{}
	for len(storeHashes) > 0 {
		n := min(len(storeHashes), inListMax)
		args, in := inList([]any{projectID}, storeHashes[:n])
		storeHashes = storeHashes[n:]
		rows, err := db.sql.QueryContext(ctx, `SELECT cp.store_hash, cp.file_size, cp.nar_size
			FROM cache_paths cp JOIN project_caches pc ON pc.cache_id = cp.cache_id
			WHERE pc.project_id = $1 AND cp.store_hash IN (`+in+`)`, args...)
		found, err := collect(rows, err, func(r *sql.Rows) (struct {
			hash string
			p    RequiredPath
		}, error) {
			var x struct {
				hash string
				p    RequiredPath
			}
			var file, nar int64
			err := r.Scan(&x.hash, &file, &nar)
			x.p = RequiredPath{Cached: true, FileSize: uint64(max(file, 0)), NarSize: uint64(max(nar, 0))}
			return x, err
		})
		if err != nil {
			return nil, err
		}
		for _, x := range found {
			out[x.hash] = x.p
		}
	}
	return out, nil
}
