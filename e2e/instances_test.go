package e2e

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/proxyworld"
	"gradient.dev/gradient/internal/waitfor"
)

// wideFlake is many independent leaves that each sleep a little, sums of
// five leaves each and a total of the sums: work that spreads over every
// slot of several workers, with dependencies that become ready one
// instance at a time. LEAVES (a multiple of 5), SLEEP (seconds) and TAG
// are replaced.
const wideFlake = `{
  outputs = { self }: let
    system = "x86_64-linux";
    step = name: script: builtins.derivation { inherit name system; builder = "/bin/sh"; args = [ "-c" script ]; };
    n = LEAVES;
    leaf = i: step "TAG-leaf-${toString i}" "echo building TAG leaf ${toString i}; /bin/sleep SLEEP; echo ${toString i} > $out";
    leaves = builtins.genList leaf n;
    sum = j: step "TAG-sum-${toString j}"
      "echo building TAG sum ${toString j}; /bin/cat ${builtins.concatStringsSep " " (map toString (builtins.genList (k: builtins.elemAt leaves (j * 5 + k)) 5))} > $out";
    sums = builtins.genList sum (n / 5);
  in {
    packages.${system} = builtins.listToAttrs (
      builtins.genList (i: { name = "leaf-${toString i}"; value = builtins.elemAt leaves i; }) n
      ++ builtins.genList (j: { name = "sum-${toString j}"; value = builtins.elemAt sums j; }) (n / 5)
      ++ [ { name = "total"; value = step "TAG-total" "echo building TAG total; /bin/cat ${builtins.concatStringsSep " " (map toString sums)} > $out"; } ]);
  };
}
`

// wideCommit commits the wide flake with tag, leaves and sleep to repo
// and returns the commit and the number of builds it makes.
func wideCommit(t *testing.T, repo, tag string, leaves int, sleep string) (string, int) {
	t.Helper()
	flake := strings.NewReplacer("TAG", tag, "LEAVES", fmt.Sprint(leaves), "SLEEP", sleep).Replace(wideFlake)
	if err := os.WriteFile(filepath.Join(repo, "flake.nix"), []byte(flake), 0o644); err != nil {
		t.Fatal(err)
	}
	nixtest.Git(t, repo, "add", "flake.nix")
	nixtest.Git(t, repo, "commit", "--quiet", "-m", tag)
	return nixtest.Git(t, repo, "rev-parse", "HEAD"), leaves + leaves/5 + 1
}

// instancesWorld is a cluster of server instances on one PostgreSQL
// database behind a load balancer, with a flake project.
type instancesWorld struct {
	c       *proxyworld.Cluster
	db      *sql.DB
	repo    string
	project string
	key     string // the project cache's public key
}

func newInstancesWorld(t *testing.T, instances int) *instancesWorld {
	t.Helper()
	w := &instancesWorld{c: proxyworld.StartCluster(t, "srv", proxyworld.ClusterOptions{Instances: instances,
		// A retry at once after a lost worker: the default waits 30 s.
		Args: []string{"--allow-local-repositories", "--build-retry-backoff-secs", "0"}})}
	db, err := sql.Open("pgx", w.c.Database)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	w.db = db
	w.repo, _ = nixtest.Repo(t, map[string]string{"README": "wide"})
	// Through the load balancer: each CLI call may reach another instance.
	w.project = w.c.Front.FlakeProject(t, "ops", "wide", w.repo, "packages.x86_64-linux.*")
	w.key = strings.TrimSpace(w.c.Front.CLI(t, "cache", "public-key", "wide-cache"))
	return w
}

// worker registers a worker ID for project and runs a gradient-worker
// with its own chroot store dialing url, with slots build slots and
// args more flags.
func (w *instancesWorld) worker(t *testing.T, name, project, url string, slots int, args ...string) *proxyworld.Worker {
	t.Helper()
	id, peers := w.c.Front.Register(t, project)
	return w.workerAs(t, name, id, peers, url, slots, args...)
}

