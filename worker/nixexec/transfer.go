package nixexec

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
)

const (
	// uploadParallel is how many paths of one job upload at once
	// (docs/protocol/worker.md §5): from the request until UploadFinished is sent.
	uploadParallel = 4
	// uploadPending is how many uploads of one job may be sent and wait
	// for the server's commit (docs/protocol/cache.md §4.3: the small-upload window),
	// so the server commits many at once (their fsyncs share journal
	// commits) instead of one per round trip.
	uploadPending = 128
	// pullRounds caps closure expansion (docs/protocol/worker.md §7.3).
	pullRounds = 1024
	storeDir   = "/nix/store/"
)

// upload puts paths into the server's cache: a Push query says which are
// missing, and those are dumped from the store and uploaded, a few at a
// time. The first failure cancels the rest and fails the job as
// Transient: a later job must never miss a path this one reported.
func (j *job) upload(ctx context.Context, paths []string) (uploaded int, bytes int64, err error) {
	return j.uploadReporting(ctx, paths, nil)
}

// uploadReporting is upload with each uploaded path counted in progress
// (nil: none), throttled to one report a second.
func (j *job) uploadReporting(ctx context.Context, paths []string, progress *buildProgress) (uploaded int, bytes int64, err error) {
	paths = slices.Compact(slices.Sorted(slices.Values(paths)))
	if len(paths) == 0 {
		return 0, 0, nil
	}
	start := time.Now()
	missing := paths
	if status, qerr := j.cache.Query(ctx, j.id, paths, wire.QueryPush); qerr == nil {
		// On a failed query every path counts as uncached (docs/protocol/worker.md §5).
		cached := map[string]bool{}
		for _, c := range status {
			if c.Cached {
				cached[c.Path] = true
			}
		}
		missing = slices.DeleteFunc(slices.Clone(paths), func(p string) bool { return cached[p] })
	} else if ctx.Err() != nil {
		return 0, 0, ctx.Err()
	} else {
		j.log.Warn("push query failed; uploading every path", "paths", len(paths), "error", qerr)
	}
	if len(missing) == 0 {
		return 0, 0, nil
	}
	infos, err := j.e.Nix.PathInfo(ctx, missing...)
	if err != nil {
		return 0, 0, worker.Fail(wire.FailureTransient, fmt.Errorf("path info for upload: %w", err))
	}
	if progress != nil && progress.total == nil {
		progress.total = new(uint32(len(infos)))
	}
	j.log.Info("uploading paths", "paths", len(missing), "already_cached", len(paths)-len(missing))

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	slots := j.uploadSlots()
	var (
		wg sync.WaitGroup
		// mu is held across progress.update, which may send a
		// BuildProgress (mu → buildProgress.mu, docs/LOCKS.md).
		mu    sync.Mutex
		first error
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
		cancel(err)
	}
	for _, info := range infos {
		if !acquire(ctx, slots.pending) {
			break
		}
		wg.Go(func() {
			defer func() { <-slots.pending }()
			if !acquire(ctx, slots.transfers) {
				return
			}
			pu, err := j.startUpload(ctx, info)
			<-slots.transfers
			if err == nil && pu != nil {
				err = pu.Wait(ctx)
			}
			if err != nil {
				fail(err)
				return
			}
			mu.Lock()
			uploaded++
			bytes += info.NarSize
			progress.update(uploaded, bytes, false)
			mu.Unlock()
		})
	}
	wg.Wait()
	if first != nil {
		return uploaded, bytes, worker.Fail(wire.FailureTransient, first)
	}
	if err := ctx.Err(); err != nil {
		return uploaded, bytes, err
	}
	j.log.Info("uploaded paths", "paths", uploaded, "nar_bytes", bytes, "took", time.Since(start).Round(time.Millisecond))
	return uploaded, bytes, nil
}

// uploadSlots are the job's upload limits, shared by every upload of the
// job (an evaluation uploads several batches at once).
type uploadSlots struct {
	transfers chan struct{} // uploadParallel: dumping and sending
	pending   chan struct{} // uploadPending: sent or sending, not committed
}

