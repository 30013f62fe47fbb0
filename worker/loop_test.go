package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"gradient.dev/gradient/wire"
)

func TestSessionStartOrder(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	cfg := testConfig(t, f.url, newBlockingExecutor())
	cfg.Architectures = []string{"x86_64-linux", "i686-linux"}
	cfg.SystemFeatures = []string{"kvm"}
	cfg.MaxBuilds = 3
	startWorker(t, cfg)
	c := f.accept()

	caps, ok := c.next(t).(*wire.WorkerCapabilities)
	if !ok {
		t.Fatal("first message is not WorkerCapabilities")
	}
	if len(caps.Architectures) != 2 || caps.SystemFeatures[0] != "kvm" || caps.MaxConcurrentBuilds != 3 ||
		caps.CPUCount == 0 || caps.CPUCoreScore != 1 || caps.Zone != nil || caps.Endpoint != nil {
		t.Fatalf("capabilities %+v", caps)
	}
	if _, ok := c.next(t).(*wire.RequestJobList); !ok {
		t.Fatal("second message is not RequestJobList")
	}
	for _, kind := range []wire.JobKind{wire.JobKindFlake, wire.JobKindBuild} {
		if r, ok := c.next(t).(*wire.RequestJob); !ok || r.Kind != kind {
			t.Fatalf("got %+v, want RequestJob %v", r, kind)
		}
	}
}

func TestHeartbeatSendsMetricsAndRequests(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	cfg := testConfig(t, f.url, newBlockingExecutor())
	cfg.Session.Heartbeat = 20 * time.Millisecond
	startWorker(t, cfg)
	c := f.accept()
	metrics := 0
	requests := 0
	for metrics < 2 || requests < 4 {
		switch m := c.next(t).(type) {
		case *wire.WorkerMetrics:
			metrics++
			if m.RAMFreeMB == 0 || m.UploadSpeedMbps != nil {
				t.Fatalf("metrics %+v", m)
			}
		case *wire.RequestJob:
			requests++
		}
	}
}

func TestAssignAbortAndCapacity(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	exec := newBlockingExecutor()
	cfg := testConfig(t, f.url, exec)
	cfg.Session.Capabilities.Eval, cfg.Session.Capabilities.Fetch = false, false
	reg := prometheus.NewRegistry()
	cfg.Session.Metrics = reg
	startWorker(t, cfg)
	c := f.accept()
	expect[*wire.RequestJobList](t, c)

	c.send(t, buildJob("build:1", "a1"))
	if r := expect[*wire.AssignJobResponse](t, c); !r.Accepted || r.JobID != "build:1" {
		t.Fatalf("response %+v", r)
	}
	if u := expect[*wire.JobUpdate](t, c); u.JobID != "build:1" || u.AssignmentID != "a1" {
		t.Fatalf("update %+v", u)
	}
	recvChan(t, "the job to start", exec.started)
	wantMetrics(t, reg, `gradient_worker_jobs_running{kind="build"} 1`, "gradient_worker_connected 1")

	// The one build slot is taken; flake jobs are not enabled.
	c.send(t, buildJob("build:2", "a2"))
	if r := expect[*wire.AssignJobResponse](t, c); r.Accepted || r.Reason == nil || *r.Reason != "at capacity (1/1)" {
		t.Fatalf("response %+v", r)
	}
	c.send(t, flakeJob("eval:1", "a3"))
	if r := expect[*wire.AssignJobResponse](t, c); r.Accepted || r.Reason == nil || *r.Reason != "capability for flake jobs not enabled" {
		t.Fatalf("response %+v", r)
	}
	// A re-sent job keeps running; its reports carry the new assignment.
	c.send(t, buildJob("build:1", "a4"))
	if r := expect[*wire.AssignJobResponse](t, c); !r.Accepted {
		t.Fatalf("response %+v", r)
	}

	c.send(t, &wire.AbortJob{JobID: "build:1", Reason: "evaluation aborted"})
	if cause := recvChan(t, "the job to end", exec.ended); !errors.Is(cause, errAbortedByServer) {
		t.Fatalf("job context ended by %v", cause)
	}
	// The report, and a request for the freed slot (on the control lane,
	// so it may overtake the report).
	var failed *wire.JobFailed
	requested := false
	for failed == nil || !requested {
		switch m := c.next(t).(type) {
		case *wire.JobFailed:
			failed = m
		case *wire.RequestJob:
			requested = requested || m.Kind == wire.JobKindBuild
		}
	}
	if failed.JobID != "build:1" || failed.AssignmentID != "a4" || failed.Kind != wire.FailureAborted || failed.Error != "aborted by server" {
		t.Fatalf("JobFailed %+v", failed)
	}
	wantMetrics(t, reg, `gradient_worker_jobs_running{kind="build"} 0`,
		`gradient_worker_jobs_finished_total{kind="build",outcome="Aborted"} 1`)
}

