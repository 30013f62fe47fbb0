package storage

import (
	"time"

	"gradient.dev/gradient/storage/sqldb"
)

// IDs and timestamps follow sqldb's conventions: canonical lowercase UUID
// text, BIGINT unix milliseconds.

// NewID returns a random (version 4) UUID.
func NewID() string { return sqldb.NewID() }

func canonicalUUID(what, s string) (string, error) { return sqldb.CanonicalUUID(what, s) }

func nowMillis() int64 { return sqldb.NowMillis() }

func fromMillis(ms int64) time.Time { return sqldb.FromMillis(ms) }
