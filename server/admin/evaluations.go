package admin

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"gradient.dev/gradient/gitsource"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// Evaluations and builds in the admin API (mounted by routes in admin.go):
//
//	POST   /api/v1/projects/{project}/evaluations       {commit?} → 201 evaluation; without a
//	                                                     commit, the head of the project's branch
//	GET    /api/v1/projects/{project}/evaluations       ?limit=N (default 50, at most 1000), newest first
//	GET    /api/v1/evaluations/{id}                     with its builds
//	GET    /api/v1/evaluations/{id}/log                 the flake job's log, text/plain
//	POST   /api/v1/evaluations/{id}/cancel              AbortJob to the workers running its jobs
//	GET    /api/v1/builds/{id}
//	GET    /api/v1/builds/{id}/log                      text/plain
//
// Starting and cancelling need a job loop that implements
// EvaluationControl (503 otherwise). A branch head that cannot be read
// is 502 (repository unreachable) or 400 (no such branch).

const (
	defaultEvaluationLimit = 50
	maxEvaluationLimit     = 1000
)

// evaluationRoutes mounts the evaluation and build endpoints.
func (a *API) evaluationRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/projects/{project}/evaluations", a.handle(a.startEvaluation))
	mux.HandleFunc("GET /api/v1/projects/{project}/evaluations", a.handle(a.listEvaluations))
	mux.HandleFunc("GET /api/v1/evaluations/{id}", a.handle(a.showEvaluation))
	mux.HandleFunc("GET /api/v1/evaluations/{id}/log", a.handle(a.evaluationLog))
	mux.HandleFunc("POST /api/v1/evaluations/{id}/cancel", a.handle(a.cancelEvaluation))
	mux.HandleFunc("GET /api/v1/builds/{id}", a.handle(a.showBuild))
	mux.HandleFunc("GET /api/v1/builds/{id}/log", a.handle(a.buildLog))
}

