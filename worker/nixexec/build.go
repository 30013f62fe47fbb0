package nixexec

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
)

// runBuilds builds a build job's specs in order (the reference server
// sends one per job).
func (j *job) runBuilds(ctx context.Context, spec *wire.BuildJob) error {
	for i, b := range spec.Builds {
		if err := j.build(ctx, uint32(i), b); err != nil {
			return err
		}
	}
	return nil
}

// build runs one BuildSpec (docs/protocol/worker.md §7.1).
func (j *job) build(ctx context.Context, task uint32, spec wire.BuildSpec) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// Building goes first: the server only allows Building → Failed.
	if err := j.r.Update(&wire.JobUpdateBuilding{BuildID: spec.BuildID}); err != nil {
		return err
	}
	log := j.log.With("build", spec.BuildID, "drv", spec.DrvPath)
	switch spec.Kind {
	case wire.BuildSpecSubstitute:
		return j.substitute(ctx, spec)
	case wire.BuildSpecBuild, wire.BuildSpecDownload:
		// A Download (builtin:fetchurl) is realised like any build: Nix
		// itself fetches and verifies the fixed output.
	default:
		return worker.Fail(wire.FailurePermanent, fmt.Errorf("unknown build kind %d of %s", spec.Kind, spec.DrvPath))
	}

	begin := time.Now()
	// The .drv and its closure (input .drv files, sources) first; ensure
	// pins the .drv, which pins its build-time closure (the GC follows
	// its inputs).
	if _, err := j.ensure(ctx, []string{spec.DrvPath}); err != nil {
		return err
	}
	drvs, err := j.derivations(ctx, spec.DrvPath)
	if err != nil {
		return classify(fmt.Errorf("reading %s: %w", spec.DrvPath, err))
	}
	drv := drvs[spec.DrvPath]
	outputs := drv.OutputPaths()
	outPaths := sortedValues(outputs)
	// The outputs are pinned before they are looked for or built: the
	// daemon's temporary roots of a build end with its connection, which
	// a collection may close the moment the build returns.
	j.pin(ctx, outPaths...)

	// Outputs already here: report them as substituted, still upload.
	if len(outPaths) > 0 {
		have, err := j.missing(ctx, outPaths)
		if err != nil {
			return err
		}
		if len(have) == 0 {
			log.Info("outputs already valid locally")
			if err := j.reportOutputs(ctx, spec.BuildID, outputs, true, nil); err != nil {
				return err
			}
			return j.uploadOutputs(ctx, spec.BuildID, outPaths)
		}
	}

	j.r.Update(wire.BuildStagePrefetch)
	if err := j.prefetch(ctx, spec.BuildID, drv); err != nil {
		j.r.Send(&wire.EvalMessage{JobID: j.id, Level: wire.EvalLevelError, Source: "build-prefetch", Message: errorText(err)})
		return err
	}

	j.r.Update(wire.BuildStageBuild)
	logs := &logForwarder{r: j.r, task: task, limit: newLogLimit(j.e.logBurst(), j.e.logSustained(), time.Now())}
	opts := nix.BuildOptions{Cores: j.e.Cores, LogWriter: logs,
		Timeout: limitDuration(spec.TimeoutSecs), MaxSilent: limitDuration(spec.MaxSilentSecs)}
	if j.e.evaluating.Load() > 0 {
		// This worker's evaluation goes first (EvalBuildNice).
		opts.Nice = j.e.EvalBuildNice
	}
	log.Debug("building", "timeout", opts.Timeout, "max_silent", opts.MaxSilent, "nice", opts.Nice)
	unhold := func() {}
	if len(outputs) < len(drv.Outputs) {
		// Outputs known only once built (content-addressed): no
		// collection until they are pinned.
		if unhold, err = j.hold(ctx); err != nil {
			return err
		}
	}
	start := time.Now()
	built, err := j.e.Nix.Build(ctx, spec.DrvPath, opts)
	logs.Flush()
	if err != nil {
		unhold()
		return classify(err)
	}
	j.pin(ctx, sortedValues(built)...) // until they are uploaded
	unhold()
	builtAt := time.Now()
	took := builtAt.Sub(start)
	ms := uint64(took.Milliseconds())
	if err := j.reportOutputs(ctx, spec.BuildID, built, false, &wire.BuildMetrics{BuildTimeMS: &ms}); err != nil {
		return err
	}
	handedOver := time.Now()
	err = j.uploadOutputs(ctx, spec.BuildID, sortedValues(built))
	end := time.Now()
	// Where a build's time goes (docs/PERFORMANCE.md): inputs, Nix's
	// build, reporting the outputs, the upload; overhead is all but the build.
	log.Info("built", "outputs", len(built), "prepare_ms", start.Sub(begin).Milliseconds(), "build_ms", took.Milliseconds(),
		"handover_ms", handedOver.Sub(builtAt).Milliseconds(), "upload_ms", end.Sub(handedOver).Milliseconds(),
		"overhead_ms", end.Sub(begin).Milliseconds()-took.Milliseconds())
	return err
}

