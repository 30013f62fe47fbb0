package wire

// Job-offer chunking (docs/protocol/session.md §8): JobOffer and JobListChunk pages are
// cut by count and by size, so a page of build candidates with large
// closures never exceeds what a worker accepts in one message.

const (
	// MaxCandidatesPerPage is the most candidates one page holds.
	MaxCandidatesPerPage = 1000
	// MaxCandidateBytesPerPage bounds the summed encoded size of a
	// page's candidates (SAFE_INFLIGHT_MESSAGE_SIZE, 2 MiB).
	MaxCandidateBytesPerPage = 2 << 20
)

// CandidatePages cuts candidates into consecutive pages, in order: a page
// closes at MaxCandidatesPerPage candidates, or before the candidate that
// would take its summed size (each candidate encoded on its own at the
// newest version) above MaxCandidateBytesPerPage. A candidate larger than
// that forms a page of its own; no page is empty. The pages share
// candidates' backing array.
func CandidatePages(candidates []JobCandidate) [][]JobCandidate {
	var pages [][]JobCandidate
	e := encoder{ver: NewestVersion}
	start, size := 0, 0
	for i := range candidates {
		e.b, e.err = e.b[:0], nil
		candidates[i].encodeWire(&e)
		n := len(e.b)
		if i > start && (i-start == MaxCandidatesPerPage || size+n > MaxCandidateBytesPerPage) {
			pages = append(pages, candidates[start:i:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(candidates) {
		pages = append(pages, candidates[start:])
	}
	return pages
}
