package worker

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/wire"
)

// NAR pulls over the session (CACHE.md §3.2): one NarRequest names the
// paths; per path the server answers NarStreamHeader and NarPush chunks,
// or NarUnavailable, or NarAbort (then the worker resumes with
// NarRequestResume from the bytes it has). Chunks are written to their
// file as they arrive, on the session's dispatch goroutine, so a pull
// holds no more than one chunk in memory.

const (
	// pullResumes is how often one path's stream is resumed after NarAbort.
	pullResumes = 3
	// PullIdleTimeout fails a pull that received nothing for this long.
	PullIdleTimeout = 120 * time.Second
)

// NarUnavailableError lists the paths the server has no object for: the
// job fails as InputsUnavailable with them.
type NarUnavailableError struct {
	Paths   []string
	Reasons []string
}

func (e *NarUnavailableError) Error() string {
	return fmt.Sprintf("%d path(s) unavailable in the cache: %s (%s)", len(e.Paths), strings.Join(e.Paths, ", "), strings.Join(e.Reasons, "; "))
}

// PulledNar is a pulled object: the file holding the compressed NAR and
// its SHA-256 (sha256:<nix32>), to check against the cache's file hash.
type PulledNar struct {
	File     string
	FileHash string
}

// narPull is the state of one path's stream.
type narPull struct {
	jobID, path string
	started     time.Time // the NarRequest
	file        *os.File
	// hash follows the bytes written; a stream restarted part-way cannot
	// be hashed that way, so rehash asks for a pass over the file.
	hash        hash.Hash
	rehash      bool
	total       uint64
	received    uint64
	token       string
	resumes     int
	done        bool
	err         error // set with done on failure
	unavailable string
}

type pullKey struct{ jobID, path string }

// Pull fetches the compressed (zstd) NAR objects of paths into files in
// dir, named after the paths' hashes, and returns them with their hashes
// by store path.
// Paths the server has no object for fail the call with a
// *NarUnavailableError (after every other path finished). The files are
// the caller's to remove.
func (c *CacheClient) Pull(ctx context.Context, jobID string, paths []string, dir string) (map[string]PulledNar, error) {
	paths = slices.Compact(slices.Sorted(slices.Values(paths)))
	if len(paths) == 0 {
		return map[string]PulledNar{}, nil
	}
	pulls := make([]*narPull, 0, len(paths))
	cleanup := func() {
		c.mu.Lock()
		for _, p := range pulls {
			delete(c.pulls, pullKey{p.jobID, p.path})
		}
		c.mu.Unlock()
		for _, p := range pulls {
			p.file.Close()
		}
	}
	c.mu.Lock()
	for _, path := range paths {
		if c.pulls[pullKey{jobID, path}] != nil {
			c.mu.Unlock()
			cleanup()
			return nil, fmt.Errorf("pull %s: already being pulled by this job", path)
		}
		f, err := os.CreateTemp(dir, filepath.Base(path)+"-*.nar.zst")
		if err != nil {
			c.mu.Unlock()
			cleanup()
			return nil, fmt.Errorf("pull %s: %w", path, err)
		}
		p := &narPull{jobID: jobID, path: path, started: time.Now(), file: f, hash: sha256.New()}
		pulls = append(pulls, p)
		c.pulls[pullKey{jobID, path}] = p
	}
	c.mu.Unlock()
	failed := true
	defer func() {
		cleanup()
		if failed {
			for _, p := range pulls {
				os.Remove(p.file.Name())
			}
		}
	}()

	if err := c.send(&wire.NarRequest{JobID: jobID, Paths: paths}); err != nil {
		return nil, fmt.Errorf("NAR request: %w", err)
	}
	// Wait for every stream to end, failing when none moved for too long.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastProgress, lastBytes := time.Now(), uint64(0)
	for {
		c.mu.Lock()
		var pending int
		var bytes uint64
		for _, p := range pulls {
			bytes += p.received
			if !p.done {
				pending++
			}
		}
		c.mu.Unlock()
		if pending == 0 {
			break
		}
		if bytes != lastBytes {
			lastBytes, lastProgress = bytes, time.Now()
		}
		if time.Since(lastProgress) > c.pullIdleTimeout() {
			return nil, fmt.Errorf("NAR pull of %d path(s): nothing received for %s", pending, c.pullIdleTimeout())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.pullProgress:
		case <-tick.C:
		}
	}

	files := make(map[string]PulledNar, len(pulls))
	var missing NarUnavailableError
	for _, p := range pulls {
		switch {
		case p.unavailable != "":
			missing.Paths = append(missing.Paths, p.path)
			missing.Reasons = append(missing.Reasons, p.unavailable)
		case p.err != nil:
			return nil, fmt.Errorf("NAR pull of %s: %w", p.path, p.err)
		default:
			sum, err := p.fileHash()
			if err != nil {
				return nil, fmt.Errorf("NAR pull of %s: %w", p.path, err)
			}
			files[p.path] = PulledNar{File: p.file.Name(), FileHash: sum}
		}
	}
	if len(missing.Paths) > 0 {
		return nil, &missing
	}
	failed = false
	return files, nil
}

