package cache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/server/internal/pathmeta"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storepath"
	"gradient.dev/gradient/wire"
)

// NAR uploads (docs/protocol/cache.md §4): UploadRequest → UploadGrant (Skip when the
// path is stored, else Passthrough from 0) → UploadChunk relay written
// straight to a narstore upload → UploadFinished → verification →
// UploadCommitted. The worker compressed the NAR; the server stores its
// bytes as they are and checks them: length and SHA-256 against the
// metadata's file_size/file_hash, and, after decompressing, nar_size and
// nar_hash. What a session may upload, and where, is its job's
// (cache_upload_scope.go): checked before the grant and again, with the
// content, at the commit. Eval-cache blobs are answered Skip: §4.2 lists
// Skip for "blob not wanted", while Rejected would fail the worker's job.

// errUploadMismatch marks a verification failure: Rejected, not Retry.
var errUploadMismatch = errors.New("upload does not match its metadata")

// uploads are the open upload requests of one connection.
type uploads struct {
	c  *Conn
	mu sync.Mutex
	// open: requested and not yet committed, failed or cancelled.
	open map[uint64]*upload
	// answered: requests that already got their UploadCommitted, so late
	// chunks and a late UploadFinished are dropped silently.
	answered map[uint64]bool
	// unreachable: store hashes whose presigned grant this connection
	// cancelled or let expire; their next request is relayed instead, so
	// a worker that cannot reach the store still uploads (bounded).
	unreachable map[string]bool
}

// maxUnreachable bounds uploads.unreachable; past it the set starts over.
const maxUnreachable = 4096

// presignFailed remembers that the worker could not use a presigned grant
// for hash.
func (us *uploads) presignFailed(hash string) {
	us.mu.Lock()
	defer us.mu.Unlock()
	if len(us.unreachable) >= maxUnreachable {
		clear(us.unreachable)
	}
	us.unreachable[hash] = true
}

type upload struct {
	id        uint64
	jobID     string
	storePath string
	hash      string
	limit     int64 // most compressed bytes accepted
	ctx       context.Context
	cancel    context.CancelFunc
	started   time.Time

	// Set by the grant goroutine under uploads.mu; afterwards only the
	// dispatch goroutine writes, until the commit goroutine takes over.
	lease *uploadLease
	w     narstore.Upload
	// p is a presigned upload's (the worker sends the bytes to the store
	// itself, no chunks); expiry fails it with Retry once its URLs lapse.
	p      narstore.PresignedUpload
	expiry *time.Timer
	size   uint64 // the declared NAR size
	final  bool
	meta   *wire.NarUploadMetadata
}

// abort drops what the upload staged. A presigned upload's abort talks to
// the store, so it runs off the caller's goroutine.
func (u *upload) abort() {
	if u.w != nil {
		u.w.Abort()
	}
	if u.p != nil {
		go u.p.Abort()
	}
}

func newUploads(c *Conn) *uploads {
	return &uploads{c: c, open: map[uint64]*upload{}, answered: map[uint64]bool{}, unreachable: map[string]bool{}}
}

func (us *uploads) answer(id uint64, outcome wire.UploadOutcome) {
	us.c.send(&wire.UploadCommitted{RequestID: id, Outcome: outcome})
}

func (us *uploads) request(m *wire.UploadRequest) {
	c := us.c
	nar, ok := m.Object.(*wire.UploadNar)
	if !ok {
		c.send(&wire.UploadGrant{RequestID: m.RequestID, Target: &wire.GrantSkip{}})
		return
	}
	hash, _, err := storepath.Parse(nar.StorePath)
	if err != nil {
		us.answer(m.RequestID, &wire.UploadRejected{Reason: "store path: " + err.Error()})
		return
	}
	if c.s.cfg.NarStore == nil {
		us.answer(m.RequestID, &wire.UploadRejected{Reason: "this server has no NAR store"})
		return
	}
	ctx, cancel := context.WithCancel(c.ctx)
	u := &upload{id: m.RequestID, jobID: m.JobID, storePath: nar.StorePath, hash: hash, ctx: ctx, cancel: cancel, started: time.Now(),
		limit: int64(m.Size + m.Size/128 + 1<<20), size: m.Size}
	us.mu.Lock()
	if _, dup := us.open[m.RequestID]; dup {
		us.mu.Unlock()
		cancel()
		us.answer(m.RequestID, &wire.UploadRejected{Reason: "duplicate open request id"})
		return
	}
	delete(us.answered, m.RequestID)
	us.open[m.RequestID] = u
	us.mu.Unlock()
	c.spawn(func() { us.grant(u) })
}

