package dashboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"gradient.dev/gradient/internal/termsafe"
	"gradient.dev/gradient/storage/jobqueue"
)

// Live build logs over Server-Sent Events. One tail per watched build
// reads the database's new log chunks every poll interval, however many
// browsers watch it; each watcher keeps only its byte offset into the
// tail. An event is one complete line, its id the byte offset after it,
// so a browser that reconnects (EventSource sends Last-Event-ID) gets
// each line once, in order. The partial last line is sent when the build
// has ended, then an "end" event.

const (
	// tailKeep bounds the log a tail keeps in memory; a watcher that
	// falls behind its start skips to it with a notice.
	tailKeep = 8 << 20
	// tailChunks bounds the chunks one poll reads.
	tailChunks = 256
	// maxWatchers bounds the open streams of one server (503 beyond).
	maxWatchers = 2000
	// heartbeat keeps idle streams open through proxies.
	heartbeat = 15 * time.Second
	// writeGrace is the deadline of one event's write: a watcher that
	// reads nothing for this long is dropped.
	writeGrace = 30 * time.Second
)

// logHub holds the tails of the builds being watched.
type logHub struct {
	jobs *jobqueue.Queue
	log  *slog.Logger
	poll time.Duration

	mu       sync.Mutex
	tails    map[string]*tail
	watchers int
}

func newLogHub(jobs *jobqueue.Queue, log *slog.Logger, poll time.Duration) *logHub {
	return &logHub{jobs: jobs, log: log, poll: poll, tails: map[string]*tail{}}
}

// tail is one build's log as far as read. Lock order: logHub.mu before
// tail.mu.
type tail struct {
	buildID string

	mu      sync.Mutex
	base    int64  // offset of data[0] in the log
	data    []byte // the log from base on
	lastSeq int64
	ended   bool          // the build ended and its log was read to the end
	status  string        // its final status, once ended
	changed chan struct{} // closed and replaced when data or ended change
	refs    int
}

// watch returns the build's tail, starting its reader for the first
// watcher; release it with unwatch.
func (h *logHub) watch(buildID string) (*tail, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watchers >= maxWatchers {
		return nil, false
	}
	h.watchers++
	t := h.tails[buildID]
	fresh := t == nil
	if fresh {
		t = &tail{buildID: buildID, changed: make(chan struct{})}
		h.tails[buildID] = t
	}
	t.mu.Lock()
	t.refs++
	t.mu.Unlock()
	if fresh {
		// After the ref: a reader that ran first saw none and stopped,
		// and the stream waited for it for ever (a CI run hung so).
		go h.read(t)
	}
	return t, true
}

func (h *logHub) unwatch(t *tail) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watchers--
	t.mu.Lock()
	t.refs--
	if t.refs == 0 && h.tails[t.buildID] == t {
		delete(h.tails, t.buildID) // its reader sees refs 0 and stops
	}
	t.mu.Unlock()
}

// read polls the build's new chunks until nobody watches or it ended.
func (h *logHub) read(t *tail) {
	ctx := context.Background()
	for {
		t.mu.Lock()
		refs, after := t.refs, t.lastSeq
		t.mu.Unlock()
		if refs == 0 {
			return
		}
		// The status is read before the chunks: a build that ended had
		// its log written out first, so no chunk comes after this read.
		b, err := h.jobs.Build(ctx, t.buildID)
		var chunks []jobqueue.LogChunk
		if err == nil {
			chunks, err = h.jobs.BuildLogChunks(ctx, t.buildID, after, tailChunks)
		}
		if err != nil {
			h.log.Warn("dashboard: reading a build log failed", "build", t.buildID, "error", err)
		}
		ended := err == nil && b.Status.Terminal() && len(chunks) < tailChunks
		if len(chunks) > 0 || ended {
			t.mu.Lock()
			for _, c := range chunks {
				t.data = append(t.data, c.Data...)
				t.lastSeq = c.Seq
			}
			if over := len(t.data) - tailKeep; over > 0 {
				t.base += int64(over)
				t.data = append([]byte(nil), t.data[over:]...)
			}
			if ended {
				t.ended, t.status = true, b.StatusText()
			}
			close(t.changed)
			t.changed = make(chan struct{})
			t.mu.Unlock()
		}
		if ended {
			return
		}
		if len(chunks) == tailChunks {
			continue // more to read now
		}
		time.Sleep(h.poll)
	}
}

