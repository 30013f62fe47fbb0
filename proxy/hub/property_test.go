package hub

import (
	"bytes"
	"cmp"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/wire"
)

// model runs two tenants' hubs side by side and drives them with random
// offers, polls, assignments, answers, reports, queries, disconnects and
// upstream losses. Every job ID and every query ID names its tenant, so
// a frame of one tenant reaching the other is visible in what the other
// tenant's workers and upstream receive.
type model struct {
	t       testing.TB
	rng     *rand.Rand
	tenants []*tenantModel
}

type tenantModel struct {
	name    string
	h       *Hub
	up      *fakeUpstream
	frames  *fakeFrames
	workers []*fakeWorker
	// relays are the workers as the hub sees them: each takes relayed
	// chunk frames over, or (decline) has them encoded.
	relays map[uint64]*relayWorker
	// running is the job each worker considers its own (got AssignJob,
	// accepted, not yet ended), by job ID → worker session.
	running map[string]uint64
	nextJob int
	// pulls are the NAR pulls workers asked for: the bytes each has and
	// the stream token it knows.
	pulls map[modelPullID]*modelPull
}

type modelPullID struct {
	session   uint64
	job, path string
}

type modelPull struct {
	have  uint64
	token string
}

func newModel(t testing.TB, seed uint64) *model {
	m := &model{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	for _, name := range []string{"A", "B"} {
		tm := &tenantModel{name: name, h: New(name, slog.New(slog.DiscardHandler), nil), running: map[string]uint64{}, pulls: map[modelPullID]*modelPull{},
			relays: map[uint64]*relayWorker{}}
		// Small limits, so the steps reach them (checkBounds).
		tm.h.limits = modelLimits
		tm.up = &fakeUpstream{}
		tm.frames = &fakeFrames{}
		tm.up.h = tm.h.Attach(tm.up.send, tm.frames)
		for i := range 3 {
			tm.join(fmt.Sprintf("%s-w%d", name, i))
		}
		m.tenants = append(m.tenants, tm)
	}
	return m
}

func (tm *tenantModel) join(id string) {
	w := buildWorker(id, "x86_64-linux")
	w.caps.Fetch, w.caps.Eval = true, true
	tm.workers = append(tm.workers, w)
	r := &relayWorker{fakeWorker: w, decline: w.session%4 == 0}
	tm.relays[w.session] = r
	tm.h.Join(r)
}

// chunk hands the hub a bulk chunk as the upstream reader would, decoded
// from its frame at a random version, and checks that the frame went to
// at most one of the tenant's workers, unchanged, and was either taken
// over (the reader forgets it) or handed back, never both.
func (m *model) chunk(tm *tenantModel, msg wire.ServerMessage) {
	tm.frames.ver = wire.OldestVersion + uint16(m.rng.IntN(int(wire.NewestVersion-wire.OldestVersion)+1))
	want := slices.Clone(tm.frames.receiveOnly(m.t, msg))
	before := tm.frames.released + tm.frames.forgot
	relayedBefore := map[uint64]int{}
	for s, r := range tm.relays {
		relayedBefore[s] = len(r.relayed)
	}
	tm.up.h.Handle(tm.frames.decoded)
	if n := tm.frames.released + tm.frames.forgot - before; n != 1 {
		m.t.Fatalf("the reader was handed %d frames back or forgot them for one chunk", n)
	}
	taken := tm.frames.lastForgot
	got := 0
	for s, r := range tm.relays {
		for _, f := range r.relayed[relayedBefore[s]:] {
			got++
			if &f[0] != &tm.frames.frame[0] || !bytes.Equal(f, want) {
				m.t.Fatalf("worker %s was relayed another frame than the chunk's", r.workerID)
			}
			if tm.worker(s) == nil {
				m.t.Fatalf("a frame was relayed to session %d, not a worker of tenant %s", s, tm.name)
			}
		}
	}
	if taken != (got == 1) || got > 1 {
		m.t.Fatalf("the chunk was relayed %d times, the reader forgot it: %v", got, taken)
	}
}

// candidate is a build candidate of one of the tenant's jobs, one in
// four with inputs (more bytes).
func (tm *tenantModel) candidate(rng *rand.Rand) wire.JobCandidate {
	c := buildCand(tm.jobID(rng), "x86_64-linux")
	if rng.IntN(4) == 0 {
		for i := range 3 {
			c.RequiredPaths = append(c.RequiredPaths, wire.RequiredPath{Path: fmt.Sprintf("/nix/store/%s-in%d", c.JobID, i)})
		}
	}
	return c
}

func (tm *tenantModel) jobID(rng *rand.Rand) string {
	if tm.nextJob == 0 || rng.IntN(3) == 0 {
		tm.nextJob++
	}
	return fmt.Sprintf("%s-j%d", tm.name, 1+rng.IntN(tm.nextJob))
}

// step does one random operation.
func (m *model) step() {
	tm := m.tenants[m.rng.IntN(2)]
	other := m.tenants[0]
	if other == tm {
		other = m.tenants[1]
	}
	w := tm.workers[m.rng.IntN(len(tm.workers))]
	switch m.rng.IntN(20) {
	case 0:
		if m.rng.IntN(3) > 0 {
			tm.up.h.Handle(&wire.JobOffer{Candidates: []wire.JobCandidate{tm.candidate(m.rng)}})
			break
		}
		// A page of a job list, asked for or not, some of them final.
		var page []wire.JobCandidate
		for range m.rng.IntN(4) {
			page = append(page, tm.candidate(m.rng))
		}
		tm.up.h.Handle(&wire.JobListChunk{Candidates: page, IsFinal: m.rng.IntN(3) == 0})
	case 1:
		tm.h.FromWorker(w, &wire.RequestJob{Kind: wire.JobKind(m.rng.IntN(2))})
	case 2, 3:
		if m.rng.IntN(2) == 0 {
			tm.up.h.Handle(buildAssign(tm.jobID(m.rng), "x86_64-linux"))
		} else {
			tm.up.h.Handle(flakeAssign(tm.jobID(m.rng), wire.FlakeStepFetchFlake, wire.FlakeStepEvaluateFlake))
		}
	case 4:
		tm.h.FromWorker(w, &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: tm.jobID(m.rng), MissingNarSize: m.rng.Uint64N(100)}}, IsFinal: true})
	case 5:
		// A report for a job of either tenant, owned or not.
		id := tm.jobID(m.rng)
		if m.rng.IntN(3) == 0 {
			id = other.jobID(m.rng)
		}
		tm.h.FromWorker(w, &wire.LogChunk{JobID: id, Data: []byte("x")})
		tm.h.FromWorker(w, &wire.JobCompleted{JobID: id})
		if tm.running[id] == w.session {
			// Its own job: the worker's completion ends it.
			delete(tm.running, id)
			tm.forgetPulls(w.session, id)
		}
	case 6:
		tm.h.FromWorker(w, &wire.CacheQuery{JobID: tm.jobID(m.rng), QueryID: tm.name + "-q"})
		tm.h.FromWorker(w, &wire.CacheQuery{QueryID: tm.name + "-q"})
	case 7:
		// The upstream answers whatever queries and uploads it got.
		for _, msg := range tm.up.take() {
			switch q := msg.(type) {
			case *wire.CacheQuery:
				tm.up.h.Handle(&wire.CacheStatus{QueryID: q.QueryID})
			case *wire.UploadRequest:
				tm.up.h.Handle(&wire.UploadGrant{RequestID: q.RequestID, Target: &wire.GrantPassthrough{}})
				tm.up.h.Handle(&wire.UploadCommitted{RequestID: q.RequestID, Outcome: &wire.UploadOk{}})
			}
		}
	case 8:
		job := tm.jobID(m.rng)
		if m.rng.IntN(2) == 0 {
			job = "" // a cache peer's upload, of no job
		}
		tm.h.FromWorker(w, &wire.UploadRequest{JobID: job, RequestID: m.rng.Uint64N(3), Object: &wire.UploadNar{StorePath: "/nix/store/x"}})
	case 9:
		id := tm.jobID(m.rng)
		m.chunk(tm, &wire.NarPush{JobID: id, StorePath: "/nix/store/" + id})
		m.chunk(tm, &wire.EvalCacheChunk{JobID: id, Data: []byte("eval cache")})
		tm.up.h.Handle(&wire.AbortJob{JobID: id})
	case 10:
		// A worker disconnects; a new session of it joins.
		tm.h.Leave(w, "disconnect")
		tm.dropWorker(w)
		tm.join(w.workerID)
	case 11:
		if m.rng.IntN(4) == 0 {
			tm.up.h.Ended("lost")
			tm.up = &fakeUpstream{}
			tm.up.h = tm.h.Attach(tm.up.send, tm.frames)
		}
	case 12:
		tm.h.FlushScores()
	case 13, 17:
		// A worker asks for a NAR of a job it runs, or resumes one.
		ids := slices.Sorted(maps.Keys(tm.running))
		if len(ids) == 0 {
			break
		}
		id := ids[m.rng.IntN(len(ids))]
		owner := tm.worker(tm.running[id])
		if owner == nil {
			break
		}
		key := modelPullID{owner.session, id, "/nix/store/" + id}
		if p := tm.pulls[key]; p != nil && m.rng.IntN(2) == 0 {
			tm.h.FromWorker(owner, &wire.NarRequestResume{JobID: id, StorePath: key.path, ReceivedBytes: p.have, StreamToken: p.token})
		} else {
			tm.pulls[key] = &modelPull{}
			tm.h.FromWorker(owner, &wire.NarRequest{JobID: id, Paths: []string{key.path}})
		}
	case 14, 18, 19:
		// The upstream streams: headers (mostly one token), chunks near
		// what a worker has (or anywhere), some final, now and then an
		// abort.
		id, near := tm.jobID(m.rng), -1
		if key, p, ok := tm.somePull(m.rng); ok {
			id, near = key.job, int(p.have)
		}
		path := "/nix/store/" + id
		switch r := m.rng.IntN(10); {
		case r == 0:
			tm.up.h.Handle(&wire.NarStreamHeader{JobID: id, StorePath: path, TotalBytes: 64, StreamToken: fmt.Sprint("t", m.rng.IntN(2))})
		case r == 1:
			tm.up.h.Handle(&wire.NarAbort{JobID: id, StorePath: path})
		default:
			off := m.rng.IntN(16) * 4
			if near >= 0 {
				off = min(max(near+[]int{-3, 0, 0, 0, 4}[m.rng.IntN(5)], 0), 64)
			}
			n := min(1+m.rng.IntN(8), 64-off)
			m.chunk(tm, &wire.NarPush{JobID: id, StorePath: path, Data: make([]byte, n), Offset: uint64(off), IsFinal: off+n == 64})
		}
	case 15, 16:
		// A worker's queue fills or drains.
		w.setBacklog([]int{0, narLowWater, narHighWater}[m.rng.IntN(3)])
	}
	m.deliver()
}

