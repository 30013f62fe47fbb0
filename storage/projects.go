package storage

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Project is a flake repository whose branch the server evaluates and builds.
type Project struct {
	ID         string
	TeamID     string
	Name       string // unique within the team
	Repository string // flake repository URL
	Branch     string
	// Wildcards are the attribute patterns its evaluations build
	// (docs/protocol/worker.md §6.2), one pattern or exclusion per element.
	Wildcards []string
	CreatedAt time.Time
}

// NewProject is the input of CreateProject.
type NewProject struct {
	TeamID     string
	Name       string
	Repository string
	Branch     string
	Wildcards  []string // none: DefaultWildcards
}

// DefaultWildcards are the patterns of a project created without its own
// (the default of migration 0012 too).
func DefaultWildcards() []string { return []string{"packages.x86_64-linux.*"} }

// EvaluationAt is the evaluation of p's repository at commit, with a
// snapshot of p's wildcards: changing them later does not change it.
func (p Project) EvaluationAt(commit string) NewEvaluation {
	return NewEvaluation{
		ProjectID: p.ID, RepositoryURL: p.Repository, Commit: commit,
		Wildcards: slices.Clone(p.Wildcards),
	}
}

const projectColumns = `id, team_id, name, repository, branch, wildcards, created_at`

// projectColumnsOf is projectColumns of the projects table named alias
// in a join.
func projectColumnsOf(alias string) string {
	cols := strings.Split(projectColumns, ", ")
	for i, c := range cols {
		cols[i] = alias + "." + c
	}
	return strings.Join(cols, ", ")
}

func scanProject(row interface{ Scan(...any) error }) (Project, error) {
	var p Project
	var wildcards string
	var created int64
	if err := row.Scan(&p.ID, &p.TeamID, &p.Name, &p.Repository, &p.Branch, &wildcards, &created); err != nil {
		return Project{}, err
	}
	p.CreatedAt = fromMillis(created)
	if err := json.Unmarshal([]byte(wildcards), &p.Wildcards); err != nil {
		return Project{}, fmt.Errorf("decode wildcards of project %s: %w", p.ID, err)
	}
	return p, nil
}

// validWildcards checks the shape storage relies on; the API checks the
// patterns' syntax.
func validWildcards(wildcards []string) error {
	if len(wildcards) == 0 {
		return invalid("project wildcards are empty")
	}
	for _, w := range wildcards {
		if strings.TrimSpace(w) == "" {
			return invalid("project wildcards hold an empty pattern")
		}
	}
	return nil
}

func validSource(repository, branch string) error {
	if strings.TrimSpace(repository) == "" {
		return invalid("project repository URL is empty")
	}
	if strings.TrimSpace(branch) == "" {
		return invalid("project branch is empty")
	}
	return nil
}

// CreateProject adds a project to a team. An unknown team is ErrNotFound,
// a name the team already uses ErrConflict.
func (db *DB) CreateProject(ctx context.Context, in NewProject) (Project, error) {
	teamID, err := canonicalUUID("team ID", in.TeamID)
	if err != nil {
		return Project{}, err
	}
	if err := validName("project", in.Name); err != nil {
		return Project{}, err
	}
	if err := validSource(in.Repository, in.Branch); err != nil {
		return Project{}, err
	}
	wildcards := slices.Clone(in.Wildcards)
	if len(wildcards) == 0 {
		wildcards = DefaultWildcards()
	}
	if err := validWildcards(wildcards); err != nil {
		return Project{}, err
	}
	encoded, err := jsonText(wildcards)
	if err != nil {
		return Project{}, err
	}
	p := Project{
		ID: NewID(), TeamID: teamID, Name: in.Name,
		Repository: in.Repository, Branch: in.Branch, Wildcards: wildcards,
		CreatedAt: fromMillis(nowMillis()),
	}
	_, err = db.exec(ctx,
		`INSERT INTO projects (id, team_id, name, repository, branch, wildcards, created_at)
		 VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		p.ID, p.TeamID, p.Name, p.Repository, p.Branch, encoded, p.CreatedAt.UnixMilli())
	switch constraintOf(err) {
	case uniqueViolation:
		return Project{}, conflict("team %s already has a project %q", teamID, in.Name)
	case foreignKeyViolation:
		return Project{}, notFound("team %s", teamID)
	}
	return p, err
}

// Project returns the project with id.
func (db *DB) Project(ctx context.Context, id string) (Project, error) {
	return db.project(ctx, db.sql, id)
}

func (db *DB) project(ctx context.Context, q querier, id string) (Project, error) {
	id, err := canonicalUUID("project ID", id)
	if err != nil {
		return Project{}, err
	}
	p, err := scanProject(q.QueryRowContext(ctx, `SELECT `+projectColumns+` FROM projects WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Project{}, notFound("project %s", id)
	}
	return p, err
}

