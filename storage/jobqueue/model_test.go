package jobqueue

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/storage"
)

// A model test of job ownership across server instances (README
// "Several instances", docs/protocol/jobs.md §12.6): three instances, each
// with its own Queue and server_instances row, take random steps — claim,
// complete, fail, lose the worker, crash, restart (recovery at start),
// recover dead instances' work, two recoveries at once — and after every
// step the database must agree with the model: each job done, failed,
// cancelled, pending with no open assignment, or assigned with exactly
// one; the open assignments exactly those the model holds, each naming
// its instance; every assignment recovered exactly once. At the end, with
// every instance back and the queue drained, every evaluation has ended.
//
// GRADIENT_MODEL_SEED replays a run (its seed is logged when it fails);
// GRADIENT_MODEL_STEPS changes the number of steps (300).
func TestInstancesModel(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GRADIENT_MODEL_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("GRADIENT_MODEL_SEED: %v", err)
		}
		seed = v
	}
	steps := 300
	if s := os.Getenv("GRADIENT_MODEL_STEPS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("GRADIENT_MODEL_STEPS: %v", err)
		}
		steps = v
	}
	forEachEngine(t, func(t *testing.T, db *testDB) {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("replay with GRADIENT_MODEL_SEED=%d GRADIENT_MODEL_STEPS=%d", seed, steps)
			}
		})
		m := newModel(t, db, seed)
		for step := range steps {
			m.step(step)
			m.check(fmt.Sprintf("step %d (%s)", step, m.last))
		}
		m.finish()
	})
}

type modelInstance struct {
	id   string
	q    *Queue
	live bool
}

type modelAssignment struct{ id, job, instance string }

type model struct {
	t       *testing.T
	db      *testDB
	rng     *rand.Rand
	inst    []*modelInstance
	worker  string
	project string
	evals   []string
	// open are the assignments the model says are open, by ID.
	open map[string]modelAssignment
	// recovered counts, by instance, the assignments recoveries closed.
	recovered map[string]int
	// closed are recovered assignments, for late reports.
	closed []modelAssignment
	last   string // the last step, for failures
	nEval  int
	sqlite bool // a start recovers every open assignment
}

func newModel(t *testing.T, db *testDB, seed uint64) *model {
	m := &model{t: t, db: db, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), worker: storage.NewID(),
		open: map[string]modelAssignment{}, recovered: map[string]int{}, sqlite: db.DB.Engine() != storage.EnginePostgres}
	for _, id := range []string{"i0", "i1", "i2"} {
		m.inst = append(m.inst, &modelInstance{id: id, q: instanceQueue(t, db, id), live: true})
	}
	m.project = newEvaluation(t, db).ProjectID // its flake job stays pending: not claimed by the model
	for range 3 {
		m.newEvaluation()
	}
	return m
}

// newEvaluation adds an evaluation whose builds form a small graph:
// a, b; c needs a; d needs a and b; e needs d.
func (m *model) newEvaluation() {
	m.nEval++
	e := newEvaluationIn(m.t, m.db, m.project)
	startEvaluation(m.t, m.db, e.ID, m.worker,
		discovered("a", "a"), discovered("b", "b"), discovered("c", "c", "a"),
		discovered("d", "d", "a", "b"), discovered("e", "e", "d"))
	m.evals = append(m.evals, e.ID)
}

func (m *model) pick(list []*modelInstance) *modelInstance {
	if len(list) == 0 {
		return nil
	}
	return list[m.rng.IntN(len(list))]
}

func (m *model) live(want bool) []*modelInstance {
	var out []*modelInstance
	for _, i := range m.inst {
		if i.live == want {
			out = append(out, i)
		}
	}
	return out
}

func (m *model) byID(id string) *modelInstance {
	for _, i := range m.inst {
		if i.id == id {
			return i
		}
	}
	m.t.Fatalf("no instance %q", id)
	return nil
}

// anyOpen is a random open assignment, or false.
func (m *model) anyOpen() (modelAssignment, bool) {
	if len(m.open) == 0 {
		return modelAssignment{}, false
	}
	ids := make([]string, 0, len(m.open))
	for id := range m.open {
		ids = append(ids, id)
	}
	slices.Sort(ids) // map order is not the seed's
	return m.open[ids[m.rng.IntN(len(ids))]], true
}

