package main

import (
	"fmt"
	"io"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
)

// Evaluations and builds: gradient eval … and gradient build …, thin
// clients of the admin API's evaluation endpoints (server/admin/evaluations.go).

func (a *app) evalCommand() *cli.Command {
	return a.adminGroup("eval", "evaluations of a project's commits",
		"An evaluation's builds: gradient build show BUILD_ID, gradient build log BUILD_ID.", exitOK,
		a.adminLeaf("start", "evaluate a commit (default: the branch head); --wait follows it and exits 1 unless it succeeds", []string{"PROJECT"}, []cli.Flag{
			&cli.StringFlag{Name: "commit", Usage: "full commit hash to evaluate (`SHA`)", DefaultText: "the head of the project's branch"},
			&cli.BoolFlag{Name: "wait", Usage: "follow the evaluation until it ends; exit 1 unless it succeeded"},
			&cli.DurationFlag{Name: "wait-interval", Usage: "how often --wait asks the server", Value: 2 * time.Second},
		}, evalStart),
		a.adminLeaf("list", "list the project's evaluations, newest first", []string{"PROJECT"}, []cli.Flag{
			&cli.IntFlag{Name: "limit", Usage: "show at most this many (up to 1000)", Value: 20},
		}, evalList),
		a.adminLeaf("show", "status and its builds (worker, outputs, failures)", []string{"EVAL_ID"}, nil, evalShow),
		a.adminLeaf("log", "the evaluation's (flake job's) log", []string{"EVAL_ID"}, nil, evalLog),
		a.adminLeaf("cancel", "stop it; workers running its jobs get AbortJob", []string{"EVAL_ID"}, nil, evalCancel),
		a.adminLeaf("approve", "let a pull request's evaluation that waits for approval run", []string{"EVAL_ID"}, nil, evalApprove),
		a.adminLeaf("restart-failed", "run its failed builds again (what succeeded stays built)", []string{"EVAL_ID"}, nil, evalRestartFailed),
		a.evalPinCommands()[0], a.evalPinCommands()[1],
	)
}

func (a *app) buildCommand() *cli.Command {
	return a.adminGroup("build", "the builds of evaluations",
		"Builds come from evaluations: gradient eval start PROJECT, then gradient eval show EVAL_ID lists them.", exitOK,
		a.adminLeaf("show", "a build: status, worker, outputs, failure", []string{"BUILD_ID"}, nil, buildShow),
		a.adminLeaf("log", "the build's log", []string{"BUILD_ID"}, nil, buildLog),
	)
}

// The admin API's evaluation and build answers, as far as the CLI prints them.

type evaluationInfo struct {
	ID          string      `json:"id"`
	ProjectID   string      `json:"project_id"`
	Project     string      `json:"project"`
	Repository  string      `json:"repository"`
	Commit      string      `json:"commit"`
	Wildcards   []string    `json:"wildcards"`
	Status      string      `json:"status"`
	Terminal    bool        `json:"terminal"`
	Error       string      `json:"error"`
	Attempts    int         `json:"attempts"`
	CreatedAt   time.Time   `json:"created_at"`
	StartedAt   time.Time   `json:"started_at"`
	FinishedAt  time.Time   `json:"finished_at"`
	DurationMS  int64       `json:"duration_ms"`
	FlakeSource string      `json:"flake_source"`
	Builds      []buildInfo `json:"builds"`
}

func (e evaluationInfo) project() string {
	if e.Project != "" {
		return e.Project
	}
	return e.ProjectID
}

type buildOutputInfo struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	NarSize uint64 `json:"nar_size"`
}

type buildInfo struct {
	ID           string            `json:"id"`
	EvaluationID string            `json:"evaluation_id"`
	Attr         string            `json:"attr"`
	DrvPath      string            `json:"drv_path"`
	Architecture string            `json:"architecture"`
	Status       string            `json:"status"`
	StatusText   string            `json:"status_text"`
	DurationMS   int64             `json:"duration_ms"`
	WorkerID     string            `json:"worker_id"`
	Outputs      []buildOutputInfo `json:"outputs"`
	FailureKind  string            `json:"failure_kind"`
	Error        string            `json:"error"`
	Attempts     int               `json:"attempts"`
	CreatedAt    time.Time         `json:"created_at"`
	StartedAt    time.Time         `json:"started_at"`
	FinishedAt   time.Time         `json:"finished_at"`
	Progress     *progressInfo     `json:"progress"`
}

// progressInfo is a running build's transfer progress.
type progressInfo struct {
	Phase      string  `json:"phase"`
	BytesDone  uint64  `json:"bytes_done"`
	BytesTotal *uint64 `json:"bytes_total"`
	PathsDone  uint32  `json:"paths_done"`
	PathsTotal *uint32 `json:"paths_total"`
}

