package storage

// The queries of a cache collection (server/retention): settings, the
// mark of what roots reach, the selection of what goes, and its deletion
// in batches. Everything a run visits lives in tables (gc_roots, gc_marks,
// gc_referenced, gc_sweep), so a run's memory does not grow with the cache: Go holds one
// batch at a time. docs/protocol/cache.md §10.1 has the rules.

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"gradient.dev/gradient/storepath"
)

// gcBatch bounds the rows one statement or transaction of a run handles.
const gcBatch = 1000

// Root kinds of gc_marks.
const (
	RootEvaluation = "evaluation" // a kept evaluation's outputs, .drv files and source
	RootPushed     = "pushed"     // an operator's push within its time to live
	RootRecent     = "recent"     // uploaded within the grace period
)

// SetProjectKeepEvaluations sets how many of the project's newest
// evaluations retention keeps; nil: the server's default.
func (db *DB) SetProjectKeepEvaluations(ctx context.Context, projectID string, keep *int) error {
	id, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return err
	}
	if keep != nil && *keep < 1 {
		return invalid("keep evaluations must be at least 1")
	}
	res, err := db.exec(ctx, `UPDATE projects SET keep_evaluations = $2 WHERE id = $1`, id, keep)
	return affectedOne(res, err, "project %s", id)
}

// ProjectKeepEvaluations returns the project's own setting, nil if none.
func (db *DB) ProjectKeepEvaluations(ctx context.Context, projectID string) (*int, error) {
	var keep sql.NullInt64
	err := db.sql.QueryRowContext(ctx, `SELECT keep_evaluations FROM projects WHERE id = $1`, projectID).Scan(&keep)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, notFound("project %s", projectID)
	}
	if err != nil || !keep.Valid {
		return nil, err
	}
	n := int(keep.Int64)
	return &n, nil
}

// SetCacheMaxBytes sets the cache's size cap; nil: none.
func (db *DB) SetCacheMaxBytes(ctx context.Context, cacheID string, max *int64) error {
	id, err := canonicalUUID("cache ID", cacheID)
	if err != nil {
		return err
	}
	if max != nil && *max < 1 {
		return invalid("a size cap must be at least 1 byte")
	}
	res, err := db.exec(ctx, `UPDATE caches SET max_bytes = $2 WHERE id = $1`, id, max)
	return affectedOne(res, err, "cache %s", id)
}

// CacheMaxBytes returns the cache's size cap, nil if none.
func (db *DB) CacheMaxBytes(ctx context.Context, cacheID string) (*int64, error) {
	var max sql.NullInt64
	err := db.sql.QueryRowContext(ctx, `SELECT max_bytes FROM caches WHERE id = $1`, cacheID).Scan(&max)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, notFound("cache %s", cacheID)
	}
	if err != nil || !max.Valid {
		return nil, err
	}
	return &max.Int64, nil
}

// SetEvaluationPinned pins an evaluation (retention keeps it whatever its
// age) or unpins it.
func (db *DB) SetEvaluationPinned(ctx context.Context, evalID string, pinned bool) error {
	id, err := canonicalUUID("evaluation ID", evalID)
	if err != nil {
		return err
	}
	res, err := db.exec(ctx, `UPDATE evaluations SET pinned = $2 WHERE id = $1`, id, pinned)
	return affectedOne(res, err, "evaluation %s", id)
}

// EvaluationPinned reports whether an evaluation is pinned.
func (db *DB) EvaluationPinned(ctx context.Context, evalID string) (bool, error) {
	var pinned bool
	err := db.sql.QueryRowContext(ctx, `SELECT pinned FROM evaluations WHERE id = $1`, evalID).Scan(&pinned)
	if errors.Is(err, sql.ErrNoRows) {
		return false, notFound("evaluation %s", evalID)
	}
	return pinned, err
}

// CacheServed is a path served at a time, for NoteCachePathsServed.
type CacheServed struct {
	CacheID, StoreHash string
	At                 time.Time
}

