package jobqueue

// Builds whose outputs exist already: derivations an earlier evaluation
// built (the server's answer to QueryKnownDerivations), and builds whose
// outputs the project's caches hold (succeeded without a run).

import (
	"context"
	"database/sql"
	"slices"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// BuiltDerivations returns those of drvPaths that some evaluation built
// successfully, with their output paths. The server answers
// QueryKnownDerivations with the ones whose outputs a worker can read, so
// an evaluation need not report them again and its builds may depend on
// them at once.
func (q *Queue) BuiltDerivations(ctx context.Context, drvPaths []string) (map[string][]string, error) {
	built := map[string][]string{}
	for len(drvPaths) > 0 {
		n := min(len(drvPaths), sqldb.InListMax)
		args, in := sqldb.InList(nil, drvPaths[:n])
		drvPaths = drvPaths[n:]
		rows, err := q.sql.QueryContext(ctx, `SELECT drv_path, outputs FROM builds
			WHERE status = 'succeeded' AND drv_path IN (`+in+`)`, args...)
		type row struct {
			drv     string
			outputs sql.NullString
		}
		part, err := sqldb.Collect(rows, err, func(r *sql.Rows) (row, error) {
			var x row
			return x, r.Scan(&x.drv, &x.outputs)
		})
		if err != nil {
			return nil, err
		}
		for _, x := range part {
			outputs, err := sqldb.DecodeJSON[[]storage.BuildOutputPath](x.outputs, "build outputs")
			if err != nil {
				return nil, err
			}
			paths := make([]string, 0, len(outputs))
			for _, o := range outputs {
				if o.Path != "" {
					paths = append(paths, o.Path)
				}
			}
			built[x.drv] = paths
		}
	}
	return built, nil
}

// MarkBuildsCached records builds of the evaluation whose outputs the
// project's caches already hold as succeeded without running them
// (a build is runnable once its inputs are built or cached; one whose
// outputs are cached needs no run at all). Only waiting or queued builds
// change; their pending jobs end as done. It returns the jobs this made
// pending (dependents whose inputs are now all available).
//
// The rows the builds rely on are touched in the same transaction (see
// GCDeleteSelected): a build one of whose outputs has no row any more (a
// collection deleted it since the caller looked) is not marked and is
// removed from outputs, so the caller queues it to be built.
func (q *Queue) MarkBuildsCached(ctx context.Context, evalID string, outputs map[string][]storage.BuildOutputInfo) ([]string, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	if len(outputs) == 0 {
		return nil, nil
	}
	var ready, gone []string
	err = q.jobTx(ctx, func(tx *sql.Tx) error {
		ready = nil
		var project string
		if err := tx.QueryRowContext(ctx, `SELECT project_id FROM evaluations WHERE id = $1`, evalID).Scan(&project); err != nil {
			return err
		}
		now := sqldb.NowMillis()
		gone = gone[:0]
		for buildID, out := range outputs {
			hashes := make([]string, 0, len(out))
			for _, o := range out {
				if h, err := storage.StorePathHash(o.StorePath); err == nil {
					hashes = append(hashes, h)
				}
			}
			// Sorted like a collection's batch: fewer deadlocks (retried anyway).
			slices.Sort(hashes)
			if all, err := storage.TouchCachePathsTx(ctx, tx, project, hashes, now); err != nil {
				return err
			} else if !all || len(hashes) != len(out) {
				gone = append(gone, buildID)
				continue
			}
			info, err := sqldb.JSONText(out)
			if err != nil {
				return err
			}
			res, err := tx.ExecContext(ctx, `UPDATE builds SET status = 'succeeded', output_info = $3, started_at = $4, finished_at = $4,
				error = NULL, failure_kind = NULL, worker_id = NULL WHERE id = $1 AND evaluation_id = $2 AND status IN ('waiting', 'queued')`,
				buildID, evalID, info, now)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n == 0 {
				continue // started or ended meanwhile
			}
			if _, err := tx.ExecContext(ctx, `UPDATE jobs SET status = 'done' WHERE build_id = $1 AND status = 'pending'`, buildID); err != nil {
				return err
			}
		}
		rows, err := tx.QueryContext(ctx, `UPDATE builds SET status = 'queued'
			WHERE evaluation_id = $1 AND status = 'waiting' AND `+readyNow+` AND `+readyCondition+` RETURNING id`, evalID)
		builds, err := sqldb.Collect(rows, err, scanString)
		if err != nil {
			return err
		}
		if ready, err = q.insertBuildJobs(ctx, tx, jobRef{kind: storage.JobBuild, evalID: evalID, projectID: project}, builds); err != nil {
			return err
		}
		q.store.CallGCHook(func(h *storage.GCHooks) func() { return h.CachedTouched })
		return q.finishEvaluationIfDone(ctx, tx, evalID)
	})
	if err == nil {
		for _, id := range gone {
			delete(outputs, id)
		}
	}
	return ready, err
}

// WaitingBuilds returns the ID and outputs of every waiting build of an
// evaluation (those a cache check may find built already).
func (q *Queue) WaitingBuilds(ctx context.Context, evalID string) ([]storage.Build, error) {
	evalID, err := sqldb.CanonicalUUID("evaluation ID", evalID)
	if err != nil {
		return nil, err
	}
	rows, err := q.sql.QueryContext(ctx, `SELECT id, outputs FROM builds WHERE evaluation_id = $1 AND status = 'waiting'`, evalID)
	return sqldb.Collect(rows, err, func(r *sql.Rows) (storage.Build, error) {
		var b storage.Build
		var outputs sql.NullString
		if err := r.Scan(&b.ID, &outputs); err != nil {
			return b, err
		}
		b.EvaluationID, b.Status = evalID, storage.BuildWaiting
		b.Outputs, err = sqldb.DecodeJSON[[]storage.BuildOutputPath](outputs, "build outputs")
		return b, err
	})
}
