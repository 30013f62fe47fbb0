package worker

import (
	"context"
	"testing"
	"time"

	"gradient.dev/gradient/wire"
)

// gatedExecutor runs every job until release closes (then succeeds) or
// its context ends (then fails with the cause).
type gatedExecutor struct {
	started chan Assignment
	release chan struct{}
}

func (e *gatedExecutor) Run(ctx context.Context, job Assignment, report Reporter) error {
	e.started <- job
	select {
	case <-e.release:
		return nil
	case <-ctx.Done():
		return Fail(wire.FailureTransient, context.Cause(ctx))
	}
}

// stopInBackground cancels the worker (SIGTERM) without waiting: Run
// returns once the drain is over.
func stopInBackground(stop func()) <-chan struct{} {
	stopped := make(chan struct{})
	go func() {
		stop()
		close(stopped)
	}()
	return stopped
}

// With a drain budget, the stop sends Draining, declines new jobs, lets
// the running one finish and report JobCompleted, then closes.
func TestStopDrainLetsRunningJobsFinish(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	exec := &gatedExecutor{started: make(chan Assignment, 4), release: make(chan struct{})}
	cfg := testConfig(t, f.url, exec)
	cfg.DrainTimeout = time.Hour
	_, stop := startWorker(t, cfg)
	c := f.accept()
	c.send(t, buildJob("build:1", "a1"))
	recvChan(t, "the job to start", exec.started)

	stopped := stopInBackground(stop)
	expect[*wire.ClientDraining](t, c)
	c.send(t, flakeJob("eval:2", "a2"))
	if r := expect[*wire.AssignJobResponse](t, c); r.JobID != "eval:2" || r.Accepted || *r.Reason != "worker is draining" {
		t.Fatalf("assignment while draining: %+v", r)
	}
	close(exec.release)
	if m := expect[*wire.JobCompleted](t, c); m.JobID != "build:1" || m.AssignmentID != "a1" {
		t.Fatalf("JobCompleted %+v", m)
	}
	recvChan(t, "the session to close", c.done)
	recvChan(t, "Run to return", stopped)
}

// A second signal (AbortDrain) or an expired budget ends the drain: the
// running job is aborted and reported Canceled, and Run returns.
func TestStopDrainAborts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		drain time.Duration
		abort bool
	}{
		{"second signal", time.Hour, true},
		{"drain timeout", 50 * time.Millisecond, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeServer(t)
			exec := newBlockingExecutor()
			cfg := testConfig(t, f.url, exec)
			cfg.DrainTimeout = c.drain
			abort := make(chan struct{})
			cfg.AbortDrain = abort
			_, stop := startWorker(t, cfg)
			conn := f.accept()
			conn.send(t, buildJob("build:1", "a1"))
			recvChan(t, "the job to start", exec.started)

			stopped := stopInBackground(stop)
			expect[*wire.ClientDraining](t, conn)
			if c.abort {
				close(abort)
			}
			if m := expect[*wire.JobFailed](t, conn); m.JobID != "build:1" || m.Kind != wire.FailureCanceled {
				t.Fatalf("JobFailed %+v, want Canceled", m)
			}
			if cause := recvChan(t, "the job's end", exec.ended); cause != errWorkerStopping {
				t.Fatalf("the job ended by %v", cause)
			}
			recvChan(t, "the session to close", conn.done)
			recvChan(t, "Run to return", stopped)
		})
	}
}
