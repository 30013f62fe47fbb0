package storage

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
)

// FindCachePaths returns the rows of any of the caches for any of the
// store hashes, in one query (a CacheQuery asks about up to 1000 paths
// at once). Unknown hashes are simply absent.
func (db *DB) FindCachePaths(ctx context.Context, cacheIDs, storeHashes []string) ([]CachePath, error) {
	if len(cacheIDs) == 0 || len(storeHashes) == 0 {
		return nil, nil
	}
	args := make([]any, 0, len(cacheIDs)+len(storeHashes))
	var q strings.Builder
	q.WriteString(`SELECT ` + cachePathColumns + ` FROM cache_paths WHERE cache_id IN (`)
	placeholders := func(values []string) {
		for i, v := range values {
			if i > 0 {
				q.WriteByte(',')
			}
			args = append(args, v)
			q.WriteString("$" + strconv.Itoa(len(args)))
		}
	}
	placeholders(cacheIDs)
	q.WriteString(`) AND store_hash IN (`)
	placeholders(storeHashes)
	q.WriteString(`) ORDER BY store_hash, cache_id`)
	rows, err := db.sql.QueryContext(ctx, q.String(), args...)
	return collect(rows, err, func(r *sql.Rows) (CachePath, error) { return scanCachePath(r) })
}