// pendingBuilds are the pending build jobs of the model's evaluations.
func (m *model) pendingBuilds() []string {
	var out []string
	for _, j := range allPending(m.t, m.db) {
		if j.Kind == storage.JobBuild {
			out = append(out, j.JobID)
		}
	}
	slices.Sort(out)
	return out
}

// expected are the open assignments a recovery by self must close:
// those of dead instances, and with own (at start) those of self, or on
// SQLite (one process by design) every one.
func (m *model) expected(self string, own bool) map[string]modelAssignment {
	out := map[string]modelAssignment{}
	for id, a := range m.open {
		if (own && (a.instance == self || m.sqlite)) || (a.instance != self && !m.byID(a.instance).live) {
			out[id] = a
		}
	}
	return out
}

// recoveredJobs checks that lost are exactly the expected assignments
// (by instance and job) and records them as closed.
func (m *model) tookOver(what string, want map[string]modelAssignment, lost ...[]LostInstance) {
	m.t.Helper()
	got := map[string]string{} // job → instance
	for _, l := range lost {
		for _, li := range l {
			for _, job := range li.Jobs {
				if prev, dup := got[job]; dup {
					m.t.Fatalf("%s: job %s recovered twice (from %s and %s)", what, job, prev, li.ID)
				}
				got[job] = li.ID
			}
		}
	}
	if len(got) != len(want) {
		m.t.Fatalf("%s: recovered %d jobs %v, want %d %v", what, len(got), got, len(want), want)
	}
	for id, a := range want {
		if got[a.job] != a.instance {
			m.t.Fatalf("%s: job %s of %s recovered as %q's", what, a.job, a.instance, got[a.job])
		}
		m.closeRecovered(id)
	}
}

func (m *model) closeRecovered(id string) {
	a := m.open[id]
	delete(m.open, id)
	m.recovered[a.instance]++
	m.closed = append(m.closed, a)
}

// restart registers a dead instance again and returns what its recovery
// at start must close.
func (m *model) register(i *modelInstance) map[string]modelAssignment {
	if _, err := m.db.RegisterInstance(m.t.Context(), storage.ServerInstance{ID: i.id, Host: "test"}, time.Hour, false); err != nil {
		m.t.Fatalf("restart %s: %v", i.id, err)
	}
	i.live = true
	return m.expected(i.id, true)
}