func (w *instancesWorld) workerAs(t *testing.T, name, id, peers, url string, slots int, args ...string) *proxyworld.Worker {
	t.Helper()
	return w.prepare(t, name, id, peers, url, slots, args...)()
}

// prepare registers nothing and starts nothing: it makes the worker's
// store and returns what starts it, so several workers start back to
// back (their connections consecutive at the load balancer).
func (w *instancesWorld) prepare(t *testing.T, name, id, peers, url string, slots int, args ...string) func() *proxyworld.Worker {
	t.Helper()
	n := nixtest.New(t)
	env := append(slices.Clone(n.Env), "NIX_CONFIG="+strings.Join(append([]string{"store = " + n.Store}, nixtest.Config...), "\n"),
		"GRADIENT_WORKER_TRUSTED_PUBLIC_KEYS="+w.key)
	return func() *proxyworld.Worker {
		return proxyworld.StartWorker(t, name, proxyworld.WorkerOptions{ServerURL: url, ID: id, Peers: peers, Slots: slots,
			Args: append([]string{"--allow-local-repositories", "--log-level", "info"}, args...), Env: env})
	}
}

// lbWorkers registers n workers with two slots each and starts them
// back to back dialing the load balancer, so its round robin spreads
// their sessions; it returns them once each is live, with the instance
// holding each one's session (asked of the first instance directly,
// not to disturb the rotation).
func (w *instancesWorld) lbWorkers(t *testing.T, n int) ([]*proxyworld.Worker, map[string]string) {
	t.Helper()
	var starts []func() *proxyworld.Worker
	for i := 1; i <= n; i++ {
		id, peers := w.c.Front.Register(t, w.project)
		starts = append(starts, w.prepare(t, fmt.Sprintf("worker-%d", i), id, peers, w.c.Front.ProtoURL, 2))
	}
	var workers []*proxyworld.Worker
	for _, start := range starts {
		workers = append(workers, start())
	}
	return workers, liveOn(t, w.c.Servers[0], w.project, workers...)
}

// sessionOnServer is a worker as `gradient worker list --json` shows it.
type sessionOnServer struct {
	WorkerID string `json:"worker_id"`
	Live     bool   `json:"live"`
	Instance string `json:"instance"`
}

// sessions are the project's workers as s lists them, by worker ID.
func sessions(t *testing.T, s *proxyworld.Server, project string) map[string]sessionOnServer {
	t.Helper()
	var list []sessionOnServer
	if err := json.Unmarshal([]byte(s.CLI(t, "worker", "list", "--project", project, "--json")), &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]sessionOnServer{}
	for _, w := range list {
		out[w.WorkerID] = w
	}
	return out
}

// liveOn waits until every one of workers is live and returns the
// instance holding each one's session.
func liveOn(t *testing.T, s *proxyworld.Server, project string, workers ...*proxyworld.Worker) map[string]string {
	t.Helper()
	on := map[string]string{}
	waitfor.Within(t, 2*time.Minute, "every worker live", func() bool {
		list := sessions(t, s, project)
		for _, w := range workers {
			if l := list[w.ID]; !l.Live || l.Instance == "" {
				time.Sleep(200 * time.Millisecond)
				return false
			}
			on[w.ID] = list[w.ID].Instance
		}
		return true
	})
	return on
}

// assignment is a row of job_assignments.
type assignment struct {
	ID, JobID, WorkerID string
	Opened              int64
	Closed              sql.NullInt64
	Outcome             sql.NullString
}