// wantMetrics requires each line in the registry's text form.
func wantMetrics(t *testing.T, g prometheus.Gatherer, lines ...string) {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			t.Fatal(err)
		}
	}
	for _, line := range lines {
		if !strings.Contains(b.String(), line+"\n") {
			t.Fatalf("metrics lack %q:\n%s", line, b.String())
		}
	}
}

func TestStopDrainsAndCancelsJobs(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	exec := newBlockingExecutor()
	cfg := testConfig(t, f.url, exec)
	_, stop := startWorker(t, cfg)
	c := f.accept()
	c.send(t, buildJob("build:1", "a1"))
	c.send(t, flakeJob("eval:1", "a2"))
	recvChan(t, "a job to start", exec.started)
	recvChan(t, "a job to start", exec.started)

	stop() // returns after the stop sequence
	expect[*wire.ClientDraining](t, c)
	failed := map[string]*wire.JobFailed{}
	for len(failed) < 2 {
		switch m := c.next(t).(type) {
		case *wire.JobFailed:
			failed[m.JobID] = m
		case *wire.RequestJob:
			t.Fatal("RequestJob after Draining")
		}
	}
	for id, aid := range map[string]string{"build:1": "a1", "eval:1": "a2"} {
		if m := failed[id]; m.Kind != wire.FailureCanceled || m.AssignmentID != aid {
			t.Fatalf("JobFailed %+v", m)
		}
	}
	recvChan(t, "the session to close", c.done)
}

func TestDeclinesWhileDrainingAndServerDrainingReconnects(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	exec := newBlockingExecutor()
	startWorker(t, testConfig(t, f.url, exec))
	c := f.accept()
	c.send(t, buildJob("build:1", "a1"))
	recvChan(t, "the job to start", exec.started)
	c.send(t, &wire.ServerDraining{})
	c.send(t, buildJob("build:2", "a2"))
	for {
		r := expect[*wire.AssignJobResponse](t, c)
		if r.JobID == "build:2" {
			if r.Accepted || *r.Reason != "worker is draining" {
				t.Fatalf("response %+v", r)
			}
			break
		}
	}
	// The running job finishes (here: aborted), then the worker ends the
	// drained session itself and reconnects.
	c.send(t, &wire.AbortJob{JobID: "build:1"})
	expect[*wire.JobFailed](t, c)
	recvChan(t, "the drained session to close", c.done)
	c2 := f.accept()
	expect[*wire.RequestJobList](t, c2)
}

func TestLostSessionCancelsJobs(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	exec := newBlockingExecutor()
	startWorker(t, testConfig(t, f.url, exec))
	c := f.accept()
	c.send(t, buildJob("build:1", "a1"))
	recvChan(t, "the job to start", exec.started)
	c.sess.Close(1001, "server gone")
	if cause := recvChan(t, "the job to end", exec.ended); !errors.Is(cause, errSessionLost) {
		t.Fatalf("job context ended by %v", cause)
	}
	// The slot is free again on the next session.
	c2 := f.accept()
	expect[*wire.RequestJobList](t, c2)
	if r := expect[*wire.RequestJob](t, c2); r.Kind != wire.JobKindFlake {
		t.Fatalf("request %+v", r)
	}
	c2.send(t, buildJob("build:1", "a2"))
	if r := expect[*wire.AssignJobResponse](t, c2); !r.Accepted {
		t.Fatalf("response %+v", r)
	}
}

