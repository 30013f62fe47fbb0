package hub

import (
	"maps"
	"slices"
	"strconv"

	"gradient.dev/gradient/wire"
)

// Flow control of the NAR pulls forwarded to a worker (issue 18). The
// upstream reader never waits for one worker (docs/protocol/federation.md
// "Passthrough"), and a worker whose queue overflows is cut off. So a
// worker that reads slower than its tenant's server sends would lose a
// large NAR every time. Instead, once the worker's queue passes
// narHighWater, the hub drops the rest of that pull's stream ("paused"),
// remembering the offset the worker expects next; when the queue drained
// below narLowWater it asks the server itself to continue there
// (NarRequestResume with the stream's token, docs/protocol/cache.md §3.2), swallows
// the new stream's header (the worker has one) and forwards its chunks
// from the expected offset. The worker sees one stream, in order, each
// byte once, whatever worker it is.
//
// A resumed stream may run beside the rest of the old one (a server that
// does not stop it): only chunks at the expected offset are forwarded,
// one that overlaps it is cut to it, others are dropped. Objects are
// immutable per token, so the same offset is the same bytes. When the
// server answers with another token it restarted the object from 0: its
// header goes to the worker, which must notice the restart (docs/protocol/cache.md
// §3.2; the Go worker starts its import again).
const (
	// narHighWater is the backlog above which a pull's next chunk is
	// dropped and the pull paused: well below OutboxBytes, so the
	// worker's other messages still fit.
	narHighWater = OutboxBytes / 2
	// narLowWater is the backlog below which paused pulls resume: the
	// worker still has this much to read while the server answers.
	narLowWater = OutboxBytes / 8
	// narIdleResumes is how many resumes of one pull in a row may
	// forward nothing before the pull is given up (NarAbort, which a
	// worker treats as transient). Each resume that forwards a byte
	// moves the offset on, so a pull cannot resume forever.
	narIdleResumes = 8
	// narRestarts is how often the server may restart one pull from
	// byte 0 with a new token on the hub's resume.
	narRestarts = 3
)

// pull is one forwarded NAR stream of a job (job ID, store path).
type pull struct {
	// next is the offset the worker expects: the end of the last chunk
	// forwarded, or what its own resume named.
	next  uint64
	token string
	// final: the worker has the whole object; later chunks are stale.
	final bool
	// paused: chunks are dropped until the worker's queue drains.
	paused bool
	// headersOwed counts the worker's requests and resumes whose
	// header has not come: those headers go to the worker, the answer
	// to the hub's own resume is swallowed.
	headersOwed int
	resumes     int // the hub's resumes of this pull
	idle        int // the hub's resumes in a row that forwarded nothing
	restarts    int // the hub's resumes the server restarted from 0
}

func (j *job) pullOf(path string) *pull {
	if j.pulls == nil {
		j.pulls = map[string]*pull{}
	}
	p := j.pulls[path]
	if p == nil {
		p = &pull{}
		j.pulls[path] = p
	}
	return p
}

// requested: the worker asked for the object from offset, with a new
// NarRequest (fresh) or its own NarRequestResume. The worker's request
// supersedes a pause; its header is the worker's.
func (p *pull) requested(offset uint64, fresh bool) {
	p.next, p.final, p.paused = offset, false, false
	p.headersOwed++
	if fresh {
		p.token = ""
		p.resumes, p.idle, p.restarts = 0, 0, 0
	}
}

// tracked is the pull of (jobID, path) and its owner, if the owner
// asked for it through the hub.
func (h *Hub) tracked(jobID, path string) (*member, *pull) {
	j := h.jobs[jobID]
	if j == nil {
		return nil, nil
	}
	w := h.workers[j.owner]
	if w == nil {
		return nil, nil
	}
	return w, j.pulls[path]
}

func (h *Hub) narHeader(e *effects, m *wire.NarStreamHeader) {
	w, p := h.tracked(m.JobID, m.StorePath)
	switch {
	case w == nil:
		return
	case p == nil:
	case p.headersOwed > 0 || p.token == "":
		p.headersOwed = max(p.headersOwed-1, 0)
		if p.token != "" && m.StreamToken != p.token {
			p.next, p.final = 0, false // another object: from the start
		}
		p.token = m.StreamToken
	case m.StreamToken == p.token:
		return // the answer to the hub's resume: the worker has a header
	default:
		// The server restarted the object from 0 on the hub's resume.
		p.restarts++
		if p.restarts > narRestarts {
			h.giveUp(e, w, m.JobID, m.StorePath, p, "the server restarted the stream "+strconv.Itoa(p.restarts)+" times")
			return
		}
		p.token, p.next, p.final, p.paused = m.StreamToken, 0, false, false
	}
	e.toWorker(w.d, m)
}