// grant decides Skip or Passthrough off the dispatch goroutine: it may
// wait for another upload of the same path.
func (us *uploads) grant(u *upload) {
	c := us.c
	scope, err := c.scope.Writable(u.ctx, u.jobID)
	if err != nil {
		us.fail(u, &wire.UploadRetry{Reason: "cache lookup failed"})
		return
	}
	if reason := scope.refusal(u.storePath); reason != "" {
		c.log.Warn("upload rejected", "path", u.storePath, "job", u.jobID, "reason", reason)
		us.fail(u, &wire.UploadRejected{Reason: reason})
		return
	}
	caches := scope.Caches
	lease, _, err := c.s.uploadLeases.acquire(u.ctx, u.hash)
	if err != nil {
		return // cancelled; whoever cancelled answered
	}
	us.mu.Lock()
	if us.open[u.id] != u {
		us.mu.Unlock()
		c.s.uploadLeases.release(lease, false)
		return
	}
	u.lease = lease
	us.mu.Unlock()
	// Stored already (maybe by the upload we waited for): record it in
	// every cache of the scope and skip; the row is reused like a Push
	// answer's, so a collection keeps it (docs/protocol/cache.md §10.1).
	// A read first: most uploads are of paths the worker was just told
	// are missing, and the reuse is a write (on SQLite, through the one
	// writer) that would find nothing. The reuse reads the rows again in
	// its own statement, so one a collection deleted meanwhile is not
	// relied on.
	found, err := c.lookup(u.ctx, caches, []string{u.storePath}, false)
	if err == nil && len(found[u.storePath]) > 0 {
		found, err = c.lookup(u.ctx, caches, []string{u.storePath}, true)
	}
	if err == nil && len(found[u.storePath]) > 0 {
		if err = c.s.recordInCaches(u.ctx, found[u.storePath][0], caches); err == nil {
			if us.take(u) {
				c.s.uploadLeases.release(lease, true)
				c.send(&wire.UploadGrant{RequestID: u.id, Target: &wire.GrantSkip{}})
				c.log.Debug("upload skipped: already stored", "path", u.storePath)
			}
			return
		}
	}
	if err != nil {
		us.fail(u, &wire.UploadRetry{Reason: "cache lookup failed"})
		return
	}
	us.mu.Lock()
	relay := us.unreachable[u.hash]
	delete(us.unreachable, u.hash)
	us.mu.Unlock()
	if ps := c.s.presigner; ps != nil && !c.s.cfg.Presign.StreamUploads && !relay {
		if us.grantPresigned(u, ps) {
			return
		}
	}
	w, err := c.s.cfg.NarStore.Create(u.ctx)
	if err != nil {
		c.log.Warn("upload: cannot stage", "path", u.storePath, "error", err)
		us.fail(u, &wire.UploadRetry{Reason: "storage error"})
		return
	}
	us.mu.Lock()
	if us.open[u.id] != u {
		us.mu.Unlock()
		w.Abort()
		return
	}
	u.w = w
	us.mu.Unlock()
	c.log.Debug("upload started", "path", u.storePath, "request", u.id)
	c.send(&wire.UploadGrant{RequestID: u.id, Target: &wire.GrantPassthrough{ResumeOffset: 0}})
}

// maxS3Object is S3's largest object (5 TiB).
const maxS3Object = 5 << 40

