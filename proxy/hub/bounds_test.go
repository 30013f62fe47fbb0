package hub

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"gradient.dev/gradient/internal/testlog"
	"gradient.dev/gradient/wire"
)

// boundedHub is a hub with small limits, its metrics and its log.
func boundedHub(t *testing.T, l Limits) (*Hub, *Metrics, *testlog.Buffer) {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	logs := &testlog.Buffer{}
	h := New("tenant-a", slog.New(slog.NewTextHandler(logs, nil)), m)
	h.limits = l.withDefaults()
	return h, m, logs
}

func candPage(prefix string, from, n int) []wire.JobCandidate {
	out := make([]wire.JobCandidate, n)
	for i := range out {
		out[i] = buildCand(fmt.Sprintf("%s%d", prefix, from+i), "x86_64-linux")
	}
	return out
}

// A tenant's server offering more candidates than the book's bound gets
// the excess dropped: not held, not offered on, counted, and logged once
// rather than per candidate; a candidate assigned leaves room for a new
// one, and an update of a held candidate still replaces it.
func TestTheOfferBookStopsAtItsCandidateBound(t *testing.T) {
	h, m, logs := boundedHub(t, Limits{BookCandidates: 10})
	w := buildWorker("w", "x86_64-linux")
	h.Join(w)
	u := attach(t, h)
	for page := range 5 {
		u.h.Handle(&wire.JobOffer{Candidates: candPage("j", page*4, 4)})
	}
	if n := len(h.book); n != 10 {
		t.Fatalf("the book holds %d candidates after 20 offered, want its bound 10", n)
	}
	var offered []string
	for _, o := range of[*wire.JobOffer](w.take()) {
		offered = append(offered, ids(o.Candidates)...)
	}
	if !slices.Equal(offered, ids(candPage("j", 0, 10))) {
		t.Fatalf("the worker was offered %v, want the 10 the book holds", offered)
	}
	if got := testutil.ToFloat64(m.bounded.WithLabelValues("tenant-a", "book_candidates")); got != 10 {
		t.Errorf("gradient_proxy_hub_bounded_total{bound=book_candidates} = %v, want 10", got)
	}
	if got := testutil.ToFloat64(m.bookSize.WithLabelValues("tenant-a")); got != 10 {
		t.Errorf("gradient_proxy_hub_book_candidates = %v, want 10", got)
	}
	if n := strings.Count(logs.String(), "passes the proxy's bounds"); n != 1 {
		t.Errorf("%d log lines for 10 dropped candidates in 3 messages, want 1:\n%s", n, logs)
	}

	// An update of a held candidate replaces it; a new one is dropped.
	update := buildCand("j3", "x86_64-linux", "kvm")
	u.h.Handle(&wire.JobOffer{Candidates: []wire.JobCandidate{update, buildCand("new", "x86_64-linux")}})
	if c := h.book["j3"]; !slices.Equal(c.Requirement.RequiredFeatures, []string{"kvm"}) {
		t.Errorf("the update of a held candidate was not taken: %+v", c)
	}
	if _, ok := h.book["new"]; ok {
		t.Errorf("a candidate past the bound entered the book")
	}
	// An assignment takes a candidate out of the book: room for one.
	h.FromWorker(w, &wire.RequestJob{Kind: wire.JobKindBuild})
	u.h.Handle(buildAssign("j0", "x86_64-linux"))
	u.h.Handle(&wire.JobOffer{Candidates: []wire.JobCandidate{buildCand("new", "x86_64-linux")}})
	if _, ok := h.book["new"]; !ok || len(h.book) != 10 {
		t.Errorf("after an assignment freed a place the book holds %d, new held: %v", len(h.book), ok)
	}
}

// The byte bound holds however few candidates carry the bytes: a
// candidate with a huge closure is dropped when it does not fit, while
// small ones still enter.
func TestTheOfferBookStopsAtItsByteBound(t *testing.T) {
	h, m, _ := boundedHub(t, Limits{BookBytes: 64 << 10})
	u := attach(t, h)
	big := buildCand("big", "x86_64-linux")
	for i := range 1000 {
		big.RequiredPaths = append(big.RequiredPaths, wire.RequiredPath{Path: fmt.Sprintf("/nix/store/%032d-input", i), CacheInfo: &wire.CacheInfo{NarSize: 1}})
	}
	u.h.Handle(&wire.JobOffer{Candidates: append(candPage("small", 0, 3), big)})
	if _, ok := h.book["big"]; ok || len(h.book) != 3 {
		t.Fatalf("book %v: want the three small candidates, the big one dropped", slices.Sorted(maps.Keys(h.book)))
	}
	if h.inBook.bytes > h.limits.BookBytes {
		t.Errorf("the book holds %d bytes, its bound is %d", h.inBook.bytes, h.limits.BookBytes)
	}
	if got := testutil.ToFloat64(m.bounded.WithLabelValues("tenant-a", "book_bytes")); got != 1 {
		t.Errorf("gradient_proxy_hub_bounded_total{bound=book_bytes} = %v, want 1", got)
	}
}