// narPush relays a chunk of a tracked pull, or pauses the pull when the
// worker's queue is full. Called with h.mu held; takes the worker's
// Outbox lock (Downstream.Backlog, and WhenDrained through pause).
func (h *Hub) narPush(e *effects, m *wire.NarPush) {
	w, p := h.tracked(m.JobID, m.StorePath)
	switch {
	case w == nil:
		return
	case p == nil:
		e.toWorker(w.d, m)
		return
	case p.final || p.paused || m.Offset > p.next:
		return // stale, or beyond what the worker has
	}
	end := m.Offset + uint64(len(m.Data))
	if m.Offset < p.next {
		if end < p.next || (end == p.next && !m.IsFinal) {
			return // the worker has these bytes
		}
		// Cut to what the worker lacks: maybe nothing but the final
		// flag, when it has every byte but not the end of the stream.
		c := *m
		c.Data, c.Offset = m.Data[p.next-m.Offset:], p.next
		m = &c
	}
	if backlog := w.d.Backlog(); backlog > 0 && backlog+messageSize(m) > narHighWater {
		h.pause(w, m, p, backlog)
		return
	}
	e.toWorker(w.d, m)
	p.next, p.idle = end, 0
	if m.IsFinal {
		p.final = true
		if p.resumes > 0 {
			h.log.Info("NAR pull to a slow worker completed after resumes", "worker", w.d.WorkerID(),
				"job", m.JobID, "path", m.StorePath, "bytes", end, "resumes", p.resumes)
		}
	}
}

// pause drops the rest of p's stream until w's queue drains. Called with
// h.mu held; WhenDrained calls back (drained) on a goroutine of its own.
func (h *Hub) pause(w *member, m *wire.NarPush, p *pull, backlog int) {
	p.paused = true
	h.m.narPaused(h.tenant)
	h.log.Debug("pausing a NAR pull: the worker's queue is full", "worker", w.d.WorkerID(),
		"job", m.JobID, "path", m.StorePath, "offset", p.next, "backlog", backlog)
	if !w.drainWatched {
		w.drainWatched = true
		session := w.d.Session()
		w.d.WhenDrained(narLowWater, func() { h.drained(session) })
	}
}

// drained: the queue of worker session has drained below narLowWater;
// its paused pulls continue where the worker is.
func (h *Hub) drained(session uint64) {
	h.mu.Lock()
	w := h.workers[session]
	if w == nil {
		h.mu.Unlock()
		return
	}
	w.drainWatched = false
	var e effects
	for _, j := range sortedJobs(h.jobs) {
		if j.owner != session {
			continue
		}
		for _, path := range slices.Sorted(maps.Keys(j.pulls)) {
			p := j.pulls[path]
			if !p.paused {
				continue
			}
			if p.idle >= narIdleResumes {
				h.giveUp(&e, w, j.id, path, p, "resumed "+strconv.Itoa(p.idle)+" times without progress")
				continue
			}
			p.paused = false
			p.resumes++
			p.idle++
			h.m.narResumed(h.tenant)
			h.toUpstream(&e, &wire.NarRequestResume{JobID: j.id, StorePath: path, ReceivedBytes: p.next, StreamToken: p.token})
		}
	}
	h.mu.Unlock()
	h.run(&e)
}

// giveUp ends a pull the hub cannot carry on: the worker gets NarAbort,
// which it treats as transient (and may resume itself).
func (h *Hub) giveUp(e *effects, w *member, jobID, path string, p *pull, why string) {
	p.paused, p.final = false, true
	h.m.narGivenUp(h.tenant)
	h.log.Warn("giving up a NAR pull to a slow worker", "worker", w.d.WorkerID(), "job", jobID, "path", path,
		"offset", p.next, "why", why)
	e.toWorker(w.d, &wire.NarAbort{JobID: jobID, StorePath: path, Reason: "proxy: " + why})
}

// narEnded forwards NarUnavailable (gone: no object) or NarAbort: the
// server's stream is over, and a resume after an abort is the worker's.
func (h *Hub) narEnded(e *effects, jobID, path string, m wire.ServerMessage, gone bool) {
	w, p := h.tracked(jobID, path)
	if w == nil {
		return
	}
	if p != nil {
		p.paused, p.headersOwed = false, 0
		if gone {
			p.final = true
		}
	}
	e.toWorker(w.d, m)
}