func TestNoExecutorDeclines(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	startWorker(t, testConfig(t, f.url, nil))
	c := f.accept()
	expect[*wire.RequestJobList](t, c)
	c.send(t, buildJob("build:1", "a1"))
	if r := expect[*wire.AssignJobResponse](t, c); r.Accepted {
		t.Fatalf("response %+v", r)
	}
}

func TestRequestsAgainWhileSlotsRemain(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	exec := newBlockingExecutor()
	cfg := testConfig(t, f.url, exec)
	cfg.MaxBuilds = 2
	startWorker(t, cfg)
	c := f.accept()
	expect[*wire.RequestJobList](t, c)
	c.send(t, buildJob("build:1", "a1"))
	expect[*wire.AssignJobResponse](t, c)
	for {
		if r, ok := c.next(t).(*wire.RequestJob); ok && r.Kind == wire.JobKindBuild {
			break
		}
	}
	recvChan(t, "the job to start", exec.started)
	c.send(t, buildJob("build:2", "a2"))
	if r := expect[*wire.AssignJobResponse](t, c); !r.Accepted {
		t.Fatalf("second build declined: %+v", r)
	}
}

// A Credential travels with the AssignJob right after it, and only that
// one.
func TestCredentialGoesWithTheNextAssignment(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	exec := newBlockingExecutor()
	cfg := testConfig(t, f.url, exec)
	cfg.MaxEvals = 2
	startWorker(t, cfg)
	c := f.accept()
	expect[*wire.RequestJobList](t, c)

	c.send(t, &wire.Credential{Kind: wire.CredentialSSHKey, Data: []byte("deploy-key")})
	c.send(t, flakeJob("eval:1", "a1"))
	if a := recvChan(t, "the first job", exec.started); string(a.SSHKey) != "deploy-key" {
		t.Fatalf("first job's key %q, want the credential", a.SSHKey)
	}
	c.send(t, flakeJob("eval:2", "a2"))
	if a := recvChan(t, "the second job", exec.started); a.SSHKey != nil {
		t.Fatalf("second job got key %q; a credential is for one assignment", a.SSHKey)
	}
}

// stubbornExecutor ignores cancellation until release is closed, as a
// build whose Nix takes its time to die does: its slot stays taken.
type stubbornExecutor struct {
	started chan Assignment
	release chan struct{}
}

func (e *stubbornExecutor) Run(_ context.Context, job Assignment, _ Reporter) error {
	e.started <- job
	<-e.release
	return Fail(wire.FailureTransient, errors.New("released"))
}

// After a server restart the worker sends the full session start, one
// RequestJob per kind included, while the lost session's aborted jobs
// still hold every slot (docs/protocol/connection.md, Server Restart).
func TestReconnectRequestsEveryKindWhileOldJobsHoldSlots(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	exec := &stubbornExecutor{started: make(chan Assignment, 4), release: make(chan struct{})}
	defer close(exec.release)
	w, _ := startWorker(t, testConfig(t, f.url, exec))
	c := f.accept()
	expect[*wire.RequestJobList](t, c)
	c.send(t, flakeJob("flake:1", "a1"))
	c.send(t, buildJob("build:1", "a2"))
	recvChan(t, "the flake job to start", exec.started)
	recvChan(t, "the build job to start", exec.started)
	c.sess.Close(1001, "server restarting")

	c2 := f.accept()
	for _, kind := range jobKinds {
		if w.slots.free(kind) {
			t.Fatalf("the old %s job no longer holds its slot: the test shows nothing", kindName(kind))
		}
	}
	if _, ok := c2.next(t).(*wire.WorkerCapabilities); !ok {
		t.Fatal("first message of the new session is not WorkerCapabilities")
	}
	if m, ok := c2.next(t).(*wire.RequestJobList); !ok {
		t.Fatalf("got %+v, want RequestJobList", m)
	}
	for _, kind := range []wire.JobKind{wire.JobKindFlake, wire.JobKindBuild} {
		if r, ok := c2.next(t).(*wire.RequestJob); !ok || r.Kind != kind {
			t.Fatalf("got %+v, want RequestJob %s", r, kindName(kind))
		}
	}
}
