package worker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// The worker's side of the binary-cache protocol (docs/protocol/cache.md §2, §4):
// CacheQuery in all three modes and NAR uploads through UploadRequest.
// The session loop feeds every ServerMessage to HandleMessage, which
// consumes the replies of requests this client has outstanding; the
// client sends through the narrow send function (WorkerSession.Send).

// Sizes and times of docs/protocol/wire.md §9 used by the cache client.
const (
	// CacheQueryMaxPaths is the most paths one CacheQuery names.
	CacheQueryMaxPaths = 1000
	// CacheQueryWindow is how many queries of one batch are in flight.
	CacheQueryWindow = 4
	// CacheQueryTimeout is how long the worker waits for CacheStatus or
	// CacheError.
	CacheQueryTimeout = 75 * time.Second
	// uploadAttempts is the most UploadRequests for one path (Retry).
	uploadAttempts = 3
	// uploadMemoryBytes: compressed NARs up to this size stay in memory,
	// larger ones are spooled to a temporary file.
	uploadMemoryBytes = 8 << 20
)

// ErrCacheQueryTimeout is returned when no reply came in QueryTimeout.
var ErrCacheQueryTimeout = errors.New("cache query: no reply in time")

// ErrUploadRejected marks an upload the server rejected (or one that kept
// failing with Retry): the job normally fails as Transient.
var ErrUploadRejected = errors.New("upload rejected")

// CacheQueryError is a CacheError reply: the cache state is unknown. It
// must never be read as "not cached"; the caller retries.
type CacheQueryError struct {
	QueryID string
	Message string
}

func (e *CacheQueryError) Error() string {
	return "cache query " + e.QueryID + " failed: " + e.Message
}

// UploadMeta is what the local store knows of an uploaded path.
type UploadMeta struct {
	// References are the store paths the NAR refers to (full paths or
	// base names; the server accepts both).
	References []string
	// Deriver and CA are optional ("" for none).
	Deriver string
	CA      string
}

// CacheClient runs cache queries and NAR uploads over one worker session.
// It is safe for concurrent use.
type CacheClient struct {
	send func(wire.ClientMessage) error

	// QueryTimeout bounds the wait for one query's reply (0 means
	// CacheQueryTimeout). Set it before the first use.
	QueryTimeout time.Duration
	// TempDir holds spooled compressed NARs ("" means os.TempDir()).
	TempDir string
	// PullIdleTimeout fails a NAR pull that received nothing for this
	// long (0 means PullIdleTimeout).
	PullIdleTimeout time.Duration
	// PullBufferBytes bounds the compressed bytes a pull buffers for its
	// reader (0 means PullBufferBytes).
	PullBufferBytes int
	// Moved, when set, counts the NAR bytes of pulls (download) and
	// uploads as they pass; it must not block.
	Moved func(download bool, n int)
	// Transferred, when set, is told of each NAR pulled whole (per path)
	// and each upload that sent bytes: the compressed bytes moved and the
	// time from the request to the end, resumes and retries included. It
	// must not block.
	Transferred func(download bool, bytes uint64, elapsed time.Duration)
	// Overflowed, when set, is told each time a pull's buffer overflows
	// (its reader fell behind; the rest is asked for again). It must not
	// block.
	Overflowed func()

	// HTTPClient makes presigned transfers (nil: a client that refuses
	// link-local and metadata addresses and bounds redirects; a
	// replacement should do the same).
	HTTPClient *http.Client
	// PresignedIdleTimeout retries a presigned request whose bytes
	// stopped moving for this long (0 means PresignedIdleTimeout).
	PresignedIdleTimeout time.Duration
	// PresignedRetryDelay is the first wait before a presigned request
	// is tried again, doubling up to 8 s (0 means 250 ms).
	PresignedRetryDelay time.Duration
	// Presigned, when set, is told of each presigned request's end: op
	// "put", "part" (of a multipart upload) or "get", outcome "ok", "retry", "resume" or "failed". It
	// must not block.
	Presigned func(op, outcome string)
	// PresignedMoved, when set, counts the NAR bytes of presigned
	// transfers as they pass (Moved counts only the session's). It must
	// not block.
	PresignedMoved func(download bool, n int)
	// Log gets the presigned transfers' retries and fallbacks (nil: none).
	Log *slog.Logger

	queryPrefix string
	querySeq    atomic.Uint64
	requestSeq  atomic.Uint64

	mu      sync.Mutex
	queries map[string]chan wire.ServerMessage
	uploads map[uint64]chan wire.ServerMessage
	pulls   map[pullKey]*NarStream
}

