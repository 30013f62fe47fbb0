package wire

import (
	"fmt"
	"slices"
	"testing"
)

func tinyCandidates(n int) []JobCandidate {
	cs := make([]JobCandidate, n)
	for i := range cs {
		cs[i] = JobCandidate{JobID: fmt.Sprintf("job-%d", i), RequiredPaths: []RequiredPath{}, DrvPaths: []string{}, OutputPaths: []string{}}
	}
	return cs
}

// bigCandidates are build candidates with paths required each.
func bigCandidates(n, paths int) []JobCandidate {
	cs := make([]JobCandidate, n)
	for i := range cs {
		c := JobCandidate{JobID: fmt.Sprintf("job-%d", i), DrvPaths: []string{fmt.Sprintf("/nix/store/%032d-x.drv", i)}, OutputPaths: []string{}}
		for k := range paths {
			c.RequiredPaths = append(c.RequiredPaths, RequiredPath{
				Path:      fmt.Sprintf("/nix/store/%032d-some-rather-long-dependency-name-%d", k, k),
				CacheInfo: &CacheInfo{FileSize: 1 << 20, NarSize: 4 << 20},
			})
		}
		cs[i] = c
	}
	return cs
}

func candidateSize(c JobCandidate) int {
	e := encoder{ver: NewestVersion}
	c.encodeWire(&e)
	return len(e.b)
}

func pageSizes(pages [][]JobCandidate) (counts, bytes []int) {
	for _, p := range pages {
		n := 0
		for _, c := range p {
			n += candidateSize(c)
		}
		counts, bytes = append(counts, len(p)), append(bytes, n)
	}
	return counts, bytes
}

// docs/protocol/session.md §8 and its test 43.
func TestCandidatePages(t *testing.T) {
	counts, _ := pageSizes(CandidatePages(tinyCandidates(2500)))
	if !slices.Equal(counts, []int{1000, 1000, 500}) {
		t.Fatalf("2500 tiny candidates paged as %v, want 1000/1000/500", counts)
	}
	if pages := CandidatePages(nil); len(pages) != 0 {
		t.Fatalf("no candidates gave %d pages", len(pages))
	}

	big := bigCandidates(200, 300)
	pages := CandidatePages(big)
	counts, bytes := pageSizes(pages)
	if len(pages) < 2 {
		t.Fatalf("200 candidates of 300 paths in %d page(s) (%v bytes): want more than one", len(pages), bytes)
	}
	for i, n := range bytes {
		if n > MaxCandidateBytesPerPage {
			t.Fatalf("page %d holds %d bytes of candidates (> 2 MiB); pages %v", i, n, bytes)
		}
		if counts[i] == 0 {
			t.Fatalf("page %d is empty", i)
		}
	}
	if joined := slices.Concat(pages...); !slices.EqualFunc(joined, big, func(a, b JobCandidate) bool { return a.JobID == b.JobID }) {
		t.Fatal("the pages, joined, are not the candidates in order")
	}
	// A page may not be empty, so a candidate over the limit is alone.
	huge := bigCandidates(1, 30000)
	mixed := append(tinyCandidates(2), append(huge, tinyCandidates(2)...)...)
	counts, _ = pageSizes(CandidatePages(mixed))
	if !slices.Equal(counts, []int{2, 1, 2}) {
		t.Fatalf("a candidate over 2 MiB between tiny ones paged as %v, want 2/1/2", counts)
	}
}

func BenchmarkCandidatePages(b *testing.B) {
	cs := bigCandidates(1000, 20)
	b.ReportAllocs()
	for b.Loop() {
		CandidatePages(cs)
	}
}
