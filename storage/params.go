package storage

import (
	"gradient.dev/gradient/storage/sqldb"
)

// inList is sqldb.InList.
func inList(args []any, values []string) ([]any, string) { return sqldb.InList(args, values) }

// inListMax is the most values an IN list of one query carries.
const inListMax = sqldb.InListMax
