package scheduler_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/internal/testworld"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/scheduler"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// peerSession dials the server at url as a bare protocol client with the
// peers line ("peer:token") and returns the established session.
func peerSession(t *testing.T, url, workerID, peers string) *session.WorkerSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)
	tr, err := session.Dial(ctx, url, session.DialOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
	peer, token, _ := strings.Cut(peers, ":")
	est, err := session.RunPeer(ctx, c, session.PeerConfig{WorkerID: workerID,
		Capabilities: wire.GradientCapabilities{Build: true}, Tokens: map[string]string{peer: token}})
	if err != nil {
		t.Fatal(err)
	}
	sess := session.SplitWorker(c, est, session.Options{Logger: quiet})
	t.Cleanup(func() { sess.Close(session.CloseNormal, "test over") })
	return sess
}

// nextOf reads the session until a message of type T arrives.
func nextOf[T wire.ServerMessage](t *testing.T, sess *session.WorkerSession) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		m, err := sess.Recv(ctx)
		if err != nil {
			var zero T
			t.Fatalf("waiting for %T: %v", zero, err)
		}
		if v, ok := m.(T); ok {
			return v
		}
	}
}

// Over a real session, a report with an empty assignment_id is not the
// assignment the session was handed, so it is dropped: the build neither
// fails nor completes by it; the report with the right ID completes it.
func TestReportWithoutAssignmentIDIsDropped(t *testing.T) {
	e := newLoopEnv(t, storagetest.SQLiteURL(t), scheduler.Config{})
	ev := e.evaluate(leaf("one"))
	url, _ := testworld.Serve(t, e.db, server.Config{Jobs: e.sched})
	id, peers := testworld.Register(t, e.db, e.project)
	sess := peerSession(t, url, id, peers)
	send := func(m wire.ClientMessage) {
		t.Helper()
		if err := sess.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(x86)
	send(&wire.RequestJob{Kind: wire.JobKindBuild})
	a := nextOf[*wire.AssignJob](t, sess)
	send(&wire.AssignJobResponse{JobID: a.JobID, Accepted: true})
	send(&wire.JobFailed{JobID: a.JobID, AssignmentID: "", Kind: wire.FailurePermanent, Error: "forged", MissingPaths: []string{}, Spans: []wire.JobPhaseSpan{}})
	send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: ""})
	// The session's messages are handled in order, so the owner's report
	// comes last: had a forged one counted, the build would have failed
	// and this report would find no assignment.
	send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
	deadline := time.Now().Add(10 * time.Second)
	for b := e.build(ev.ID); b.Status != storage.BuildSucceeded; b = e.build(ev.ID) {
		if b.Status != storage.BuildBuilding || time.Now().After(deadline) {
			t.Fatalf("build %s (%s %q), want succeeded by the owner's report alone", b.Status, b.FailureKind, b.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
