package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"gradient.dev/gradient/storage"
)

// upLogTail is how many lines of a failed job's log gradient up prints.
const upLogTail = 15

// upReadGap: a read of the builds is followed by at least this many
// times its own duration without one (at most a tenth of the time
// reading them).
const upReadGap = 10

// upStatusChecks is how often per poll gradient up reads the evaluation's
// status alone.
const upStatusChecks = 10

// evaluate runs the evaluation, printing one progress line per state
// change, then the summary table, and returns the exit code.
func (u *upRun) evaluate(ctx context.Context) int {
	ev, err := u.sched.StartEvaluation(ctx, u.project.EvaluationAt(u.commit))
	if err != nil {
		fmt.Fprintf(u.stderr, "gradient up: starting the evaluation: %v\n", err)
		return exitFail
	}
	u.progress("evaluation of %s queued", strings.Join(ev.Wildcards, ", "))

	lastEval := storage.EvaluationStatus("")
	type seen struct {
		status storage.BuildStatus
		worker string
	}
	lastBuild := map[string]seen{}
	var builds []storage.Build
	// The builds are read for the progress lines when, at a poll, their
	// mark (storage.BuildsMark: counts and times of the builds past
	// waiting) moved, so an evaluation discovering thousands of
	// derivations is not read whole every poll; between polls the
	// evaluation's row alone is read, often, so the run ends soon after
	// the evaluation (an end found only by the next full poll cost up to
	// a poll, 250 ms on average).
	tick := time.NewTicker(max(u.opts.poll/upStatusChecks, time.Millisecond))
	defer tick.Stop()
	var lastRead time.Time
	var lastMark storage.BuildsMark
	// readTook is how long the last read of the builds took: the next
	// waits at least upReadGap times that, so the progress of an
	// evaluation of thousands of builds that all keep moving (streamed
	// builds) takes a bounded share of the CPU the run needs.
	var readTook time.Duration
	for {
		if !lastRead.IsZero() {
			if cur, err := u.queue.Evaluation(ctx, ev.ID); err == nil && !cur.Status.Terminal() && cur.Status == lastEval {
				unchanged := true
				if time.Since(lastRead) >= max(u.opts.poll, upReadGap*readTook) {
					mark, err := u.db.EvaluationBuildsMark(ctx, ev.ID)
					if unchanged = err == nil && mark == lastMark; unchanged {
						lastRead = time.Now()
					}
				}
				if unchanged {
					select {
					case <-ctx.Done():
						return u.interrupted(ctx, ev.ID)
					case <-tick.C:
					}
					continue
				}
			}
		}
		lastRead = time.Now()
		// The mark first: a change between it and the builds is read now
		// and moves the next mark, which reads the builds again.
		if mark, err := u.db.EvaluationBuildsMark(ctx, ev.ID); err == nil {
			lastMark = mark
		}
		// A short read deadline of its own: the run's context may be over
		// and the final state must still be read.
		ev, builds, err = u.readEvaluation(ctx, ev.ID)
		readTook = time.Since(lastRead)
		if err != nil && ctx.Err() == nil {
			fmt.Fprintf(u.stderr, "gradient up: reading the evaluation: %v\n", err)
			return exitFail
		}
		if err == nil {
			if ev.Status != lastEval && !ev.Status.Terminal() {
				lastEval = ev.Status
				u.progress("evaluation %s", u.describeEvaluation(ev, builds))
			}
			var changed []storage.Build
			for _, b := range builds {
				now := seen{b.Status, b.WorkerID}
				if lastBuild[b.ID] == now {
					continue
				}
				lastBuild[b.ID] = now
				if b.Status != storage.BuildWaiting { // discovered: the evaluation line counts them
					changed = append(changed, b)
				}
			}
			for _, b := range upEventOrder(changed, builds) {
				u.progress("%-10s %s", upShortAttr(b), u.describeBuild(b))
			}
			if ev.Status.Terminal() {
				u.progress("evaluation %s", u.describeEvaluation(ev, builds))
				break
			}
		}
		select {
		case <-ctx.Done():
			return u.interrupted(ctx, ev.ID)
		case <-tick.C:
		}
	}
	evalErrors := u.printEvalMessages(ev.ID)
	if len(builds) > 0 {
		u.printSummary(builds)
	}
	return u.verdict(ev, builds, evalErrors)
}

// upEventOrder orders the builds that changed since the last poll by when
// they changed: a build started or ended at its own time, one that became
// queued when the last build before it ended; at the same moment endings
// come before the queueing they caused, and that before starts.
func upEventOrder(changed, all []storage.Build) []storage.Build {
	var lastEnd time.Time
	for _, b := range all {
		if b.FinishedAt.After(lastEnd) {
			lastEnd = b.FinishedAt
		}
	}
	at := func(b storage.Build) (time.Time, int) {
		switch {
		case b.Status.Terminal():
			return b.FinishedAt, 0
		case b.Status == storage.BuildBuilding:
			return b.StartedAt, 2
		}
		return lastEnd, 1
	}
	out := slices.Clone(changed)
	slices.SortStableFunc(out, func(a, b storage.Build) int {
		ta, ra := at(a)
		tb, rb := at(b)
		if c := ta.Compare(tb); c != 0 {
			return c
		}
		return ra - rb
	})
	return out
}

