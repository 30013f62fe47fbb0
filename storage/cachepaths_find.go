package storage

import (
	"context"
	"database/sql"
)

// FindCachePaths returns the rows of any of the caches for any of the
// store hashes, in one query (a CacheQuery asks about up to 1000 paths
// at once). Unknown hashes are simply absent.
func (db *DB) FindCachePaths(ctx context.Context, cacheIDs, storeHashes []string) ([]CachePath, error) {
	if len(cacheIDs) == 0 || len(storeHashes) == 0 {
		return nil, nil
	}
	args, caches := inList(nil, cacheIDs)
	args, hashes := inList(args, storeHashes)
	query := `SELECT ` + cachePathColumns + ` FROM cache_paths WHERE cache_id IN (` + caches +
		`) AND store_hash IN (` + hashes + `) ORDER BY store_hash, cache_id`
	rows, err := db.sql.QueryContext(ctx, query, args...)
	return collect(rows, err, func(r *sql.Rows) (CachePath, error) { return scanCachePath(r) })
}