func (tm *tenantModel) dropWorker(w *fakeWorker) {
	delete(tm.relays, w.session)
	for id, s := range tm.running {
		if s == w.session {
			delete(tm.running, id)
		}
	}
	for id := range tm.pulls {
		if id.session == w.session {
			delete(tm.pulls, id)
		}
	}
	for i, x := range tm.workers {
		if x == w {
			tm.workers = append(tm.workers[:i], tm.workers[i+1:]...)
			return
		}
	}
}

// deliver lets every worker act on what it received, checking that it
// is of its own tenant and that no job runs on two workers.
func (m *model) deliver() {
	for _, tm := range m.tenants {
		for _, w := range append([]*fakeWorker(nil), tm.workers...) {
			for _, msg := range w.take() {
				m.checkTenant(tm, "worker "+w.workerID, msg)
				switch a := msg.(type) {
				case *wire.AssignJob:
					if owner, ok := tm.running[a.JobID]; ok && owner != w.session {
						m.t.Fatalf("job %s assigned to %s while session %d runs it", a.JobID, w.workerID, owner)
					}
					switch m.rng.IntN(4) {
					case 0:
						tm.h.FromWorker(w, &wire.AssignJobResponse{JobID: a.JobID, Accepted: false})
						continue
					case 1:
						// A fast job: its end overtakes the answer.
						tm.h.FromWorker(w, &wire.JobCompleted{JobID: a.JobID})
						tm.h.FromWorker(w, &wire.AssignJobResponse{JobID: a.JobID, Accepted: true})
						continue
					}
					tm.running[a.JobID] = w.session
					tm.forgetPulls(w.session, a.JobID)
					tm.h.FromWorker(w, &wire.AssignJobResponse{JobID: a.JobID, Accepted: true})
				case *wire.NarStreamHeader:
					if p := tm.pulls[modelPullID{w.session, a.JobID, a.StorePath}]; p != nil {
						if p.token != "" && a.StreamToken != p.token {
							p.have = 0 // another object: the worker starts again
						}
						p.token = a.StreamToken
					}
				case *wire.NarPush:
					if p := tm.pulls[modelPullID{w.session, a.JobID, a.StorePath}]; p != nil {
						if a.Offset != p.have {
							m.t.Fatalf("worker %s got a chunk of %s at %d, it has %d bytes", w.workerID, a.StorePath, a.Offset, p.have)
						}
						p.have += uint64(len(a.Data))
					}
				case *wire.AbortJob:
					if tm.running[a.JobID] == w.session {
						delete(tm.running, a.JobID)
						tm.forgetPulls(w.session, a.JobID)
						tm.h.FromWorker(w, &wire.JobFailed{JobID: a.JobID, Kind: wire.FailureAborted})
					}
				}
			}
			if w.closed != "" {
				tm.h.Leave(w, w.closed)
				tm.dropWorker(w)
				tm.join(w.workerID)
			}
		}
		// Workers finish some of their jobs, those pulling NARs
		// seldom.
		for id, s := range tm.running {
			if odds := 3 + 20*len(tm.pullsOf(s, id)); m.rng.IntN(odds) == 0 {
				for _, w := range tm.workers {
					if w.session == s {
						delete(tm.running, id)
						tm.forgetPulls(s, id)
						tm.h.FromWorker(w, &wire.JobCompleted{JobID: id})
					}
				}
			}
		}
		for _, msg := range tm.up.sentSoFar() {
			m.checkTenant(tm, "upstream", msg)
		}
		m.checkPulls(tm)
		m.checkBounds(tm)
		checkWaiters(m.t, tm.h)
	}
}

