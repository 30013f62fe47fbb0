package nixexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/worker"
)

const (
	// uploadParallel is how many paths of one job upload at once
	// (WORKER.md §5): from the request until UploadFinished is sent.
	uploadParallel = 4
	// uploadPending is how many uploads of one job may be sent and wait
	// for the server's commit (CACHE.md §4.3: the small-upload window),
	// so the server commits many at once (their fsyncs share journal
	// commits) instead of one per round trip.
	uploadPending = 128
	// pullRounds caps closure expansion (WORKER.md §7.3).
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
		// On a failed query every path counts as uncached (WORKER.md §5).
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
		wg    sync.WaitGroup
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
// pulling what is missing from the server's cache (WORKER.md §7.3): each
// round asks where the missing paths are, pulls them, and adds their
// references that are missing too; everything is imported at the end (Nix
// orders the import by references). A path the cache does not have fails
// the job as InputsUnavailable naming it.
func (j *job) ensure(ctx context.Context, paths []string) (pulled int, err error) {
	pulled, _, err = j.ensureCounting(ctx, paths)
	return pulled, err
}

// ensureCounting is ensure that also returns the compressed bytes pulled.
func (j *job) ensureCounting(ctx context.Context, paths []string) (pulled int, compressed uint64, err error) {
	want, err := j.missing(ctx, paths)
	if err != nil || len(want) == 0 {
		return 0, 0, err
	}
	dir, cleanup, err := j.tempDir()
	if err != nil {
		return 0, 0, err
	}
	defer cleanup()
	start := time.Now()
	queried := map[string]bool{}
	var imports []nix.NarImport
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
		files, err := j.cache.Pull(ctx, j.id, want, dir)
		if err != nil {
			return 0, 0, classifyPull(err)
		}
		var next []string
		for _, p := range want {
			e := byPath[p]
			if e.FileHash != nil && files[p].FileHash != *e.FileHash {
				return 0, 0, &worker.JobError{Kind: wire.FailureInputsUnavailable, MissingPaths: []string{p},
					Err: fmt.Errorf("pulled %s: file hash %s, the cache says %s", p, files[p].FileHash, *e.FileHash)}
			}
			item := nix.NarImport{StorePath: p, NarHash: *e.NarHash, NarZst: files[p].File}
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
			imports = append(imports, item)
		}
		if want, err = j.missing(ctx, next); err != nil {
			return 0, 0, err
		}
	}
	j.log.Info("importing pulled paths", "paths", len(imports), "compressed_bytes", compressed)
	if err := j.e.Nix.ImportNARs(ctx, imports); err != nil {
		return 0, 0, worker.Fail(wire.FailureTransient, fmt.Errorf("importing pulled paths: %w", err))
	}
	for _, it := range imports {
		j.pin(ctx, it.StorePath)
	}
	j.log.Info("pulled paths", "paths", len(imports), "took", time.Since(start).Round(time.Millisecond))
	return len(imports), compressed, nil
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

func classifyPull(err error) error {
	var unavailable *worker.NarUnavailableError
	if errors.As(err, &unavailable) {
		return &worker.JobError{Kind: wire.FailureInputsUnavailable, MissingPaths: unavailable.Paths, Err: err}
	}
	return worker.Fail(wire.FailureTransient, err)
}

// fullPath accepts a store path or its base name.
func fullPath(p string) string {
	if p == "" || strings.HasPrefix(p, "/") {
		return p
	}
	return storeDir + path.Base(p)
}