// NewCacheClient returns a client that sends through send, normally
// (*session.WorkerSession).Send.
func NewCacheClient(send func(wire.ClientMessage) error) *CacheClient {
	var b [8]byte
	rand.Read(b[:])
	return &CacheClient{
		send:        send,
		queryPrefix: hex.EncodeToString(b[:]),
		queries:     map[string]chan wire.ServerMessage{},
		uploads:     map[uint64]chan wire.ServerMessage{},
		pulls:       map[pullKey]*NarStream{},
	}
}

// HandleMessage delivers a reply to the request waiting for it and
// reports whether it did. Messages of other kinds, and replies nobody
// waits for any more (a query that timed out, a cancelled upload), are
// left to the caller. It never blocks.
func (c *CacheClient) HandleMessage(m wire.ServerMessage) bool {
	switch m := m.(type) {
	case *wire.NarStreamHeader:
		return c.handlePull(m.JobID, m.StorePath, m)
	case *wire.NarPush:
		return c.handlePull(m.JobID, m.StorePath, m)
	case *wire.NarUnavailable:
		return c.handlePull(m.JobID, m.StorePath, m)
	case *wire.NarAbort:
		return c.handlePull(m.JobID, m.StorePath, m)
	}
	var ch chan wire.ServerMessage
	c.mu.Lock()
	switch m := m.(type) {
	case *wire.KnownDerivations:
		ch = c.queries[m.QueryID]
	case *wire.CacheStatus:
		ch = c.queries[m.QueryID]
	case *wire.CacheError:
		ch = c.queries[m.QueryID]
	case *wire.UploadGrant:
		ch = c.uploads[m.RequestID]
	case *wire.UploadCommitted:
		ch = c.uploads[m.RequestID]
	}
	c.mu.Unlock()
	if ch == nil {
		return false
	}
	select {
	case ch <- m:
	default:
		// A request gets at most a grant and a commit; a full channel
		// means a misbehaving server. Drop, but still consume.
	}
	return true
}

func (c *CacheClient) queryTimeout() time.Duration {
	if c.QueryTimeout > 0 {
		return c.QueryTimeout
	}
	return CacheQueryTimeout
}

