// Package sqldb is the engine layer under the server's storage and the
// proxy's store: one database/sql handle on embedded SQLite (modernc) or
// PostgreSQL (pgx), opened from a URL, migrated from a schema's embedded
// numbered migrations, with transactions that queue for SQLite's single
// writer in Go, and the error kinds and constraint classification both
// engines map to.
//
// # Schema conventions
//
//   - IDs are UUIDs stored as canonical lowercase TEXT; inputs in either
//     case are accepted and lowercased (CanonicalUUID).
//   - Times are BIGINT unix milliseconds, UTC (NowMillis, FromMillis).
//   - Queries are written once with $N placeholders, which SQLite binds
//     by position too.
package sqldb