// grantPresigned grants Put or Multipart (docs/protocol/cache.md §4.5);
// false when the store could not presign, so the caller relays instead.
func (us *uploads) grantPresigned(u *upload, ps narstore.Presigner) bool {
	c := us.c
	if u.limit <= 0 || u.limit > maxS3Object {
		return false // a size S3 cannot hold (or an overflow): relay, where the bytes decide
	}
	multipart := int64(u.size) > c.s.cfg.Presign.MultipartThreshold
	p, err := ps.PresignUpload(u.ctx, u.limit, multipart)
	if err != nil {
		if u.ctx.Err() == nil {
			c.log.Warn("upload: cannot presign, relaying instead", "path", u.storePath, "error", err)
		}
		return false
	}
	us.mu.Lock()
	if us.open[u.id] != u {
		us.mu.Unlock()
		go p.Abort()
		return true
	}
	u.p = p
	// The lease lasts as long as the URLs: a worker that never finishes
	// does not hold the path forever.
	u.expiry = time.AfterFunc(time.Until(p.Expires()), func() {
		if us.fail(u, &wire.UploadRetry{Reason: "the presigned URLs expired before UploadFinished"}) {
			us.presignFailed(u.hash)
		}
	})
	us.mu.Unlock()
	var target wire.GrantTarget
	kind := "put"
	if multipart {
		kind = "multipart"
		target = &wire.PresignedMultipart{UploadID: p.UploadID(), PartSize: uint64(p.PartSize()), PartURLs: p.URLs()}
	} else {
		target = &wire.GrantPut{URL: p.URLs()[0]}
	}
	c.s.metrics.presignedGrants.WithLabelValues(kind).Inc()
	c.log.Debug("upload granted presigned", "path", u.storePath, "request", u.id, "kind", kind, "parts", len(p.URLs()))
	c.send(&wire.UploadGrant{RequestID: u.id, Target: target})
	return true
}

// chunk writes a relayed chunk synchronously, so the caller can release
// the frame afterwards.
func (us *uploads) chunk(m *wire.UploadChunk) {
	us.mu.Lock()
	u := us.open[m.RequestID]
	var w narstore.Upload
	var presigned bool
	if u != nil {
		w, presigned = u.w, u.p != nil
	}
	us.mu.Unlock()
	if u == nil || u.final {
		return // answered already (Rejected, cancelled): late frames are dropped
	}
	if presigned {
		us.fail(u, &wire.UploadRejected{Reason: "UploadChunk for a presigned grant"})
		return
	}
	if w == nil {
		us.fail(u, &wire.UploadRejected{Reason: "UploadChunk before the grant"})
		return
	}
	if written := w.Written(); m.Offset != uint64(written) {
		us.fail(u, &wire.UploadRejected{Reason: fmt.Sprintf("chunk at offset %d, expected %d", m.Offset, written)})
		return
	}
	if w.Written()+int64(len(m.Data)) > u.limit {
		us.fail(u, &wire.UploadRejected{Reason: "upload larger than the announced size allows"})
		return
	}
	if _, err := w.Write(m.Data); err != nil {
		us.c.log.Warn("upload: write failed", "path", u.storePath, "error", err)
		us.fail(u, &wire.UploadRetry{Reason: "storage error"})
		return
	}
	if m.IsFinal {
		u.final = true
		us.maybeCommit(u)
	}
}

