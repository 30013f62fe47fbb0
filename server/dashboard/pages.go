package dashboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/gitsource"
	"gradient.dev/gradient/internal/termsafe"
	"gradient.dev/gradient/server/admin"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
)

// buildsPerPage is the evaluation page's page of builds.
const buildsPerPage = 100

// maxInlineLog bounds the stored log a build page renders; the rest is
// behind the log link.
const maxInlineLog = 2 << 20

var funcs = template.FuncMap{
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
	},
	"ms": func(ms int64) string {
		if ms <= 0 {
			return "–"
		}
		return (time.Duration(ms) * time.Millisecond).Round(100 * time.Millisecond).String()
	},
	"short": func(s string) string {
		if len(s) > 12 {
			return s[:12]
		}
		return s
	},
	"bytes": humanBytes,
	"mb":    func(mb uint64) string { return humanBytes(int64(mb) << 20) },
	"statusClass": func(s string) string {
		return "st-" + strings.ReplaceAll(s, " ", "-")
	},
	// statusText shows a status in words ("waiting for approval").
	"statusText": func(s string) string { return strings.ReplaceAll(s, "_", " ") },
	"sourceText": func(s string) string {
		if s == string(storage.SourcePR) {
			return "PR"
		}
		return s
	},
	"ref":  evaluatedRef,
	"join": strings.Join,
	"deref32": func(p *float32) string {
		if p == nil {
			return "–"
		}
		return fmt.Sprintf("%.0f%%", *p)
	},
	"derefMB": func(p *uint64) string {
		if p == nil {
			return "–"
		}
		return humanBytes(int64(*p) << 20)
	},
}