// assignments are the evaluation's jobs' assignments (every instance's,
// read from the shared database), by job, in the order they opened;
// kind "" is every job's, else only kind's (flake, build).
func (w *instancesWorld) assignments(t *testing.T, evalID, kind string) map[string][]assignment {
	t.Helper()
	rows, err := w.db.QueryContext(t.Context(), `SELECT a.id, a.job_id, a.worker_id, a.opened_at, a.closed_at, a.outcome
		FROM job_assignments a JOIN jobs j ON j.id = a.job_id WHERE j.evaluation_id = $1 AND ($2 = '' OR j.kind = $2)
		ORDER BY a.opened_at, a.id`, evalID, kind)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]assignment{}
	for rows.Next() {
		var a assignment
		if err := rows.Scan(&a.ID, &a.JobID, &a.WorkerID, &a.Opened, &a.Closed, &a.Outcome); err != nil {
			t.Fatal(err)
		}
		out[a.JobID] = append(out[a.JobID], a)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// noOverlap fails t when a job ran on two workers at once, or had an
// assignment still open after its evaluation ended. The database itself
// holds at most one open assignment per job (the unique partial index
// job_assignments_open, required here); the times compare the
// assignments a worker accepted. A declined one never ran, and its
// times cannot be compared with the next claim's: opened_at is taken
// before the claim's statement waits for a connection and for the job's
// row, so a claim that waited behind another instance's claim, decline
// and release opens "before" that release closed (CI saw 136 ms).
func (w *instancesWorld) noOverlap(t *testing.T, byJob map[string][]assignment) {
	t.Helper()
	var def string
	if err := w.db.QueryRowContext(t.Context(), `SELECT indexdef FROM pg_indexes WHERE indexname = 'job_assignments_open'`).Scan(&def); err != nil ||
		!strings.Contains(def, "UNIQUE") || !strings.Contains(def, "closed_at IS NULL") {
		t.Errorf("the database does not hold one open assignment per job: index %q, %v", def, err)
	}
	for job, as := range byJob {
		var ran []assignment
		for _, a := range as {
			if !a.Closed.Valid {
				t.Errorf("job %s: assignment %s to %s still open after the evaluation ended", job, a.ID, a.WorkerID)
				continue
			}
			if a.Outcome.String != outcomeDeclined {
				ran = append(ran, a)
			}
		}
		for i := 0; i+1 < len(ran); i++ {
			if a, b := ran[i], ran[i+1]; a.Closed.Int64 > b.Opened {
				t.Errorf("job %s: assignment %s (%s, %d–%d) overlaps %s (%s, opened %d)", job, a.ID, a.WorkerID,
					a.Opened, a.Closed.Int64, b.ID, b.WorkerID, b.Opened)
			}
		}
	}
}

// outcomeDeclined closes an assignment the worker declined.
const outcomeDeclined = "declined"

// buildLog is `gradient build log` of a build against s.
func buildLog(t *testing.T, s *proxyworld.Server, buildID string) string {
	t.Helper()
	return s.CLI(t, "build", "log", buildID)
}

// checkEverywhere requires the evaluation to have succeeded with builds
// builds as every instance sees it (same status, every build succeeded),
// each build's log readable from each instance and its outputs in the
// project's cache.
func (w *instancesWorld) checkEverywhere(t *testing.T, ev evalView, builds int, tag string) {
	t.Helper()
	if len(ev.Builds) != builds {
		t.Errorf("evaluation %s has %d builds, want %d", ev.ID, len(ev.Builds), builds)
	}
	for _, s := range w.c.Servers {
		if s.Exited() {
			continue
		}
		got := evaluation(t, s, ev.ID)
		succeeded(t, s, got)
		if got.Status != ev.Status || len(got.Builds) != len(ev.Builds) {
			t.Errorf("%s: evaluation %s %s with %d builds; through the load balancer %s with %d", s.Name, ev.ID, got.Status,
				len(got.Builds), ev.Status, len(ev.Builds))
		}
		for i, b := range got.Builds {
			// The first through the CLI, the others through the admin API
			// it calls (faster than a process per log).
			var log string
			if i == 0 {
				log = buildLog(t, s, b.ID)
			} else {
				log = string(s.API(t, "GET", "/api/v1/builds/"+b.ID+"/log", nil, nil))
			}
			if !strings.Contains(log, "building "+tag+" "+strings.ReplaceAll(b.leaf(), "-", " ")) {
				t.Errorf("%s: log of %s (%s) reads %q", s.Name, b.Attr, b.ID, log)
			}
		}
	}
	for _, b := range ev.Builds {
		for _, o := range b.Outputs {
			hash := strings.SplitN(strings.TrimPrefix(o.Path, "/nix/store/"), "-", 2)[0]
			resp, err := http.Get(w.c.Front.URL + "/cache/wide-cache/" + hash + ".narinfo")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s's output %s: narinfo answers %d", b.Attr, o.Path, resp.StatusCode)
			}
		}
	}
}