// EvaluationView is an evaluation; Builds are filled by show only.
type EvaluationView struct {
	ID         string   `json:"id"`
	ProjectID  string   `json:"project_id"`
	Project    string   `json:"project"` // TEAM/PROJECT
	Repository string   `json:"repository"`
	Commit     string   `json:"commit"`
	Wildcards  []string `json:"wildcards"`
	Status     string   `json:"status"`
	Terminal   bool     `json:"terminal"`
	Error      string   `json:"error,omitempty"`
	Attempts   int      `json:"attempts"`
	// Source is what started it: manual, poll, push (a forge's push
	// webhook) or pr (with the pull request's number and target branch).
	Source       string    `json:"source"`
	PRNumber     int       `json:"pr_number,omitempty"`
	TargetBranch string    `json:"target_branch,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	StartedAt    time.Time `json:"started_at,omitzero"`
	FinishedAt   time.Time `json:"finished_at,omitzero"`
	// DurationMS is how long it ran (so far, while running); 0 before.
	DurationMS  int64       `json:"duration_ms"`
	FlakeSource string      `json:"flake_source,omitempty"`
	Builds      []BuildView `json:"builds,omitempty"`
}

func viewEvaluation(e storage.Evaluation, project string) EvaluationView {
	return EvaluationView{
		ID: e.ID, ProjectID: e.ProjectID, Project: project, Repository: e.RepositoryURL,
		Commit: e.Commit, Wildcards: listOf(e.Wildcards), Status: string(e.Status), Terminal: e.Status.Terminal(),
		Error: e.Error, Attempts: e.Attempts, Source: string(e.Source), PRNumber: e.PRNumber, TargetBranch: e.TargetBranch,
		CreatedAt: e.CreatedAt, StartedAt: e.StartedAt,
		FinishedAt: e.FinishedAt, DurationMS: e.Duration().Milliseconds(), FlakeSource: e.FlakeSource,
	}
}

// buildOutputView is an output of a build: the path the worker reported
// once built, before that the path the derivation names ("" for a
// content-addressed output not built yet).
type buildOutputView struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	NarSize uint64 `json:"nar_size,omitempty"`
}

// BuildView is a build in admin answers, with its outputs (and, while it
// runs, its transfer progress).
type BuildView struct {
	ID           string `json:"id"`
	EvaluationID string `json:"evaluation_id"`
	Attr         string `json:"attr"` // "" for a dependency
	DrvPath      string `json:"drv_path"`
	Architecture string `json:"architecture"`
	Status       string `json:"status"`
	// StatusText is the status for people ("timed out", "dependency failed").
	StatusText  string            `json:"status_text"`
	DurationMS  int64             `json:"duration_ms"`
	WorkerID    string            `json:"worker_id,omitempty"` // of the latest run
	Outputs     []buildOutputView `json:"outputs"`
	FailureKind string            `json:"failure_kind,omitempty"`
	Error       string            `json:"error,omitempty"`
	Attempts    int               `json:"attempts"`
	CreatedAt   time.Time         `json:"created_at"`
	StartedAt   time.Time         `json:"started_at,omitzero"`
	FinishedAt  time.Time         `json:"finished_at,omitzero"`
	// Progress is the worker's latest BuildProgress while it builds.
	Progress *buildProgressView `json:"progress,omitempty"`
}

// buildProgressView is a running build's transfer progress: the phase
// (download, prefetch, upload), bytes and store paths so far, and the
// totals when known.
type buildProgressView struct {
	Phase      string  `json:"phase"`
	BytesDone  uint64  `json:"bytes_done"`
	BytesTotal *uint64 `json:"bytes_total,omitempty"`
	PathsDone  uint32  `json:"paths_done"`
	PathsTotal *uint32 `json:"paths_total,omitempty"`
}

// BuildProgress is the job loop's view of running builds' progress (the
// scheduler implements it).
type BuildProgress interface {
	BuildProgress(buildID string) (wire.BuildProgress, bool)
}

// viewBuildNow is viewBuild with the live progress of a running build.
func (a *API) viewBuildNow(b storage.Build) BuildView {
	v := viewBuild(b)
	src := a.cfg.Progress
	if src == nil || b.Status != storage.BuildBuilding {
		return v
	}
	if p, ok := src.BuildProgress(b.ID); ok {
		v.Progress = &buildProgressView{Phase: strings.ToLower(p.Phase.String()), BytesDone: p.BytesDone, BytesTotal: p.BytesTotal, PathsDone: p.PathsDone, PathsTotal: p.PathsTotal}
	}
	return v
}

func viewBuild(b storage.Build) BuildView {
	v := BuildView{
		ID: b.ID, EvaluationID: b.EvaluationID, Attr: b.Attr, DrvPath: b.DrvPath, Architecture: b.Architecture,
		Status: string(b.Status), StatusText: b.StatusText(), DurationMS: b.Duration().Milliseconds(),
		WorkerID: b.WorkerID, FailureKind: string(b.FailureKind), Error: b.Error, Attempts: b.Attempts,
		CreatedAt: b.CreatedAt, StartedAt: b.StartedAt, FinishedAt: b.FinishedAt,
		Outputs: []buildOutputView{},
	}
	built := make(map[string]storage.BuildOutputInfo, len(b.OutputInfo))
	for _, o := range b.OutputInfo {
		built[o.Name] = o
	}
	for _, o := range b.Outputs {
		out := buildOutputView{Name: o.Name, Path: o.Path}
		if info, ok := built[o.Name]; ok {
			out.Path, out.NarSize = info.StorePath, info.NarSize
			delete(built, o.Name)
		}
		v.Outputs = append(v.Outputs, out)
	}
	for _, info := range b.OutputInfo { // reported outputs the derivation did not name
		if _, ok := built[info.Name]; ok {
			v.Outputs = append(v.Outputs, buildOutputView{Name: info.Name, Path: info.StorePath, NarSize: info.NarSize})
		}
	}
	return v
}

// control is the job loop's Evaluations; without them it answers 503.
func (a *API) control(w http.ResponseWriter) (Evaluations, bool) {
	ctl := a.cfg.Evaluations
	ok := ctl != nil
	if !ok {
		writeError(w, http.StatusServiceUnavailable, "no job loop: this server cannot start or cancel evaluations")
	}
	return ctl, ok
}

func (a *API) startEvaluation(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	var in struct {
		Commit string `json:"commit"`
	}
	// The body is optional: none starts the branch head.
	body := bufio.NewReader(r.Body)
	if _, err := body.Peek(1); err == nil {
		r.Body = readCloser{body, r.Body}
		if err := decodeBody(w, r, &in); err != nil {
			return err
		}
	}
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	ctl, ok := a.control(w)
	if !ok {
		return nil
	}
	// A project stored before the API checked repositories may name one
	// git must not be given; its evaluation would reach the workers.
	if err := gitsource.ValidateRepositoryURL(p.Repository, a.cfg.AllowLocalRepositories); err != nil {
		return invalidf("the project's repository cannot be evaluated: %v", err)
	}
	commit := strings.TrimSpace(in.Commit)
	if commit != "" {
		if gitsource.ValidateCommit(commit) != nil {
			return invalidf("commit %q: give the full 40-character (or 64 for SHA-256) hex hash", commit)
		}
		commit = strings.ToLower(commit)
	} else {
		var missing bool
		commit, missing, err = a.cfg.Branches.BranchHead(ctx, p)
		if err != nil {
			status := http.StatusBadGateway
			if missing {
				status = http.StatusBadRequest
			}
			a.log.Warn("admin: cannot resolve the branch head", "project_id", p.ID, "branch", p.Branch, "error", err)
			writeError(w, status, "cannot resolve the head of branch "+strconv.Quote(p.Branch)+
				" (give a commit instead): "+err.Error())
			return nil
		}
	}
	ev, err := ctl.StartEvaluation(ctx, p.EvaluationAt(commit))
	if err != nil {
		return err
	}
	name := a.projectName(ctx, p)
	a.log.Info("admin: evaluation started", "project", name, "commit", commit, "evaluation", ev.ID)
	writeJSON(w, http.StatusCreated, viewEvaluation(ev, name))
	return nil
}

// readCloser reads through a peeked buffer and closes the original body.
type readCloser struct {
	io.Reader
	io.Closer
}

func (a *API) listEvaluations(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	limit := defaultEvaluationLimit
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxEvaluationLimit {
			return invalidf("limit %q: want a number from 1 to %d", s, maxEvaluationLimit)
		}
		limit = n
	}
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	evals, err := a.queue.ListEvaluations(ctx, p.ID, limit)
	if err != nil {
		return err
	}
	name := a.projectName(ctx, p)
	views := make([]EvaluationView, 0, len(evals))
	for _, e := range evals {
		views = append(views, viewEvaluation(e, name))
	}
	writeJSON(w, http.StatusOK, views)
	return nil
}

func (a *API) showEvaluation(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	e, err := a.queue.Evaluation(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	builds, err := a.queue.EvaluationBuilds(ctx, e.ID)
	if err != nil {
		return err
	}
	v := viewEvaluation(e, a.projectNameByID(ctx, e.ProjectID))
	v.Builds = make([]BuildView, 0, len(builds))
	for _, b := range builds {
		v.Builds = append(v.Builds, a.viewBuildNow(b))
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (a *API) cancelEvaluation(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	e, err := a.queue.Evaluation(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	ctl, ok := a.control(w)
	if !ok {
		return nil
	}
	if err := ctl.CancelEvaluation(ctx, e.ID); err != nil {
		return err
	}
	if e, err = a.queue.Evaluation(ctx, e.ID); err != nil {
		return err
	}
	a.log.Info("admin: evaluation cancelled", "evaluation", e.ID, "status", e.Status)
	writeJSON(w, http.StatusOK, viewEvaluation(e, a.projectNameByID(ctx, e.ProjectID)))
	return nil
}

func (a *API) showBuild(w http.ResponseWriter, r *http.Request) error {
	b, err := a.queue.Build(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, a.viewBuildNow(b))
	return nil
}

func (a *API) buildLog(w http.ResponseWriter, r *http.Request) error {
	log, err := a.queue.BuildLog(r.Context(), r.PathValue("id"))
	a.writeLog(w, r, log, err)
	return nil
}

func (a *API) evaluationLog(w http.ResponseWriter, r *http.Request) error {
	log, err := a.queue.EvaluationLog(r.Context(), r.PathValue("id"))
	a.writeLog(w, r, log, err)
	return nil
}

// writeLog answers a job log as text/plain (errors stay JSON).
func (a *API) writeLog(w http.ResponseWriter, r *http.Request, log []byte, err error) {
	if err != nil {
		a.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(log)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(log)
}

// projectName is p as TEAM/PROJECT (its ID if the team cannot be read).
func (a *API) projectName(ctx context.Context, p storage.Project) string {
	t, err := a.db.Team(ctx, p.TeamID)
	if err != nil {
		return p.ID
	}
	return t.Name + "/" + p.Name
}

// projectNameByID is projectName of the project with id ("" if deleted).
func (a *API) projectNameByID(ctx context.Context, id string) string {
	p, err := a.db.Project(ctx, id)
	if err != nil {
		return ""
	}
	return a.projectName(ctx, p)
}
