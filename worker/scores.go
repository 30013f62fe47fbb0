package worker

import (
	"context"
	"time"

	"gradient.dev/gradient/wire"
)

// Scoring (docs/protocol/jobs.md §4): the worker answers every JobListChunk and JobOffer
// with a score per candidate, so the server can prefer the worker that
// already holds a job's inputs (and reference servers release a build
// only once it is scored).

// PathChecker tells which store paths are valid locally; an Executor that
// implements it makes the scores real. Without it every required path
// counts as missing.
type PathChecker interface {
	ValidPaths(ctx context.Context, paths ...string) ([]string, error)
}

// scoreTimeout bounds the local store checks of one batch.
const scoreTimeout = 10 * time.Second

// scoreCandidates computes the scores of candidates (one store query for
// all of them).
func scoreCandidates(ctx context.Context, checker PathChecker, candidates []wire.JobCandidate) []wire.CandidateScore {
	valid := map[string]bool{}
	if checker != nil {
		var paths []string
		for _, c := range candidates {
			for _, r := range c.RequiredPaths {
				paths = append(paths, r.Path)
			}
			paths = append(paths, c.OutputPaths...)
		}
		if len(paths) > 0 {
			ctx, cancel := context.WithTimeout(ctx, scoreTimeout)
			have, err := checker.ValidPaths(ctx, paths...)
			cancel()
			if err == nil {
				for _, p := range have {
					valid[p] = true
				}
			}
		}
	}
	scores := make([]wire.CandidateScore, len(candidates))
	for i, c := range candidates {
		s := wire.CandidateScore{JobID: c.JobID}
		for _, r := range c.RequiredPaths {
			if !valid[r.Path] {
				s.MissingCount++
				if r.CacheInfo != nil {
					s.MissingNarSize += r.CacheInfo.NarSize
				}
			}
		}
		s.OutputsPresent = len(c.OutputPaths) > 0
		for _, p := range c.OutputPaths {
			if !valid[p] {
				s.OutputsPresent = false
				break
			}
		}
		scores[i] = s
	}
	return scores
}

type scoreTask struct {
	candidates   []wire.JobCandidate
	final, offer bool
}

// scorer answers the session's offers and list pages in arrival order.
func (ls *liveSession) scorer() {
	for {
		select {
		case <-ls.s.Done():
			return
		case t := <-ls.scoring:
			ls.answerCandidates(t.candidates, t.final, t.offer)
		}
	}
}

// scoreMaxPerChunk is the most scores per RequestJobChunk.
const scoreMaxPerChunk = 1000

// answerCandidates scores candidates and sends them in RequestJobChunks,
// the last one flagged final when final is set (an offer's answer always
// is, a list page's follows the page). After an offer it asks for work
// for every free slot: a build held for its score is released now.
func (ls *liveSession) answerCandidates(candidates []wire.JobCandidate, final, offer bool) {
	if ls.quiet() || (offer && len(candidates) == 0) {
		return
	}
	checker, _ := ls.w.cfg.Executor.(PathChecker)
	scores := scoreCandidates(context.Background(), checker, candidates)
	for {
		n := min(len(scores), scoreMaxPerChunk)
		chunk := scores[:n]
		scores = scores[n:]
		if chunk == nil {
			chunk = []wire.CandidateScore{}
		}
		ls.send(&wire.RequestJobChunk{Scores: chunk, IsFinal: final && len(scores) == 0})
		if len(scores) == 0 {
			break
		}
	}
	if offer {
		ls.requestFreeSlots()
	}
}