func (us *uploads) finished(m *wire.UploadFinished) {
	us.mu.Lock()
	u := us.open[m.RequestID]
	answered := us.answered[m.RequestID]
	delete(us.answered, m.RequestID)
	us.mu.Unlock()
	if u == nil {
		if !answered {
			us.answer(m.RequestID, &wire.UploadRejected{Reason: "no open upload with this request id"})
		}
		return
	}
	us.mu.Lock()
	granted := u.w != nil || u.p != nil
	presigned := u.p
	us.mu.Unlock()
	meta, ok := m.Metadata.(*wire.NarUploadMetadata)
	if !ok || !granted || u.meta != nil {
		us.fail(u, &wire.UploadRejected{Reason: "UploadFinished does not match the request"})
		return
	}
	if presigned != nil {
		// The bytes are in the store already: no chunks to wait for. A
		// Multipart grant needs its ETags, a Put none.
		mp := meta.Multipart
		if (presigned.UploadID() != "") != (mp != nil) || (mp != nil && mp.UploadID != presigned.UploadID()) {
			us.fail(u, &wire.UploadRejected{Reason: "multipart metadata does not match the grant"})
			return
		}
		u.final = true
	}
	u.meta = meta
	// Chunks ride the bulk lane and may arrive after UploadFinished.
	us.maybeCommit(u)
}

func (us *uploads) maybeCommit(u *upload) {
	if !u.final || u.meta == nil || !us.take(u) {
		return
	}
	us.c.spawn(func() { us.commit(u) })
}

// commit verifies the staged bytes, makes the object visible and records
// the path in every cache of the upload's scope.
func (us *uploads) commit(u *upload) {
	c := us.c
	defer u.cancel()
	outcome, stored := us.store(u)
	c.s.uploadLeases.release(u.lease, stored)
	if stored {
		c.log.Info("upload committed", "path", u.storePath, "bytes", u.meta.FileSize, "nar_bytes", u.meta.NarSize,
			"took", time.Since(u.started).Round(time.Millisecond))
	}
	us.answer(u.id, outcome)
}

func (us *uploads) store(u *upload) (wire.UploadOutcome, bool) {
	c, meta := us.c, u.meta
	reject := func(reason string) (wire.UploadOutcome, bool) {
		u.abort()
		c.log.Warn("upload rejected", "path", u.storePath, "reason", reason)
		return &wire.UploadRejected{Reason: reason}, false
	}
	// Nothing the narinfo would carry is trusted: check it before the
	// object becomes visible.
	var deriver, ca string
	if meta.Deriver != nil {
		deriver = *meta.Deriver
	}
	if meta.CA != nil {
		ca = *meta.CA
	}
	if err := pathmeta.Check(u.storePath, meta.References, deriver, ca); err != nil {
		return reject("metadata: " + err.Error())
	}
	// The scope again: the job may have ended, or the grant changed.
	scope, err := c.scope.Writable(u.ctx, u.jobID)
	if err != nil {
		u.abort()
		return &wire.UploadRetry{Reason: "cache lookup failed"}, false
	}
	if reason := scope.refusal(u.storePath); reason != "" {
		return reject(reason)
	}
	check, err := scope.certify(u.storePath, meta)
	if err != nil {
		return reject(err.Error())
	}
	fileHash, err := pathmeta.ParseSHA256(meta.FileHash)
	if err != nil {
		return reject("file_hash: " + err.Error())
	}
	narHash, err := pathmeta.ParseSHA256(meta.NarHash)
	if err != nil {
		return reject("nar_hash: " + err.Error())
	}
	if u.p == nil {
		if got := u.w.Written(); uint64(got) != meta.FileSize {
			return reject(fmt.Sprintf("received %d bytes, file_size says %d", got, meta.FileSize))
		}
	}
	verify := func(o narstore.Object) error {
		switch {
		case o.FileHash != fileHash:
			return fmt.Errorf("%w: file hash is %s, metadata says %s", errUploadMismatch, o.FileHashText(), meta.FileHash)
		case uint64(o.NarSize) != meta.NarSize:
			return fmt.Errorf("%w: NAR size is %d, metadata says %d", errUploadMismatch, o.NarSize, meta.NarSize)
		case o.NarHash != narHash:
			return fmt.Errorf("%w: NAR hash is %s, metadata says %s", errUploadMismatch, o.NarHashText(), meta.NarHash)
		}
		return check.verify(o)
	}
	var obj narstore.Object
	if u.p != nil {
		// Read back once from the store (docs/protocol/cache.md §4.5).
		var etags []string
		if meta.Multipart != nil {
			etags = meta.Multipart.ETags
		}
		started := time.Now()
		obj, err = u.p.Commit(u.ctx, etags, int64(min(meta.FileSize, 1<<62)), check.inspect(), verify)
		c.s.metrics.verifySeconds.Observe(time.Since(started).Seconds())
		outcome := "ok"
		switch {
		case errors.Is(err, errUploadMismatch) || errors.Is(err, narstore.ErrCorrupt) || errors.Is(err, narstore.ErrMismatch):
			outcome = "rejected"
		case err != nil:
			outcome = "retry"
		}
		c.s.metrics.presignedCommits.WithLabelValues(outcome).Inc()
	} else {
		obj, err = u.w.Commit(u.ctx, check.inspect(), verify)
	}
	switch {
	case errors.Is(err, errUploadMismatch) || errors.Is(err, narstore.ErrCorrupt) || errors.Is(err, narstore.ErrMismatch):
		return reject(err.Error())
	case err != nil:
		c.log.Warn("upload: commit failed", "path", u.storePath, "error", err)
		return &wire.UploadRetry{Reason: "storage error"}, false
	}
	row := storage.CachePath{StorePath: u.storePath, NarHash: obj.NarHashText(), NarSize: obj.NarSize,
		FileHash: obj.FileHashText(), FileSize: obj.FileSize, Compression: narstore.Compression,
		References: meta.References, Deriver: deriver, CA: ca, ObjectKey: obj.Key}
	for _, cache := range scope.Caches {
		row.CacheID = cache.ID
		_, _, err := c.s.db.PutCachePath(u.ctx, row)
		if errors.Is(err, storage.ErrInvalid) {
			return reject(err.Error())
		}
		if err != nil {
			c.log.Warn("upload: recording the path failed", "path", u.storePath, "cache", cache.Name, "error", err)
			return &wire.UploadRetry{Reason: "database error"}, false
		}
	}
	return &wire.UploadOk{}, true
}