// spread requires the workers' sessions to be on more than one instance.
func spread(t *testing.T, on map[string]string) {
	t.Helper()
	instances := map[string]bool{}
	for _, in := range on {
		instances[in] = true
	}
	if len(instances) < 2 {
		t.Errorf("every worker's session is on %v: the load balancer did not spread them", on)
	}
}

// runWide runs one wide evaluation through the load balancer on three
// workers with two slots each, all dialing the load balancer, and checks
// it from every instance.
func runWide(t *testing.T, instances int) {
	w := newInstancesWorld(t, instances)
	workers, on := w.lbWorkers(t, 3)
	t.Logf("sessions: %v; load balancer connections: %v", on, w.c.LB.Connections())
	spread(t, on)
	tag := fmt.Sprintf("wide%d", instances)
	commit, builds := wideCommit(t, w.repo, tag, 25, "1")
	start := time.Now()
	id := startEval(t, w.c.Front, w.project, commit)
	ev := waitEval(t, w.c.Front, id, "ends", terminal)
	t.Logf("%d builds on %d instances: %s", builds, instances, time.Since(start).Round(time.Millisecond))
	w.checkEverywhere(t, ev, builds, tag)
	byJob := w.assignments(t, id, "")
	w.noOverlap(t, byJob)
	// Nothing was lost, so each build was built by exactly one worker.
	for _, b := range ev.Builds {
		if by := builtBy(b, workers...); len(by) != 1 {
			t.Errorf("%s built by %v, want exactly one worker", b.Attr, by)
		}
	}
	// The builds ran on more than one instance's workers.
	used := map[string]bool{}
	for _, b := range ev.Builds {
		used[on[b.WorkerID]] = true
	}
	if len(used) < 2 {
		t.Errorf("every build ran on workers of %v", used)
	}
}

// Two and three gradient-server instances on one PostgreSQL database
// behind a load balancer, real workers on real Nix dialing the load
// balancer: the evaluation completes and every instance tells the same.
func TestInstancesTwo(t *testing.T) {
	nixtest.Require(t, "nix", "nix-store", "git")
	runWide(t, 2)
}

func TestInstancesThree(t *testing.T) {
	nixtest.Require(t, "nix", "nix-store", "git")
	runWide(t, 3)
}

// outcomeInstanceLost closes the assignments of a server instance that
// died, once its lease passed (the re-queue of the claims work).
const outcomeInstanceLost = "server instance lost"

