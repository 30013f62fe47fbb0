package testdb

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"
)

// PostgresURLOrSkip is PostgresURL for benchmarks (any testing.TB): a new,
// empty schema in this run's test database, dropped when tb ends. An
// unreachable server skips instead of failing.
func PostgresURLOrSkip(tb testing.TB) string {
	tb.Helper()
	run.once.Do(func() { run.err = createDatabase() })
	if run.err != nil {
		tb.Skipf("PostgreSQL unavailable: %v", run.err)
	}
	u, err := url.Parse(run.base)
	if err != nil {
		tb.Fatal(err)
	}
	u.Path = "/" + run.name
	schema := "t_" + randomHex()
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	conn, err := sql.Open("pgx", u.String())
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.ExecContext(tb.Context(), `CREATE SCHEMA `+schema); err != nil {
		conn.Close()
		tb.Fatalf("create test schema: %v", err)
	}
	tb.Cleanup(func() {
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := conn.ExecContext(ctx, `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			tb.Errorf("drop test schema %s: %v", schema, err)
		}
	})
	return u.String()
}