// substitute runs a Substitute spec (docs/protocol/worker.md §7.5): the outputs the
// cache lacks come from the substituters the local Nix is configured with
// (never built, no inputs fetched), then go to the cache.
func (j *job) substitute(ctx context.Context, spec wire.BuildSpec) error {
	outputs := map[string]string{}
	var paths []string
	for _, o := range spec.Outputs {
		if o.Path != "" {
			outputs[o.Name] = o.Path
			paths = append(paths, o.Path)
		}
	}
	if len(paths) == 0 {
		return worker.Fail(wire.FailurePermanent, fmt.Errorf("substitute job for %s names no outputs", spec.DrvPath))
	}
	j.pin(ctx, paths...) // until they are uploaded
	missing, err := j.missing(ctx, paths)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		j.log.Info("substituting outputs", "build", spec.BuildID, "paths", len(missing))
		if err := j.e.Nix.Substitute(ctx, missing...); err != nil {
			return &worker.JobError{Kind: wire.FailureSubstituteUnavailable, MissingPaths: missing, Err: err}
		}
	}
	if err := j.reportOutputs(ctx, spec.BuildID, outputs, true, nil); err != nil {
		return err
	}
	return j.uploadOutputs(ctx, spec.BuildID, paths)
}

// prefetch makes the build's inputs valid locally (docs/protocol/worker.md §7.3): the
// .drv's input sources and the outputs it uses of each input derivation.
// What it pulled is reported as the build's Prefetch progress.
func (j *job) prefetch(ctx context.Context, buildID string, drv *nix.Derivation) error {
	inputDrvs := make([]string, 0, len(drv.InputDrvs))
	for in := range drv.InputDrvs {
		inputDrvs = append(inputDrvs, in)
	}
	sort.Strings(inputDrvs)
	wanted := append([]string{}, drv.InputSrcs...)
	if len(inputDrvs) > 0 {
		parsed, err := j.derivations(ctx, inputDrvs...)
		if err != nil {
			return classify(fmt.Errorf("reading input derivations: %w", err))
		}
		for _, in := range inputDrvs {
			outs := parsed[in].OutputPaths()
			for _, name := range drv.InputDrvs[in] {
				if p := outs[name]; p != "" {
					wanted = append(wanted, p)
				}
			}
		}
	}
	n, compressed, err := j.ensureCounting(ctx, wanted)
	if err == nil && n > 0 {
		j.log.Info("prefetched inputs", "paths", n, "compressed_bytes", compressed)
		j.progress(buildID, wire.ProgressPrefetch, n).update(n, int64(compressed), true)
	}
	return err
}

// reportOutputs sends BuildOutput with each output's NAR hash and size.
func (j *job) reportOutputs(ctx context.Context, buildID string, outputs map[string]string, substituted bool, metrics *wire.BuildMetrics) error {
	names := make([]string, 0, len(outputs))
	for name := range outputs {
		names = append(names, name)
	}
	sort.Strings(names)
	paths := make([]string, len(names))
	for i, name := range names {
		paths[i] = outputs[name]
	}
	infos, err := j.e.Nix.PathInfo(ctx, paths...)
	if err != nil {
		return classify(worker.Fail(wire.FailureTransient, fmt.Errorf("path info of outputs: %w", err)))
	}
	report := &wire.JobUpdateBuildOutput{BuildID: buildID, Outputs: make([]wire.BuildOutput, len(names)), Metrics: metrics, Substituted: substituted}
	for i, name := range names {
		size := infos[i].NarSize
		hash, err := infos[i].NarHashNix32()
		if err != nil {
			return worker.Fail(wire.FailureTransient, err)
		}
		report.Outputs[i] = wire.BuildOutput{Name: name, StorePath: paths[i], Hash: storeHash(paths[i]),
			NarSize: &size, NarHash: &hash, Products: []wire.BuildProduct{}}
	}
	return j.r.Update(report)
}