// kill -9 of one of three instances while builds run on workers whose
// sessions it holds: those workers get into a live instance through the
// load balancer, the jobs it held are re-queued once, and the evaluation
// completes with nothing lost.
func TestInstanceKilledMidRun(t *testing.T) {
	nixtest.Require(t, "nix", "nix-store", "git")
	w := newInstancesWorld(t, 3)
	workers, on := w.lbWorkers(t, 3)
	t.Logf("sessions: %v", on)
	spread(t, on)
	commit, builds := wideCommit(t, w.repo, "kill", 20, "4")
	id := startEval(t, w.c.Front, w.project, commit)

	// The victim: an instance holding the session of a worker that has
	// just started a build (each runs 4 s and more: still running at the
	// kill).
	var victim string
	waitfor.Within(t, 4*time.Minute, "a build just started on a worker of some instance", func() bool {
		time.Sleep(100 * time.Millisecond)
		recent := time.Now().Add(-1500 * time.Millisecond).UnixMilli()
		for _, as := range w.assignments(t, id, "build") {
			last := as[len(as)-1]
			if !last.Closed.Valid && on[last.WorkerID] != "" && last.Opened >= recent {
				victim = on[last.WorkerID]
				return true
			}
		}
		return false
	})
	vi := slices.IndexFunc(w.c.Servers, func(s *proxyworld.Server) bool { return s.Name == victim })
	established := map[string]int{}
	for _, wk := range workers {
		established[wk.ID] = len(wk.Lines(`msg="session established"`))
	}
	w.c.Kill(vi)
	killed := time.Now()
	// What it held at the kill: nothing closes its assignments until its
	// lease passes, so they are the open ones of its workers now.
	held := map[string]assignment{} // job → its open assignment on the victim
	for job, as := range w.assignments(t, id, "") {
		last := as[len(as)-1]
		if !last.Closed.Valid && on[last.WorkerID] == victim {
			held[job] = last
		}
	}
	if len(held) == 0 {
		t.Fatalf("%s held no job at the kill", victim)
	}
	t.Logf("killed %s holding %d jobs: %v", victim, len(held), held)

	// Its workers' sessions move to live instances.
	var moved []*proxyworld.Worker
	var movedNames []string
	for _, wk := range workers {
		if on[wk.ID] == victim {
			moved = append(moved, wk)
			movedNames = append(movedNames, wk.Name+"="+wk.ID)
		}
	}
	// A new session of each (its log: the list may show a session still
	// in its handshake), then the list naming a live instance.
	var list map[string]sessionOnServer
	waitfor.Within(t, 3*time.Minute, "the killed instance's workers in a new session on another instance", func() bool {
		time.Sleep(200 * time.Millisecond)
		for _, wk := range moved {
			if len(wk.Lines(`msg="session established"`)) <= established[wk.ID] {
				return false
			}
		}
		list = sessions(t, w.c.Front, w.project)
		for _, wk := range moved {
			if l := list[wk.ID]; !l.Live || l.Instance == victim || l.Instance == "" {
				return false
			}
		}
		return true
	})
	t.Logf("workers %v back on live instances %s after the kill: %v", movedNames, time.Since(killed).Round(time.Millisecond), list)

	// Its jobs are re-queued once each: their assignment closed as lost.
	waitfor.Within(t, 90*time.Second, "the killed instance's assignments closed", func() bool {
		byJob := w.assignments(t, id, "")
		for job, a := range held {
			for _, b := range byJob[job] {
				if b.ID == a.ID && !b.Closed.Valid {
					time.Sleep(200 * time.Millisecond)
					return false
				}
			}
		}
		return true
	})
	ev := waitEval(t, w.c.Front, id, "ends after the kill", terminal)
	done := time.Since(killed)
	// When the re-queue happened is in the database: the closing of the
	// last of the killed instance's assignments (same machine, same clock).
	var requeued int64
	for job, a := range held {
		for _, b := range w.assignments(t, id, "")[job] {
			if b.ID == a.ID && b.Closed.Int64 > requeued {
				requeued = b.Closed.Int64
			}
		}
	}
	t.Logf("kill → re-queue %s, kill → evaluation done %s (instance lease %s)",
		time.UnixMilli(requeued).Sub(killed).Round(time.Millisecond), done.Round(time.Millisecond), 6*time.Second)
	w.checkEverywhere(t, ev, builds, "kill")

	byJob := w.assignments(t, id, "")
	w.noOverlap(t, byJob)
	for job, a := range held {
		var lost int
		for _, b := range byJob[job] {
			if b.Outcome.String == outcomeInstanceLost {
				lost++
			}
			if b.ID == a.ID && b.Outcome.String != outcomeInstanceLost {
				t.Errorf("job %s: the killed instance's assignment %s closed as %q, want %q", job, a.ID, b.Outcome.String, outcomeInstanceLost)
			}
		}
		if lost != 1 {
			t.Errorf("job %s: %d assignments closed as %q, want one", job, lost, outcomeInstanceLost)
		}
	}
	// No job of a live instance was closed as lost.
	for job, as := range byJob {
		for _, a := range as {
			if _, ok := held[job]; !ok && a.Outcome.String == outcomeInstanceLost {
				t.Errorf("job %s of a live instance: assignment %s closed as %q", job, a.ID, outcomeInstanceLost)
			}
		}
	}
	if len(w.c.Servers[vi].Lines("recovered interrupted work")) > 0 {
		t.Error("the killed instance recovered work (it was never restarted)")
	}

	// The killed instance restarted while the live ones run builds: its
	// recovery at start leaves their running jobs alone (its own were
	// re-queued already), and it serves again behind the load balancer.
	commit, builds = wideCommit(t, w.repo, "restart", 10, "3")
	id = startEval(t, w.c.Front, w.project, commit)
	var running map[string]assignment // job → open assignment when the restart began
	waitfor.Within(t, 4*time.Minute, "builds running on the live instances' workers", func() bool {
		time.Sleep(100 * time.Millisecond)
		running = map[string]assignment{}
		for job, as := range w.assignments(t, id, "build") {
			if last := as[len(as)-1]; !last.Closed.Valid {
				running[job] = last
			}
		}
		return len(running) > 0
	})
	w.c.Restart(t, vi)
	t.Logf("restarted %s while %d builds ran on the live instances' workers", victim, len(running))
	ev = waitEval(t, w.c.Front, id, "ends after the restart", terminal)
	w.checkEverywhere(t, ev, builds, "restart")
	byJob = w.assignments(t, id, "")
	w.noOverlap(t, byJob)
	for job, a := range running {
		for _, b := range byJob[job] {
			// Its worker may still decline the offer (an assignment is
			// open from the claim to the worker's answer); what the
			// restart must not do is close it as recovered work.
			if b.ID == a.ID && (b.Outcome.String == "server restarted" || b.Outcome.String == "server instance lost") {
				t.Errorf("job %s running on a live instance's worker during the restart of %s: its assignment closed as %q by the restart",
					job, victim, b.Outcome.String)
			}
		}
	}
	if lines := w.c.Servers[vi].Lines("recovered interrupted work"); len(lines) > 0 {
		t.Errorf("the restarted %s re-queued running jobs: %s", victim, lines)
	}
	status := w.c.Front.CLI(t, "server", "status")
	for _, s := range w.c.Servers {
		if !strings.Contains(status, "live instance:     "+s.Name) {
			t.Errorf("after the restart, gradient server status does not list %s:\n%s", s.Name, status)
		}
	}
}

