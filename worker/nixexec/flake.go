package nixexec

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"gradient.dev/gradient/gitsource"
	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
)

const (
	// evalBatch is how many derivations one EvalResult carries; each
	// batch's .drv files and sources are uploaded before it is sent
	// (docs/protocol/worker.md §6.3).
	evalBatch = 50
	// walkWave is how many .drv files are parsed per Nix call.
	walkWave = 256
	// evalBatchesAhead is how many batches may be uploading while an
	// earlier one waits for its uploads to be reported (docs/protocol/worker.md §6.3:
	// walk and uploads run concurrently, EvalResults stay in walk order).
	evalBatchesAhead = 8
)

// runFlake runs a flake job's steps in order; the first failure ends it.
func (j *job) runFlake(ctx context.Context, spec *wire.FlakeJob) error {
	if err := j.checkSource(spec.Source); err != nil {
		return err
	}
	source := "" // the flake's source in the local store, once known
	for _, step := range spec.Steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		var err error
		switch step {
		case wire.FlakeStepFetchFlake:
			source, err = j.fetch(ctx, spec)
		case wire.FlakeStepEvaluateFlake:
			err = j.r.Update(&wire.JobUpdateEvaluatingFlake{})
		case wire.FlakeStepEvaluateDerivations:
			if source == "" {
				source, err = j.localSource(ctx, spec.Source)
				if err != nil {
					break
				}
			}
			err = j.evaluate(ctx, source, spec.Wildcards)
		default:
			err = worker.Fail(wire.FailurePermanent, fmt.Errorf("unknown flake step %d", step))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// checkSource refuses a repository source git must not be given (an
// option as the URL or commit, a remote helper, a local repository the
// operator did not allow) before any step runs: the server is not
// trusted with the worker's command lines.
func (j *job) checkSource(src wire.FlakeSource) error {
	repo, ok := src.(*wire.FlakeSourceRepository)
	if !ok {
		return nil
	}
	err := gitsource.ValidateRepositoryURL(repo.URL, j.e.AllowLocalRepositories)
	if err == nil {
		err = gitsource.ValidateCommit(repo.Commit)
	}
	if err != nil {
		j.log.Warn("refusing the flake job's source", "error", err)
		return worker.Fail(wire.FailurePermanent, fmt.Errorf("refusing the flake source: %w", err))
	}
	return nil
}

// fetch is the FetchFlake step (docs/protocol/worker.md §6.1): the source and its locked
// inputs into the store, uploaded, then FetchResult.
func (j *job) fetch(ctx context.Context, spec *wire.FlakeJob) (string, error) {
	if err := j.r.Update(&wire.JobUpdateFetching{}); err != nil {
		return "", err
	}
	var paths []string
	source := ""
	switch src := spec.Source.(type) {
	case *wire.FlakeSourceRepository:
		j.log.Info("fetching flake", "repository", gitsource.Redact(src.URL), "commit", src.Commit)
		fetched, err := j.fetchPinned(ctx, src)
		if err != nil {
			return "", err
		}
		source = fetched.SourcePath
		paths = append([]string{source}, fetched.InputPaths...)
	case *wire.FlakeSourceCached:
		if _, err := j.ensure(ctx, []string{src.StorePath}); err != nil {
			return "", err
		}
		source = src.StorePath
		paths = []string{source}
	default:
		return "", worker.Fail(wire.FailurePermanent, fmt.Errorf("unknown flake source %T", spec.Source))
	}
	if _, _, err := j.upload(ctx, paths); err != nil {
		return "", err
	}
	j.log.Info("flake fetched", "source", source, "inputs", len(paths)-1)
	return source, j.r.Update(&wire.JobUpdateFetchResult{FlakeSource: &source})
}

// localSource brings the source of an evaluation without a fetch step
// into the store: pulled from the cache, or fetched from the repository
// (without uploading: the server did not ask for it).
func (j *job) localSource(ctx context.Context, src wire.FlakeSource) (string, error) {
	switch src := src.(type) {
	case *wire.FlakeSourceCached:
		if _, err := j.ensure(ctx, []string{src.StorePath}); err != nil {
			return "", err
		}
		j.pullInputs(ctx, src.StorePath)
		return src.StorePath, nil
	case *wire.FlakeSourceRepository:
		fetched, err := j.fetchPinned(ctx, src)
		if err != nil {
			return "", err
		}
		return fetched.SourcePath, nil
	}
	return "", worker.Fail(wire.FailurePermanent, fmt.Errorf("unknown flake source %T", src))
}

// fetchPinned fetches a flake and pins its source and inputs; no
// collection runs in between (the CLI's temporary roots end with it).
func (j *job) fetchPinned(ctx context.Context, src *wire.FlakeSourceRepository) (*nix.FetchedFlake, error) {
	release, err := j.hold(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	fetched, err := j.e.Nix.FetchFlake(ctx, src.URL, src.Commit, j.fetchOptions())
	if err != nil {
		return nil, worker.Fail(wire.FailurePermanent, fmt.Errorf("fetching %s at %s: %w", src.URL, src.Commit, err))
	}
	j.pin(ctx, append([]string{fetched.SourcePath}, fetched.InputPaths...)...)
	return fetched, nil
}

// pullInputs brings a cached source's locked inputs from the cache, where
// the job that fetched it put them (docs/protocol/jobs.md §8.1 FetchFlake): a worker
// that may not fetch has no credentials for private inputs. Inputs the
// cache lacks are left to Nix, which fetches them itself if it can.
func (j *job) pullInputs(ctx context.Context, source string) {
	inputs, err := j.e.Nix.LockedInputPaths(ctx, "path:"+source)
	if err != nil {
		j.log.Warn("cannot list the flake's locked inputs; nix fetches them itself", "source", source, "error", err)
		return
	}
	if len(inputs) == 0 {
		return
	}
	pulled, err := j.ensure(ctx, inputs) // pins them
	if err != nil {
		j.log.Warn("flake inputs not pulled from the cache; nix fetches them itself", "inputs", len(inputs), "error", err)
		return
	}
	j.log.Info("flake inputs ready", "inputs", len(inputs), "pulled", pulled)
}

// evaluate is the EvaluateDerivations step (docs/protocol/worker.md §6.2, §6.3).
// The closure walk starts with the first derivation Nix finds and goes on
// while Nix evaluates: EvalResult batches stream, and the server may start
// their builds before the evaluation ends.
func (j *job) evaluate(ctx context.Context, source string, wildcards []string) error {
	if err := j.r.Update(&wire.JobUpdateEvaluatingDerivations{}); err != nil {
		return err
	}
	j.e.evaluating.Add(1)
	defer j.e.evaluating.Add(-1)
	flakeRef := "path:" + source
	j.log.Info("evaluating flake", "flake", flakeRef, "wildcards", wildcards, "shards", j.e.evalShards())
	// The .drv files the evaluation writes have no root but the CLI's
	// temporary ones until pinned below: no collection in between.
	release, err := j.hold(ctx)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	roots := make(chan nix.FoundDerivation, rootsBuffered)
	var ev *nix.Evaluation
	evalDone := make(chan error, 1)
	go func() {
		var err error
		ev, err = j.e.Nix.Evaluate(ctx, flakeRef, wildcards, nix.EvalOptions{Shards: j.e.evalShards(), MaxMemoryMiB: j.e.EvalMaxMemoryMiB},
			func(d nix.FoundDerivation) {
				select {
				case roots <- d: // Nix waits while the walk is this far behind
				case <-ctx.Done():
				}
			})
		close(roots)
		if err != nil {
			err = worker.Fail(wire.FailurePermanent, fmt.Errorf("evaluating %s: %w", flakeRef, err))
			cancel(err) // the walk stops; nothing more is reported
		}
		evalDone <- err
	}()
	w := &walk{j: j, state: map[string]drvState{}, uploaded: map[string]bool{}}
	werr := w.run(ctx, roots)
	if werr != nil {
		cancel(werr) // Nix stops
	}
	if err := <-evalDone; err != nil {
		return err
	}
	if werr != nil {
		return werr
	}
	attrs := make([]string, 0, len(ev.AttrErrors))
	for attr := range ev.AttrErrors {
		attrs = append(attrs, attr)
	}
	sort.Strings(attrs)
	for _, attr := range attrs {
		j.r.Send(&wire.EvalMessage{JobID: j.id, Level: wire.EvalLevelError, Source: "nix-eval:" + attr, Message: ev.AttrErrors[attr]})
	}
	// The discovered .drv files pin their closures until uploaded.
	drvPaths := make([]string, len(ev.Derivations))
	for i, d := range ev.Derivations {
		drvPaths[i] = d.DrvPath
	}
	j.pin(ctx, drvPaths...)
	release()
	errs := slices.Clone(ev.Unmatched)
	if errs == nil {
		errs = []string{}
	}
	j.log.Info("evaluation done", "derivations", w.reported, "attribute_errors", len(attrs))
	return j.r.Update(&wire.JobUpdateEvalResult{Derivations: w.batch, Warnings: []string{}, Errors: errs})
}

// idleFlush is how long a begun batch waits for more derivations while
// Nix evaluates before it is reported as it is.
const idleFlush = 100 * time.Millisecond

// rootsBuffered is how many found derivations may wait for the walk
// before Nix is made to wait.
const rootsBuffered = 4096

// drvState is where a derivation is in the walk.
type drvState uint8

const (
	drvQueued   drvState = iota + 1 // to be parsed and reported
	drvReported                     // reported without an attribute (an input)
	drvNamed                        // reported, or queued, as an attribute's
	drvKnown                        // the server knows it: not walked
)

// walk is the breadth-first closure walk of an evaluation: it parses the
// discovered .drv files and their inputs (not those the server already
// knows), uploads them with their sources, and reports them in batches.
// Roots arrive while it runs, as Nix finds them. Batches upload
// concurrently with the walk and with each other (the job's upload slots
// bound them); a reporter sends each batch's EvalResult in walk order
// once its own uploads are done.
type walk struct {
	j        *job
	state    map[string]drvState
	uploaded map[string]bool
	batch    []wire.DiscoveredDerivation
	reported int

	ctx     context.Context // the walk's, cancelled by a failed batch
	batches chan *batchUpload
}

// batchUpload is one batch on its way: its uploads, then its report.
type batchUpload struct {
	derivations []wire.DiscoveredDerivation // nil: the final batch, reported by the caller
	done        chan struct{}
	err         error
}

func (w *walk) run(ctx context.Context, roots <-chan nix.FoundDerivation) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w.ctx = ctx
	w.batches = make(chan *batchUpload, evalBatchesAhead)
	reported := make(chan error, 1)
	go func() { reported <- w.report(cancel) }()
	err := w.walk(ctx, roots)
	if err != nil {
		cancel(err) // batches still uploading stop, none is reported
	}
	close(w.batches)
	rerr := <-reported
	if cause := context.Cause(ctx); cause != nil && (err != nil || rerr != nil) {
		return cause // the first failure; the others are its consequence
	}
	return err
}

// report waits for each batch in order and sends its EvalResult; the
// first failure cancels the walk and is returned.
func (w *walk) report(cancel context.CancelCauseFunc) error {
	var first error
	for b := range w.batches {
		<-b.done
		if first != nil {
			continue
		}
		err := b.err
		if err == nil && b.derivations != nil {
			err = w.j.r.Update(&wire.JobUpdateEvalResult{Derivations: b.derivations, Warnings: []string{}, Errors: []string{}})
		}
		if err != nil {
			first = err
			cancel(err)
		}
	}
	return first
}

func (w *walk) walk(ctx context.Context, roots <-chan nix.FoundDerivation) error {
	attrOf := map[string]string{}
	var queue []string
	var renamed []string // reported without an attribute, found as one later
	addRoot := func(r nix.FoundDerivation) {
		switch w.state[r.DrvPath] {
		case 0:
			w.state[r.DrvPath] = drvNamed
			attrOf[r.DrvPath] = r.Attr
			queue = append(queue, r.DrvPath)
			w.j.pin(ctx, r.DrvPath) // until uploaded
		case drvQueued:
			w.state[r.DrvPath] = drvNamed
			attrOf[r.DrvPath] = r.Attr
		case drvReported, drvKnown:
			// Reported again with its attribute: the server fills it in.
			w.state[r.DrvPath] = drvNamed
			attrOf[r.DrvPath] = r.Attr
			renamed = append(renamed, r.DrvPath)
		}
		// drvNamed: two attributes of one derivation, the first names it
	}
	open := true
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if len(queue) == 0 && len(renamed) == 0 {
			if !open {
				break
			}
			// Wait for Nix to find the next one; a batch begun goes out
			// if none comes soon, so its builds need not wait for 50.
			var idle <-chan time.Time
			if len(w.batch) > 0 {
				idle = time.After(idleFlush)
			}
			select {
			case r, ok := <-roots:
				if !ok {
					open = false
					continue
				}
				addRoot(r)
			case <-idle:
				if err := w.flush(false); err != nil {
					return err
				}
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	more:
		for open && len(queue) < walkWave {
			select {
			case r, ok := <-roots:
				if !ok {
					open = false
					break more
				}
				addRoot(r)
			default:
				break more
			}
		}
		wave := queue[:min(walkWave, len(queue))]
		queue = queue[len(wave):]
		if len(wave) < walkWave && len(renamed) > 0 {
			n := min(walkWave-len(wave), len(renamed))
			wave = append(slices.Clip(wave), renamed[:n]...)
			renamed = renamed[n:]
		}
		drvs, err := w.j.derivations(ctx, wave...)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return worker.Fail(wire.FailurePermanent, fmt.Errorf("reading derivations: %w", err))
		}
		var inputs []string
		for _, p := range wave {
			for in := range drvs[p].InputDrvs {
				if w.state[in] == 0 {
					w.state[in] = drvQueued
					inputs = append(inputs, in)
				}
			}
		}
		sort.Strings(inputs)
		known, err := w.j.cache.KnownDerivations(ctx, w.j.id, inputs)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			known = nil // a failed query counts as "none known"
		}
		skip := make(map[string]bool, len(known))
		for _, k := range known {
			skip[k] = true
		}
		for _, in := range inputs {
			if !skip[in] {
				queue = append(queue, in)
			} else if w.state[in] == drvQueued {
				w.state[in] = drvKnown
			}
		}
		for _, p := range wave {
			if w.state[p] == drvQueued {
				w.state[p] = drvReported
			}
			w.batch = append(w.batch, discovered(attrOf[p], drvs[p]))
			if len(w.batch) == evalBatch {
				if err := w.flush(false); err != nil {
					return err
				}
			}
		}
	}
	return w.flush(true)
}

// flush starts uploading the batch's .drv files and sources; unless
// final, the reporter then reports the batch (the final batch goes with
// the last EvalResult, after run returns).
func (w *walk) flush(final bool) error {
	var paths []string
	for _, d := range w.batch {
		for _, p := range append([]string{d.DrvPath}, d.InputSources...) {
			if !w.uploaded[p] {
				w.uploaded[p] = true
				paths = append(paths, p)
			}
		}
	}
	w.reported += len(w.batch)
	b := &batchUpload{done: make(chan struct{})}
	if !final {
		b.derivations = w.batch
		w.batch = nil
	}
	go func() {
		defer close(b.done)
		_, _, b.err = w.j.upload(w.ctx, paths)
	}()
	select {
	case w.batches <- b:
		return nil
	case <-w.ctx.Done():
		<-b.done
		return w.ctx.Err()
	}
}

// discovered describes a parsed derivation as the server wants it
// (docs/protocol/worker.md §6.3).
func discovered(attr string, d *nix.Derivation) wire.DiscoveredDerivation {
	outputs := []wire.DerivationOutput{}
	for name, path := range d.OutputPaths() {
		outputs = append(outputs, wire.DerivationOutput{Name: name, Path: path})
	}
	sort.Slice(outputs, func(a, b int) bool { return outputs[a].Name < outputs[b].Name })
	deps := make([]string, 0, len(d.InputDrvs))
	for in := range d.InputDrvs {
		deps = append(deps, in)
	}
	sort.Strings(deps)
	dd := wire.DiscoveredDerivation{
		Attr:             attr,
		DrvPath:          d.Path,
		Outputs:          outputs,
		Dependencies:     deps,
		InputSources:     nonNil(slices.Sorted(slices.Values(d.InputSrcs))),
		Architecture:     d.System,
		RequiredFeatures: nonNil(d.RequiredSystemFeatures()),
		PreferLocalBuild: d.PreferLocalBuild(),
		IsFixedOutput:    d.IsFixedOutput(),
		AllowSubstitutes: d.AllowSubstitutes(),
	}
	// Unset stays nil (the server's default applies); an explicit 0 goes
	// out as 0, which disables the limit.
	dd.TimeoutSecs, dd.MaxSilentSecs = d.TimeoutSecs(), d.MaxSilentSecs()
	if p := d.Pname(); p != "" {
		dd.Pname = &p
	}
	return dd
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// errorText is an error's message without Nix's trailing blank lines.
func errorText(err error) string {
	var je *worker.JobError
	if errors.As(err, &je) {
		err = je.Err
	}
	return strings.TrimSpace(err.Error())
}

func (j *job) fetchOptions() nix.FetchOptions {
	return nix.FetchOptions{SSHKey: j.sshKey, SSH: j.e.SSH, AllowLocal: j.e.AllowLocalRepositories}
}
