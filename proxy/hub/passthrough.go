package hub

// Cache passthrough (docs/protocol/cache.md): a worker's cache queries
// and uploads go to the tenant's server under fresh IDs, the answers
// come back to that worker only; nothing is stored on the proxy. NAR
// pulls are paced per pull in narflow.go. Called with h.mu held.

import (
	"crypto/rand"
	"encoding/hex"

	"gradient.dev/gradient/wire"
)

// cacheFromWorker passes a cache message through to the tenant's server
// under fresh IDs (docs/protocol/cache.md): the answers come back to this worker only.
func (h *Hub) cacheFromWorker(e *effects, w *member, msg wire.ClientMessage) {
	up := h.up != nil
	switch m := msg.(type) {
	case *wire.CacheQuery:
		if h.admitQuery(e, w, up, m.JobID, m.QueryID) {
			c := *m
			c.QueryID = h.newQuery(w, m.QueryID)
			h.toUpstream(e, &c)
		}
	case *wire.QueryKnownDerivations:
		if h.admitQuery(e, w, up, m.JobID, m.QueryID) {
			c := *m
			c.QueryID = h.newQuery(w, m.QueryID)
			h.toUpstream(e, &c)
		}
	case *wire.NarRequest:
		if !up || !h.jobOK(w, m.JobID, false) {
			for _, p := range m.Paths {
				e.toWorker(w.d, &wire.NarAbort{JobID: m.JobID, StorePath: p, Reason: h.refusal(up)})
			}
			return
		}
		j := h.jobs[m.JobID]
		for _, p := range m.Paths {
			j.pullOf(p).requested(0, true)
		}
		h.toUpstream(e, m)
	case *wire.NarRequestResume:
		if !up || !h.jobOK(w, m.JobID, false) {
			e.toWorker(w.d, &wire.NarAbort{JobID: m.JobID, StorePath: m.StorePath, Reason: h.refusal(up)})
			return
		}
		h.jobs[m.JobID].pullOf(m.StorePath).requested(m.ReceivedBytes, false)
		h.toUpstream(e, m)
	case *wire.EvalCachePull:
		if !up || !h.jobOK(w, m.JobID, false) {
			e.toWorker(w.d, &wire.EvalCachePullResult{JobID: m.JobID, Outcome: &wire.EvalCacheMiss{}})
			return
		}
		h.toUpstream(e, m)
	case *wire.UploadRequest:
		if !up || !h.jobOK(w, m.JobID, true) {
			e.toWorker(w.d, &wire.UploadCommitted{RequestID: m.RequestID, Outcome: &wire.UploadRetry{Reason: h.refusal(up)}})
			return
		}
		if old, ok := w.uploads[m.RequestID]; ok {
			delete(h.uploads, old) // the worker reused its ID
			delete(w.uploads, m.RequestID)
		}
		if len(h.uploads) >= h.limits.PendingUploads {
			h.bounded.drop(boundUploads, 1)
			e.toWorker(w.d, &wire.UploadCommitted{RequestID: m.RequestID, Outcome: &wire.UploadRetry{Reason: reasonTooManyUploads}})
			return
		}
		h.nextUpload++
		id := h.nextUpload
		h.uploads[id] = uploadRoute{worker: w.d.Session(), id: m.RequestID}
		w.uploads[m.RequestID] = id
		c := *m
		c.RequestID = id
		h.toUpstream(e, &c)
	case *wire.UploadChunk:
		if id, ok := w.uploads[m.RequestID]; ok {
			h.m.narPassed(h.tenant, "upload", len(m.Data))
			c := *m
			c.RequestID = id
			h.toUpstream(e, &c)
		}
	case *wire.UploadFinished:
		if id, ok := w.uploads[m.RequestID]; ok {
			c := *m
			c.RequestID = id
			h.toUpstream(e, &c)
		}
	case *wire.UploadCancel:
		if id, ok := w.uploads[m.RequestID]; ok {
			delete(w.uploads, m.RequestID)
			delete(h.uploads, id)
			h.toUpstream(e, &wire.UploadCancel{RequestID: id})
		}
	default:
		h.log.Debug("ignoring worker message", "message", msg.WireName())
	}
}