func (j *job) uploadOutputs(ctx context.Context, buildID string, paths []string) error {
	j.r.Update(wire.BuildStageUpload)
	progress := j.progress(buildID, wire.ProgressUpload, 0)
	n, bytes, err := j.uploadReporting(ctx, paths, progress)
	if err != nil {
		return err
	}
	if n > 0 {
		progress.total = new(uint32(n))
		progress.update(n, bytes, true)
	}
	return nil
}

// storeHash is the hash part of a store path.
func storeHash(p string) string {
	base := p[len(storeDir):]
	if len(base) >= 32 {
		return base[:32]
	}
	return base
}

func sortedValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// logForwarder sends a build's log as LogChunks of whole lines; the last
// partial line goes out on Flush. Two token buckets (docs/protocol/worker.md §7.2)
// bound what one build may send: a burst per minute and a sustained
// amount per hour. When either runs dry the server gets one line saying
// so and nothing more of this build's log; the build goes on.
type logForwarder struct {
	r     worker.Reporter
	task  uint32
	limit *logLimit // nil: unlimited

	// mu is held across the send of each chunk, so lines keep their
	// order (logForwarder.mu → session.Writer.mu, docs/LOCKS.md).
	mu        sync.Mutex
	buf       []byte
	truncated bool
}

// truncatedLine tells the server the rest of the log was dropped.
const truncatedLine = "[gradient: log truncated — rate limit exceeded]\n"

func (l *logForwarder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.truncated {
		return len(p), nil
	}
	l.buf = append(l.buf, p...)
	if i := bytes.LastIndexByte(l.buf, '\n'); i >= 0 {
		chunk := bytes.Clone(l.buf[:i+1])
		l.buf = append(l.buf[:0], l.buf[i+1:]...)
		l.send(chunk)
	}
	return len(p), nil
}

// Flush sends what is left of the log.
func (l *logForwarder) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 && !l.truncated {
		l.send(append(bytes.Clone(l.buf), '\n'))
	}
	l.buf = nil
}

func (l *logForwarder) send(chunk []byte) {
	if l.limit != nil && !l.limit.take(len(chunk), time.Now()) {
		l.truncated = true
		l.r.Log(l.task, []byte(truncatedLine))
		return
	}
	// A lost session fails the job anyway; the build keeps going.
	l.r.Log(l.task, chunk)
}

// logLimit is the pair of token buckets of one build's log.
type logLimit struct {
	burst, sustained bucket
}

func newLogLimit(perMinute, perHour int64, now time.Time) *logLimit {
	if perMinute <= 0 && perHour <= 0 {
		return nil
	}
	return &logLimit{burst: newBucket(perMinute, time.Minute, now), sustained: newBucket(perHour, time.Hour, now)}
}

// take spends n bytes from both buckets, or neither.
func (l *logLimit) take(n int, now time.Time) bool {
	l.burst.refill(now)
	l.sustained.refill(now)
	if !l.burst.has(n) || !l.sustained.has(n) {
		return false
	}
	l.burst.spend(n)
	l.sustained.spend(n)
	return true
}

// bucket holds up to capacity bytes and refills capacity per period.
type bucket struct {
	capacity, tokens float64 // capacity 0: unlimited
	perSecond        float64
	last             time.Time
}

func newBucket(capacity int64, period time.Duration, now time.Time) bucket {
	c := float64(max(capacity, 0))
	return bucket{capacity: c, tokens: c, perSecond: c / period.Seconds(), last: now}
}

func (b *bucket) refill(now time.Time) {
	if b.capacity == 0 {
		return
	}
	b.tokens = min(b.capacity, b.tokens+now.Sub(b.last).Seconds()*b.perSecond)
	b.last = now
}

func (b *bucket) has(n int) bool { return b.capacity == 0 || b.tokens >= float64(n) }

func (b *bucket) spend(n int) {
	if b.capacity != 0 {
		b.tokens -= float64(n)
	}
}

// limitDuration is a BuildSpec limit for Nix: none, 0, or more seconds
// than a Duration holds (about 292 years, which would wrap round to a
// short limit) is no limit.
func limitDuration(secs *uint64) time.Duration {
	if secs == nil || *secs > uint64(math.MaxInt64/int64(time.Second)) {
		return 0
	}
	return time.Duration(*secs) * time.Second
}
