package worker

import (
	"context"
	"slices"
	"testing"

	"gradient.dev/gradient/wire"
)

// checkingExecutor holds some paths locally; it scores candidates.
type checkingExecutor struct {
	*blockingExecutor
	local []string
}

func (e checkingExecutor) ValidPaths(_ context.Context, paths ...string) ([]string, error) {
	var out []string
	for _, p := range paths {
		if slices.Contains(e.local, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// Offers and list pages are answered with scores from the local store,
// in order, and an offer is followed by requests for the free slots.
func TestScoresOffersAndListPages(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	exec := checkingExecutor{newBlockingExecutor(), []string{"/nix/store/a-in", "/nix/store/x-out", "/nix/store/y-out"}}
	startWorker(t, testConfig(t, f.url, exec))
	c := f.accept()
	expect[*wire.RequestJobList](t, c)

	size := func(n uint64) *wire.CacheInfo { return &wire.CacheInfo{NarSize: n, FileSize: n / 2} }
	c.send(t, &wire.JobOffer{Candidates: []wire.JobCandidate{
		{JobID: "half-local", RequiredPaths: []wire.RequiredPath{{Path: "/nix/store/a-in", CacheInfo: size(10)}, {Path: "/nix/store/b-in", CacheInfo: size(700)}},
			OutputPaths: []string{"/nix/store/o-out"}},
		{JobID: "built", RequiredPaths: []wire.RequiredPath{}, OutputPaths: []string{"/nix/store/x-out", "/nix/store/y-out"}},
		{JobID: "flake", RequiredPaths: []wire.RequiredPath{}, OutputPaths: []string{}},
	}})
	chunk := expect[*wire.RequestJobChunk](t, c)
	want := []wire.CandidateScore{
		{JobID: "half-local", MissingCount: 1, MissingNarSize: 700},
		{JobID: "built", OutputsPresent: true},
		{JobID: "flake"},
	}
	if !chunk.IsFinal || !slices.Equal(chunk.Scores, want) {
		t.Fatalf("scores %+v (final %v), want %+v", chunk.Scores, chunk.IsFinal, want)
	}
	if r, ok := c.next(t).(*wire.RequestJob); !ok {
		t.Fatalf("after the scores: %+v, want RequestJob", r)
	}

	// List pages: one chunk per page, final only with the last page.
	c.send(t, &wire.JobListChunk{Candidates: []wire.JobCandidate{{JobID: "p1", RequiredPaths: []wire.RequiredPath{}, OutputPaths: []string{}}}})
	c.send(t, &wire.JobListChunk{Candidates: []wire.JobCandidate{}, IsFinal: true})
	first, second := expect[*wire.RequestJobChunk](t, c), expect[*wire.RequestJobChunk](t, c)
	if first.IsFinal || len(first.Scores) != 1 || first.Scores[0].JobID != "p1" || !second.IsFinal || len(second.Scores) != 0 {
		t.Fatalf("list answers %+v then %+v", first, second)
	}
}