// String reads "upload: 2 of 5 paths, 12.0 MiB of 40.1 MiB".
func (p progressInfo) String() string {
	paths, bytes := strconv.FormatUint(uint64(p.PathsDone), 10), humanBytes(p.BytesDone)
	switch {
	case p.PathsTotal != nil:
		paths += " of " + strconv.FormatUint(uint64(*p.PathsTotal), 10) + " paths"
	case p.PathsDone == 1:
		paths += " path"
	default:
		paths += " paths"
	}
	if p.BytesTotal != nil {
		bytes += " of " + humanBytes(*p.BytesTotal)
	}
	return p.Phase + ": " + paths + ", " + bytes
}

// name is the build's attribute, or for a dependency its derivation's
// name marked "(dep)".
func (b buildInfo) name() string {
	if b.Attr != "" {
		return b.Attr
	}
	return "(dep) " + evalDrvName(b.DrvPath)
}

// outputPaths are the build's output paths, comma-separated.
func (b buildInfo) outputPaths() string {
	var paths []string
	for _, o := range b.Outputs {
		if o.Path != "" {
			paths = append(paths, o.Path)
		}
	}
	return listOrDash(paths)
}

// failure is "Kind: error" on one line, "" without a failure.
func (b buildInfo) failure() string {
	msg := evalOneLine(b.Error)
	switch {
	case b.FailureKind != "" && msg != "":
		return b.FailureKind + ": " + msg
	case b.FailureKind != "":
		return b.FailureKind
	}
	return msg
}

func (b buildInfo) statusText() string {
	text := b.StatusText
	if text == "" {
		text = strings.ReplaceAll(b.Status, "_", " ")
	}
	if b.Progress != nil {
		text += " (" + b.Progress.String() + ")"
	}
	return text
}

// duration is how long the build ran; "-" for one that never ran (its
// outputs were cached already) or has not started.
func (b buildInfo) duration() string {
	if b.StatusText == "cached" {
		return "-"
	}
	return evalDuration(b.DurationMS, b.StartedAt)
}

func evaluationsPath(project string) string {
	return "/api/v1/projects/" + seg(project) + "/evaluations"
}

func evalStart(c *adminCmd) int {
	pos := c.args
	commit, wait, interval := c.cmd.String("commit"), c.cmd.Bool("wait"), c.cmd.Duration("wait-interval")
	if interval <= 0 {
		fmt.Fprintf(c.stderr, "gradient %s: --wait-interval must be positive\n", c.name)
		return exitUsage
	}
	body := map[string]any{}
	if commit != "" {
		body["commit"] = commit
	}
	var ev evaluationInfo
	raw, ok := c.call("POST", evaluationsPath(pos[0]), body, &ev)
	if !ok {
		return exitFail
	}
	if !wait {
		if c.json {
			return c.printJSON(raw)
		}
		fmt.Fprintf(c.stdout, "Started evaluation %s of %s at %s\n", ev.ID, ev.project(), ev.Commit)
		fmt.Fprintf(c.stdout, "Follow it: gradient eval show %s\n", ev.ID)
		return exitOK
	}
	if !c.json {
		fmt.Fprintf(c.stdout, "Started evaluation %s of %s at %s\n", ev.ID, ev.project(), ev.Commit)
	}
	return c.waitEvaluation(ev.ID, ev.Status, interval)
}

// waitEvaluation polls the evaluation until it ends, telling status
// changes on stderr, then shows it; exit 1 unless it succeeded.
func (c *adminCmd) waitEvaluation(id, status string, interval time.Duration) int {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			fmt.Fprintf(c.stderr, "gradient %s: %v\n", c.name, c.ctx.Err())
			return exitFail
		case <-t.C:
		}
		var ev evaluationInfo
		raw, ok := c.call("GET", "/api/v1/evaluations/"+seg(id), nil, &ev)
		if !ok {
			return exitFail
		}
		if ev.Status != status {
			status = ev.Status
			fmt.Fprintf(c.stderr, "%s evaluation %s: %s\n", time.Now().Format("15:04:05"), id, status)
		}
		if !ev.Terminal {
			continue
		}
		if c.json {
			c.printJSON(raw)
		} else {
			printEvaluation(c.stdout, ev)
		}
		if ev.Status != "succeeded" {
			return exitFail
		}
		return exitOK
	}
}

func evalList(c *adminCmd) int {
	pos := c.args
	limit := c.cmd.Int("limit")
	var evals []evaluationInfo
	raw, ok := c.call("GET", evaluationsPath(pos[0])+"?limit="+url.QueryEscape(strconv.Itoa(limit)), nil, &evals)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(evals))
	for _, e := range evals {
		rows = append(rows, []string{e.ID, e.Status, evalShortCommit(e.Commit), when(e.CreatedAt),
			evalDuration(e.DurationMS, e.StartedAt), orDash(evalClip(evalOneLine(e.Error), 60))})
	}
	table(c.stdout, []string{"EVALUATION", "STATUS", "COMMIT", "CREATED", "DURATION", "ERROR"}, rows)
	return exitOK
}

