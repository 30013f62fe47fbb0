package storage

import (
	"context"
	"database/sql"
)

// hotFindMax bounds the caches and hashes of a FindCachePaths whose
// statement is kept prepared, so at most hotFindMax² shapes are kept.
const hotFindMax = 4

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
	var rows *sql.Rows
	var err error
	if len(cacheIDs) <= hotFindMax && len(storeHashes) <= hotFindMax {
		// An upload's grant asks about one path: its statement is
		// prepared once instead of parsed on every upload. Larger
		// shapes (a CacheQuery of many paths) vary too much to keep.
		rows, err = db.hotQuery(ctx, query, args...)
	} else {
		rows, err = db.sql.QueryContext(ctx, query, args...)
	}
	return collect(rows, err, func(r *sql.Rows) (CachePath, error) { return scanCachePath(r) })
}