// next returns the complete lines after offset (all of it once ended),
// the offset after them, whether the stream is over, and the channel
// that is closed on the next change.
func (t *tail) next(offset int64) (out []byte, to int64, skipped, over bool, changed <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if offset < t.base {
		offset, skipped = t.base, true
	}
	end := t.base + int64(len(t.data))
	if offset > end {
		// Not read this far yet (a reconnect to a fresh tail), or past
		// the end of a log that ended.
		return nil, offset, skipped, t.ended, t.changed
	}
	rest := t.data[offset-t.base:]
	if !t.ended {
		nl := bytes.LastIndexByte(rest, '\n')
		rest = rest[:nl+1]
	}
	return rest, offset + int64(len(rest)), skipped, t.ended && offset+int64(len(rest)) == end, t.changed
}

// errNoFlush is a response writer that cannot stream.
var errNoFlush = errors.New("response cannot be streamed")

// serveStream streams the build's log from offset to w.
func (h *logHub) serveStream(w http.ResponseWriter, r *http.Request, buildID string, offset int64) error {
	t, ok := h.watch(buildID)
	if !ok {
		http.Error(w, "too many log streams open: retry later", http.StatusServiceUnavailable)
		return nil
	}
	defer h.unwatch(t)
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return errNoFlush
	}
	var ev []byte
	beat := time.NewTicker(heartbeat)
	defer beat.Stop()
	for {
		data, to, skipped, over, changed := t.next(offset)
		ev = ev[:0]
		if skipped {
			ev = appendEvent(ev, offset, "… earlier lines left out; the whole log is at the build's log link")
		}
		for len(data) > 0 {
			line := data
			if i := bytes.IndexByte(data, '\n'); i >= 0 {
				line = data[:i]
				offset += int64(i + 1)
				data = data[i+1:]
			} else {
				offset += int64(len(data))
				data = nil
			}
			ev = appendEvent(ev, offset, termsafe.Strip(string(line)))
		}
		offset = to
		if over {
			t.mu.Lock()
			status := t.status
			t.mu.Unlock()
			ev = append(ev, "event: end\ndata: "...)
			ev = append(ev, status...)
			ev = append(ev, "\n\n"...)
		}
		if len(ev) > 0 {
			_ = rc.SetWriteDeadline(time.Now().Add(writeGrace))
			if _, err := w.Write(ev); err != nil {
				return err
			}
			if err := rc.Flush(); err != nil {
				return err
			}
		}
		if over {
			return nil
		}
		select {
		case <-r.Context().Done():
			return nil
		case <-changed:
		case <-beat.C:
			_ = rc.SetWriteDeadline(time.Now().Add(writeGrace))
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
				return err
			}
			if err := rc.Flush(); err != nil {
				return err
			}
		}
	}
}

// appendEvent appends one SSE message: the line (one data field: it has
// no line breaks left) with the offset after it as its id.
func appendEvent(ev []byte, offset int64, line string) []byte {
	ev = append(ev, "id: "...)
	ev = strconv.AppendInt(ev, offset, 10)
	ev = append(ev, "\ndata: "...)
	ev = append(ev, line...)
	return append(ev, "\n\n"...)
}

// streamOffset is where a stream starts: Last-Event-ID on a reconnect,
// else ?from= (the offset the page was rendered up to), else 0.
func streamOffset(r *http.Request) (int64, error) {
	s := r.Header.Get("Last-Event-ID")
	if s == "" {
		s = r.URL.Query().Get("from")
	}
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("log offset %q: want a byte offset", s)
	}
	return n, nil
}