func (j *job) uploadSlots() *uploadSlots {
	j.slotsOnce.Do(func() {
		j.slots = &uploadSlots{transfers: make(chan struct{}, uploadParallel), pending: make(chan struct{}, uploadPending)}
	})
	return j.slots
}

// acquire takes a slot of sem unless ctx ends first.
func acquire(ctx context.Context, sem chan struct{}) bool {
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	if ctx.Err() != nil {
		<-sem
		return false
	}
	return true
}

// startUpload streams one path's NAR from the store into an upload and
// returns it waiting for its commit, or nil when the cache uploads only
// synchronously and the upload is done.
func (j *job) startUpload(ctx context.Context, info nix.PathInfo) (*worker.PendingUpload, error) {
	pr, pw := io.Pipe()
	dumped := make(chan error, 1)
	go func() {
		err := j.e.Nix.DumpPath(ctx, info.Path, pw)
		pw.CloseWithError(err)
		dumped <- err
	}()
	meta := worker.UploadMeta{References: info.References, Deriver: info.Deriver, CA: info.CA}
	var (
		pu  *worker.PendingUpload
		err error
	)
	if async, ok := j.cache.(worker.AsyncUploader); ok {
		pu, err = async.StartUpload(ctx, j.id, info.Path, pr, meta)
	} else {
		err = j.cache.Upload(ctx, j.id, info.Path, pr, meta)
	}
	pr.CloseWithError(errors.New("upload ended"))
	if derr := <-dumped; err == nil && derr != nil {
		err = fmt.Errorf("dumping %s: %w", info.Path, derr)
		if pu != nil {
			pu.Wait(ctx) // frees it; the dump's failure fails the upload
			pu = nil
		}
	}
	return pu, err
}

// ensure makes paths and their runtime closures valid in the local store,
// pulling what is missing from the server's cache (docs/protocol/worker.md §7.3). The
// closure is found first: each round asks the cache (a Pull query) for
// the missing paths' metadata and adds their references that are missing
// too. Then every path's NAR streams from the session into the daemon
// (AddToStoreNar), a path only after the references it pulls, a few at a
// time. A path the cache does not have, or whose bytes do not match its
// metadata (its CA included), fails the job as InputsUnavailable naming
// it; an input-addressed path without a signature by a trusted key is
// never added (nix.ImportNAR) and fails the job as Transient.
func (j *job) ensure(ctx context.Context, paths []string) (pulled int, err error) {
	pulled, _, err = j.ensureCounting(ctx, paths)
	return pulled, err
}

