package storage

import (
	"context"
	"database/sql"
)

// SubscribeProject subscribes a project to a cache, so its builds are
// signed into that cache. added is false when it already was subscribed;
// a new subscription should reauth the project's workers.
func (db *DB) SubscribeProject(ctx context.Context, projectID, cacheID string) (added bool, err error) {
	return db.addLink(ctx, subscriptionLink, projectID, cacheID)
}

// UnsubscribeProject ends a subscription; none is ErrNotFound.
func (db *DB) UnsubscribeProject(ctx context.Context, projectID, cacheID string) error {
	return db.removeLink(ctx, subscriptionLink, projectID, cacheID)
}

// ProjectCaches returns the caches a project subscribes to, by name.
// The authority moves a project without any to failed_peers.
func (db *DB) ProjectCaches(ctx context.Context, projectID string) ([]Cache, error) {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return nil, err
	}
	rows, err := db.sql.QueryContext(ctx,
		`SELECT c.id, c.name, c.public, c.public_key, c.created_at
		 FROM caches c JOIN project_caches pc ON pc.cache_id = c.id
		 WHERE pc.project_id = $1 ORDER BY c.name`, projectID)
	return collect(rows, err, func(r *sql.Rows) (Cache, error) { return scanCache(r) })
}

// CacheProjects returns the projects subscribed to a cache, by team and name.
func (db *DB) CacheProjects(ctx context.Context, cacheID string) ([]Project, error) {
	cacheID, err := canonicalUUID("cache ID", cacheID)
	if err != nil {
		return nil, err
	}
	rows, err := db.sql.QueryContext(ctx,
		`SELECT `+projectColumnsOf("p")+`
		 FROM projects p JOIN project_caches pc ON pc.project_id = p.id
		 WHERE pc.cache_id = $1 ORDER BY p.team_id, p.name`, cacheID)
	return collect(rows, err, func(r *sql.Rows) (Project, error) { return scanProject(r) })
}

// mustExist returns ErrNotFound (described by format and id) when query
// finds no row.
func mustExist(ctx context.Context, q querier, query, id, format string) error {
	found, err := exists(ctx, q, query, id)
	if err != nil {
		return err
	}
	if !found {
		return notFound(format, id)
	}
	return nil
}
