package hub

// Assignment: the workers waiting for a job of each kind, the pick of
// the best capable one for an upstream AssignJob, its answer, and the
// cluster attempts' members. Called with h.mu held.

import (
	"maps"
	"slices"

	"gradient.dev/gradient/wire"
)

// setWaiting records whether w's RequestJob of kind is unanswered, in
// the member and in the hub's index of waiters. Called with h.mu held.
func (h *Hub) setWaiting(w *member, kind wire.JobKind, on bool) {
	if w.waiting[kind] == on {
		return
	}
	w.waiting[kind] = on
	ws := h.waiters[kind]
	if on {
		w.waitAt[kind] = len(ws)
		h.waiters[kind] = append(ws, w)
		return
	}
	// The last waiter takes w's place.
	i, last := w.waitAt[kind], len(ws)-1
	ws[i] = ws[last]
	ws[i].waitAt[kind] = i
	ws[last] = nil
	h.waiters[kind] = ws[:last]
}

// notWaiting clears every kind w waits for. Called with h.mu held.
func (h *Hub) notWaiting(w *member) {
	for _, kind := range []wire.JobKind{wire.JobKindFlake, wire.JobKindBuild} {
		h.setWaiting(w, kind, false)
	}
}

// assign hands an upstream AssignJob to the best capable waiting worker,
// or declines it; it returns the outcome to count ("" for a re-sent job).
func (h *Hub) assign(e *effects, m *wire.AssignJob) string {
	cred := h.credential
	h.credential = nil
	if j := h.jobs[m.JobID]; j != nil {
		// Re-sent by the server: the owner re-adopts it.
		j.assignment = m.AssignmentID
		h.toOwner(e, j, m)
		return ""
	}
	kind, known := jobKind(m.Job)
	var best *member
	if known && h.polling() {
		best = h.pick(kind, m)
	}
	if best == nil {
		r := ReasonNoWorker
		h.toUpstream(e, &wire.AssignJobResponse{JobID: m.JobID, Accepted: false, Reason: &r})
		return "declined"
	}
	h.removeFromBook(m.JobID)
	h.jobs[m.JobID] = &job{id: m.JobID, assignment: m.AssignmentID, owner: best.d.Session(), kind: kind, cluster: m.Cluster}
	best.jobs++
	h.setWaiting(best, kind, false)
	if cred != nil && needsFetch(m.Job) && best.d.Capabilities().Fetch {
		e.toWorker(best.d, cred)
	}
	e.toWorker(best.d, m)
	return "forwarded"
}

// ranksBefore is pick's order on the hub's own state: a worker waiting
// for the kind, then one with a score for the job, the better score,
// fewer jobs, the older session. It is total, so pick may test it before
// asking a worker's session whether it may take the job.
func ranksBefore(kind wire.JobKind, job string, a, b *member) bool {
	if a.waiting[kind] != b.waiting[kind] {
		return a.waiting[kind]
	}
	sa, oka := a.scores[job]
	sb, okb := b.scores[job]
	if oka != okb {
		return oka
	}
	if oka {
		if c := compareScores(sa, sb); c != 0 {
			return c < 0
		}
	}
	if a.jobs != b.jobs {
		return a.jobs < b.jobs
	}
	return a.d.Session() < b.d.Session()
}

// pick is the best capable worker for m: waiting for its kind (a
// cluster member may also go to a worker that is not), not draining, by
// its score for the job, then fewer jobs, then the older session.
// Called with h.mu held; takes each candidate's session lock
// (Downstream.Draining, and Capabilities and Host through canRun).
func (h *Hub) pick(kind wire.JobKind, m *wire.AssignJob) *member {
	var best *member
	// Only a cluster member may go to a worker that is not waiting: for
	// any other job the waiters of its kind are all the candidates.
	candidates := h.waiters[kind]
	if m.Cluster != nil {
		candidates = slices.Collect(maps.Values(h.workers))
	}
	for _, w := range candidates {
		// The order is the hub's own state; whether the worker may take
		// the job asks its session (and the jobs, for a cluster): the
		// cheap test first, so most workers are passed over by it.
		if best != nil && !ranksBefore(kind, m.JobID, w, best) {
			continue
		}
		if m.Cluster == nil && !w.waiting[kind] {
			continue
		}
		if w.d.Draining() || !canRun(w.d, m.Job) {
			continue
		}
		if m.Cluster != nil && h.holdsAttempt(w, m.Cluster.Attempt) {
			continue
		}
		best = w
	}
	return best
}

// assignResponse forwards the worker's answer to a job it was handed.
func (h *Hub) assignResponse(e *effects, w *member, m *wire.AssignJobResponse) {
	j := h.jobs[m.JobID]
	if j == nil || j.owner != w.d.Session() {
		h.dropped(w.d, m, reasonNotHeld)
		return
	}
	h.toUpstream(e, m)
	if m.Accepted && !j.ended {
		j.accepted = true
		return
	}
	h.release(j)
}

// holdsAttempt: w owns a member of the cluster attempt.
func (h *Hub) holdsAttempt(w *member, attempt string) bool {
	for _, j := range h.jobs {
		if j.owner == w.d.Session() && j.cluster != nil && j.cluster.Attempt == attempt {
			return true
		}
	}
	return false
}

// attemptWorkers are the workers holding a member of the attempt.
func (h *Hub) attemptWorkers(attempt string) []*member {
	seen := map[uint64]bool{}
	var out []*member
	for _, j := range sortedJobs(h.jobs) {
		if j.cluster == nil || j.cluster.Attempt != attempt || seen[j.owner] {
			continue
		}
		if w := h.workers[j.owner]; w != nil {
			seen[j.owner] = true
			out = append(out, w)
		}
	}
	return out
}

// startCluster sends StartCluster to every worker holding a member, the
// roster naming the workers behind the proxy with their zone and
// endpoint instead of the proxy.
func (h *Hub) startCluster(e *effects, m *wire.StartCluster) {
	holders := map[wire.ClusterAddress]*member{}
	for _, j := range h.jobs {
		if j.cluster != nil && j.cluster.Attempt == m.Attempt {
			j.started = true
			if w := h.workers[j.owner]; w != nil {
				holders[wire.ClusterAddress{Role: j.cluster.Role, Index: j.cluster.Index}] = w
			}
		}
	}
	if len(holders) == 0 {
		return
	}
	c := *m
	c.Roster = slices.Clone(m.Roster)
	for i, p := range c.Roster {
		w := holders[wire.ClusterAddress{Role: p.Role, Index: p.Index}]
		if w == nil {
			continue
		}
		p.Worker = w.d.WorkerID()
		p.Zone, p.Endpoint = nil, nil
		if host := w.d.Host(); host != nil {
			p.Zone, p.Endpoint = host.Zone, host.Endpoint
		}
		c.Roster[i] = p
	}
	for _, w := range h.attemptWorkers(m.Attempt) {
		e.toWorker(w.d, &c)
	}
}