// somePull is a random pull a worker asked for.
func (tm *tenantModel) somePull(rng *rand.Rand) (modelPullID, *modelPull, bool) {
	if len(tm.pulls) == 0 || rng.IntN(4) == 0 {
		return modelPullID{}, nil, false
	}
	keys := slices.SortedFunc(maps.Keys(tm.pulls), func(a, b modelPullID) int {
		return cmp.Or(cmp.Compare(a.session, b.session), cmp.Compare(a.job, b.job))
	})
	k := keys[rng.IntN(len(keys))]
	return k, tm.pulls[k], true
}

func (tm *tenantModel) worker(session uint64) *fakeWorker {
	for _, w := range tm.workers {
		if w.session == session {
			return w
		}
	}
	return nil
}

func (tm *tenantModel) pullsOf(session uint64, job string) []modelPullID {
	var out []modelPullID
	for id := range tm.pulls {
		if id.session == session && id.job == job {
			out = append(out, id)
		}
	}
	return out
}

func (tm *tenantModel) forgetPulls(session uint64, job string) {
	for id := range tm.pulls {
		if id.session == session && id.job == job {
			delete(tm.pulls, id)
		}
	}
}

// checkPulls: a paused pull always waits for its worker's queue to
// drain (else it would never resume), and pulls live only in jobs the
// hub holds, owned by a worker it holds.
func (m *model) checkPulls(tm *tenantModel) {
	h := tm.h
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, j := range h.jobs {
		w := h.workers[j.owner]
		if w == nil && len(j.pulls) > 0 {
			m.t.Fatalf("job %s of a gone worker holds %d pulls", j.id, len(j.pulls))
		}
		for path, p := range j.pulls {
			if p.paused && (!w.drainWatched || !w.d.(*relayWorker).watched()) {
				m.t.Fatalf("the pull of %s (job %s) is paused and waits for nothing", path, j.id)
			}
		}
	}
}