func evalShow(c *adminCmd) int {
	pos := c.args
	var ev evaluationInfo
	raw, ok := c.call("GET", "/api/v1/evaluations/"+seg(pos[0]), nil, &ev)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	printEvaluation(c.stdout, ev)
	return exitOK
}

// printEvaluation shows an evaluation and a table of its builds.
func printEvaluation(w io.Writer, ev evaluationInfo) {
	fields(w,
		"evaluation", ev.ID,
		"project", ev.project(),
		"repository", ev.Repository,
		"commit", ev.Commit,
		"wildcards", listOrDash(ev.Wildcards),
		"status", ev.Status,
		"created", when(ev.CreatedAt),
		"started", when(ev.StartedAt),
		"finished", when(ev.FinishedAt),
		"duration", evalDuration(ev.DurationMS, ev.StartedAt),
		"attempts", strconv.Itoa(ev.Attempts),
		"error", orDash(evalOneLine(ev.Error)),
		"builds", buildSummary(ev.Builds))
	if len(ev.Builds) == 0 {
		return
	}
	fmt.Fprintln(w)
	rows := make([][]string, 0, len(ev.Builds))
	for _, b := range ev.Builds {
		rows = append(rows, []string{b.ID, b.name(), b.statusText(), b.duration(),
			orDash(b.WorkerID), b.outputPaths(), orDash(evalClip(b.failure(), 80))})
	}
	table(w, []string{"BUILD", "ATTR", "STATUS", "DURATION", "WORKER", "OUTPUT", "FAILURE"}, rows)
}

// buildSummary counts builds by status: "3 (2 succeeded, 1 failed)".
func buildSummary(builds []buildInfo) string {
	if len(builds) == 0 {
		return "none"
	}
	var order []string
	counts := map[string]int{}
	for _, b := range builds {
		s := b.statusText()
		if counts[s] == 0 {
			order = append(order, s)
		}
		counts[s]++
	}
	parts := make([]string, 0, len(order))
	for _, s := range order {
		parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
	}
	return fmt.Sprintf("%d (%s)", len(builds), strings.Join(parts, ", "))
}

func evalCancel(c *adminCmd) int {
	pos := c.args
	var ev evaluationInfo
	raw, ok := c.call("POST", "/api/v1/evaluations/"+seg(pos[0])+"/cancel", nil, &ev)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Evaluation %s is %s\n", ev.ID, ev.Status)
	return exitOK
}

func evalLog(c *adminCmd) int {
	pos := c.args
	return c.copyLog("/api/v1/evaluations/" + seg(pos[0]) + "/log")
}

func buildShow(c *adminCmd) int {
	pos := c.args
	var b buildInfo
	raw, ok := c.call("GET", "/api/v1/builds/"+seg(pos[0]), nil, &b)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	outputs := make([]string, 0, len(b.Outputs))
	for _, o := range b.Outputs {
		outputs = append(outputs, o.Name+"="+orDash(o.Path))
	}
	fields(c.stdout,
		"build", b.ID,
		"evaluation", b.EvaluationID,
		"attr", orDash(b.Attr),
		"derivation", b.DrvPath,
		"architecture", orDash(b.Architecture),
		"status", b.statusText(),
		"worker", orDash(b.WorkerID),
		"attempts", strconv.Itoa(b.Attempts),
		"created", when(b.CreatedAt),
		"started", when(b.StartedAt),
		"finished", when(b.FinishedAt),
		"duration", b.duration(),
		"outputs", listOrDash(outputs),
		"failure kind", orDash(b.FailureKind),
		"error", orDash(evalOneLine(b.Error)))
	return exitOK
}

func buildLog(c *adminCmd) int {
	pos := c.args
	return c.copyLog("/api/v1/builds/" + seg(pos[0]) + "/log")
}

// copyLog writes a text/plain log to stdout as it arrives.
func (c *adminCmd) copyLog(path string) int {
	if err := c.api.copyText(c.ctx, path, c.stdout); err != nil {
		fmt.Fprintf(c.stderr, "gradient %s: %v\n", c.name, err)
		return exitFail
	}
	return exitOK
}

// evalDuration shows milliseconds as 400ms, 12.3s or 1m23s; "-" before
// the start.
func evalDuration(ms int64, started time.Time) string {
	if started.IsZero() {
		return "-"
	}
	d := time.Duration(max(ms, 0)) * time.Millisecond
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	}
	return d.Round(time.Second).String()
}

func evalShortCommit(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return orDash(sha)
}

// evalDrvName is a derivation path without the store directory, hash and
// .drv: /nix/store/abc…-hello-2.12.drv → hello-2.12.
func evalDrvName(drv string) string {
	base := strings.TrimSuffix(path.Base(drv), ".drv")
	if _, name, ok := strings.Cut(base, "-"); ok && name != "" {
		return name
	}
	return base
}

// evalOneLine joins the lines of a message so it fits a table cell.
func evalOneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// evalClip shortens s to at most n runes, marking the cut.
func evalClip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
