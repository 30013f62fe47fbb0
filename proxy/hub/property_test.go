package hub

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
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
	workers []*fakeWorker
	// running is the job each worker considers its own (got AssignJob,
	// accepted, not yet ended), by job ID → worker session.
	running map[string]uint64
	nextJob int
}

func newModel(t testing.TB, seed uint64) *model {
	m := &model{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	for _, name := range []string{"A", "B"} {
		tm := &tenantModel{name: name, h: New(name, slog.New(slog.DiscardHandler), nil), running: map[string]uint64{}}
		tm.up = &fakeUpstream{}
		tm.up.h = tm.h.Forward(fwdSession(tm.up))
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
	tm.h.Join(w)
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
	switch m.rng.IntN(14) {
	case 0:
		tm.up.h.Handle(&wire.JobOffer{Candidates: []wire.JobCandidate{buildCand(tm.jobID(m.rng), "x86_64-linux")}})
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
		tm.h.FromWorker(w, &wire.UploadRequest{JobID: tm.jobID(m.rng), RequestID: m.rng.Uint64N(3), Object: &wire.UploadNar{StorePath: "/nix/store/x"}})
	case 9:
		id := tm.jobID(m.rng)
		tm.up.h.Handle(&wire.NarPush{JobID: id, StorePath: "/nix/store/" + id})
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
			tm.up.h = tm.h.Forward(fwdSession(tm.up))
		}
	case 12:
		tm.h.FlushScores()
	}
	m.deliver()
}

func (tm *tenantModel) dropWorker(w *fakeWorker) {
	for id, s := range tm.running {
		if s == w.session {
			delete(tm.running, id)
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
					tm.h.FromWorker(w, &wire.AssignJobResponse{JobID: a.JobID, Accepted: true})
				case *wire.AbortJob:
					if tm.running[a.JobID] == w.session {
						delete(tm.running, a.JobID)
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
		// Workers finish some of their jobs.
		for id, s := range tm.running {
			if m.rng.IntN(3) == 0 {
				for _, w := range tm.workers {
					if w.session == s {
						delete(tm.running, id)
						tm.h.FromWorker(w, &wire.JobCompleted{JobID: id})
					}
				}
			}
		}
		for _, msg := range tm.up.sentSoFar() {
			m.checkTenant(tm, "upstream", msg)
		}
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