func (h *Hub) refusal(up bool) string {
	if !up {
		return "no upstream session to the tenant's server"
	}
	return reasonNotHeld
}

// jobOK: the worker holds jobID (or, where allowed, names no job).
func (h *Hub) jobOK(w *member, jobID string, noneOK bool) bool {
	if jobID == "" {
		return noneOK
	}
	j := h.jobs[jobID]
	return j != nil && j.owner == w.d.Session()
}

func (h *Hub) newQuery(w *member, id string) string {
	var b [16]byte
	rand.Read(b[:])
	q := hex.EncodeToString(b[:])
	h.queries[q] = queryRoute{worker: w.d.Session(), id: id}
	return q
}

func (h *Hub) takeQuery(id string) (queryRoute, bool) {
	q, ok := h.queries[id]
	if ok {
		delete(h.queries, id)
	}
	return q, ok && h.workers[q.worker] != nil
}

// uploadRoute maps an upstream request ID back; done forgets it.
func (h *Hub) uploadRoute(id uint64, done bool) (uploadRoute, bool) {
	u, ok := h.uploads[id]
	if !ok {
		return u, false
	}
	w := h.workers[u.worker]
	if done {
		delete(h.uploads, id)
		if w != nil {
			delete(w.uploads, u.id)
		}
	}
	return u, w != nil
}

// roomForQuery reports whether one more query may wait for the tenant's
// server, counting a refusal.
func (h *Hub) roomForQuery() bool {
	if len(h.queries) < h.limits.PendingQueries {
		return true
	}
	h.bounded.drop(boundQueries, 1)
	return false
}

// answerQuery sends the tenant's server's answer to a passed-through
// query (CacheStatus, KnownDerivations, CacheError) to the worker that
// asked, under the worker's own query ID.
func (h *Hub) answerQuery(e *effects, msg wire.ServerMessage) {
	var c wire.ServerMessage
	var id *string // c's query ID
	switch m := msg.(type) {
	case *wire.CacheStatus:
		cp := *m
		c, id = &cp, &cp.QueryID
	case *wire.KnownDerivations:
		cp := *m
		c, id = &cp, &cp.QueryID
	case *wire.CacheError:
		cp := *m
		c, id = &cp, &cp.QueryID
	default:
		return
	}
	if q, ok := h.takeQuery(*id); ok {
		*id = q.id
		e.toWorker(h.workers[q.worker].d, c)
	}
}

// answerUpload sends the tenant's server's answer to a passed-through
// upload (UploadGrant, UploadCommitted) to the worker that asked, under
// the worker's own request ID; a skip and a commit end the upload.
func (h *Hub) answerUpload(e *effects, msg wire.ServerMessage) {
	var c wire.ServerMessage
	var id *uint64 // c's request ID
	done := true
	switch m := msg.(type) {
	case *wire.UploadGrant:
		cp := *m
		c, id = &cp, &cp.RequestID
		_, done = m.Target.(*wire.GrantSkip)
	case *wire.UploadCommitted:
		cp := *m
		c, id = &cp, &cp.RequestID
	default:
		return
	}
	if u, ok := h.uploadRoute(*id, done); ok {
		*id = u.id
		e.toWorker(h.workers[u.worker].d, c)
	}
}

// admitQuery reports whether a worker's query (a CacheQuery or a
// QueryKnownDerivations) may go upstream; if not, the worker gets a
// CacheError saying why: no upstream session, not its job, or too many
// queries awaiting answers.
func (h *Hub) admitQuery(e *effects, w *member, up bool, jobID, queryID string) bool {
	if !up || !h.jobOK(w, jobID, true) {
		e.toWorker(w.d, &wire.CacheError{QueryID: queryID, Message: h.refusal(up)})
		return false
	}
	if !h.roomForQuery() {
		e.toWorker(w.d, &wire.CacheError{QueryID: queryID, Message: reasonTooManyQueries})
		return false
	}
	return true
}