// evaluatedRef is what an evaluation evaluated: "PR #12 → main" for a
// pull request (the target branch came from a forge's webhook: its
// control and bidirectional characters are removed), else the project's
// branch.
func evaluatedRef(e admin.EvaluationView, branch string) string {
	switch {
	case e.PRNumber > 0 && e.TargetBranch != "":
		return fmt.Sprintf("PR #%d → %s", e.PRNumber, termsafe.Strip(e.TargetBranch))
	case e.PRNumber > 0:
		return fmt.Sprintf("PR #%d", e.PRNumber)
	}
	return branch
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// page is what every template gets.
type page struct {
	Viewer viewer
	Title  string
	Data   any
}

// render writes a page; a template error becomes a 500 before anything
// was sent.
func (d *Dashboard) render(w http.ResponseWriter, r *http.Request, status int, name string, v viewer, data any) {
	var buf bytes.Buffer
	title := strings.ToUpper(name[:1]) + name[1:]
	if err := d.pages[name].Execute(&buf, page{Viewer: v, Title: title, Data: data}); err != nil {
		d.log.Error("dashboard: rendering failed", "page", name, "error", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type errorData struct{ Message string }

func (d *Dashboard) fail(w http.ResponseWriter, r *http.Request, v viewer, status int, msg string) {
	d.render(w, r, status, "error", v, errorData{Message: msg})
}

// failErr answers a storage error: not found and invalid as such,
// anything else as a 500 logged with its cause.
func (d *Dashboard) failErr(w http.ResponseWriter, r *http.Request, v viewer, err error) {
	switch {
	case errors.Is(err, storage.ErrNotFound), errors.Is(err, storage.ErrInvalid):
		d.fail(w, r, v, http.StatusNotFound, "Not found.")
	default:
		d.internalError(w, r, v, err)
	}
}

func (d *Dashboard) internalError(w http.ResponseWriter, r *http.Request, v viewer, err error) {
	d.log.Error("dashboard: request failed", "path", r.URL.Path, "error", err)
	d.fail(w, r, v, http.StatusInternalServerError, "Something went wrong on the server; its log has the cause.")
}

// notFoundForViewer is what a page of a private project answers logged
// out: the same as a page that does not exist, after a hint to log in.
func (d *Dashboard) notReadable(w http.ResponseWriter, r *http.Request, v viewer) {
	d.fail(w, r, v, http.StatusNotFound, "Not found. Log in to see private projects.")
}

// ---- overview ----

type overviewData struct {
	jobqueue.Overview
	BuildsPerMinute string
	WorkersLive     int
	WorkersBusy     int
	WorkersKnown    int
	Running         []evalRow
}

type evalRow struct {
	admin.EvaluationView
	Counts map[storage.BuildStatus]int
}

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request, v viewer) {
	ctx := r.Context()
	o, err := d.queue.ReadOverview(ctx, time.Now())
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	data := overviewData{Overview: o, BuildsPerMinute: fmt.Sprintf("%.1f", float64(o.BuildsLast10Min)/10)}
	ws, err := d.workerRows(ctx)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	data.WorkersKnown = len(ws)
	for _, wr := range ws {
		if wr.Live {
			data.WorkersLive++
			if len(wr.Jobs) > 0 {
				data.WorkersBusy++
			}
		}
	}
	names, err := d.projectNames(ctx)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	recent, err := d.queue.ListEvaluations(ctx, "", 20)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	for _, e := range recent {
		data.Running = append(data.Running, evalRow{EvaluationView: admin.EvaluationOf(e, names[e.ProjectID])})
	}
	d.render(w, r, http.StatusOK, "overview", v, data)
}

// projectNames maps project IDs to TEAM/PROJECT.
func (d *Dashboard) projectNames(ctx context.Context) (map[string]string, error) {
	teams, err := d.db.ListTeams(ctx)
	if err != nil {
		return nil, err
	}
	teamNames := map[string]string{}
	for _, t := range teams {
		teamNames[t.ID] = t.Name
	}
	projects, err := d.db.ListProjects(ctx)
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	for _, p := range projects {
		names[p.ID] = teamNames[p.TeamID] + "/" + p.Name
	}
	return names, nil
}

// ---- projects ----

type projectRow struct {
	ID, Name, Repository, Branch string
	Public                       bool
	Latest                       *admin.EvaluationView
}

func (d *Dashboard) projects(w http.ResponseWriter, r *http.Request, v viewer) {
	ctx := r.Context()
	projects, err := d.db.ListProjects(ctx)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	names, err := d.projectNames(ctx)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	public, err := d.db.PublicProjectIDs(ctx)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	rows := make([]projectRow, 0, len(projects))
	for _, p := range projects {
		row := projectRow{ID: p.ID, Name: names[p.ID], Repository: gitsource.Redact(p.Repository), Branch: p.Branch, Public: public[p.ID]}
		if e, err := d.queue.LatestEvaluation(ctx, p.ID); err == nil {
			ev := admin.EvaluationOf(e, row.Name)
			row.Latest = &ev
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b projectRow) int { return strings.Compare(a.Name, b.Name) })
	d.render(w, r, http.StatusOK, "projects", v, rows)
}

type projectData struct {
	ID, Name, Repository, Branch string
	Public                       bool
	Wildcards                    []string
	Evaluations                  []evalRow
}

func (d *Dashboard) project(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	v, err := d.viewerOf(r)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	p, err := d.db.Project(ctx, r.PathValue("project"))
	if err != nil {
		d.failErr(w, r, v, err)
		return
	}
	public, err := d.db.ProjectPublic(ctx, p.ID)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	if !v.LoggedIn && !public {
		d.notReadable(w, r, v)
		return
	}
	name := p.Name
	if t, err := d.db.Team(ctx, p.TeamID); err == nil {
		name = t.Name + "/" + p.Name
	}
	evals, err := d.queue.ListEvaluations(ctx, p.ID, 50)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	data := projectData{ID: p.ID, Name: name, Repository: gitsource.Redact(p.Repository), Branch: p.Branch, Public: public, Wildcards: p.Wildcards}
	for _, e := range evals {
		row := evalRow{EvaluationView: admin.EvaluationOf(e, name)}
		if row.Counts, err = d.queue.BuildStatusCounts(ctx, e.ID); err != nil {
			d.internalError(w, r, v, err)
			return
		}
		data.Evaluations = append(data.Evaluations, row)
	}
	d.render(w, r, http.StatusOK, "project", v, data)
}

// ---- evaluation ----

type statusCount struct {
	Status storage.BuildStatus
	Text   string
	N      int
}

type evaluationData struct {
	admin.EvaluationView
	Branch      string // the project's, shown for a branch's evaluation
	Counts      []statusCount
	Total       int
	Failed      int
	Filter      storage.BuildStatus
	Builds      []admin.BuildView
	Next        string // query of the next page, "" on the last
	First       bool
	Cancellable bool
	Waiting     bool // for approval
}

func (d *Dashboard) evaluation(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	v, err := d.viewerOf(r)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	e, err := d.queue.Evaluation(ctx, r.PathValue("id"))
	if err != nil {
		d.failErr(w, r, v, err)
		return
	}
	if ok, err := d.mayReadProject(ctx, v, e.ProjectID); err != nil {
		d.internalError(w, r, v, err)
		return
	} else if !ok {
		d.notReadable(w, r, v)
		return
	}
	q := r.URL.Query()
	filter := storage.BuildStatus(q.Get("status"))
	if filter != "" && !slices.Contains(jobqueue.BuildPageOrder, filter) {
		d.fail(w, r, v, http.StatusBadRequest, "Unknown build status.")
		return
	}
	cursor := jobqueue.BuildCursor{Status: storage.BuildStatus(q.Get("after_status")), ID: q.Get("after")}
	if (cursor.Status == "") != (cursor.ID == "") {
		d.fail(w, r, v, http.StatusBadRequest, "Bad page cursor.")
		return
	}
	builds, next, err := d.queue.BuildsPage(ctx, e.ID, filter, cursor, buildsPerPage)
	if err != nil {
		d.failErr(w, r, v, err)
		return
	}
	counts, err := d.queue.BuildStatusCounts(ctx, e.ID)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	project, branch := "", ""
	if p, err := d.db.Project(ctx, e.ProjectID); err == nil {
		project, branch = p.Name, p.Branch
		if t, err := d.db.Team(ctx, p.TeamID); err == nil {
			project = t.Name + "/" + p.Name
		}
	}
	data := evaluationData{EvaluationView: admin.EvaluationOf(e, project), Branch: branch, Filter: filter, First: cursor.IsZero(),
		Failed: counts[storage.BuildFailed], Cancellable: !e.Status.Terminal(), Waiting: e.Status == storage.EvaluationWaiting}
	for _, s := range jobqueue.BuildPageOrder {
		data.Total += counts[s]
		if counts[s] > 0 {
			data.Counts = append(data.Counts, statusCount{Status: s, Text: strings.ReplaceAll(string(s), "_", " "), N: counts[s]})
		}
	}
	data.Builds = make([]admin.BuildView, 0, len(builds))
	for _, b := range builds {
		data.Builds = append(data.Builds, d.cfg.API.BuildOf(b))
	}
	if !next.IsZero() {
		nq := make([]string, 0, 3)
		if filter != "" {
			nq = append(nq, "status="+string(filter))
		}
		nq = append(nq, "after_status="+string(next.Status), "after="+next.ID)
		data.Next = strings.Join(nq, "&")
	}
	d.render(w, r, http.StatusOK, "evaluation", v, data)
}

// ---- build ----

type outputRow struct {
	Name, Path string
	NarSize    uint64
	// From the cache that holds it, when one of the project's does.
	Cached     bool
	Cache      string
	Narinfo    string // URL of the narinfo
	NarHash    string
	FileSize   int64
	References []string
	Deriver    string
}

type buildData struct {
	admin.BuildView
	EvaluationProject string
	Outputs           []outputRow
	Log               string
	LogOffset         int64
	LogTruncated      bool
	LogPruned         bool // retention deleted the log
	Live              bool
}

func (d *Dashboard) readableBuild(w http.ResponseWriter, r *http.Request) (storage.Build, storage.Evaluation, viewer, bool) {
	ctx := r.Context()
	v, err := d.viewerOf(r)
	if err != nil {
		d.internalError(w, r, v, err)
		return storage.Build{}, storage.Evaluation{}, v, false
	}
	b, err := d.queue.Build(ctx, r.PathValue("id"))
	if err != nil {
		d.failErr(w, r, v, err)
		return b, storage.Evaluation{}, v, false
	}
	e, err := d.queue.Evaluation(ctx, b.EvaluationID)
	if err != nil {
		d.failErr(w, r, v, err)
		return b, e, v, false
	}
	if ok, err := d.mayReadProject(ctx, v, e.ProjectID); err != nil {
		d.internalError(w, r, v, err)
		return b, e, v, false
	} else if !ok {
		d.notReadable(w, r, v)
		return b, e, v, false
	}
	return b, e, v, true
}

func (d *Dashboard) build(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	b, e, v, ok := d.readableBuild(w, r)
	if !ok {
		return
	}
	log, err := d.queue.BuildLog(ctx, b.ID)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	data := buildData{BuildView: d.cfg.API.BuildOf(b), Live: !b.Status.Terminal()}
	if data.Live {
		// Complete lines only: the stream continues after the last one.
		log = log[:bytes.LastIndexByte(log, '\n')+1]
	}
	data.LogOffset = int64(len(log))
	if len(log) > maxInlineLog {
		log, data.LogTruncated = log[len(log)-maxInlineLog:], true
	}
	data.Log = sanitizeLog(log)
	if len(log) == 0 && !data.Live {
		data.LogPruned = d.logsPruned(r.Context(), e.ID)
	}
	data.Outputs = d.outputRows(ctx, e.ProjectID, data.BuildView.Outputs)
	d.render(w, r, http.StatusOK, "build", v, data)
}

// logPrunedText stands for a log retention deleted (its evaluation is no
// longer kept; docs/protocol/cache.md §10.1).
const logPrunedText = "log removed by retention"

// logsPruned reports whether retention deleted the evaluation's logs; a
// failed lookup reads as not.
func (d *Dashboard) logsPruned(ctx context.Context, evalID string) bool {
	pruned, err := d.db.EvaluationLogsPruned(ctx, evalID)
	if err != nil {
		d.log.Warn("dashboard: reading whether logs were pruned failed", "evaluation", evalID, "error", err)
	}
	return pruned
}

// sanitizeLog is termsafe.Strip line by line.
func sanitizeLog(log []byte) string {
	lines := strings.Split(string(log), "\n")
	for i, l := range lines {
		lines[i] = termsafe.Strip(l)
	}
	return strings.Join(lines, "\n")
}

// outputRows looks each output up in the project's caches.
func (d *Dashboard) outputRows(ctx context.Context, projectID string, outs []admin.BuildOutputView) []outputRow {
	rows := make([]outputRow, 0, len(outs))
	caches, _ := d.db.ProjectCaches(ctx, projectID)
	cacheIDs := make([]string, 0, len(caches))
	cacheNames := map[string]string{}
	for _, c := range caches {
		cacheIDs = append(cacheIDs, c.ID)
		cacheNames[c.ID] = c.Name
	}
	var hashes []string
	for _, o := range outs {
		if h, err := storage.StorePathHash(o.Path); err == nil {
			hashes = append(hashes, h)
		}
	}
	found := map[string]storage.CachePath{}
	if len(cacheIDs) > 0 && len(hashes) > 0 {
		paths, err := d.db.FindCachePaths(ctx, cacheIDs, hashes)
		if err != nil {
			d.log.Warn("dashboard: looking up outputs in the caches failed", "error", err)
		}
		for _, p := range paths {
			found[p.StorePath] = p
		}
	}
	for _, o := range outs {
		row := outputRow{Name: o.Name, Path: o.Path, NarSize: o.NarSize}
		if p, ok := found[o.Path]; ok {
			h, _ := storage.StorePathHash(p.StorePath)
			row.Cached, row.Cache = true, cacheNames[p.CacheID]
			row.Narinfo = "/cache/" + row.Cache + "/" + h + ".narinfo"
			row.NarHash, row.FileSize, row.References, row.Deriver = p.NarHash, p.FileSize, p.References, p.Deriver
		}
		rows = append(rows, row)
	}
	return rows
}

// buildLog is the stored log as text (sanitized: it opens in the browser).
func (d *Dashboard) buildLog(w http.ResponseWriter, r *http.Request) {
	b, e, v, ok := d.readableBuild(w, r)
	if !ok {
		return
	}
	log, err := d.queue.BuildLog(r.Context(), b.ID)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	if len(log) == 0 && d.logsPruned(r.Context(), e.ID) {
		log = []byte(logPrunedText + "\n")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte(sanitizeLog(log)))
}

func (d *Dashboard) buildLogStream(w http.ResponseWriter, r *http.Request) {
	b, _, v, ok := d.readableBuild(w, r)
	if !ok {
		return
	}
	offset, err := streamOffset(r)
	if err != nil {
		d.fail(w, r, v, http.StatusBadRequest, err.Error())
		return
	}
	if err := d.logs.serveStream(w, r, b.ID, offset); err != nil && r.Context().Err() == nil {
		d.log.Debug("dashboard: log stream ended", "build", b.ID, "error", err)
	}
}

// ---- workers ----

type workerRow struct {
	authority.WorkerStatus
	// ProjectNames are the projects its session serves, as TEAM/PROJECT.
	ProjectNames []string
	Jobs         []storage.HeldJob
}

func (d *Dashboard) workerRows(ctx context.Context) ([]workerRow, error) {
	ids, err := d.db.KnownWorkerIDs(ctx)
	if err != nil {
		return nil, err
	}
	held, err := d.db.HeldJobs(ctx)
	if err != nil {
		return nil, err
	}
	jobs := map[string][]storage.HeldJob{}
	for _, h := range held {
		jobs[h.WorkerID] = append(jobs[h.WorkerID], h)
	}
	rows := make([]workerRow, 0, len(ids))
	for _, id := range ids {
		rows = append(rows, workerRow{WorkerStatus: d.cfg.Workers.WorkerStatus(id), Jobs: jobs[id]})
	}
	// Live first, then by ID.
	slices.SortStableFunc(rows, func(a, b workerRow) int {
		if a.Live != b.Live {
			if a.Live {
				return -1
			}
			return 1
		}
		return 0
	})
	return rows, nil
}

func (d *Dashboard) workers(w http.ResponseWriter, r *http.Request, v viewer) {
	rows, err := d.workerRows(r.Context())
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	names, err := d.projectNames(r.Context())
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	for i := range rows {
		for _, id := range rows[i].Projects {
			name := names[id]
			if name == "" {
				name = id
			}
			rows[i].ProjectNames = append(rows[i].ProjectNames, name)
		}
	}
	d.render(w, r, http.StatusOK, "workers", v, rows)
}

// ---- caches ----

type cacheRow struct {
	admin.CacheView
	storage.CacheStats
}

func (d *Dashboard) caches(w http.ResponseWriter, r *http.Request, v viewer) {
	ctx := r.Context()
	caches, err := d.db.ListCaches(ctx)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	rows := make([]cacheRow, 0, len(caches))
	for _, c := range caches {
		st, err := d.db.ReadCacheStats(ctx, c.ID)
		if err != nil {
			d.internalError(w, r, v, err)
			return
		}
		rows = append(rows, cacheRow{CacheView: admin.CacheOf(c), CacheStats: st})
	}
	d.render(w, r, http.StatusOK, "caches", v, rows)
}

type cacheData struct {
	cacheRow
	Recent []storage.CachePath
	Query  string
	Found  *storage.CachePath
	Miss   string
}

func (d *Dashboard) cache(w http.ResponseWriter, r *http.Request, v viewer) {
	ctx := r.Context()
	c, err := d.db.CacheByName(ctx, r.PathValue("cache"))
	if err != nil {
		d.failErr(w, r, v, err)
		return
	}
	st, err := d.db.ReadCacheStats(ctx, c.ID)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	data := cacheData{cacheRow: cacheRow{CacheView: admin.CacheOf(c), CacheStats: st}}
	if data.Recent, err = d.db.RecentCachePaths(ctx, c.ID, 25); err != nil {
		d.internalError(w, r, v, err)
		return
	}
	if q := strings.TrimSpace(r.URL.Query().Get("path")); q != "" {
		data.Query = q
		hash := q
		if !strings.Contains(q, "/") && len(q) == storage.StoreHashLen {
			hash = q
		} else if h, err := storage.StorePathHash(q); err == nil {
			hash = h
		}
		p, err := d.db.CachePath(ctx, c.ID, hash)
		switch {
		case err == nil:
			data.Found = &p
		case errors.Is(err, storage.ErrNotFound), errors.Is(err, storage.ErrInvalid):
			data.Miss = "The cache does not hold " + q + "."
		default:
			d.internalError(w, r, v, err)
			return
		}
	}
	d.render(w, r, http.StatusOK, "cache", v, data)
}