// readEvaluation reads the evaluation and its builds; while it still
// discovers derivations, only the builds past waiting (those streamed so
// far: the progress lines print nothing of the waiting ones, and reading
// the thousands of them at every poll while builds stream cost the
// process more CPU than the walk).
func (u *upRun) readEvaluation(ctx context.Context, id string) (storage.Evaluation, []storage.Build, error) {
	ev, err := u.queue.Evaluation(ctx, id)
	if err != nil {
		return ev, nil, err
	}
	var builds []storage.Build
	if upDiscovering(ev.Status) {
		builds, err = u.queue.EvaluationBuildsPastWaiting(ctx, id)
		if err == nil {
			// It may have ended its discovery meanwhile: then its
			// evaluation line counts every build.
			ev, err = u.queue.Evaluation(ctx, id)
		}
		if err != nil {
			return ev, nil, err
		}
	}
	if !upDiscovering(ev.Status) {
		builds, err = u.queue.EvaluationBuilds(ctx, id)
		if err != nil {
			return ev, nil, err
		}
	}
	slices.SortStableFunc(builds, func(a, b storage.Build) int { return strings.Compare(upDisplayAttr(a), upDisplayAttr(b)) })
	return ev, builds, nil
}

// upDiscovering: the evaluation may still add builds.
func upDiscovering(s storage.EvaluationStatus) bool {
	return s == storage.EvaluationQueued || s == storage.EvaluationFetching || s == storage.EvaluationEvaluating
}

func (u *upRun) describeEvaluation(ev storage.Evaluation, builds []storage.Build) string {
	switch ev.Status {
	case storage.EvaluationBuilding:
		return fmt.Sprintf("building: %d derivations discovered", len(builds))
	case storage.EvaluationSucceeded, storage.EvaluationFailed:
		return fmt.Sprintf("%s in %s", ev.Status, upRound(ev.Duration()))
	}
	return string(ev.Status)
}

func (u *upRun) describeBuild(b storage.Build) string {
	w := u.workerName(b.WorkerID)
	switch b.Status {
	case storage.BuildBuilding:
		return "building on " + w
	case storage.BuildSucceeded:
		if b.Cached() {
			return "already in the cache: not built"
		}
		return fmt.Sprintf("succeeded on %s in %s", w, upRound(b.Duration()))
	case storage.BuildFailed:
		return fmt.Sprintf("%s on %s after %s: %s", b.StatusText(), w, upRound(b.Duration()), upFirstLine(b.Error))
	case storage.BuildDependencyFailed:
		return "not built: a dependency failed"
	}
	return b.StatusText()
}

func (u *upRun) workerName(id string) string {
	if n, ok := u.workerNames[id]; ok {
		return n
	}
	if id == "" {
		return "?"
	}
	return "worker " + upShortID(id)
}

// interrupted cancels the evaluation after a timeout or Ctrl-C and shows
// where it stood.
func (u *upRun) interrupted(ctx context.Context, evalID string) int {
	why := "interrupted"
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		why = fmt.Sprintf("timed out after %s (--timeout)", u.opts.timeout)
	}
	bg, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := u.sched.CancelEvaluation(bg, evalID); err != nil {
		fmt.Fprintf(u.stderr, "gradient up: cancelling the evaluation: %v\n", err)
	}
	if _, builds, err := u.readEvaluation(bg, evalID); err == nil {
		u.printSummary(builds)
	}
	fmt.Fprintf(u.stderr, "gradient up: %s; the evaluation was cancelled\n", why)
	return exitFail
}

// printEvalMessages shows the evaluation's errors and warnings (an
// attribute that failed to evaluate, a target that matched nothing) and
// returns the number of errors.
func (u *upRun) printEvalMessages(evalID string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	text, err := u.queue.EvaluationLog(ctx, evalID)
	if err != nil {
		return 0
	}
	errs := 0
	for _, line := range strings.Split(string(text), "\n") {
		isErr := strings.HasPrefix(line, "[error] ")
		if isErr || strings.HasPrefix(line, "[warning] ") {
			fmt.Fprintf(u.stderr, "gradient up: %s\n", line)
		}
		if isErr {
			errs++
		}
	}
	return errs
}

