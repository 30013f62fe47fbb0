package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"gradient.dev/gradient/wire"
)

// NAR pulls over the session (docs/protocol/cache.md §3.2): a NarRequest names a path;
// the server answers NarStreamHeader and NarPush chunks, or
// NarUnavailable, or NarAbort (then the worker resumes with
// NarRequestResume from the bytes it has). The chunks go into a bounded
// buffer that the pull's reader drains, normally straight into the Nix
// daemon's AddToStoreNar; nothing is written to disk.
//
// The session's dispatch goroutine only copies a chunk into the buffer
// and never waits for the reader. When the reader falls behind and the
// buffer is full, the chunks that do not fit are dropped; once the reader
// has drained the buffer and the server's stream has ended, the reader
// asks for the rest with NarRequestResume from the bytes it has (the
// protocol's own resume, so a stalled import costs bandwidth, never the
// session or memory).

const (
	// pullResumes is how often one path's stream is resumed after NarAbort.
	pullResumes = 3
	// PullIdleTimeout fails a pull that received nothing for this long.
	PullIdleTimeout = 120 * time.Second
	// PullBufferBytes bounds the compressed bytes one pull holds for its
	// reader (16 chunks of 512 KiB; an empty buffer takes one chunk of
	// any size).
	PullBufferBytes = 8 << 20
	// pullOverflows is how often one path's buffer may overflow (each
	// time the rest of the object is asked for again) before the pull
	// fails.
	pullOverflows = 32
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

// ErrPullRestarted: the server restarted a stream from byte 0 with a
// different object (its stream token changed) after part of it was read.
// Bytes handed to the reader cannot be taken back: the caller starts the
// path's import again with a new pull.
var ErrPullRestarted = errors.New("NAR pull: the server restarted the stream with a different object")

// NarStream is one path's pull: an io.ReadCloser of its compressed (zstd)
// object, in order. Read fails with a *NarUnavailableError when the
// server has no object, with ErrPullRestarted (see there), or when
// nothing arrived for the idle timeout. Close ends the pull.
type NarStream struct {
	c       *CacheClient
	ctx     context.Context
	key     pullKey
	started time.Time
	idle    time.Duration
	limit   int
	wake    chan struct{} // buffered by one: a wake-up is never lost

	mu       sync.Mutex
	chunks   [][]byte // accepted, not yet read
	buffered int
	next     uint64 // offset of the next byte to accept
	total    uint64
	token    string
	arrived  time.Time // last chunk, a resume sent, or the request
	final    bool      // every byte accepted
	// dropping: the buffer overflowed and chunks are dropped until the
	// reader drained it and the server's stream ended (ended).
	dropping, ended bool
	// resumed: a resume was sent, so chunks of an earlier stream beyond
	// next may still arrive; they are dropped, not a protocol error.
	resumed     bool
	aborts      int
	overflows   int
	err         error
	unavailable string
	closed      bool
}

type pullKey struct{ jobID, path string }

// OpenNar starts pulling path's compressed NAR object for the job. The
// stream is the caller's to close; ctx bounds its reads.
func (c *CacheClient) OpenNar(ctx context.Context, jobID, path string) (io.ReadCloser, error) {
	now := time.Now()
	s := &NarStream{c: c, ctx: ctx, key: pullKey{jobID, path}, started: now, arrived: now,
		idle: c.pullIdleTimeout(), limit: c.pullBufferBytes(), wake: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.pulls[s.key] != nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("pull %s: already being pulled by this job", path)
	}
	c.pulls[s.key] = s
	c.mu.Unlock()
	if err := c.send(&wire.NarRequest{JobID: jobID, Paths: []string{path}}); err != nil {
		s.Close()
		return nil, fmt.Errorf("NAR request for %s: %w", path, err)
	}
	return s, nil
}

func (c *CacheClient) pullIdleTimeout() time.Duration {
	if c.PullIdleTimeout > 0 {
		return c.PullIdleTimeout
	}
	return PullIdleTimeout
}

func (c *CacheClient) pullBufferBytes() int {
	if c.PullBufferBytes > 0 {
		return c.PullBufferBytes
	}
	return PullBufferBytes
}

// Read returns the object's next bytes.
func (s *NarStream) Read(p []byte) (int, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return 0, errors.New("NAR pull: read after close")
		}
		if len(s.chunks) > 0 {
			n := copy(p, s.chunks[0])
			if n == len(s.chunks[0]) {
				s.chunks[0] = nil
				s.chunks = s.chunks[1:]
			} else {
				s.chunks[0] = s.chunks[0][n:]
			}
			s.buffered -= n
			s.mu.Unlock()
			return n, nil
		}
		switch {
		case s.err != nil:
			err := s.err
			s.mu.Unlock()
			return 0, fmt.Errorf("NAR pull of %s: %w", s.key.path, err)
		case s.unavailable != "":
			err := &NarUnavailableError{Paths: []string{s.key.path}, Reasons: []string{s.unavailable}}
			s.mu.Unlock()
			return 0, err
		case s.final:
			s.mu.Unlock()
			return 0, io.EOF
		case s.dropping && s.ended:
			// Drained after an overflow, and the server is done with the
			// stream: ask for the rest.
			s.dropping, s.ended, s.resumed = false, false, true
			s.arrived = time.Now()
			resume := &wire.NarRequestResume{JobID: s.key.jobID, StorePath: s.key.path, ReceivedBytes: s.next, StreamToken: s.token}
			s.mu.Unlock()
			if err := s.c.send(resume); err != nil {
				s.fail(err)
			}
			continue
		}
		wait := s.idle - time.Since(s.arrived)
		s.mu.Unlock()
		if wait <= 0 {
			return 0, fmt.Errorf("NAR pull of %s: nothing received for %s", s.key.path, s.idle)
		}
		t := time.NewTimer(wait)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return 0, s.ctx.Err()
		case <-s.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// Close ends the pull; chunks still arriving are left to the session.
func (s *NarStream) Close() error {
	s.c.mu.Lock()
	if s.c.pulls[s.key] == s {
		delete(s.c.pulls, s.key)
	}
	s.c.mu.Unlock()
	s.mu.Lock()
	s.closed, s.chunks, s.buffered = true, nil, 0
	s.mu.Unlock()
	return nil
}

func (s *NarStream) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.notify()
}

