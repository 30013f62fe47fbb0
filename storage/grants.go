package storage

import (
	"context"
	"database/sql"
)

// GrantTeam lets a team's workers run a project's jobs. added is false
// when the grant already existed; a new grant should reauth the team's
// connected workers so the project joins their sessions.
func (db *DB) GrantTeam(ctx context.Context, projectID, teamID string) (added bool, err error) {
	return db.addLink(ctx, grantLink, projectID, teamID)
}

// RevokeTeam withdraws a project's grant to a team; none is ErrNotFound.
func (db *DB) RevokeTeam(ctx context.Context, projectID, teamID string) error {
	return db.removeLink(ctx, grantLink, projectID, teamID)
}

// ProjectGrantedTeams returns the teams whose workers a project accepts, by name.
func (db *DB) ProjectGrantedTeams(ctx context.Context, projectID string) ([]Team, error) {
	projectID, err := canonicalUUID("project ID", projectID)
	if err != nil {
		return nil, err
	}
	rows, err := db.sql.QueryContext(ctx,
		`SELECT t.id, t.name, t.created_at
		 FROM teams t JOIN team_grants g ON g.team_id = t.id
		 WHERE g.project_id = $1 ORDER BY t.name`, projectID)
	return collect(rows, err, func(r *sql.Rows) (Team, error) { return scanTeam(r) })
}

// TeamGrantingProjects returns the projects that grant a team's workers,
// by team and name.
func (db *DB) TeamGrantingProjects(ctx context.Context, teamID string) ([]Project, error) {
	teamID, err := canonicalUUID("team ID", teamID)
	if err != nil {
		return nil, err
	}
	return teamGrantingProjects(ctx, db.sql, teamID)
}

func teamGrantingProjects(ctx context.Context, q querier, teamID string) ([]Project, error) {
	rows, err := q.QueryContext(ctx,
		`SELECT `+projectColumnsOf("p")+`
		 FROM projects p JOIN team_grants g ON g.project_id = p.id
		 WHERE g.team_id = $1 ORDER BY p.team_id, p.name`, teamID)
	return collect(rows, err, func(r *sql.Rows) (Project, error) { return scanProject(r) })
}
