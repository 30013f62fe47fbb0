package jobqueue

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"gradient.dev/gradient/storage/sqldb"
)

// TestKeyedPlansGoByKeyAfterTheTablesGrew (PostgreSQL): the claim and
// completion statements run on the keyed pool, where a plan cached while
// the job tables were nearly empty (a new server's first evaluation)
// still looks rows up by key once they hold thousands. On the main pool
// the cached generic plans scan jobs and job_assignments and hash-join
// them against the batch: one scan per batch, each as long as the
// table, which made PostgreSQL's CPU per assignment grow with the queue
// (issue 21; docs/PERFORMANCE.md).
func TestKeyedPlansGoByKeyAfterTheTablesGrew(t *testing.T) {
	t.Parallel()
	db := openTestDB(t, freshPostgresURL(t))
	ctx := t.Context()
	ev := newEvaluation(t, db)

	conn := genericPlanConn(t, db.keyed)
	statements := []struct{ name, params, sql, args string }{
		{"claim", "text, text, text, bigint, text", claimJobSQL, `'x', 'y', 'w', 1, 'i'`},
		{"claims", "text[], text[], text[], bigint, text", claimJobsSQL, `'{x,y}', '{a,b}', '{w,w}', 1, 'i'`},
		{"complete", "text, bigint, text, int, boolean", completeBuildSQL, `'x', 1, '[]', 100, true`},
		{"completes", "text[], text[], bigint, int, boolean", completeBuildsSQL, `'{x,y}', '{[],[]}', 1, 100, true`},
	}
	for _, s := range statements {
		mustExec(t, conn, `PREPARE `+s.name+` (`+s.params+`) AS `+s.sql)
		mustExec(t, conn, `EXECUTE `+s.name+` (`+s.args+`)`) // matches nothing
	}

	// Grow the tables a queue of builds fills: 5,000 builds with a job
	// and a closed assignment each.
	for _, q := range []string{
		`INSERT INTO builds (id, evaluation_id, drv_path, architecture, required_features, outputs, status, created_at)
		 SELECT 'b' || i, $1, '/nix/store/' || i || '-x.drv', 'x86_64-linux', '[]', '[]', 'succeeded', 0
		 FROM generate_series(1, 5000) i`,
		`INSERT INTO jobs (id, kind, evaluation_id, build_id, project_id, status, ready_at, created_at)
		 SELECT 'j' || i, 'build', $1, 'b' || i, (SELECT project_id FROM evaluations WHERE id = $1), 'done', 0, 0
		 FROM generate_series(1, 5000) i`,
		`INSERT INTO job_assignments (id, job_id, worker_id, opened_at, closed_at, outcome)
		 SELECT 'a' || i, 'j' || i, 'w', 0, 1, 'completed' FROM generate_series(1, 5000) i WHERE $1 <> ''`,
	} {
		if _, err := db.sql.ExecContext(ctx, q, ev.ID); err != nil {
			t.Fatal(err)
		}
	}

	for _, s := range statements {
		plan := explain(t, conn, `EXPLAIN EXECUTE `+s.name+` (`+s.args+`)`)
		for _, scan := range []string{"Seq Scan on jobs", "Seq Scan on job_assignments", "Seq Scan on builds", "Hash Join", "Merge Join"} {
			if strings.Contains(plan, scan) {
				t.Errorf("%s: the plan cached before the tables grew has a %s:\n%s", s.name, scan, plan)
			}
		}
	}
}

// genericPlanConn is a connection of pool that plans every prepared
// statement generically from its first execution, as the plan cache
// settles on after five while the tables are small.
func genericPlanConn(t *testing.T, pool *sql.DB) *sql.Conn {
	t.Helper()
	conn, err := pool.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	mustExec(t, conn, `SET plan_cache_mode = force_generic_plan`)
	return conn
}

func mustExec(t *testing.T, conn *sql.Conn, query string) {
	t.Helper()
	if _, err := conn.ExecContext(context.Background(), query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func explain(t *testing.T, conn *sql.Conn, query string) string {
	t.Helper()
	rows, err := conn.QueryContext(context.Background(), query)
	lines, err := sqldb.Collect(rows, err, scanString)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return strings.Join(lines, "\n")
}

// TestPendingJobsByIDGoesByKeyAfterTheQueueDrained (PostgreSQL): the
// scheduler reads the jobs a completion or a readied chunk made pending
// by ID, through a statement pgx prepares once per connection. Cached
// while the table was small, a plan through the partial index
// jobs_pending would walk an entry for every job that was ever pending
// (until a vacuum) on every call; the by-ID read must go by the primary
// key instead.
func TestPendingJobsByIDGoesByKeyAfterTheQueueDrained(t *testing.T) {
	t.Parallel()
	db := openTestDB(t, freshPostgresURL(t))
	ctx := t.Context()
	ev := newEvaluation(t, db)

	conn := genericPlanConn(t, db.keyed)
	mustExec(t, conn, `PREPARE byid (text[]) AS `+fmt.Sprintf(pendingJobsByIDSQL, "= ANY($1::text[])"))
	mustExec(t, conn, `EXECUTE byid ('{x,y}')`)

	// 5,000 jobs that were pending and ran: their entries stay in
	// jobs_pending until a vacuum.
	for _, q := range []string{
		`INSERT INTO jobs (id, kind, evaluation_id, project_id, status, ready_at, created_at)
		 SELECT 'j' || i, 'flake', $1, (SELECT project_id FROM evaluations WHERE id = $1), 'pending', i, 0
		 FROM generate_series(1, 5000) i`,
		`UPDATE jobs SET status = 'done' WHERE id LIKE 'j%' AND $1 <> ''`,
	} {
		if _, err := db.sql.ExecContext(ctx, q, ev.ID); err != nil {
			t.Fatal(err)
		}
	}
	plan := explain(t, conn, `EXPLAIN EXECUTE byid ('{j1,j2}')`)
	if strings.Contains(plan, "jobs_pending") || strings.Contains(plan, "Seq Scan on jobs") || strings.Contains(plan, "Hash Join") {
		t.Errorf("the by-ID read of pending jobs does not go by the primary key:\n%s", plan)
	}
}