// take removes u from the open requests; false if it was gone already.
func (us *uploads) take(u *upload) bool {
	us.mu.Lock()
	defer us.mu.Unlock()
	if us.open[u.id] != u {
		return false
	}
	delete(us.open, u.id)
	return true
}

// fail answers an open request with outcome and frees what it holds;
// false if the request was answered already.
func (us *uploads) fail(u *upload, outcome wire.UploadOutcome) bool {
	if !us.take(u) {
		return false
	}
	us.mu.Lock()
	us.answered[u.id] = true
	us.mu.Unlock()
	us.drop(u)
	us.answer(u.id, outcome)
	return true
}

// cancel is UploadCancel: free everything, answer nothing.
func (us *uploads) cancel(id uint64) {
	us.mu.Lock()
	u := us.open[id]
	delete(us.answered, id)
	us.mu.Unlock()
	if u != nil && us.take(u) {
		us.mu.Lock()
		presigned := u.p != nil
		us.mu.Unlock()
		if presigned {
			// The worker gave up on the URLs (docs/protocol/cache.md
			// §4.5): its next request for the path is relayed.
			us.presignFailed(u.hash)
		}
		us.drop(u)
		us.c.log.Debug("upload cancelled", "path", u.storePath, "request", id)
	}
}

// drop frees a request taken out of the open set.
func (us *uploads) drop(u *upload) {
	u.cancel()
	us.mu.Lock()
	lease := u.lease
	if u.expiry != nil {
		u.expiry.Stop()
	}
	us.mu.Unlock()
	// Taken out of the open set, u gets no new w or p: no lock needed.
	u.abort()
	us.c.s.uploadLeases.release(lease, false)
}

// closeAll frees every open request when the connection ends.
func (us *uploads) closeAll() {
	us.mu.Lock()
	open := us.open
	us.open = map[uint64]*upload{}
	us.mu.Unlock()
	for _, u := range open {
		us.drop(u)
	}
}
