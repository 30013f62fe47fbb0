package cache

import (
	"context"
	"errors"
	"io"
	"time"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// NAR downloads over the socket (docs/protocol/cache.md §3.2): per path a
// NarStreamHeader, then NarPush chunks of the stored zstd object, or
// NarUnavailable / NarAbort. Each path streams on its own goroutine,
// bounded per connection.

// narStreamToken names the object a stream reads. Objects are immutable
// and keyed by their file hash, so the key is a token that matches
// exactly when a resumed prefix is still valid.
func narStreamToken(objectKey string) string { return "sha256:" + objectKey }

// streamKey names a path's NAR stream on a connection.
type streamKey struct{ jobID, storePath string }

// liveStream is a stream in flight; stop ends it.
type liveStream struct{ stop context.CancelFunc }

// goServe streams one path; resume, if set, asks to continue a stream.
// A request or resume of a path whose stream is still in flight stops
// that stream without a word: the worker (or a proxy pacing a slow
// worker, issue 18) asked for the rest again, so the old stream's bytes
// would be sent twice and it would hold a second serve slot.
func (c *Conn) goServe(jobID, storePath string, resume *wire.NarRequestResume) {
	ctx, stop := context.WithCancel(c.ctx)
	key, mine := streamKey{jobID, storePath}, &liveStream{stop: stop}
	c.streamsMu.Lock()
	if old := c.streams[key]; old != nil {
		old.stop()
	}
	c.streams[key] = mine
	c.streamsMu.Unlock()
	c.transfers.Add(1)
	c.spawn(func() {
		defer func() {
			c.streamsMu.Lock()
			if c.streams[key] == mine {
				delete(c.streams, key)
			}
			c.streamsMu.Unlock()
			stop()
			c.lastTransfer.Store(time.Now().UnixNano())
			c.transfers.Add(-1)
		}()
		if !c.acquire(ctx, c.serves) {
			return
		}
		defer func() { <-c.serves }()
		c.serve(ctx, jobID, storePath, resume)
	})
}

func (c *Conn) serve(ctx context.Context, jobID, storePath string, resume *wire.NarRequestResume) {
	unavailable := func(reason string) {
		if !c.readOnly { // a cache session skips unknown paths silently
			c.send(&wire.NarUnavailable{JobID: jobID, StorePath: storePath, Reason: reason})
		}
	}
	abort := func(reason string) {
		c.send(&wire.NarAbort{JobID: jobID, StorePath: storePath, Reason: reason})
	}
	caches, err := c.scope.Readable(ctx)
	var found map[string][]storage.CachePath
	if err == nil {
		found, err = c.lookup(ctx, caches, []string{storePath}, false)
	}
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("NAR request: lookup failed", "path", storePath, "error", err)
			abort("cache lookup failed")
		}
		return
	}
	rows := found[storePath]
	if len(rows) == 0 {
		unavailable("not in any cache this connection may read")
		return
	}
	store := c.s.cfg.NarStore
	if store == nil {
		abort("this server has no NAR store")
		return
	}
	p := rows[0]
	obj, size, err := store.Open(ctx, p.ObjectKey)
	if errors.Is(err, narstore.ErrNotFound) {
		c.log.Warn("NAR request: object of a recorded path is missing", "path", storePath, "object", p.ObjectKey)
		unavailable("the object is missing")
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("NAR request: open failed", "path", storePath, "error", err)
			abort("storage error")
		}
		return
	}
	defer obj.Close()
	c.s.served.noteRow(p, time.Now())
	token := narStreamToken(p.ObjectKey)
	var offset int64
	if resume != nil && resume.StreamToken == token && resume.ReceivedBytes <= uint64(size) {
		offset = int64(resume.ReceivedBytes)
	}
	if offset > 0 {
		seeker, ok := obj.(io.Seeker)
		if !ok {
			offset = 0 // a backend without seeking restarts; the worker sees offset 0
		} else if _, err := seeker.Seek(offset, io.SeekStart); err != nil {
			abort("storage error")
			return
		}
	}
	if err := c.send(&wire.NarStreamHeader{JobID: jobID, StorePath: storePath, TotalBytes: uint64(size), StreamToken: token}); err != nil {
		return
	}
	start, from := time.Now(), offset
	c.log.Debug("NAR stream started", "path", storePath, "bytes", size, "offset", offset)
	sent, err := c.streamChunks(ctx, jobID, storePath, obj, offset, size)
	switch {
	case err == nil:
		c.log.Info("NAR stream sent", "path", storePath, "bytes", sent, "resumed_at", from, "took", time.Since(start).Round(time.Millisecond))
	case ctx.Err() != nil || errors.Is(err, session.ErrClosed):
		c.log.Debug("NAR stream stopped: the connection ended or the path was asked for again", "path", storePath, "bytes", sent)
	default:
		c.log.Warn("NAR stream failed", "path", storePath, "bytes", sent, "error", err)
		abort("storage error")
	}
}

// streamChunks sends the object from offset in BulkChunkSize frames; the
// last frame with data is flagged final (an empty one when nothing is
// left). The buffer is reused: Send has encoded the frame when it returns.
func (c *Conn) streamChunks(ctx context.Context, jobID, storePath string, obj io.Reader, offset, size int64) (int64, error) {
	buf := make([]byte, session.BulkChunkSize)
	var sent int64
	for {
		if err := ctx.Err(); err != nil {
			return sent, err
		}
		want := min(int64(len(buf)), size-offset)
		n, err := io.ReadFull(obj, buf[:want])
		if err != nil && want > 0 {
			return sent, err
		}
		final := offset+int64(n) == size
		if err := c.send(&wire.NarPush{JobID: jobID, StorePath: storePath, Data: buf[:n], Offset: uint64(offset), IsFinal: final}); err != nil {
			return sent, err
		}
		offset += int64(n)
		sent += int64(n)
		if final {
			return sent, nil
		}
	}
}