func (c *CacheClient) pullIdleTimeout() time.Duration {
	if c.PullIdleTimeout > 0 {
		return c.PullIdleTimeout
	}
	return PullIdleTimeout
}

// handlePull consumes a NAR stream message; false when no pull waits for
// it. Runs on the dispatch goroutine: it writes, it never blocks on the
// network.
func (c *CacheClient) handlePull(jobID, path string, m wire.ServerMessage) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.pulls[pullKey{jobID, path}]
	if p == nil || p.done {
		return p != nil
	}
	switch m := m.(type) {
	case *wire.NarStreamHeader:
		p.total, p.token = m.TotalBytes, m.StreamToken
	case *wire.NarPush:
		if m.Offset != p.received {
			if m.Offset > p.received {
				p.fail(fmt.Errorf("chunk at offset %d, have %d bytes", m.Offset, p.received))
				break
			}
			// The server restarted the stream (token mismatch): start over.
			if err := p.file.Truncate(int64(m.Offset)); err != nil {
				p.fail(err)
				break
			}
			p.received = m.Offset
			if m.Offset == 0 {
				p.hash.Reset()
			} else {
				p.rehash = true
			}
		}
		if _, err := p.file.WriteAt(m.Data, int64(m.Offset)); err != nil {
			p.fail(err)
			break
		}
		p.hash.Write(m.Data)
		p.received += uint64(len(m.Data))
		if c.Moved != nil {
			c.Moved(true, len(m.Data))
		}
		if m.IsFinal {
			if p.total != 0 && p.received != p.total {
				p.fail(fmt.Errorf("stream ended at %d of %d bytes", p.received, p.total))
				break
			}
			p.done = true
			if c.Transferred != nil {
				c.Transferred(true, p.received, time.Since(p.started))
			}
		}
	case *wire.NarUnavailable:
		p.unavailable = m.Reason
		if p.unavailable == "" {
			p.unavailable = "not in the cache"
		}
		p.done = true
	case *wire.NarAbort:
		if p.resumes >= pullResumes {
			p.fail(fmt.Errorf("server aborted the stream %d times, last: %s", p.resumes+1, m.Reason))
			break
		}
		p.resumes++
		if err := c.send(&wire.NarRequestResume{JobID: jobID, StorePath: path, ReceivedBytes: p.received, StreamToken: p.token}); err != nil {
			p.fail(err)
		}
	}
	select {
	case c.pullProgress <- struct{}{}:
	default:
	}
	return true
}

// fileHash is the object's sha256:<nix32>, from the stream as it was
// written, or read back when the stream restarted part-way.
func (p *narPull) fileHash() (string, error) {
	if p.rehash {
		p.hash.Reset()
		if _, err := io.Copy(p.hash, io.NewSectionReader(p.file, 0, int64(p.received))); err != nil {
			return "", err
		}
	}
	return "sha256:" + nixbase32.Encode(p.hash.Sum(nil)), nil
}

func (p *narPull) fail(err error) {
	p.err, p.done = err, true
}

// ErrKnownDerivationsTimeout: no KnownDerivations reply in time.
var ErrKnownDerivationsTimeout = errors.New("known-derivations query: no reply in time")

// KnownDerivations asks which of drvPaths the server already recorded
// (JOBS.md, closure walk): the walk need not descend into them.
func (c *CacheClient) KnownDerivations(ctx context.Context, jobID string, drvPaths []string) ([]string, error) {
	if len(drvPaths) == 0 {
		return nil, nil
	}
	id := fmt.Sprintf("%s-k%d", c.queryPrefix, c.querySeq.Add(1))
	m, err := c.ask(ctx, id, &wire.QueryKnownDerivations{JobID: jobID, QueryID: id, DrvPaths: drvPaths})
	switch {
	case errors.Is(err, errNoReply):
		return nil, ErrKnownDerivationsTimeout
	case err != nil:
		return nil, fmt.Errorf("known-derivations query: %w", err)
	}
	if kd, ok := m.(*wire.KnownDerivations); ok {
		return kd.Known, nil
	}
	return nil, fmt.Errorf("known-derivations query %s: unexpected reply %s", id, m.WireName())
}
