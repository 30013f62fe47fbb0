package scheduler_test

import (
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// pgStats is a snapshot of PostgreSQL's per-relation counters for the
// benchmark's database: with GRADIENT_BENCH_PGSTATS=1, BenchmarkDispatchScale
// logs what each table and index cost per assignment (buffers touched,
// updates and how many were HOT, dead tuples, vacuums), to find which
// relation's cost grows with the queue.
type pgStats map[string]relStats

type relStats struct {
	buffers                      float64 // blocks hit or read
	inserts, updates, hotUpdates float64
	seqScans, seqRows            float64
	deadTuples, vacuums          float64
	index                        bool
}

func pgStatsWanted() bool { return os.Getenv("GRADIENT_BENCH_PGSTATS") == "1" }

// readPGStats reads the counters through conn, which must be on the
// benchmark's database. Busy backends publish their counters at most
// once a second, idle ones after 10 s.
func readPGStats(b *testing.B, conn *sql.DB) pgStats {
	b.Helper()
	time.Sleep(11 * time.Second) // idle backends flush their counters after 10 s
	out := pgStats{}
	rows, err := conn.Query(`SELECT t.relname, COALESCE(io.heap_blks_hit, 0) + COALESCE(io.heap_blks_read, 0),
		t.seq_scan, t.seq_tup_read, t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, t.n_dead_tup, t.autovacuum_count + t.vacuum_count
		FROM pg_stat_user_tables t JOIN pg_statio_user_tables io USING (relid)
		WHERE t.schemaname = current_schema()`)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var name string
		var s relStats
		if err := rows.Scan(&name, &s.buffers, &s.seqScans, &s.seqRows, &s.inserts, &s.updates, &s.hotUpdates, &s.deadTuples, &s.vacuums); err != nil {
			b.Fatal(err)
		}
		out[name] = s
	}
	rows.Close()
	rows, err = conn.Query(`SELECT relname || ' ~ ' || indexrelname, COALESCE(idx_blks_hit, 0) + COALESCE(idx_blks_read, 0) FROM pg_statio_user_indexes
		WHERE schemaname = current_schema()`)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var name string
		var s relStats
		if err := rows.Scan(&name, &s.buffers); err != nil {
			b.Fatal(err)
		}
		s.index = true
		out[name] = s
	}
	rows.Close()
	return out
}

// logPGStatsSince logs the counters' growth since before, per assignment,
// for the relations that touched at least 0.1 buffers per assignment.
func logPGStatsSince(b *testing.B, conn *sql.DB, before pgStats, n int) {
	b.Helper()
	after := readPGStats(b, conn)
	var lines []string
	per := func(v float64) float64 { return v / float64(n) }
	for name, a := range after {
		s := before[name]
		bufs := per(a.buffers - s.buffers)
		if bufs < 0.1 {
			continue
		}
		line := fmt.Sprintf("%-40s %8.2f buffers", name, bufs)
		if !a.index {
			line += fmt.Sprintf("  seq scans %.0f rows %.0f  ins %.2f upd %.2f hot %.2f  dead %.0f  vacuums %.0f",
				a.seqScans-s.seqScans, a.seqRows-s.seqRows, per(a.inserts-s.inserts), per(a.updates-s.updates), per(a.hotUpdates-s.hotUpdates),
				a.deadTuples, a.vacuums-s.vacuums)
		}
		lines = append(lines, line)
	}
	slices.Sort(lines)
	b.Logf("per assignment (n=%d):\n%s", n, strings.Join(lines, "\n"))
}