func (m *model) step(n int) {
	t, ctx := m.t, m.t.Context()
	switch r := m.rng.IntN(100); {
	case r < 35: // claim a pending job, mostly on a live instance
		i := m.pick(m.live(true))
		if m.rng.IntN(20) == 0 || i == nil {
			i = m.pick(m.inst) // a paused instance that does not know it is taken for dead
		}
		pending := m.pendingBuilds()
		if len(pending) == 0 {
			if len(m.open) == 0 {
				m.last = "new evaluation"
				m.newEvaluation()
				return
			}
			m.last = "claim: nothing pending"
			return
		}
		job := pending[m.rng.IntN(len(pending))]
		m.last = "claim " + job + " on " + i.id
		id, err := i.q.ClaimJob(ctx, job, m.worker)
		if err != nil {
			t.Fatalf("%s: %v", m.last, err)
		}
		m.open[id] = modelAssignment{id: id, job: job, instance: i.id}
	case r < 45: // a worker completes (its instance may be paused: it still records)
		a, ok := m.anyOpen()
		if !ok {
			m.last = "complete: nothing open"
			return
		}
		m.last = "complete " + a.job + " on " + a.instance
		if _, err := m.byID(a.instance).q.CompleteBuild(ctx, a.id, nil); err != nil {
			t.Fatalf("%s: %v", m.last, err)
		}
		delete(m.open, a.id)
	case r < 49: // a paused instance's worker reports on a recovered assignment
		if len(m.closed) == 0 {
			m.last = "late report: nothing recovered yet"
			return
		}
		a := m.closed[m.rng.IntN(len(m.closed))]
		m.last = "late report " + a.job + " of " + a.instance
		var err error
		if m.rng.IntN(2) == 0 {
			_, err = m.byID(a.instance).q.CompleteBuild(ctx, a.id, nil)
		} else {
			_, _, err = m.byID(a.instance).q.FailJob(ctx, a.id, storage.FailurePermanent, "late", 3)
		}
		if !errors.Is(err, storage.ErrConflict) {
			t.Fatalf("%s: %v, want ErrConflict", m.last, err)
		}
	case r < 54: // a retryable failure
		a, ok := m.anyOpen()
		if !ok {
			m.last = "fail: nothing open"
			return
		}
		m.last = "fail " + a.job
		if _, _, err := m.byID(a.instance).q.FailJob(ctx, a.id, storage.FailureTransient, "blip", 3); err != nil {
			t.Fatalf("%s: %v", m.last, err)
		}
		delete(m.open, a.id)
	case r < 58: // the worker's session is lost
		a, ok := m.anyOpen()
		if !ok {
			m.last = "lose: nothing open"
			return
		}
		m.last = "lose the worker of " + a.job
		if _, err := m.byID(a.instance).q.ReleaseLostAssignment(ctx, a.id, 100); err != nil {
			t.Fatalf("%s: %v", m.last, err)
		}
		delete(m.open, a.id)
	case r < 66: // an instance crashes: lease passes, or its row goes (a stop)
		live := m.live(true)
		if len(live) < 2 {
			m.last = "crash: keeping the last live instance"
			return
		}
		i := m.pick(live)
		if m.rng.IntN(2) == 0 {
			m.last = "crash " + i.id + " (lease passes)"
			expireInstance(t, m.db, i.id)
		} else {
			m.last = "crash " + i.id + " (row deleted)"
			if err := m.db.DeleteInstance(ctx, i.id); err != nil {
				t.Fatal(err)
			}
		}
		i.live = false
	case r < 72: // a dead instance restarts
		i := m.pick(m.live(false))
		if i == nil {
			m.last = "restart: none dead"
			return
		}
		m.last = "restart " + i.id
		want := m.register(i)
		n, err := i.q.RecoverInterruptedWork(ctx)
		if err != nil || n != len(want) {
			t.Fatalf("%s: RecoverInterruptedWork = %d, %v; want %d", m.last, n, err, len(want))
		}
		for id := range want {
			m.closeRecovered(id)
		}
	case r < 86: // a live instance's pass recovers dead instances' work
		i := m.pick(m.live(true))
		m.last = "recover dead on " + i.id
		want := m.expected(i.id, false)
		lost, err := i.q.RecoverDeadInstances(ctx)
		if err != nil {
			t.Fatalf("%s: %v", m.last, err)
		}
		m.tookOver(m.last, want, lost)
	case r < 96: // two live instances' passes at the same moment
		live := m.live(true)
		if len(live) < 2 {
			m.last = "concurrent recovery: one live instance"
			return
		}
		m.rng.Shuffle(len(live), func(x, y int) { live[x], live[y] = live[y], live[x] })
		m.last = "recover dead on " + live[0].id + " and " + live[1].id + " at once"
		want := m.expected(live[0].id, false)
		lost := make([][]LostInstance, 2)
		var wg sync.WaitGroup
		for k := range 2 {
			wg.Go(func() {
				var err error
				if lost[k], err = live[k].q.RecoverDeadInstances(ctx); err != nil {
					t.Errorf("%s: %v", m.last, err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		m.tookOver(m.last, want, lost...)
	default: // a dead instance restarts while a live one recovers
		dead, live := m.pick(m.live(false)), m.pick(m.live(true))
		if dead == nil {
			m.last = "restart during recovery: none dead"
			return
		}
		m.last = "restart " + dead.id + " while " + live.id + " recovers"
		want := m.register(dead)
		var n int
		var lost []LostInstance
		var errStart, errDead error
		var wg sync.WaitGroup
		wg.Go(func() { n, errStart = dead.q.RecoverInterruptedWork(ctx) })
		wg.Go(func() { lost, errDead = live.q.RecoverDeadInstances(ctx) })
		wg.Wait()
		if errStart != nil || errDead != nil {
			t.Fatalf("%s: %v, %v", m.last, errStart, errDead)
		}
		took := 0
		for _, l := range lost {
			if l.ID == dead.id {
				t.Fatalf("%s: %s recovered the restarted instance's work", m.last, live.id)
			}
			took += len(l.Jobs)
		}
		if n+took != len(want) {
			t.Fatalf("%s: the start closed %d and the pass %d, want %d in all, each once", m.last, n, took, len(want))
		}
		for id := range want {
			m.closeRecovered(id)
		}
	}
}

// check compares the database with the model.
func (m *model) check(when string) {
	t, ctx := m.t, m.t.Context()
	t.Helper()
	raw := m.db.Base().SQL()
	// The open assignments are the model's, each naming its instance.
	open, err := m.db.OpenAssignments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range open {
		want, ok := m.open[a.AssignmentID]
		if !ok {
			if a.InstanceID == "" { // the flake jobs startEvaluation runs close at once
				t.Fatalf("%s: ownerless open assignment %+v", when, a)
			}
			t.Fatalf("%s: assignment %s of job %s (%s) open, the model closed it", when, a.AssignmentID, a.JobID, a.InstanceID)
		}
		if a.InstanceID != want.instance || a.JobID != want.job {
			t.Fatalf("%s: assignment %+v, model %+v", when, a, want)
		}
		if seen[a.JobID] {
			t.Fatalf("%s: two open assignments of job %s", when, a.JobID)
		}
		seen[a.JobID] = true
	}
	if len(open) != len(m.open) {
		t.Fatalf("%s: %d open assignments, the model holds %d", when, len(open), len(m.open))
	}
	// Every job is ended, or pending with no open assignment (its build
	// queued), or assigned with exactly one (its build building).
	rows, err := raw.QueryContext(ctx, `SELECT j.id, j.status, COALESCE(b.status, ''),
		(SELECT count(*) FROM job_assignments a WHERE a.job_id = j.id AND a.closed_at IS NULL)
		FROM jobs j LEFT JOIN builds b ON b.id = j.build_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, status, build string
		var nOpen int
		if err := rows.Scan(&id, &status, &build, &nOpen); err != nil {
			t.Fatal(err)
		}
		ok := false
		switch status {
		case "done", "failed", "cancelled":
			ok = nOpen == 0
		case "pending":
			ok = nOpen == 0 && (build == "" || build == "queued")
		case "assigned":
			ok = nOpen == 1 && build == "building"
		}
		if !ok {
			t.Fatalf("%s: job %s is %s with %d open assignments, its build %q", when, id, status, nOpen, build)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Each recovered assignment closed once, by one recovery.
	rows2, err := raw.QueryContext(ctx, `SELECT instance_id, count(*) FROM job_assignments
		WHERE outcome IN ($1, $2) GROUP BY instance_id`, OutcomeInstanceLost, OutcomeServerRestart)
	if err != nil {
		t.Fatal(err)
	}
	defer rows2.Close()
	got := map[string]int{}
	for rows2.Next() {
		var id string
		var n int
		if err := rows2.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		got[id] = n
	}
	for id, n := range m.recovered {
		if got[id] != n {
			t.Fatalf("%s: %d assignments of %s closed by recoveries, the model recovered %d", when, got[id], id, n)
		}
	}
	if len(got) > len(m.recovered) {
		t.Fatalf("%s: recoveries closed %v, the model %v", when, got, m.recovered)
	}
}

// finish brings every instance back, drains the queue and checks that
// every evaluation ended.
func (m *model) finish() {
	t, ctx := m.t, m.t.Context()
	for _, i := range m.live(false) {
		want := m.register(i)
		if n, err := i.q.RecoverInterruptedWork(ctx); err != nil || n != len(want) {
			t.Fatalf("final restart of %s: %d, %v; want %d", i.id, n, err, len(want))
		}
		for id := range want {
			m.closeRecovered(id)
		}
	}
	m.check("after the final restarts")
	for round := 0; ; round++ {
		if round > 1000 {
			t.Fatalf("the queue does not drain: %d open, %d pending", len(m.open), len(m.pendingBuilds()))
		}
		for id, a := range m.open {
			if _, err := m.byID(a.instance).q.CompleteBuild(ctx, id, nil); err != nil {
				t.Fatalf("draining: %v", err)
			}
			delete(m.open, id)
		}
		pending := m.pendingBuilds()
		if len(pending) == 0 {
			break
		}
		for _, job := range pending {
			i := m.pick(m.inst)
			id, err := i.q.ClaimJob(ctx, job, m.worker)
			if err != nil {
				t.Fatalf("draining: %v", err)
			}
			m.open[id] = modelAssignment{id: id, job: job, instance: i.id}
		}
	}
	m.check("drained")
	var ended []string
	for _, id := range m.evals {
		e, err := m.db.Evaluation(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if e.Status != storage.EvaluationSucceeded && e.Status != storage.EvaluationFailed {
			t.Fatalf("evaluation %s is %s after draining, want ended", id, e.Status)
		}
		ended = append(ended, string(e.Status))
	}
	t.Logf("%d evaluations ended (%s); recovered per instance %v", len(ended), strings.Join(ended, ", "), m.recovered)
}