func (s *NarStream) notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// handlePull consumes a NAR stream message; false when no pull waits for
// it. Runs on the dispatch goroutine: it copies, it never blocks.
func (c *CacheClient) handlePull(jobID, path string, m wire.ServerMessage) bool {
	c.mu.Lock()
	s := c.pulls[pullKey{jobID, path}]
	c.mu.Unlock()
	if s == nil {
		return false
	}
	var resume *wire.NarRequestResume
	s.mu.Lock()
	if !s.closed && !s.final && s.err == nil && s.unavailable == "" {
		resume = s.take(m)
	}
	s.mu.Unlock()
	if resume != nil {
		if err := c.send(resume); err != nil {
			s.fail(err)
		}
	}
	s.notify()
	return true
}

// take applies m to the stream (s.mu held); a resume to send, or nil.
func (s *NarStream) take(m wire.ServerMessage) *wire.NarRequestResume {
	switch m := m.(type) {
	case *wire.NarStreamHeader:
		if s.token != "" && m.StreamToken != s.token && s.next > 0 {
			s.err = ErrPullRestarted
			break
		}
		s.total, s.token = m.TotalBytes, m.StreamToken
	case *wire.NarPush:
		// Any chunk shows the server is sending, also one dropped
		// while a full buffer waits for the reader.
		s.arrived = time.Now()
		data, offset := m.Data, m.Offset
		end := offset + uint64(len(data))
		switch {
		case offset > s.next:
			if !s.dropping && !s.resumed {
				s.err = fmt.Errorf("chunk at offset %d, have %d bytes", offset, s.next)
			}
			// Beyond a dropped part: the stream that overflowed, or an
			// earlier one still running.
			if s.dropping && m.IsFinal {
				s.ended = true
			}
			return nil
		case end < s.next || (end == s.next && !m.IsFinal):
			// Bytes already taken (a resume that started earlier, or a
			// stream still running beside the resumed one); a final
			// chunk ending here still ends the object.
			return nil
		}
		data = data[s.next-offset:] // the same object (same token): skip what was taken
		// An empty buffer takes any chunk: one larger than the limit
		// must not overflow forever.
		if len(data) > 0 && (s.dropping || (s.buffered > 0 && s.buffered+len(data) > s.limit)) {
			if !s.dropping {
				s.overflows++
				if s.overflows > pullOverflows {
					s.err = fmt.Errorf("the import fell behind %d times", s.overflows)
					return nil
				}
				s.dropping = true
				if s.c.Overflowed != nil {
					s.c.Overflowed()
				}
			}
			if m.IsFinal {
				s.ended = true
			}
			return nil
		}
		if len(data) > 0 {
			s.chunks = append(s.chunks, append([]byte(nil), data...))
			s.buffered += len(data)
			s.next += uint64(len(data))
			if s.c.Moved != nil {
				s.c.Moved(true, len(data))
			}
		}
		if m.IsFinal {
			if s.total != 0 && s.next != s.total {
				s.err = fmt.Errorf("stream ended at %d of %d bytes", s.next, s.total)
				return nil
			}
			s.final = true
			if s.c.Transferred != nil {
				s.c.Transferred(true, s.next, time.Since(s.started))
			}
		}
	case *wire.NarUnavailable:
		s.unavailable = m.Reason
		if s.unavailable == "" {
			s.unavailable = "not in the cache"
		}
	case *wire.NarAbort:
		if s.dropping {
			s.ended = true // the reader resumes once it drained the buffer
			return nil
		}
		if s.aborts >= pullResumes {
			s.err = fmt.Errorf("server aborted the stream %d times, last: %s", s.aborts+1, m.Reason)
			return nil
		}
		s.aborts++
		s.resumed = true
		s.arrived = time.Now()
		return &wire.NarRequestResume{JobID: s.key.jobID, StorePath: s.key.path, ReceivedBytes: s.next, StreamToken: s.token}
	}
	return nil
}

// ErrKnownDerivationsTimeout: no KnownDerivations reply in time.
var ErrKnownDerivationsTimeout = errors.New("known-derivations query: no reply in time")

// KnownDerivations asks which of drvPaths the server already recorded
// (docs/protocol/worker.md §6.3, closure walk): the walk need not descend into them.
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