// ProjectByName returns the project called name in a team.
func (db *DB) ProjectByName(ctx context.Context, teamID, name string) (Project, error) {
	teamID, err := canonicalUUID("team ID", teamID)
	if err != nil {
		return Project{}, err
	}
	p, err := scanProject(db.sql.QueryRowContext(ctx,
		`SELECT `+projectColumns+` FROM projects WHERE team_id = $1 AND name = $2`, teamID, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Project{}, notFound("project %q in team %s", name, teamID)
	}
	return p, err
}

// ListProjects returns every project, by team and name.
func (db *DB) ListProjects(ctx context.Context) ([]Project, error) {
	rows, err := db.sql.QueryContext(ctx, `SELECT `+projectColumns+` FROM projects ORDER BY team_id, name`)
	return collect(rows, err, func(r *sql.Rows) (Project, error) { return scanProject(r) })
}

// ListTeamProjects returns a team's projects, by name.
func (db *DB) ListTeamProjects(ctx context.Context, teamID string) ([]Project, error) {
	teamID, err := canonicalUUID("team ID", teamID)
	if err != nil {
		return nil, err
	}
	rows, err := db.sql.QueryContext(ctx,
		`SELECT `+projectColumns+` FROM projects WHERE team_id = $1 ORDER BY name`, teamID)
	return collect(rows, err, func(r *sql.Rows) (Project, error) { return scanProject(r) })
}

// UpdateProjectSource changes the repository URL and branch of a project.
func (db *DB) UpdateProjectSource(ctx context.Context, id, repository, branch string) error {
	id, err := canonicalUUID("project ID", id)
	if err != nil {
		return err
	}
	if err := validSource(repository, branch); err != nil {
		return err
	}
	res, err := db.exec(ctx,
		`UPDATE projects SET repository = $1, branch = $2 WHERE id = $3`, repository, branch, id)
	return affectedOne(res, err, "project %s", id)
}

// UpdateProjectWildcards replaces the patterns a project's evaluations
// build from now on; queued and running evaluations keep theirs.
func (db *DB) UpdateProjectWildcards(ctx context.Context, id string, wildcards []string) error {
	id, err := canonicalUUID("project ID", id)
	if err != nil {
		return err
	}
	if err := validWildcards(wildcards); err != nil {
		return err
	}
	encoded, err := jsonText(wildcards)
	if err != nil {
		return err
	}
	res, err := db.exec(ctx, `UPDATE projects SET wildcards = $1 WHERE id = $2`, encoded, id)
	return affectedOne(res, err, "project %s", id)
}

// DeleteProject removes a project with its cache subscriptions, team
// grants and worker registrations.
func (db *DB) DeleteProject(ctx context.Context, id string) error {
	id, err := canonicalUUID("project ID", id)
	if err != nil {
		return err
	}
	return db.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM projects WHERE id = $1`, id)
		if err := affectedOne(res, err, "project %s", id); err != nil {
			return err
		}
		return deletePeerRegistrations(ctx, tx, Peer{Kind: PeerProject, ID: id})
	})
}
