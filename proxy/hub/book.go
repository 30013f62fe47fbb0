package hub

// The mirrored offer book (docs/protocol/federation.md "Job Forwarding"):
// the upstream's offers and full lists, each worker offered what it can
// run, the best score per candidate sent upstream. Every function here
// runs with h.mu held but the exported ones, which take it.

import (
	"cmp"
	"maps"
	"slices"

	"gradient.dev/gradient/wire"
)

// addToBook mirrors a JobOffer and offers each worker what it can run.
// A candidate the book has no room for is dropped (an update of one it
// holds that does not fit leaves the one held).
func (h *Hub) addToBook(e *effects, cands []wire.JobCandidate) {
	var fresh []wire.JobCandidate
	for i := range cands {
		c := &cands[i]
		n := candidateBytes(c)
		room := h.inBook
		old, held := h.book[c.JobID]
		if held {
			room.remove(candidateBytes(&old))
		}
		if ok, b := room.fits(h.limits, n); !ok {
			h.bounded.drop(b, 1)
			continue
		}
		room.add(n)
		h.inBook = room
		if !held {
			h.bookOrder = append(h.bookOrder, c.JobID)
		}
		h.book[c.JobID] = *c
		fresh = append(fresh, *c)
	}
	h.offer(e, fresh)
}

// addToListing collects a JobListChunk's candidates, those the listing
// has room for.
func (h *Hub) addToListing(cands []wire.JobCandidate) {
	for i := range cands {
		n := candidateBytes(&cands[i])
		if ok, b := h.inListing.fits(h.limits, n); !ok {
			h.bounded.drop(b, 1)
			continue
		}
		h.inListing.add(n)
		h.listing = append(h.listing, cands[i])
	}
}

// startListing: a full list was asked for; its pages start anew.
func (h *Hub) startListing() {
	h.listAsked = true
	h.listing = nil
	h.inListing = candidateSet{}
}

// replaceBook takes a full list: candidates gone are dropped, new ones
// offered.
func (h *Hub) replaceBook(e *effects, cands []wire.JobCandidate) {
	old := h.book
	h.book = make(map[string]wire.JobCandidate, len(cands))
	h.bookOrder = h.bookOrder[:0]
	// The listing was within the limits, so is its first of each ID.
	h.inBook = candidateSet{}
	var fresh []wire.JobCandidate
	for _, c := range cands {
		if _, dup := h.book[c.JobID]; dup {
			continue
		}
		h.inBook.add(candidateBytes(&c))
		h.book[c.JobID] = c
		h.bookOrder = append(h.bookOrder, c.JobID)
		if _, ok := old[c.JobID]; !ok {
			fresh = append(fresh, c)
		}
	}
	for id := range old {
		if _, ok := h.book[id]; !ok {
			h.forgetCandidate(id)
		}
	}
	h.offer(e, fresh)
}

func (h *Hub) removeFromBook(id string) {
	c, ok := h.book[id]
	if !ok {
		return
	}
	h.inBook.remove(candidateBytes(&c))
	delete(h.book, id)
	h.bookOrder = slices.DeleteFunc(h.bookOrder, func(s string) bool { return s == id })
	h.forgetCandidate(id)
}

func (h *Hub) forgetCandidate(id string) {
	for _, w := range h.workers {
		delete(w.scores, id)
	}
	delete(h.sentScores, id)
	delete(h.dirty, id)
}

// offer sends each worker the candidates it can run, as JobOffer pages.
func (h *Hub) offer(e *effects, cands []wire.JobCandidate) {
	if len(cands) == 0 {
		return
	}
	for _, w := range h.sortedMembers() {
		if w.d.Draining() {
			continue
		}
		var mine []wire.JobCandidate
		for _, c := range cands {
			if canSee(w.d, c) {
				mine = append(mine, c)
			}
		}
		for _, page := range wire.CandidatePages(mine) {
			e.toWorker(w.d, &wire.JobOffer{Candidates: page})
		}
	}
}

// sendList answers a worker's RequestJobList from the mirrored book.
func (h *Hub) sendList(e *effects, w *member) {
	var mine []wire.JobCandidate
	for _, id := range h.bookOrder {
		if c := h.book[id]; canSee(w.d, c) {
			mine = append(mine, c)
		}
	}
	pages := wire.CandidatePages(mine)
	if len(pages) == 0 {
		e.toWorker(w.d, &wire.JobListChunk{IsFinal: true})
		return
	}
	for i, p := range pages {
		e.toWorker(w.d, &wire.JobListChunk{Candidates: p, IsFinal: i == len(pages)-1})
	}
}

// FlushScores sends upstream the best score per candidate where it
// changed since the last flush (the proxy's wiring calls it once per
// second), then polls once more for every kind a worker waits for, as a
// worker does after scoring an offer.
func (h *Hub) FlushScores() {
	h.mu.Lock()
	if !h.polling() || len(h.dirty) == 0 {
		h.dirty = map[string]bool{}
		h.mu.Unlock()
		return
	}
	var scores []wire.CandidateScore
	for _, id := range slices.Sorted(maps.Keys(h.dirty)) {
		best, ok := h.bestScore(id)
		if !ok {
			continue
		}
		if prev, sent := h.sentScores[id]; sent && prev == best {
			continue
		}
		h.sentScores[id] = best
		scores = append(scores, best)
	}
	h.dirty = map[string]bool{}
	var e effects
	for len(scores) > 0 {
		n := min(len(scores), wire.MaxCandidatesPerPage)
		h.toUpstream(&e, &wire.RequestJobChunk{Scores: scores[:n:n], IsFinal: n == len(scores)})
		scores = scores[n:]
	}
	if len(e.list) > 0 {
		for _, kind := range []wire.JobKind{wire.JobKindFlake, wire.JobKindBuild} {
			for _, w := range h.sortedMembers() {
				if w.waiting[kind] && !w.d.Draining() {
					h.toUpstream(&e, &wire.RequestJob{Kind: kind})
				}
			}
		}
	}
	h.mu.Unlock()
	h.run(&e)
}

func (h *Hub) bestScore(id string) (wire.CandidateScore, bool) {
	var best wire.CandidateScore
	found := false
	for _, w := range h.workers {
		s, ok := w.scores[id]
		if ok && (!found || compareScores(s, best) < 0) {
			best, found = s, true
		}
	}
	return best, found
}

// compareScores orders scores best first: outputs present, then less to
// download, then fewer missing paths.
func compareScores(a, b wire.CandidateScore) int {
	if a.OutputsPresent != b.OutputsPresent {
		if a.OutputsPresent {
			return -1
		}
		return 1
	}
	return cmp.Or(cmp.Compare(a.MissingNarSize, b.MissingNarSize), cmp.Compare(a.MissingCount, b.MissingCount))
}

// Pending counts the build candidates of the mirrored offer book per
// Nix system: jobs the tenant's server would hand the proxy's workers.
// Flake candidates and builtin jobs name no system and are not counted.
func (h *Hub) Pending() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for _, c := range h.book {
		if c.Requirement != nil && c.Requirement.Architecture != "builtin" && c.Requirement.Architecture != "" {
			out[c.Requirement.Architecture]++
		}
	}
	return out
}

// RefreshBook asks the upstream for its full offer list, unless one is
// outstanding: candidates another worker of the server took leave the
// book only with a full list.
func (h *Hub) RefreshBook() {
	h.mu.Lock()
	var e effects
	if h.polling() && !h.listAsked {
		h.startListing()
		h.toUpstream(&e, &wire.RequestJobList{})
	}
	h.mu.Unlock()
	h.run(&e)
}