// ensureCounting is ensure that also returns the compressed bytes pulled.
func (j *job) ensureCounting(ctx context.Context, paths []string) (pulled int, compressed uint64, err error) {
	// Pinned before they are looked for: a path found valid stays so.
	j.pin(ctx, paths...)
	want, err := j.missing(ctx, paths)
	if err != nil || len(want) == 0 {
		return 0, 0, err
	}
	start := time.Now()
	queried := map[string]bool{}
	var pulls []pullItem
	for round := 0; len(want) > 0; round++ {
		if round == pullRounds {
			return 0, 0, worker.Fail(wire.FailureTransient, fmt.Errorf("closure of %d paths did not converge in %d rounds", len(paths), pullRounds))
		}
		for _, p := range want {
			queried[p] = true
		}
		entries, err := j.cache.Query(ctx, j.id, want, wire.QueryPull)
		if err != nil {
			return 0, 0, worker.Fail(wire.FailureTransient, fmt.Errorf("pull query: %w", err))
		}
		byPath := map[string]wire.CachedPath{}
		for _, e := range entries {
			byPath[e.Path] = e
		}
		var uncached []string
		for _, p := range want {
			if e, ok := byPath[p]; !ok || !e.Cached || e.NarHash == nil {
				uncached = append(uncached, p)
			}
		}
		if len(uncached) > 0 {
			return 0, 0, &worker.JobError{Kind: wire.FailureInputsUnavailable, MissingPaths: uncached,
				Err: fmt.Errorf("not in the cache: %s", strings.Join(uncached, ", "))}
		}
		var next []string
		for _, p := range want {
			e := byPath[p]
			item := pullItem{NarImport: nix.NarImport{StorePath: p, NarHash: *e.NarHash}, fileHash: e.FileHash, fileSize: e.FileSize}
			if e.NarSize != nil {
				item.NarSize = int64(*e.NarSize)
			}
			if e.FileSize != nil {
				compressed += *e.FileSize
			}
			if e.Deriver != nil {
				item.Deriver = fullPath(*e.Deriver)
			}
			if e.CA != nil {
				item.CA = *e.CA
			}
			if e.Signatures != nil {
				item.Signatures = *e.Signatures
			}
			if e.References != nil {
				for _, ref := range *e.References {
					ref = fullPath(ref)
					item.References = append(item.References, ref)
					if !queried[ref] {
						queried[ref] = true
						next = append(next, ref)
					}
				}
			}
			pulls = append(pulls, item)
		}
		if want, err = j.missing(ctx, next); err != nil {
			return 0, 0, err
		}
	}
	j.log.Info("pulling paths", "paths", len(pulls), "compressed_bytes", compressed)
	// Each pulled path is pinned before it is imported: until its
	// referrers are in, nothing else holds it but the temporary root of
	// a daemon connection that a collection may close.
	pinned := make([]string, len(pulls))
	for i, it := range pulls {
		pinned[i] = it.StorePath
	}
	j.pin(ctx, pinned...)
	if err := j.pullAll(ctx, pulls); err != nil {
		return 0, 0, err
	}
	j.log.Info("pulled paths", "paths", len(pulls), "took", time.Since(start).Round(time.Millisecond))
	return len(pulls), compressed, nil
}

// importParallel is how many pulled paths stream into the store at once
// (docs/protocol/cache.md §3.1: at most 8); each holds a daemon connection meanwhile.
const importParallel = 4

// pullRestarts is how often one path's import starts again after the
// server restarted its stream with another object.
const pullRestarts = 2

// pullItem is a path to pull: its import metadata and what the cache
// says of its compressed object.
type pullItem struct {
	nix.NarImport
	fileHash *string
	fileSize *uint64
}