// NoteCachePathsServed records when paths were last served (the size
// cap's order), in one transaction; rows gone meanwhile are skipped.
func (db *DB) NoteCachePathsServed(ctx context.Context, served []CacheServed) error {
	for len(served) > 0 {
		part := served[:min(len(served), gcBatch)]
		served = served[len(part):]
		err := db.inTx(ctx, func(tx *sql.Tx) error {
			st, err := tx.PrepareContext(ctx, `UPDATE cache_paths SET last_served = $3
				WHERE cache_id = $1 AND store_hash = $2 AND (last_served IS NULL OR last_served < $3)`)
			if err != nil {
				return err
			}
			defer st.Close()
			for _, s := range part {
				if _, err := st.ExecContext(ctx, s.CacheID, s.StoreHash, s.At.UnixMilli()); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// GCReset empties the previous run's work tables.
func (db *DB) GCReset(ctx context.Context) error {
	return db.inTx(ctx, func(tx *sql.Tx) error {
		for _, t := range []string{"gc_marks", "gc_roots", "gc_referenced", "gc_sweep"} {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+t); err != nil {
				return err
			}
		}
		return nil
	})
}

// GCAnalyze refreshes PostgreSQL's statistics of cache_paths and the work
// tables; a no-op on SQLite, whose plans here need none. Without them
// (autovacuum has not analyzed yet after a bulk upload or a refill) the
// planner guessed a cache's rows few and looked paths up by cache alone,
// reading every row of the cache per statement.
func (db *DB) GCAnalyze(ctx context.Context) error {
	if db.engine != EnginePostgres {
		return nil
	}
	_, err := db.exec(ctx, `ANALYZE cache_paths, gc_marks, gc_sweep`)
	return err
}

// KeptEvaluations returns, per project, the evaluations retention keeps:
// the newest keep (the project's own setting, else defaultKeep), the
// newest successful one of the project's branch, pinned ones, and those
// still running. Small: bounded by projects × keep plus pins.
func (db *DB) KeptEvaluations(ctx context.Context, defaultKeep int) (map[string][]string, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT id, keep_evaluations FROM projects ORDER BY id`)
	type proj struct {
		id   string
		keep int
	}
	projects, err := collect(rows, err, func(r *sql.Rows) (proj, error) {
		var p proj
		var keep sql.NullInt64
		err := r.Scan(&p.id, &keep)
		p.keep = defaultKeep
		if keep.Valid {
			p.keep = int(keep.Int64)
		}
		return p, err
	})
	if err != nil {
		return nil, err
	}
	kept := map[string][]string{}
	for _, p := range projects {
		rows, err := db.sql.QueryContext(ctx, `
			SELECT id FROM (SELECT id FROM evaluations WHERE project_id = $1
				ORDER BY created_at DESC, id DESC LIMIT $2) newest
			UNION SELECT id FROM (SELECT id FROM evaluations WHERE project_id = $1
				AND status = 'succeeded' AND pr_number IS NULL
				ORDER BY created_at DESC, id DESC LIMIT 1) branch
			UNION SELECT id FROM evaluations WHERE project_id = $1 AND pinned
			UNION SELECT id FROM evaluations WHERE project_id = $1
				AND status IN ('queued', 'fetching', 'evaluating', 'building')`, p.id, p.keep)
		ids, err := collect(rows, err, func(r *sql.Rows) (string, error) {
			var id string
			return id, r.Scan(&id)
		})
		if err != nil {
			return nil, err
		}
		kept[p.id] = ids
	}
	return kept, nil
}

// GCRootEvaluation records the store hashes an evaluation keeps — its
// builds' outputs and .drv files and its flake source — as roots of its
// project, in batches of builds.
func (db *DB) GCRootEvaluation(ctx context.Context, evalID string) error {
	var projectID string
	var source sql.NullString
	err := db.sql.QueryRowContext(ctx, `SELECT project_id, flake_source FROM evaluations WHERE id = $1`, evalID).
		Scan(&projectID, &source)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // deleted meanwhile: nothing to keep
	}
	if err != nil {
		return err
	}
	var hashes []string
	if source.Valid {
		hashes = appendHash(hashes, source.String)
	}
	after := ""
	for {
		rows, err := db.sql.QueryContext(ctx, `SELECT drv_path, outputs FROM builds
			WHERE evaluation_id = $1 AND drv_path > $2 ORDER BY drv_path LIMIT $3`, evalID, after, gcBatch)
		type build struct {
			drv     string
			outputs sql.NullString
		}
		part, err := collect(rows, err, func(r *sql.Rows) (build, error) {
			var b build
			return b, r.Scan(&b.drv, &b.outputs)
		})
		if err != nil {
			return err
		}
		for _, b := range part {
			hashes = appendHash(hashes, b.drv)
			outputs, err := decodeJSON[[]BuildOutputPath](b.outputs, "build outputs")
			if err != nil {
				return err
			}
			for _, o := range outputs {
				hashes = appendHash(hashes, o.Path)
			}
			after = b.drv
		}
		if err := db.insertRoots(ctx, projectID, hashes); err != nil {
			return err
		}
		hashes = hashes[:0]
		if len(part) < gcBatch {
			return nil
		}
	}
}

func appendHash(hashes []string, path string) []string {
	if h, err := storepath.Hash(path); err == nil {
		hashes = append(hashes, h)
	}
	return hashes
}

func (db *DB) insertRoots(ctx context.Context, projectID string, hashes []string) error {
	if len(hashes) == 0 {
		return nil
	}
	return db.inTx(ctx, func(tx *sql.Tx) error {
		st, err := tx.PrepareContext(ctx, `INSERT INTO gc_roots (project_id, store_hash) VALUES ($1, $2)
			ON CONFLICT DO NOTHING`)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, h := range hashes {
			if _, err := st.ExecContext(ctx, projectID, h); err != nil {
				return err
			}
		}
		return nil
	})
}

// GCMarkRoots marks, as generation gen, the kept evaluations' roots in
// their projects' caches and the operators' pushes still within their
// time to live at now.
func (db *DB) GCMarkRoots(ctx context.Context, gen int, now time.Time) error {
	if _, err := db.exec(ctx, `INSERT INTO gc_marks (cache_id, store_hash, gen, kind)
		SELECT cp.cache_id, cp.store_hash, $1, $2 FROM gc_roots r
		JOIN project_caches pc ON pc.project_id = r.project_id
		JOIN cache_paths cp ON cp.cache_id = pc.cache_id AND cp.store_hash = r.store_hash
		WHERE TRUE ON CONFLICT DO NOTHING`, gen, RootEvaluation); err != nil {
		return err
	}
	_, err := db.exec(ctx, `INSERT INTO gc_marks (cache_id, store_hash, gen, kind)
		SELECT cache_id, store_hash, $1, $2 FROM cache_paths
		WHERE pushed AND (expires_at IS NULL OR expires_at > $3) ON CONFLICT DO NOTHING`,
		gen, RootPushed, now.UnixMilli())
	return err
}

// GCMarkRecent marks, as generation gen, the paths uploaded after cutoff,
// and those a Push answer reused after it (ReuseCachePaths).
func (db *DB) GCMarkRecent(ctx context.Context, gen int, cutoff time.Time) error {
	_, err := db.exec(ctx, `INSERT INTO gc_marks (cache_id, store_hash, gen, kind)
		SELECT cache_id, store_hash, $1, $2 FROM cache_paths WHERE created_at > $3 OR reused_at > $3
		ON CONFLICT DO NOTHING`, gen, RootRecent, cutoff.UnixMilli())
	return err
}

// GCPropagate marks the references of generation gen's marks as
// generation gen+1 (in the same cache, with their referrer's kind), a
// batch at a time, and returns how many marks it added.
func (db *DB) GCPropagate(ctx context.Context, gen int) (int64, error) {
	var added int64
	afterCache, afterHash := "", ""
	for {
		rows, err := db.sql.QueryContext(ctx, `SELECT m.cache_id, m.store_hash, m.kind, COALESCE(cp.refs, '')
			FROM gc_marks m LEFT JOIN cache_paths cp ON cp.cache_id = m.cache_id AND cp.store_hash = m.store_hash
			WHERE m.gen = $1 AND (m.cache_id, m.store_hash) > ($2, $3)
			ORDER BY m.cache_id, m.store_hash LIMIT $4`, gen, afterCache, afterHash, gcBatch)
		type mark struct{ cache, hash, kind, refs string }
		part, err := collect(rows, err, func(r *sql.Rows) (mark, error) {
			var m mark
			return m, r.Scan(&m.cache, &m.hash, &m.kind, &m.refs)
		})
		if err != nil {
			return added, err
		}
		type group struct{ cache, kind string }
		refs := map[group][]string{}
		for _, m := range part {
			for _, ref := range strings.Fields(m.refs) {
				if h, err := storepath.Hash(ref); err == nil && h != m.hash {
					g := group{m.cache, m.kind}
					refs[g] = append(refs[g], h)
				}
			}
			afterCache, afterHash = m.cache, m.hash
		}
		for g, hashes := range refs {
			for len(hashes) > 0 {
				n := min(len(hashes), inListMax)
				args, in := inList([]any{g.cache, gen + 1, g.kind}, hashes[:n])
				hashes = hashes[n:]
				res, err := db.exec(ctx, `INSERT INTO gc_marks (cache_id, store_hash, gen, kind)
					SELECT cache_id, store_hash, $2, $3 FROM cache_paths
					WHERE cache_id = $1 AND store_hash IN (`+in+`) ON CONFLICT DO NOTHING`, args...)
				if err != nil {
					return added, err
				}
				n64, _ := res.RowsAffected()
				added += n64
			}
		}
		if len(part) < gcBatch {
			return added, nil
		}
	}
}

// GCProtected counts the marks per root kind.
func (db *DB) GCProtected(ctx context.Context) (map[string]int64, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT kind, COUNT(*) FROM gc_marks GROUP BY kind`)
	type kc struct {
		kind string
		n    int64
	}
	all, err := collect(rows, err, func(r *sql.Rows) (kc, error) {
		var x kc
		return x, r.Scan(&x.kind, &x.n)
	})
	out := map[string]int64{RootEvaluation: 0, RootPushed: 0, RootRecent: 0}
	for _, x := range all {
		out[x.kind] = x.n
	}
	return out, err
}

// GCSelectUnreachable fills gc_sweep with the rows of caches without a
// size cap that no mark reaches and that were uploaded at or before
// cutoff, a range of rows at a time.
func (db *DB) GCSelectUnreachable(ctx context.Context, cutoff time.Time) error {
	afterCache, afterHash := "", ""
	for {
		// The range's upper end: the gcBatch-th row after the last one.
		var hiCache, hiHash string
		err := db.sql.QueryRowContext(ctx, `SELECT cache_id, store_hash FROM cache_paths
			WHERE (cache_id, store_hash) > ($1, $2)
			ORDER BY cache_id, store_hash LIMIT 1 OFFSET $3`, afterCache, afterHash, gcBatch-1).Scan(&hiCache, &hiHash)
		last := errors.Is(err, sql.ErrNoRows)
		if err != nil && !last {
			return err
		}
		cond := `(cp.cache_id, cp.store_hash) > ($1, $2)`
		args := []any{afterCache, afterHash, cutoff.UnixMilli()}
		if !last {
			cond += ` AND (cp.cache_id, cp.store_hash) <= ($4, $5)`
			args = append(args, hiCache, hiHash)
		}
		if _, err := db.exec(ctx, `INSERT INTO gc_sweep (cache_id, store_hash, store_path, object_key, file_size, reason)
			SELECT cp.cache_id, cp.store_hash, cp.store_path, cp.object_key, cp.file_size, 'unreachable'
			FROM cache_paths cp JOIN caches c ON c.id = cp.cache_id
			WHERE `+cond+` AND c.max_bytes IS NULL AND cp.created_at <= $3 AND (cp.reused_at IS NULL OR cp.reused_at <= $3)
			AND NOT EXISTS (SELECT 1 FROM gc_marks m WHERE m.cache_id = cp.cache_id AND m.store_hash = cp.store_hash)
			ON CONFLICT DO NOTHING`, args...); err != nil {
			return err
		}
		if last {
			return nil
		}
		afterCache, afterHash = hiCache, hiHash
	}
}

// CacheSize is a cache's bytes and paths.
type CacheSize struct {
	CacheID, Name string
	Public        bool
	MaxBytes      *int64
	Bytes, Paths  int64
}

// CacheSizes returns every cache's size (the sum of its rows' file sizes).
func (db *DB) CacheSizes(ctx context.Context) ([]CacheSize, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT c.id, c.name, c.public, c.max_bytes,
		COALESCE((SELECT SUM(file_size) FROM cache_paths cp WHERE cp.cache_id = c.id), 0),
		(SELECT COUNT(*) FROM cache_paths cp WHERE cp.cache_id = c.id)
		FROM caches c ORDER BY c.name`)
	return collect(rows, err, func(r *sql.Rows) (CacheSize, error) {
		var s CacheSize
		var max sql.NullInt64
		err := r.Scan(&s.CacheID, &s.Name, &s.Public, &max, &s.Bytes, &s.Paths)
		if max.Valid {
			s.MaxBytes = &max.Int64
		}
		return s, err
	})
}

// rootCapKept is the transient kind of GCSelectOverCap's marks: what a
// capped cache keeps within its cap. They are dropped before the function
// returns, so they never count as protected.
const rootCapKept = "cap-kept"

// GCSelectOverCap, for a capped cache above its cap, keeps the most
// recently used unmarked paths that no other row of the cache references
// (the "tops"), each with its whole closure, while the cache's kept bytes
// (marked rows included) stay within max; it adds every other unmarked
// row of the cache to gc_sweep. A path is never evicted while a remaining
// path references it, and a path goes with what only it references
// (docs/protocol/cache.md §10.1). Marked rows are never selected, so a
// cache can stay above its cap. gen is the last mark generation used; it
// returns the bytes left and the last generation it used.
func (db *DB) GCSelectOverCap(ctx context.Context, cacheID string, max int64, gen int) (int64, int, error) {
	var size int64
	if err := db.sql.QueryRowContext(ctx, `SELECT COALESCE(SUM(file_size), 0) FROM cache_paths WHERE cache_id = $1`,
		cacheID).Scan(&size); err != nil {
		return 0, gen, err
	}
	if size <= max {
		return size, gen, nil
	}
	defer func() {
		// Best effort: GCReset empties both tables at the next run anyway.
		db.exec(context.WithoutCancel(ctx), `DELETE FROM gc_referenced WHERE cache_id = $1`, cacheID)
		db.exec(context.WithoutCancel(ctx), `DELETE FROM gc_marks WHERE cache_id = $1 AND kind = $2`, cacheID, rootCapKept)
	}()
	if err := db.gcNoteReferenced(ctx, cacheID); err != nil {
		return size, gen, err
	}
	sumMarked := func(fromGen int) (int64, error) {
		var n int64
		err := db.sql.QueryRowContext(ctx, `SELECT COALESCE(SUM(cp.file_size), 0) FROM gc_marks m
			JOIN cache_paths cp ON cp.cache_id = m.cache_id AND cp.store_hash = m.store_hash
			WHERE m.cache_id = $1 AND m.gen >= $2`, cacheID, fromGen).Scan(&n)
		return n, err
	}
	kept, err := sumMarked(0)
	if err != nil {
		return size, gen, err
	}
	// Tops, most recently used first (keyset over (use, hash) descending),
	// a batch at a time; the batch that does not fit is retried one top at
	// a time, and the first top that does not fit ends the walk.
	const maxUsed = int64(1) << 62
	beforeUsed, beforeHash := maxUsed, ""
	batch := gcBatch
	for kept < max {
		rows, err := db.sql.QueryContext(ctx, `SELECT store_hash, used FROM (
				SELECT cp.store_hash, COALESCE(cp.last_served, cp.created_at) AS used
				FROM cache_paths cp WHERE cp.cache_id = $1
				AND NOT EXISTS (SELECT 1 FROM gc_marks m WHERE m.cache_id = cp.cache_id AND m.store_hash = cp.store_hash)
				AND NOT EXISTS (SELECT 1 FROM gc_referenced r WHERE r.cache_id = cp.cache_id AND r.store_hash = cp.store_hash)) c
			WHERE used < $2 OR (used = $2 AND store_hash < $3)
			ORDER BY used DESC, store_hash DESC LIMIT $4`, cacheID, beforeUsed, beforeHash, batch)
		type top struct {
			hash string
			used int64
		}
		part, err := collect(rows, err, func(r *sql.Rows) (top, error) {
			var x top
			return x, r.Scan(&x.hash, &x.used)
		})
		if err != nil {
			return size, gen, err
		}
		if len(part) == 0 {
			break
		}
		first := gen + 1
		hashes := make([]string, len(part))
		for i, x := range part {
			hashes[i] = x.hash
		}
		args, in := inList([]any{cacheID, first, rootCapKept}, hashes)
		if _, err := db.exec(ctx, `INSERT INTO gc_marks (cache_id, store_hash, gen, kind)
			SELECT cache_id, store_hash, $2, $3 FROM cache_paths WHERE cache_id = $1 AND store_hash IN (`+in+`)
			ON CONFLICT DO NOTHING`, args...); err != nil {
			return size, gen, err
		}
		last := first
		for {
			added, err := db.GCPropagate(ctx, last)
			if err != nil {
				return size, gen, err
			}
			if added == 0 {
				break
			}
			last++
		}
		more, err := sumMarked(first)
		if err != nil {
			return size, gen, err
		}
		if kept+more <= max {
			kept += more
			gen = last + 1 // GCPropagate probed last+1
			beforeUsed, beforeHash = part[len(part)-1].used, part[len(part)-1].hash
			continue
		}
		if _, err := db.exec(ctx, `DELETE FROM gc_marks WHERE cache_id = $1 AND gen >= $2`, cacheID, first); err != nil {
			return size, gen, err
		}
		if batch == 1 {
			break // the least recently used rest goes
		}
		batch = 1
	}
	if _, err := db.exec(ctx, `INSERT INTO gc_sweep (cache_id, store_hash, store_path, object_key, file_size, reason)
		SELECT cp.cache_id, cp.store_hash, cp.store_path, cp.object_key, cp.file_size, 'cap' FROM cache_paths cp
		WHERE cp.cache_id = $1
		AND NOT EXISTS (SELECT 1 FROM gc_marks m WHERE m.cache_id = cp.cache_id AND m.store_hash = cp.store_hash)
		ON CONFLICT DO NOTHING`, cacheID); err != nil {
		return size, gen, err
	}
	var selected int64
	if err := db.sql.QueryRowContext(ctx, `SELECT COALESCE(SUM(file_size), 0) FROM gc_sweep WHERE cache_id = $1`,
		cacheID).Scan(&selected); err != nil {
		return size, gen, err
	}
	return size - selected, gen, nil
}

// gcNoteReferenced records in gc_referenced every hash a row of the cache
// references (itself aside), a batch of rows at a time. It first empties
// the cache's set: what an interrupted run left is never read.
func (db *DB) gcNoteReferenced(ctx context.Context, cacheID string) error {
	if _, err := db.exec(ctx, `DELETE FROM gc_referenced WHERE cache_id = $1`, cacheID); err != nil {
		return err
	}
	after := ""
	for {
		rows, err := db.sql.QueryContext(ctx, `SELECT store_hash, refs FROM cache_paths
			WHERE cache_id = $1 AND store_hash > $2 ORDER BY store_hash LIMIT $3`, cacheID, after, gcBatch)
		type row struct{ hash, refs string }
		part, err := collect(rows, err, func(r *sql.Rows) (row, error) {
			var x row
			return x, r.Scan(&x.hash, &x.refs)
		})
		if err != nil {
			return err
		}
		var hashes []string
		for _, x := range part {
			for _, ref := range strings.Fields(x.refs) {
				if h, err := storepath.Hash(ref); err == nil && h != x.hash {
					hashes = append(hashes, h)
				}
			}
			after = x.hash
		}
		if err := db.insertReferenced(ctx, cacheID, hashes); err != nil {
			return err
		}
		if len(part) < gcBatch {
			return nil
		}
	}
}

func (db *DB) insertReferenced(ctx context.Context, cacheID string, hashes []string) error {
	if len(hashes) == 0 {
		return nil
	}
	return db.inTx(ctx, func(tx *sql.Tx) error {
		st, err := tx.PrepareContext(ctx, `INSERT INTO gc_referenced (cache_id, store_hash) VALUES ($1, $2)
			ON CONFLICT DO NOTHING`)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, h := range hashes {
			if _, err := st.ExecContext(ctx, cacheID, h); err != nil {
				return err
			}
		}
		return nil
	})
}

// GCUnselectMarked drops from gc_sweep what the marks of generation
// fromGen on reach. Earlier marks were unselected when they were made (or
// kept their rows out of gc_sweep), so only the new marks are walked, not
// all of gc_sweep.
func (db *DB) GCUnselectMarked(ctx context.Context, fromGen int) error {
	_, err := db.exec(ctx, `DELETE FROM gc_sweep WHERE (cache_id, store_hash) IN
		(SELECT cache_id, store_hash FROM gc_marks WHERE gen >= $1)`, fromGen)
	return err
}

// GCSweepEntry is a row a run deletes (or, dry, would delete).
type GCSweepEntry struct {
	CacheID, StoreHash, StorePath, ObjectKey, Reason string
	FileSize                                         int64
}

// GCSelected calls fn for every selected row, a batch at a time, in
// (cache, hash) order.
func (db *DB) GCSelected(ctx context.Context, fn func([]GCSweepEntry) error) error {
	afterCache, afterHash := "", ""
	for {
		part, err := db.gcSelectedAfter(ctx, afterCache, afterHash)
		if err != nil {
			return err
		}
		if len(part) == 0 {
			return nil
		}
		if err := fn(part); err != nil {
			return err
		}
		afterCache, afterHash = part[len(part)-1].CacheID, part[len(part)-1].StoreHash
	}
}

func (db *DB) gcSelectedAfter(ctx context.Context, afterCache, afterHash string) ([]GCSweepEntry, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT cache_id, store_hash, store_path, object_key, file_size, reason
		FROM gc_sweep WHERE (cache_id, store_hash) > ($1, $2)
		ORDER BY cache_id, store_hash LIMIT $3`, afterCache, afterHash, gcBatch)
	return collect(rows, err, func(r *sql.Rows) (GCSweepEntry, error) {
		var e GCSweepEntry
		return e, r.Scan(&e.CacheID, &e.StoreHash, &e.StorePath, &e.ObjectKey, &e.FileSize, &e.Reason)
	})
}

// GCObjectsFreed calls fn with the object keys (and sizes) no row would
// reference once the selected rows are deleted: what a dry run reports.
func (db *DB) GCObjectsFreed(ctx context.Context, fn func(key string, size int64) error) error {
	after := ""
	for {
		rows, err := db.sql.QueryContext(ctx, `SELECT object_key, MAX(file_size) FROM gc_sweep s
			WHERE object_key > $1 AND NOT EXISTS (SELECT 1 FROM cache_paths cp WHERE cp.object_key = s.object_key
				AND NOT EXISTS (SELECT 1 FROM gc_sweep s2 WHERE s2.cache_id = cp.cache_id AND s2.store_hash = cp.store_hash))
			GROUP BY object_key ORDER BY object_key LIMIT $2`, after, gcBatch)
		type obj struct {
			key  string
			size int64
		}
		part, err := collect(rows, err, func(r *sql.Rows) (obj, error) {
			var o obj
			return o, r.Scan(&o.key, &o.size)
		})
		if err != nil {
			return err
		}
		for _, o := range part {
			if err := fn(o.key, o.size); err != nil {
				return err
			}
			after = o.key
		}
		if len(part) < gcBatch {
			return nil
		}
	}
}

// GCDeleteSelected deletes the next batch of selected rows, rechecked
// in the DELETE itself (not pushed again, not uploaded or reused after
// cutoff, same object, not touched — last_served — at or after usedSince, the start of
// the run's latest mark), queues the objects no row references any more
// in the same transaction, and returns the rows deleted and whether
// selected rows remain.
//
// The touch check is what makes a writer that relies on a row safe
// without a lock of its own (docs/protocol/cache.md §10.1): MarkBuildsCached
// touches the rows in its transaction, ReuseCachePaths (a Push answer)
// sets reused_at. On PostgreSQL a DELETE that meets
// a row a concurrent transaction touched waits for it and re-evaluates its
// WHERE on the touched row (READ COMMITTED), and a touch that meets a
// deleted row updates nothing; on SQLite the transactions run one at a
// time. Either the row stays or the writer sees it gone.
func (db *DB) GCDeleteSelected(ctx context.Context, cutoff, now, usedSince time.Time) (deleted []GCSweepEntry, more bool, err error) {
	db.gcHook(func(h *GCHooks) func() { return h.DeleteBatchStart })
	// A deadlock with a writer touching rows of the same batch in another
	// order aborts one of the two; retried like the job transactions.
	err = db.jobTx(ctx, func(tx *sql.Tx) error {
		deleted = deleted[:0]
		// The batch: the first gcBatch selected rows (one run at a time
		// changes gc_sweep, and earlier batches left it), named by key so
		// every statement below finds its rows through an index: a
		// statement per cache and inListMax rows, not one a row, and never
		// a scan of cache_paths or gc_sweep per batch.
		rows, err := tx.QueryContext(ctx, `SELECT cache_id, store_hash, reason FROM gc_sweep
			ORDER BY cache_id, store_hash LIMIT $1`, gcBatch)
		type key struct{ cache, hash, reason string }
		batch, err := collect(rows, err, func(r *sql.Rows) (key, error) {
			var k key
			return k, r.Scan(&k.cache, &k.hash, &k.reason)
		})
		if err != nil || len(batch) == 0 {
			return err
		}
		more = len(batch) == gcBatch
		last := batch[len(batch)-1]
		reasons := make(map[[2]string]string, len(batch))
		for _, k := range batch {
			reasons[[2]string{k.cache, k.hash}] = k.reason
		}
		for i := 0; i < len(batch); {
			j := i
			for j < len(batch) && j-i < inListMax && batch[j].cache == batch[i].cache {
				j++
			}
			hashes := make([]string, 0, j-i)
			for _, k := range batch[i:j] {
				hashes = append(hashes, k.hash)
			}
			args, in := inList([]any{batch[i].cache, cutoff.UnixMilli(), now.UnixMilli(), usedSince.UnixMilli()}, hashes)
			i = j
			// The recheck is part of the DELETE's own WHERE, evaluated
			// per row (PostgreSQL evaluates it again on a row a concurrent
			// transaction changed, once that commits).
			rows, err := tx.QueryContext(ctx, `DELETE FROM cache_paths WHERE cache_id = $1 AND store_hash IN (`+in+`)
				AND EXISTS (SELECT 1 FROM gc_sweep s WHERE s.cache_id = cache_paths.cache_id
					AND s.store_hash = cache_paths.store_hash AND s.object_key = cache_paths.object_key)
				AND created_at <= $2 AND (reused_at IS NULL OR reused_at <= $2)
				AND NOT (pushed AND (expires_at IS NULL OR expires_at > $3))
				AND (last_served IS NULL OR last_served < $4)
				RETURNING cache_id, store_hash, store_path, object_key, file_size`, args...)
			part, err := collect(rows, err, func(r *sql.Rows) (GCSweepEntry, error) {
				var e GCSweepEntry
				return e, r.Scan(&e.CacheID, &e.StoreHash, &e.StorePath, &e.ObjectKey, &e.FileSize)
			})
			if err != nil {
				return err
			}
			for i := range part {
				part[i].Reason = reasons[[2]string{part[i].CacheID, part[i].StoreHash}]
			}
			deleted = append(deleted, part...)
		}
		if len(deleted) > 0 {
			slices.SortFunc(deleted, func(a, b GCSweepEntry) int {
				return cmp.Or(strings.Compare(a.CacheID, b.CacheID), strings.Compare(a.StoreHash, b.StoreHash))
			})
			// Every object of the batch no row references any more, named
			// by key (a range of gc_sweep grouped by object could walk all
			// of gc_sweep in object order).
			sizes := map[string]int64{}
			for _, e := range deleted {
				sizes[e.ObjectKey] = max(sizes[e.ObjectKey], e.FileSize)
			}
			keys := slices.Sorted(maps.Keys(sizes))
			for part := range slices.Chunk(keys, inListMax/2) {
				var b strings.Builder
				args := []any{nowMillis()}
				for i, k := range part {
					if i > 0 {
						b.WriteString(", ")
					}
					args = append(args, k, sizes[k])
					fmt.Fprintf(&b, "($%d, CAST($%d AS BIGINT))", len(args)-1, len(args))
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO nar_deletions (object_key, file_size, queued_at)
					SELECT v.column1, v.column2, $1 FROM (VALUES `+b.String()+`) v
					WHERE NOT EXISTS (SELECT 1 FROM cache_paths cp WHERE cp.object_key = v.column1)
					ON CONFLICT (object_key) DO NOTHING`, args...); err != nil {
					return err
				}
			}
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM gc_sweep WHERE (cache_id, store_hash) <= ($1, $2)`,
			last.cache, last.hash); err != nil {
			return err
		}
		db.gcHook(func(h *GCHooks) func() { return h.DeleteBatchDeleted })
		return nil
	})
	return deleted, more, err
}

// touchCachePaths sets last_served of the rows of the project's caches
// holding hashes to at least now, in tx, and reports whether every hash
// has a row: a writer that relies on the rows calls it in the
// transaction that relies on them, so a collection running meanwhile
// either deletes a row first (the writer sees it gone) or keeps it
// (GCDeleteSelected).
func touchCachePaths(ctx context.Context, tx *sql.Tx, projectID string, hashes []string, now int64) (bool, error) {
	all := true
	for _, h := range hashes {
		res, err := tx.ExecContext(ctx, `UPDATE cache_paths SET last_served = CASE
				WHEN last_served IS NULL OR last_served < $3 THEN $3 ELSE last_served END
			WHERE store_hash = $1 AND cache_id IN (SELECT cache_id FROM project_caches WHERE project_id = $2)`,
			h, projectID, now)
		if err != nil {
			return false, err
		}
		if n, err := res.RowsAffected(); err != nil {
			return false, err
		} else if n == 0 {
			all = false
		}
	}
	return all, nil
}

// ReuseCachePaths is FindCachePaths for a Push answer: it returns the
// rows of storeHashes in cacheIDs and sets their reused_at to now in the
// same statement, so for the grace period they count as uploaded now and
// a collection keeps them while the worker, told they are cached, skips
// their upload and uploads what references them (docs/protocol/cache.md
// §10.1). A row a collection deleted first is not returned: the path is
// answered uncached and uploaded again.
func (db *DB) ReuseCachePaths(ctx context.Context, cacheIDs, storeHashes []string) ([]CachePath, error) {
	if len(cacheIDs) == 0 || len(storeHashes) == 0 {
		return nil, nil
	}
	args, caches := inList([]any{nowMillis()}, cacheIDs)
	args, hashes := inList(args, storeHashes)
	var found []CachePath
	// A deadlock with a collection's batch deleting rows in another
	// order aborts one of the two; retried like the job transactions.
	err := db.jobTx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `UPDATE cache_paths SET reused_at = $1
			WHERE cache_id IN (`+caches+`) AND store_hash IN (`+hashes+`)
			RETURNING `+cachePathColumns+`, store_hash`, args...)
		type row struct {
			p    CachePath
			hash string
		}
		all, err := collect(rows, err, func(r *sql.Rows) (row, error) {
			var x row
			var refs string
			var created int64
			err := r.Scan(&x.p.CacheID, &x.p.StorePath, &x.p.NarHash, &x.p.NarSize, &x.p.FileHash, &x.p.FileSize,
				&x.p.Compression, &refs, &x.p.Deriver, &x.p.CA, &x.p.ObjectKey, &created, &x.hash)
			x.p.References = strings.Fields(refs)
			x.p.CreatedAt = fromMillis(created)
			return x, err
		})
		if err != nil {
			return err
		}
		// FindCachePaths' order: by path, then cache.
		slices.SortFunc(all, func(a, b row) int {
			return cmp.Or(strings.Compare(a.hash, b.hash), strings.Compare(a.p.CacheID, b.p.CacheID))
		})
		found = found[:0]
		for _, x := range all {
			found = append(found, x.p)
		}
		db.gcHook(func(h *GCHooks) func() { return h.ReuseTouched })
		return nil
	})
	return found, err
}

// GCQueueOrphans queues, of keys (objects the NAR store holds), those no
// row references; they were stored by uploads that never recorded a row.
func (db *DB) GCQueueOrphans(ctx context.Context, keys []string, sizes []int64) error {
	return db.inTx(ctx, func(tx *sql.Tx) error {
		for i, k := range keys {
			if err := queueObjectIfUnused(ctx, tx, k, sizes[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// GCUnreferenced returns those of keys no row references.
func (db *DB) GCUnreferenced(ctx context.Context, keys []string) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	args, in := inList(nil, keys)
	rows, err := db.sql.QueryContext(ctx, `SELECT DISTINCT object_key FROM cache_paths WHERE object_key IN (`+in+`)`, args...)
	used, err := collect(rows, err, func(r *sql.Rows) (string, error) {
		var k string
		return k, r.Scan(&k)
	})
	if err != nil {
		return nil, err
	}
	set := make(map[string]bool, len(used))
	for _, k := range used {
		set[k] = true
	}
	var out []string
	for _, k := range keys {
		if !set[k] {
			out = append(out, k)
		}
	}
	return out, nil
}

// GCDroppedEvaluations calls fn with batches of finished evaluations that
// are not kept and whose logs are still there.
func (db *DB) GCDroppedEvaluations(ctx context.Context, kept map[string]bool, fn func(ids []string) error) error {
	after := ""
	for {
		rows, err := db.sql.QueryContext(ctx, `SELECT id FROM evaluations WHERE id > $1 AND logs_pruned_at IS NULL
			AND status IN ('succeeded', 'failed', 'cancelled') ORDER BY id LIMIT $2`, after, gcBatch)
		ids, err := collect(rows, err, func(r *sql.Rows) (string, error) {
			var id string
			return id, r.Scan(&id)
		})
		if err != nil {
			return err
		}
		var dropped []string
		for _, id := range ids {
			if !kept[id] {
				dropped = append(dropped, id)
			}
			after = id
		}
		if len(dropped) > 0 {
			if err := fn(dropped); err != nil {
				return err
			}
		}
		if len(ids) < gcBatch {
			return nil
		}
	}
}

// PruneEvaluationLogs deletes the job logs of an evaluation retention no
// longer keeps and records it; the evaluation, its builds and jobs stay
// for the dashboard. It returns the log bytes deleted.
func (db *DB) PruneEvaluationLogs(ctx context.Context, evalID string) (int64, error) {
	var freed int64
	err := db.inTx(ctx, func(tx *sql.Tx) error {
		var pinned bool
		if err := tx.QueryRowContext(ctx, `SELECT pinned FROM evaluations WHERE id = $1`, evalID).Scan(&pinned); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return nil
			}
			return err
		}
		if pinned {
			return nil // pinned since the run started
		}
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(LENGTH(data)), 0) FROM job_logs
			WHERE job_id IN (SELECT id FROM jobs WHERE evaluation_id = $1)`, evalID).Scan(&freed); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM job_logs WHERE job_id IN (SELECT id FROM jobs WHERE evaluation_id = $1)`, evalID); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE evaluations SET logs_pruned_at = $2 WHERE id = $1`, evalID, nowMillis())
		return err
	})
	return freed, err
}

// EvaluationLogsPruned reports whether retention deleted the evaluation's
// job logs (the dashboard says so instead of showing an empty log).
func (db *DB) EvaluationLogsPruned(ctx context.Context, evalID string) (bool, error) {
	var at sql.NullInt64
	err := db.sql.QueryRowContext(ctx, `SELECT logs_pruned_at FROM evaluations WHERE id = $1`, evalID).Scan(&at)
	if errors.Is(err, sql.ErrNoRows) {
		return false, notFound("evaluation %s", evalID)
	}
	return at.Valid, err
}

// RecentlyChangedEvaluations returns the evaluations created at or after
// since and those still running: what a run marks again before it
// deletes, so an evaluation that began (or found more builds) meanwhile
// keeps what it uses.
func (db *DB) RecentlyChangedEvaluations(ctx context.Context, since time.Time) ([]string, error) {
	ms := since.UnixMilli()
	rows, err := db.sql.QueryContext(ctx, `SELECT id FROM evaluations WHERE created_at >= $1
		UNION SELECT id FROM evaluations WHERE status IN ('queued', 'fetching', 'evaluating', 'building')`, ms)
	return collect(rows, err, func(r *sql.Rows) (string, error) {
		var id string
		return id, r.Scan(&id)
	})
}