// printSummary writes the table of builds to stdout.
func (u *upRun) printSummary(builds []storage.Build) {
	fmt.Fprintln(u.stdout)
	tw := tabwriter.NewWriter(u.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTRIBUTE\tSTATUS\tDURATION\tWORKER\tOUTPUT")
	for _, b := range builds {
		dur, w := "-", "-"
		if !b.StartedAt.IsZero() && !b.Cached() {
			dur = upRound(b.Duration()).String()
			w = u.workerName(b.WorkerID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", upDisplayAttr(b), b.StatusText(), dur, w, upOutputText(b))
	}
	tw.Flush()
}

// verdict names the failures (with the end of each failed build's log) on
// stderr and returns the exit code.
func (u *upRun) verdict(ev storage.Evaluation, builds []storage.Build, evalErrors int) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if len(builds) == 0 {
		if ev.Status == storage.EvaluationFailed {
			fmt.Fprintf(u.stderr, "\ngradient up: the evaluation failed: %s\n", ev.Error)
			if text, err := u.queue.EvaluationLog(ctx, ev.ID); err == nil {
				u.printTail("evaluation log", text)
			}
		} else if evalErrors > 0 {
			fmt.Fprintf(u.stderr, "\ngradient up: nothing to build: the evaluation reported %d errors (above)\n", evalErrors)
		} else {
			fmt.Fprintf(u.stderr, "\ngradient up: the flake has no %s derivations\n", strings.Join(ev.Wildcards, ", "))
		}
		return exitFail
	}
	var failed, notBuilt []storage.Build
	cached := 0
	for _, b := range builds {
		switch b.Status {
		case storage.BuildSucceeded:
			if b.Cached() {
				cached++
			}
		case storage.BuildDependencyFailed, storage.BuildCancelled:
			notBuilt = append(notBuilt, b)
		default:
			failed = append(failed, b)
		}
	}
	if len(failed) == 0 && len(notBuilt) == 0 && ev.Status == storage.EvaluationSucceeded && evalErrors == 0 {
		fromCache := ""
		if cached > 0 {
			fromCache = fmt.Sprintf(" (%d of them already in the cache)", cached)
		}
		fmt.Fprintf(u.stderr, "\ngradient up: all %d builds succeeded%s in %s\n", len(builds), fromCache, upRound(time.Since(u.start)))
		return exitOK
	}
	if n := len(failed) + len(notBuilt); n > 0 {
		fmt.Fprintf(u.stderr, "\ngradient up: %d of %d builds did not succeed\n", n, len(builds))
	} else {
		fmt.Fprintf(u.stderr, "\ngradient up: all %d builds succeeded, but not the whole evaluation\n", len(builds))
	}
	for _, b := range failed {
		fmt.Fprintf(u.stderr, "FAILED %s (%s", upDisplayAttr(b), b.StatusText())
		if b.FailureKind != "" {
			fmt.Fprintf(u.stderr, ", %s", b.FailureKind)
		}
		fmt.Fprintf(u.stderr, "): %s\n", upFirstLine(b.Error))
		if text, err := u.queue.BuildLog(ctx, b.ID); err == nil {
			u.printTail("log of "+upShortAttr(b), text)
		}
	}
	for _, b := range notBuilt {
		fmt.Fprintf(u.stderr, "NOT BUILT %s (%s)\n", upDisplayAttr(b), b.StatusText())
	}
	if ev.Status == storage.EvaluationFailed && len(failed) == 0 && len(notBuilt) == 0 {
		fmt.Fprintf(u.stderr, "the evaluation failed: %s\n", ev.Error)
	}
	if evalErrors > 0 {
		fmt.Fprintf(u.stderr, "the evaluation reported %d errors (above)\n", evalErrors)
	}
	return exitFail
}

func (u *upRun) printTail(what string, text []byte) {
	lines := strings.Split(strings.TrimRight(string(bytes.ToValidUTF8(text, []byte("?"))), "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		fmt.Fprintf(u.stderr, "  (%s is empty)\n", what)
		return
	}
	if len(lines) > upLogTail {
		lines = lines[len(lines)-upLogTail:]
	}
	fmt.Fprintf(u.stderr, "  last lines of the %s:\n", what)
	for _, l := range lines {
		fmt.Fprintf(u.stderr, "  | %s\n", l)
	}
}

// upDisplayAttr is a build's attribute path, or its derivation name for a
// dependency that no attribute names.
func upDisplayAttr(b storage.Build) string {
	if b.Attr != "" {
		return b.Attr
	}
	return upDrvName(b.DrvPath)
}

// upShortAttr drops the packages.<system>. prefix for progress lines.
func upShortAttr(b storage.Build) string {
	a := upDisplayAttr(b)
	if rest, ok := strings.CutPrefix(a, "packages."); ok {
		if i := strings.IndexByte(rest, '.'); i >= 0 {
			return rest[i+1:]
		}
	}
	return a
}

func upDrvName(drv string) string {
	base := strings.TrimSuffix(drv[strings.LastIndexByte(drv, '/')+1:], ".drv")
	if i := strings.IndexByte(base, '-'); i >= 0 {
		return base[i+1:]
	}
	return base
}

func upOutputText(b storage.Build) string {
	var paths []string
	if b.Status == storage.BuildSucceeded {
		for _, o := range b.OutputInfo {
			paths = append(paths, o.StorePath)
		}
		if len(paths) == 0 {
			for _, o := range b.Outputs {
				paths = append(paths, o.Path)
			}
		}
	}
	if len(paths) == 0 {
		return "-"
	}
	return strings.Join(paths, ",")
}

func upFirstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

func upRound(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}