// modelLimits are the model's hubs' limits: small enough that offers,
// lists, queries and uploads pass them.
var modelLimits = Limits{BookCandidates: 6, BookBytes: 1900, PendingQueries: 4, PendingUploads: 2}

// checkBounds: the book and the listing hold what their counts say,
// within the limits, and so do the queries and uploads waiting upstream.
func (m *model) checkBounds(tm *tenantModel) {
	h := tm.h
	h.mu.Lock()
	defer h.mu.Unlock()
	var book, listing candidateSet
	for _, c := range h.book {
		book.add(candidateBytes(&c))
	}
	for i := range h.listing {
		listing.add(candidateBytes(&h.listing[i]))
	}
	switch l := h.limits; {
	case book != h.inBook || listing != h.inListing:
		m.t.Fatalf("tenant %s: book %+v counted as %+v, listing %+v as %+v", tm.name, book, h.inBook, listing, h.inListing)
	case book.count > l.BookCandidates || book.bytes > l.BookBytes || listing.count > l.BookCandidates || listing.bytes > l.BookBytes:
		m.t.Fatalf("tenant %s: book %+v, listing %+v past the limits %+v", tm.name, book, listing, l)
	case len(h.bookOrder) != len(h.book):
		m.t.Fatalf("tenant %s: %d candidates in order, %d in the book", tm.name, len(h.bookOrder), len(h.book))
	case len(h.queries) > l.PendingQueries || len(h.uploads) > l.PendingUploads:
		m.t.Fatalf("tenant %s: %d queries and %d uploads wait upstream, past the limits %+v", tm.name, len(h.queries), len(h.uploads), l)
	}
}

