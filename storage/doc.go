// Package storage is the server's database (embedded SQLite or PostgreSQL,
// one schema, versioned migrations) and its NAR object store.
package storage