// One worker ID dialing two instances directly at once: one session,
// the other connection refused with 496.
func TestInstancesOneSessionPerWorker(t *testing.T) {
	nixtest.Require(t, "nix", "nix-store", "git")
	t.Parallel() // two light processes and one worker
	w := newInstancesWorld(t, 2)
	a, b := w.c.Servers[0], w.c.Servers[1]
	id, peers := w.c.Front.Register(t, w.project)
	first := w.workerAs(t, "worker-on-a", id, peers, a.ProtoURL, 1)
	on := liveOn(t, b, w.project, first)
	if on[id] != a.Name {
		t.Fatalf("the worker dialing %s directly is live on %q", a.Name, on[id])
	}
	second := w.workerAs(t, "worker-on-b", id, peers, b.ProtoURL, 1)
	waitfor.Within(t, time.Minute, "the second connection refused with 496", func() bool {
		time.Sleep(100 * time.Millisecond)
		return len(second.Lines("code=496")) > 0
	})
	// A few more attempts of the second: still the first's session.
	waitfor.Within(t, time.Minute, "the second worker's further attempts", func() bool {
		time.Sleep(200 * time.Millisecond)
		return len(second.Lines("code=496")) >= 2
	})
	for _, s := range w.c.Servers {
		if l := sessions(t, s, w.project)[id]; !l.Live || l.Instance != a.Name {
			t.Errorf("%s lists the worker live=%v on %q, want live on %s", s.Name, l.Live, l.Instance, a.Name)
		}
	}
	if n := len(second.Lines(`msg="session established"`)); n != 0 {
		t.Errorf("the second worker established %d sessions", n)
	}
	if n := len(first.Lines(`msg="session established"`)); n != 1 {
		t.Errorf("the first worker established %d sessions, want its one", n)
	}
	// B says why: the ID is held on A.
	if len(b.Lines(`msg="worker ID held by another instance"`, "worker="+id, "instance="+a.Name)) == 0 {
		t.Errorf("%s did not log the worker ID held by %s", b.Name, a.Name)
	}
	t.Logf("the refusal as the second worker logged it: %s", second.Lines("code=496")[0])
}