// checkTenant fails when a message names another tenant's job or query.
func (m *model) checkTenant(tm *tenantModel, who string, msg any) {
	v := reflect.ValueOf(msg).Elem()
	for _, field := range []string{"JobID", "QueryID"} {
		f := v.FieldByName(field)
		if !f.IsValid() || f.String() == "" {
			continue
		}
		s := f.String()
		if field == "QueryID" && who == "upstream" {
			continue // fresh, random IDs upstream
		}
		if !strings.HasPrefix(s, tm.name+"-") {
			m.t.Fatalf("%s of tenant %s got %T with %s %q", who, tm.name, msg, field, s)
		}
	}
}

func (u *fakeUpstream) sentSoFar() []wire.ClientMessage {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]wire.ClientMessage(nil), u.sent...)
}

func runModel(t testing.TB, seed uint64, steps int) {
	m := newModel(t, seed)
	for range steps {
		m.step()
	}
}

// Random interleavings of two tenants' offers, polls, reports and
// disconnects never deliver a frame of one tenant to the other and never
// leave a job owned by two workers.
func TestRandomInterleavingsKeepTenantsApart(t *testing.T) {
	for seed := range uint64(200) {
		runModel(t, seed, 400)
	}
}

func FuzzHubInterleavings(f *testing.F) {
	f.Add(uint64(1), uint16(200))
	f.Add(uint64(42), uint16(1000))
	f.Fuzz(func(t *testing.T, seed uint64, steps uint16) {
		runModel(t, seed, int(steps%2000))
	})
}
