package storage

import (
	"context"
	"database/sql"
)

// link is a many-to-many table from projects to another kind of row:
// project_caches (subscriptions) and team_grants (grants).
type link struct {
	table  string // the link table
	column string // its column naming the other row
	kind   string // the other row's kind, for errors ("cache")
	source string // the other row's table ("caches")
	what   string // the link in errors: "subscription of project %s to cache %s"
}

var (
	subscriptionLink = link{"project_caches", "cache_id", "cache", "caches", "subscription of project %s to cache %s"}
	grantLink        = link{"team_grants", "team_id", "team", "teams", "grant of project %s to team %s"}
)

// add links a project to the row otherID; added is false when the link
// already existed. Both rows must exist.
func (db *DB) addLink(ctx context.Context, l link, projectID, otherID string) (added bool, err error) {
	projectID, err = canonicalUUID("project ID", projectID)
	if err != nil {
		return false, err
	}
	otherID, err = canonicalUUID(l.kind+" ID", otherID)
	if err != nil {
		return false, err
	}
	err = db.inTx(ctx, func(tx *sql.Tx) error {
		if err := mustExist(ctx, tx, `SELECT 1 FROM projects WHERE id = $1`, projectID, "project %s"); err != nil {
			return err
		}
		if err := mustExist(ctx, tx, `SELECT 1 FROM `+l.source+` WHERE id = $1`, otherID, l.kind+" %s"); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx,
			`INSERT INTO `+l.table+` (project_id, `+l.column+`, created_at) VALUES ($1, $2, $3)
			 ON CONFLICT (project_id, `+l.column+`) DO NOTHING`,
			projectID, otherID, nowMillis())
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		added = n > 0
		return err
	})
	return added, err
}

// removeLink deletes a link; none is ErrNotFound.
func (db *DB) removeLink(ctx context.Context, l link, projectID, otherID string) error {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return err
	}
	otherID, err = canonicalUUID(l.kind+" ID", otherID)
	if err != nil {
		return err
	}
	res, err := db.exec(ctx,
		`DELETE FROM `+l.table+` WHERE project_id = $1 AND `+l.column+` = $2`, projectID, otherID)
	return affectedOne(res, err, l.what, projectID, otherID)
}