// Query asks which of paths the caches hold (docs/protocol/cache.md §2). Paths are
// split into queries of at most CacheQueryMaxPaths, at most
// CacheQueryWindow in flight; the replies' entries are concatenated in
// the order of the queries. A CacheError fails the whole call with a
// *CacheQueryError, a missing reply with ErrCacheQueryTimeout.
func (c *CacheClient) Query(ctx context.Context, jobID string, paths []string, mode wire.QueryMode) ([]wire.CachedPath, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	n := (len(paths) + CacheQueryMaxPaths - 1) / CacheQueryMaxPaths
	results := make([][]wire.CachedPath, n)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
	)
	window := make(chan struct{}, CacheQueryWindow)
	var wg sync.WaitGroup
	for i := range n {
		select {
		case window <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		part := paths[i*CacheQueryMaxPaths : min((i+1)*CacheQueryMaxPaths, len(paths))]
		wg.Go(func() {
			defer func() { <-window }()
			r, err := c.queryOne(ctx, jobID, part, mode)
			if err != nil {
				// The first failure wins over the cancellations it causes.
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				cancel()
				return
			}
			results[i] = r
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []wire.CachedPath
	for _, r := range results {
		out = append(out, r...)
	}
	return out, nil
}

func (c *CacheClient) queryOne(ctx context.Context, jobID string, paths []string, mode wire.QueryMode) ([]wire.CachedPath, error) {
	id := fmt.Sprintf("%s-%d", c.queryPrefix, c.querySeq.Add(1))
	m, err := c.ask(ctx, id, &wire.CacheQuery{JobID: jobID, QueryID: id, Paths: paths, Mode: mode, NarSizes: []*uint64{}})
	switch {
	case errors.Is(err, errNoReply):
		return nil, fmt.Errorf("%w (query %s, %d paths)", ErrCacheQueryTimeout, id, len(paths))
	case err != nil:
		return nil, fmt.Errorf("cache query: %w", err)
	}
	switch m := m.(type) {
	case *wire.CacheStatus:
		return m.Cached, nil
	case *wire.CacheError:
		return nil, &CacheQueryError{QueryID: id, Message: m.Message}
	}
	return nil, fmt.Errorf("cache query %s: unexpected reply %s", id, m.WireName())
}

var errNoReply = errors.New("no reply in time")

// ask sends a query with ID id and waits for the reply HandleMessage
// routes to it, at most the query timeout (then errNoReply).
func (c *CacheClient) ask(ctx context.Context, id string, query wire.ClientMessage) (wire.ServerMessage, error) {
	ch := make(chan wire.ServerMessage, 1)
	c.mu.Lock()
	c.queries[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.queries, id)
		c.mu.Unlock()
	}()
	if err := c.send(query); err != nil {
		return nil, err
	}
	timer := time.NewTimer(c.queryTimeout())
	defer timer.Stop()
	select {
	case m := <-ch:
		return m, nil
	case <-timer.C:
		return nil, errNoReply
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// packedNar is a compressed NAR ready to upload, with its metadata.
type packedNar struct {
	data io.ReaderAt
	file *os.File // non-nil when spooled to disk
	meta wire.NarUploadMetadata
	sent uint64 // bytes relayed, over every attempt
}

func (p *packedNar) close() {
	if p.file != nil {
		p.file.Close()
		os.Remove(p.file.Name())
	}
}

// spool keeps written bytes in memory up to uploadMemoryBytes, then moves
// them to a temporary file.
type spool struct {
	dir  string
	buf  bytes.Buffer
	file *os.File
}

func (s *spool) Write(p []byte) (int, error) {
	if s.file == nil && s.buf.Len()+len(p) > uploadMemoryBytes {
		f, err := os.CreateTemp(s.dir, "nar-upload-*.zst")
		if err != nil {
			return 0, err
		}
		s.file = f
		if _, err := f.Write(s.buf.Bytes()); err != nil {
			return 0, err
		}
		s.buf = bytes.Buffer{}
	}
	if s.file != nil {
		return s.file.Write(p)
	}
	return s.buf.Write(p)
}

// pack compresses nar at NAR_ZSTD_LEVEL (narstore.Compress: pooled
// encoders, one goroutine each, so a resumed upload produces identical
// bytes), hashing and counting both the NAR and the compressed bytes.
func (c *CacheClient) pack(ctx context.Context, nar io.Reader, meta UploadMeta) (p *packedNar, err error) {
	sp := &spool{dir: c.TempDir}
	defer func() {
		if err != nil && sp.file != nil {
			sp.file.Close()
			os.Remove(sp.file.Name())
		}
	}()
	obj, err := narstore.Compress(ctx, sp, nar)
	if err != nil {
		return nil, fmt.Errorf("compressing the NAR: %w", err)
	}
	refs := meta.References
	if refs == nil {
		refs = []string{}
	}
	p = &packedNar{meta: wire.NarUploadMetadata{
		FileHash: obj.FileHashText(), FileSize: uint64(obj.FileSize),
		NarHash: obj.NarHashText(), NarSize: uint64(obj.NarSize), References: refs,
	}}
	if meta.Deriver != "" {
		p.meta.Deriver = &meta.Deriver
	}
	if meta.CA != "" {
		p.meta.CA = &meta.CA
	}
	if sp.file != nil {
		p.file, p.data = sp.file, sp.file
	} else {
		p.data = bytes.NewReader(sp.buf.Bytes())
	}
	return p, nil
}

// Upload compresses nar, the NAR serialisation of storePath, and uploads
// it (docs/protocol/cache.md §4): Skip grants end it at once, Passthrough grants relay
// the compressed bytes from the resume offset, Put and Multipart grants
// send them to the object store (presigned.go, §4.6). Retry outcomes start a new
// request, at most three in all; Rejected fails with ErrUploadRejected
// and the server's reason. Cancelling ctx sends UploadCancel. It is
// StartUpload and Wait.
func (c *CacheClient) Upload(ctx context.Context, jobID, storePath string, nar io.Reader, meta UploadMeta) error {
	pu, err := c.StartUpload(ctx, jobID, storePath, nar, meta)
	if err != nil {
		return err
	}
	return pu.Wait(ctx)
}

// AsyncUploader is a cache whose uploads can be sent without waiting for
// the server's commit (CacheClient): a job keeps its few transfers busy
// while many sent uploads wait for their commits (docs/protocol/cache.md §4.3: a slot
// is held until UploadFinished is sent, not through the commit).
type AsyncUploader interface {
	StartUpload(ctx context.Context, jobID, storePath string, nar io.Reader, meta UploadMeta) (*PendingUpload, error)
}

// PendingUpload is an upload whose bytes are sent (or that the server
// answered without them); Wait returns when the server committed it.
type PendingUpload struct {
	c                *CacheClient
	jobID, storePath string
	p                *packedNar
	started          time.Time
	attempts         int
	last             string         // the last Retry's reason
	attempt          *uploadAttempt // waiting for its UploadCommitted; nil when done
}

// StartUpload is the first half of Upload: it compresses nar, requests
// the upload and relays the bytes up to UploadFinished (retrying a Retry
// answered before that). The caller must call Wait, which returns when
// the server committed the object and frees what the upload holds.
func (c *CacheClient) StartUpload(ctx context.Context, jobID, storePath string, nar io.Reader, meta UploadMeta) (*PendingUpload, error) {
	p, err := c.pack(ctx, nar, meta)
	if err != nil {
		return nil, fmt.Errorf("upload %s: %w", storePath, err)
	}
	pu := &PendingUpload{c: c, jobID: jobID, storePath: storePath, p: p, started: time.Now()}
	if err := pu.send(ctx); err != nil {
		p.close()
		return nil, err
	}
	return pu, nil
}

// send runs requests until one waits for its commit or ends stored.
func (pu *PendingUpload) send(ctx context.Context) error {
	for pu.attempts < uploadAttempts {
		pu.attempts++
		a, retry, err := pu.c.sendAttempt(ctx, pu.jobID, pu.storePath, pu.p)
		switch {
		case err != nil:
			return fmt.Errorf("upload %s: %w", pu.storePath, err)
		case a != nil:
			pu.attempt = a
			return nil
		case retry == "":
			return nil // Skip, or committed before the bytes
		}
		pu.last = retry
	}
	return fmt.Errorf("upload %s: %w: %d attempts, last retry: %s", pu.storePath, ErrUploadRejected, uploadAttempts, pu.last)
}

// Wait waits for the server's commit, sending the upload again on Retry
// (three requests in all). Cancelling ctx sends UploadCancel.
func (pu *PendingUpload) Wait(ctx context.Context) error {
	defer pu.p.close()
	for pu.attempt != nil {
		a := pu.attempt
		pu.attempt = nil
		retry, err := pu.c.awaitCommit(ctx, a)
		if err != nil {
			return fmt.Errorf("upload %s: %w", pu.storePath, err)
		}
		if retry == "" {
			break
		}
		pu.last = retry
		if err := pu.send(ctx); err != nil {
			return err
		}
	}
	if pu.c.Transferred != nil && pu.p.sent > 0 {
		pu.c.Transferred(false, pu.p.sent, time.Since(pu.started))
	}
	return nil
}

// uploadAttempt is one UploadRequest the server holds.
type uploadAttempt struct {
	id uint64
	ch chan wire.ServerMessage
}

func (c *CacheClient) unregister(a *uploadAttempt) {
	c.mu.Lock()
	delete(c.uploads, a.id)
	c.mu.Unlock()
}

// uploadOutcome reads an UploadCommitted: "" and nil when stored, the
// reason of a Retry, or the Rejected error.
func uploadOutcome(m *wire.UploadCommitted) (string, error) {
	switch o := m.Outcome.(type) {
	case *wire.UploadOk:
		return "", nil
	case *wire.UploadRetry:
		return o.Reason, nil
	case *wire.UploadRejected:
		return "", fmt.Errorf("%w: %s", ErrUploadRejected, o.Reason)
	}
	return "", fmt.Errorf("unknown upload outcome %T", m.Outcome)
}

// sendAttempt runs one request up to UploadFinished: the attempt when it
// waits for its commit, or nil and "" when stored or skipped, the reason
// of a Retry outcome, or an error.
func (c *CacheClient) sendAttempt(ctx context.Context, jobID, storePath string, p *packedNar) (pending *uploadAttempt, retry string, err error) {
	a := &uploadAttempt{id: c.requestSeq.Add(1), ch: make(chan wire.ServerMessage, 4)}
	id := a.id
	c.mu.Lock()
	c.uploads[id] = a.ch
	c.mu.Unlock()
	// open: the server holds the request, so abandoning it needs a cancel.
	open := false
	defer func() {
		if pending != nil {
			return // awaitCommit owns the request now
		}
		if open && err != nil {
			c.send(&wire.UploadCancel{RequestID: id})
		}
		c.unregister(a)
	}()
	if err := c.send(&wire.UploadRequest{JobID: jobID, RequestID: id,
		Object: &wire.UploadNar{StorePath: storePath}, Size: p.meta.NarSize}); err != nil {
		return nil, "", err
	}
	open = true
	outcome := func(m *wire.UploadCommitted) (*uploadAttempt, string, error) {
		open = false
		retry, err := uploadOutcome(m)
		return nil, retry, err
	}
	var m wire.ServerMessage
	select {
	case m = <-a.ch:
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
	var grant *wire.UploadGrant
	switch m := m.(type) {
	case *wire.UploadCommitted:
		return outcome(m) // Retry/Rejected before any grant
	case *wire.UploadGrant:
		grant = m
	default:
		return nil, "", fmt.Errorf("unexpected reply %s", m.WireName())
	}
	var from uint64
	switch t := grant.Target.(type) {
	case *wire.GrantSkip:
		open = false
		return nil, "", nil
	case *wire.GrantPassthrough:
		from = t.ResumeOffset
	case *wire.GrantPut, *wire.PresignedMultipart:
		meta, done, err := c.presignedUpload(ctx, t, p, a.ch)
		switch {
		case done != nil:
			return outcome(done)
		case err != nil && ctx.Err() != nil:
			return nil, "", ctx.Err()
		case err != nil:
			// docs/protocol/cache.md §4.6: give the grant back and ask again;
			// the server may grant another URL or the session stream.
			c.log().Warn("presigned upload failed; cancelling it and asking again", "path", storePath, "error", err)
			open = false
			if err := c.send(&wire.UploadCancel{RequestID: id}); err != nil {
				return nil, "", err
			}
			return nil, err.Error(), nil
		}
		if err := c.send(&wire.UploadFinished{RequestID: id, Metadata: meta}); err != nil {
			return nil, "", err
		}
		return a, "", nil
	default:
		return nil, "", fmt.Errorf("unsupported upload grant %T", grant.Target)
	}
	if from > p.meta.FileSize {
		return nil, "", fmt.Errorf("resume offset %d beyond the %d compressed bytes", from, p.meta.FileSize)
	}
	if done, err := c.relay(ctx, id, p, from, a.ch); done != nil || err != nil {
		if err != nil {
			return nil, "", err
		}
		return outcome(done)
	}
	if err := c.send(&wire.UploadFinished{RequestID: id, Metadata: &p.meta}); err != nil {
		return nil, "", err
	}
	return a, "", nil
}

// awaitCommit waits for a sent request's UploadCommitted; on
// cancellation it sends UploadCancel.
func (c *CacheClient) awaitCommit(ctx context.Context, a *uploadAttempt) (string, error) {
	defer c.unregister(a)
	for {
		select {
		case m := <-a.ch:
			if m, ok := m.(*wire.UploadCommitted); ok {
				return uploadOutcome(m)
			}
		case <-ctx.Done():
			c.send(&wire.UploadCancel{RequestID: a.id})
			return "", ctx.Err()
		}
	}
}

// relay sends the compressed bytes from offset from as UploadChunk frames
// and the empty final frame. An UploadCommitted arriving meanwhile (the
// server gave up) stops it and is returned.
func (c *CacheClient) relay(ctx context.Context, id uint64, p *packedNar, from uint64, ch chan wire.ServerMessage) (*wire.UploadCommitted, error) {
	// Sized to what is left: most uploads of an evaluation are .drv files
	// of a few hundred bytes, and a full chunk buffer each (zeroed by the
	// allocator) cost more CPU than compressing them.
	buf := make([]byte, min(uint64(session.BulkChunkSize), p.meta.FileSize-min(from, p.meta.FileSize)))
	for off := from; off < p.meta.FileSize; {
		select {
		case m := <-ch:
			if m, ok := m.(*wire.UploadCommitted); ok {
				return m, nil
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		default:
		}
		n := int(min(uint64(len(buf)), p.meta.FileSize-off))
		if got, err := p.data.ReadAt(buf[:n], int64(off)); got < n {
			return nil, fmt.Errorf("reading the compressed NAR: %w", err)
		}
		// Send encodes synchronously, so buf can be reused at once.
		if err := c.send(&wire.UploadChunk{RequestID: id, Data: buf[:n], Offset: off}); err != nil {
			return nil, err
		}
		if c.Moved != nil {
			c.Moved(false, n)
		}
		p.sent += uint64(n)
		off += uint64(n)
	}
	return nil, c.send(&wire.UploadChunk{RequestID: id, Data: []byte{}, Offset: p.meta.FileSize, IsFinal: true})
}