// A job list is bounded on its own while its pages arrive, whether
// asked for or not: pages that never end hold no more than the bound,
// and the final page replaces the book with what was kept.
func TestAJobListStopsAtTheBound(t *testing.T) {
	h, _, _ := boundedHub(t, Limits{BookCandidates: 10})
	u := attach(t, h)
	u.h.Handle(&wire.JobOffer{Candidates: candPage("old", 0, 10)})
	for page := range 50 {
		u.h.Handle(&wire.JobListChunk{Candidates: candPage("l", page*100, 100)})
	}
	if len(h.listing) != 10 || len(h.book) != 10 {
		t.Fatalf("after 5,000 listed candidates the listing holds %d and the book %d, want 10 each", len(h.listing), len(h.book))
	}
	u.h.Handle(&wire.JobListChunk{IsFinal: true})
	if _, ok := h.book["l9"]; !ok || len(h.book) != 10 || len(h.listing) != 0 {
		t.Fatalf("the final page left a book of %d (l9 held: %v), a listing of %d", len(h.book), ok, len(h.listing))
	}
	if h.inBook.count != 10 || h.inListing.count != 0 {
		t.Errorf("held counts %+v, %+v", h.inBook, h.inListing)
	}
}

// Cache queries and uploads waiting for a tenant's server that never
// answers are bounded: past the bound a worker's query gets a CacheError
// at once and its upload a retry, nothing more is held.
func TestWaitingQueriesAndUploadsAreBounded(t *testing.T) {
	h, m, _ := boundedHub(t, Limits{PendingQueries: 3, PendingUploads: 2})
	w := buildWorker("w", "x86_64-linux")
	h.Join(w)
	u := attach(t, h)
	for i := range 5 {
		h.FromWorker(w, &wire.CacheQuery{QueryID: fmt.Sprint("q", i)})
	}
	if n := len(upOf[*wire.CacheQuery](u.take())); n != 3 || len(h.queries) != 3 {
		t.Fatalf("%d queries went upstream, %d held; want 3 (the bound)", n, len(h.queries))
	}
	errs := of[*wire.CacheError](w.take())
	if len(errs) != 2 || errs[0].QueryID != "q3" || errs[1].QueryID != "q4" || errs[0].Message != reasonTooManyQueries {
		t.Fatalf("the worker got %+v, want q3 and q4 refused", errs)
	}
	h.FromWorker(w, &wire.QueryKnownDerivations{QueryID: "k"})
	if errs := of[*wire.CacheError](w.take()); len(errs) != 1 || errs[0].QueryID != "k" {
		t.Fatalf("a QueryKnownDerivations past the bound: %+v", errs)
	}
	for i := range 3 {
		h.FromWorker(w, &wire.UploadRequest{RequestID: uint64(i), Object: &wire.UploadNar{StorePath: "/nix/store/x"}})
	}
	if n := len(upOf[*wire.UploadRequest](u.take())); n != 2 || len(h.uploads) != 2 {
		t.Fatalf("%d uploads went upstream, %d held; want 2", n, len(h.uploads))
	}
	if got := of[*wire.UploadCommitted](w.take()); len(got) != 1 || got[0].RequestID != 2 {
		t.Fatalf("the upload past the bound got %+v, want a retry for request 2", got)
	}
	if got := testutil.ToFloat64(m.bounded.WithLabelValues("tenant-a", "pending_queries")); got != 3 {
		t.Errorf("refused queries counted %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.bounded.WithLabelValues("tenant-a", "pending_uploads")); got != 1 {
		t.Errorf("refused uploads counted %v, want 1", got)
	}
	// An answer frees a place.
	for id := range h.queries {
		u.h.Handle(&wire.CacheStatus{QueryID: id})
		break
	}
	h.FromWorker(w, &wire.CacheQuery{QueryID: "again"})
	if n := len(upOf[*wire.CacheQuery](u.take())); n != 1 {
		t.Errorf("after an answer a query went upstream %d times, want 1", n)
	}
}

// The attacker's path: a page of 1,000 offered candidates into a book
// at its bound costs a size estimate per candidate and no allocation
// per candidate; into a book with room, the candidates are kept.
func BenchmarkOfferPageIntoAFullBook(b *testing.B) {
	h := New("tenant-a", slog.New(slog.DiscardHandler), nil)
	h.limits = Limits{BookCandidates: 1000}.withDefaults()
	u := &fakeUpstream{}
	u.h = h.Attach(u.send, nil)
	u.h.Handle(&wire.JobOffer{Candidates: candPage("held", 0, 1000)})
	page := &wire.JobOffer{Candidates: candPage("flood", 0, 1000)}
	b.ReportAllocs()
	for b.Loop() {
		u.h.Handle(page)
	}
	if len(h.book) != 1000 {
		b.Fatalf("the book holds %d", len(h.book))
	}
}