// pullAll streams items into the store, each after the items it
// references (Nix registers a path only once its references are valid),
// up to importParallel at a time. The first failure cancels the rest.
func (j *job) pullAll(ctx context.Context, items []pullItem) error {
	index := make(map[string]int, len(items))
	for i, it := range items {
		index[it.StorePath] = i
	}
	waiting := make([]int, len(items))     // references not imported yet
	referrers := make([][]int, len(items)) // items referencing each
	var ready []int
	for i, it := range items {
		for _, ref := range slices.Compact(slices.Sorted(slices.Values(it.References))) {
			if r, ok := index[ref]; ok && r != i {
				waiting[i]++
				referrers[r] = append(referrers[r], i)
			}
		}
		if waiting[i] == 0 {
			ready = append(ready, i)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(items))
	running, done := 0, 0
	var first error
	for done < len(items) {
		for first == nil && running < importParallel && len(ready) > 0 {
			i := ready[0]
			ready = ready[1:]
			running++
			go func() { results <- result{i, j.pullOne(ctx, items[i])} }()
		}
		if running == 0 {
			if first != nil {
				return first
			}
			return worker.Fail(wire.FailureTransient, fmt.Errorf("%d pulled paths reference each other in a cycle", len(items)-done))
		}
		r := <-results
		running--
		done++
		if r.err != nil {
			if first == nil {
				first = r.err
				cancel()
			}
			continue
		}
		for _, k := range referrers[r.i] {
			if waiting[k]--; waiting[k] == 0 {
				ready = append(ready, k)
			}
		}
	}
	return first
}

// pullOne streams one path from the cache into the store, unless it
// became valid meanwhile (another job of this worker pulled it).
func (j *job) pullOne(ctx context.Context, it pullItem) error {
	for attempt := 0; ; attempt++ {
		if valid, err := j.e.Nix.ValidPaths(ctx, it.StorePath); err != nil {
			return worker.Fail(wire.FailureTransient, fmt.Errorf("checking the local store: %w", err))
		} else if len(valid) == 1 {
			return nil
		}
		nar, err := j.cache.OpenNar(ctx, j.id, it.StorePath)
		if err != nil {
			return classifyPull(ctx, it.StorePath, err)
		}
		obj := &objectCheck{r: nar, path: it.StorePath, h: sha256.New(), want: it.fileHash, size: it.fileSize}
		err = j.e.Nix.ImportNAR(ctx, it.NarImport, obj)
		nar.Close()
		if errors.Is(err, worker.ErrPullRestarted) && attempt < pullRestarts {
			j.log.Info("the cache restarted a NAR stream; importing again", "path", it.StorePath)
			continue
		}
		return classifyPull(ctx, it.StorePath, err)
	}
}

// objectCheck passes a pulled compressed object through and, at its end,
// fails the read unless its size and hash match the cache's entry (the
// import then stops short, so nothing is added).
type objectCheck struct {
	r    io.Reader
	path string
	h    hash.Hash
	n    uint64
	want *string
	size *uint64
}

// objectMismatchError: the compressed object differs from its cache entry.
type objectMismatchError struct{ path, message string }

func (e *objectMismatchError) Error() string {
	return fmt.Sprintf("pulled %s: %s", e.path, e.message)
}

func (o *objectCheck) Read(p []byte) (int, error) {
	n, err := o.r.Read(p)
	o.h.Write(p[:n])
	o.n += uint64(n)
	if o.size != nil && o.n > *o.size {
		return 0, &objectMismatchError{o.path, fmt.Sprintf("more than the %d bytes the cache says", *o.size)}
	}
	if err == io.EOF {
		if o.size != nil && o.n != *o.size {
			return n, &objectMismatchError{o.path, fmt.Sprintf("%d bytes, the cache says %d", o.n, *o.size)}
		}
		if sum := "sha256:" + nixbase32.Encode(o.h.Sum(nil)); o.want != nil && sum != *o.want {
			return n, &objectMismatchError{o.path, fmt.Sprintf("file hash %s, the cache says %s", sum, *o.want)}
		}
	}
	return n, err
}

// missing returns which of paths the local store lacks.
func (j *job) missing(ctx context.Context, paths []string) ([]string, error) {
	paths = slices.Compact(slices.Sorted(slices.Values(paths)))
	if len(paths) == 0 {
		return nil, nil
	}
	valid, err := j.e.Nix.ValidPaths(ctx, paths...)
	if err != nil {
		return nil, worker.Fail(wire.FailureTransient, fmt.Errorf("checking the local store: %w", err))
	}
	have := make(map[string]bool, len(valid))
	for _, p := range valid {
		have[p] = true
	}
	return slices.DeleteFunc(paths, func(p string) bool { return have[p] }), nil
}

// classifyPull turns a failed pull of path into a job failure: what the
// cache lacks, or sent wrong, is InputsUnavailable (the server demotes it
// and builds it again); the rest is Transient. A path no key this worker
// trusts signed is Transient too: the cache's object is not at fault (a
// reference server would delete it on InputsUnavailable), this worker
// lacks the key, and another worker may have it.
func classifyPull(ctx context.Context, path string, err error) error {
	var (
		unavailable *worker.NarUnavailableError
		object      *objectMismatchError
		nar         *nix.NarMismatchError
		untrusted   *nix.UntrustedPathError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &untrusted):
		return worker.Fail(wire.FailureTransient, err)
	case errors.As(err, &unavailable):
		return &worker.JobError{Kind: wire.FailureInputsUnavailable, MissingPaths: unavailable.Paths, Err: err}
	case errors.As(err, &object), errors.As(err, &nar):
		return &worker.JobError{Kind: wire.FailureInputsUnavailable, MissingPaths: []string{path}, Err: err}
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return worker.Fail(wire.FailureTransient, fmt.Errorf("importing %s: %w", path, err))
}

// fullPath accepts a store path or its base name.
func fullPath(p string) string {
	if p == "" || strings.HasPrefix(p, "/") {
		return p
	}
	return storeDir + path.Base(p)
}