// A build made ready on instance A (its evaluating worker's session is
// there) is assigned to the idle worker whose session is on instance B.
func TestInstancesReadyOnAAssignedOnB(t *testing.T) {
	nixtest.Require(t, "nix", "nix-store", "git")
	t.Parallel() // two workers, six small builds
	w := newInstancesWorld(t, 2)
	a, b := w.c.Servers[0], w.c.Servers[1]
	evaluator := w.worker(t, "evaluator", w.project, a.ProtoURL, 1, "--capabilities-build=false")
	builder := w.worker(t, "builder", w.project, b.ProtoURL, 4, "--capabilities-fetch=false", "--capabilities-eval=false")
	on := liveOn(t, a, w.project, evaluator, builder)
	if on[evaluator.ID] != a.Name || on[builder.ID] != b.Name {
		t.Fatalf("sessions %v: want the evaluator on %s, the builder on %s", on, a.Name, b.Name)
	}
	// Several rounds, one after the other (the builder idle at each
	// round's start): without word from A, B would find each round's
	// first build at its next re-read of the queue, somewhere within its
	// 5 s tick, so one quick round could be luck; all of them cannot.
	const rounds = 4
	var latencies []time.Duration
	for r := 1; r <= rounds; r++ {
		tag := fmt.Sprintf("ready%d", r)
		commit, builds := wideCommit(t, w.repo, tag, 5, "0")
		id := startEval(t, a, w.project, commit)
		ev := waitEval(t, a, id, "ends", terminal)
		w.checkEverywhere(t, ev, builds, tag)
		for _, bd := range ev.Builds {
			if bd.WorkerID != builder.ID {
				t.Errorf("%s built by %s, want the builder on %s", bd.Attr, bd.WorkerID, b.Name)
			}
		}
		// The idle builder waited from the first build job's creation (on
		// A, while the evaluator reported it) to its first assignment (on B).
		var created, opened int64
		if err := w.db.QueryRowContext(t.Context(), `SELECT min(j.created_at), min(a.opened_at)
			FROM jobs j JOIN job_assignments a ON a.job_id = j.id WHERE j.evaluation_id = $1 AND j.kind = 'build'`, id).Scan(&created, &opened); err != nil {
			t.Fatal(err)
		}
		latencies = append(latencies, time.Duration(opened-created)*time.Millisecond)
	}
	t.Logf("ready on %s → assigned on %s, %d rounds: %v", a.Name, b.Name, rounds, latencies)
	// Well under the scheduler's tick (5 s) every time: B learned of the
	// work from A, not from its periodic re-read of the queue.
	for i, l := range latencies {
		if l > 2*time.Second {
			t.Errorf("round %d: the first build waited %s for the idle worker on the other instance, want well under the 5 s tick", i+1, l)
		}
	}
}
