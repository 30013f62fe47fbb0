package jobqueue

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/storage"
)

// TestDeadInstanceCheckReadsNoJobs (PostgreSQL): the check every
// scheduler pass runs for dead instances holding work
// (DeadInstancesHolding) reads neither jobs nor the closed assignments
// however many there are: on 100,000 jobs, each with a closed assignment,
// and 300 running on three live instances, its plan has no sequential
// scan and reads a handful of pages. The recovery statements go through
// the open assignments' partial indexes too. The plans and the measured
// time are logged (go test -v).
func TestDeadInstanceCheckReadsNoJobs(t *testing.T) {
	t.Parallel()
	db := openTestDB(t, freshPostgresURL(t))
	ctx := t.Context()
	ev := newEvaluation(t, db)
	for _, id := range []string{"i1", "i2", "i3"} {
		if _, err := db.RegisterInstance(ctx, storage.ServerInstance{ID: id, Host: "test"}, time.Hour, false); err != nil {
			t.Fatal(err)
		}
	}
	const jobs, running = 100_000, 300
	for _, q := range []string{
		`INSERT INTO builds (id, evaluation_id, drv_path, architecture, required_features, outputs, status, created_at)
		 SELECT 'b' || i, $1, '/nix/store/' || i || '-x.drv', 'x86_64-linux', '[]', '[]',
		        CASE WHEN i <= $3 THEN 'building' ELSE 'succeeded' END, 0
		 FROM generate_series(1, $2::int) i`,
		`INSERT INTO jobs (id, kind, evaluation_id, build_id, project_id, status, ready_at, created_at)
		 SELECT 'j' || i, 'build', $1, 'b' || i, (SELECT project_id FROM evaluations WHERE id = $1),
		        CASE WHEN i <= $3 THEN 'assigned' ELSE 'done' END, 0, 0
		 FROM generate_series(1, $2::int) i`,
		`INSERT INTO job_assignments (id, job_id, worker_id, opened_at, closed_at, outcome, instance_id)
		 SELECT 'a' || i, 'j' || i, 'w', 0, CASE WHEN i <= $3 THEN NULL ELSE 1 END,
		        CASE WHEN i <= $3 THEN NULL ELSE 'completed' END, 'i' || (1 + i % 3)
		 FROM generate_series(1, $2::int) i WHERE $1 <> ''`,
		`ANALYZE`,
	} {
		args := []any{ev.ID, jobs, running}
		if q == `ANALYZE` {
			args = nil
		}
		if _, err := db.sql.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := db.sql.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	clock := db.ClockMillisSQL()
	check := strings.ReplaceAll(deadInstancesSQL(clock), "$1", "'self'")
	plan := explain(t, conn, `EXPLAIN (ANALYZE, BUFFERS) `+check)
	t.Logf("dead-instance check on %d jobs, %d running:\n%s", jobs, running, plan)
	for _, bad := range []string{"Seq Scan on jobs", "Seq Scan on job_assignments", "jobs_pkey"} {
		if strings.Contains(plan, bad) {
			t.Errorf("the check's plan has %s", bad)
		}
	}
	if dead, err := db.DeadInstancesHolding(ctx); err != nil || len(dead) != 0 {
		t.Fatalf("DeadInstancesHolding with every instance live = %v, %v", dead, err)
	}

	// What an instance checks of its running assignments on every pass
	// (RecoveredAssignments): by primary key.
	ids := make([]string, running)
	for i := range ids {
		ids[i] = fmt.Sprintf("a%d", i+1)
	}
	plan = explain(t, conn, `EXPLAIN (ANALYZE, BUFFERS) `+strings.ReplaceAll(fmt.Sprintf(recoveredAssignmentsSQL, "= ANY($1::text[])"),
		"$1::text[]", "'{"+strings.Join(ids, ",")+"}'::text[]"))
	t.Logf("running assignments recovered elsewhere, %d running:\n%s", running, plan)
	if strings.Contains(plan, "Seq Scan") {
		t.Errorf("the check of running assignments scans a table")
	}

	// The recovery statements (not run: EXPLAIN without ANALYZE).
	q := New(db.DB, ForInstance("i1"))
	for name, cond := range map[string]string{
		"dead instances":    `a.instance_id IN ('i2') AND a.instance_id <> 'i1' AND NOT ` + q.liveInstance(),
		"recovery at start": `a.instance_id IS NULL OR a.instance_id = 'i1' OR NOT ` + q.liveInstance(),
	} {
		stmt := `UPDATE job_assignments SET closed_at = 1, outcome = 'x'
			WHERE id IN (SELECT a.id FROM job_assignments a WHERE a.closed_at IS NULL AND (` + cond + `)
			             ORDER BY a.id LIMIT 500` + q.skipLocked() + `) AND closed_at IS NULL`
		plan := explain(t, conn, `EXPLAIN `+stmt)
		t.Logf("%s:\n%s", name, plan)
		for _, bad := range []string{"Seq Scan on jobs", "Seq Scan on job_assignments"} {
			if strings.Contains(plan, bad) {
				t.Errorf("%s: the plan has %s", name, bad)
			}
		}
	}
}
