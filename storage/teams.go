package storage

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"gradient.dev/gradient/storage/sqldb"
)

// Team owns projects and team workers.
type Team struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

const teamColumns = `id, name, created_at`

func scanTeam(row interface{ Scan(...any) error }) (Team, error) {
	var t Team
	var created int64
	err := row.Scan(&t.ID, &t.Name, &created)
	t.CreatedAt = fromMillis(created)
	return t, err
}

// CreateTeam adds a team. A taken name is ErrConflict.
func (db *DB) CreateTeam(ctx context.Context, name string) (Team, error) {
	if err := validName("team", name); err != nil {
		return Team{}, err
	}
	t := Team{ID: NewID(), Name: name, CreatedAt: fromMillis(nowMillis())}
	_, err := db.exec(ctx,
		`INSERT INTO teams (id, name, created_at) VALUES ($1, $2, $3)`,
		t.ID, t.Name, t.CreatedAt.UnixMilli())
	if constraintOf(err) == uniqueViolation {
		return Team{}, conflict("team %q already exists", name)
	}
	return t, err
}

// Team returns the team with id.
func (db *DB) Team(ctx context.Context, id string) (Team, error) {
	id, err := canonicalUUID("team ID", id)
	if err != nil {
		return Team{}, err
	}
	t, err := scanTeam(db.sql.QueryRowContext(ctx, `SELECT `+teamColumns+` FROM teams WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Team{}, notFound("team %s", id)
	}
	return t, err
}

// TeamByName returns the team called name.
func (db *DB) TeamByName(ctx context.Context, name string) (Team, error) {
	t, err := scanTeam(db.sql.QueryRowContext(ctx, `SELECT `+teamColumns+` FROM teams WHERE name = $1`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Team{}, notFound("team %q", name)
	}
	return t, err
}

// ListTeams returns every team, by name.
func (db *DB) ListTeams(ctx context.Context) ([]Team, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT `+teamColumns+` FROM teams ORDER BY name`)
	return collect(rows, err, func(r *sql.Rows) (Team, error) { return scanTeam(r) })
}

// DeleteTeam removes a team with its team workers and grants. A team that
// still has projects is ErrConflict: delete those first.
func (db *DB) DeleteTeam(ctx context.Context, id string) error {
	id, err := canonicalUUID("team ID", id)
	if err != nil {
		return err
	}
	return db.inTx(ctx, func(tx *sql.Tx) error {
		hasProjects, err := exists(ctx, tx, `SELECT 1 FROM projects WHERE team_id = $1`, id)
		if err != nil {
			return err
		}
		if hasProjects {
			return conflict("team %s still has projects; delete them first", id)
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM teams WHERE id = $1`, id)
		return affectedOne(res, err, "team %s", id)
	})
}

// affectedOne turns "no row changed" into ErrNotFound.
func affectedOne(res sql.Result, err error, format string, args ...any) error {
	return sqldb.AffectedOne(res, err, format, args...)
}
