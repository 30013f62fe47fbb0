package hub_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"gradient.dev/gradient/internal/waitfor"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// narServer streams one object to the proxy's upstream session as fast
// as the session takes it, honouring NarRequestResume (docs/protocol/cache.md §3.2):
// a request or resume stops the path's earlier stream, as our server does.
type narServer struct {
	c     *rawConn
	size  uint64
	token string
	// bytesAt is the object's bytes [off, end), at most chunkSize.
	bytesAt func(off, end uint64) []byte
	gen     atomic.Int64 // the current stream; older ones stop
}

// handle answers a NarRequest or NarRequestResume; false for another
// message.
func (s *narServer) handle(m wire.ClientMessage) bool {
	switch m := m.(type) {
	case *wire.NarRequest:
		s.serve(m.JobID, m.Paths[0], 0)
	case *wire.NarRequestResume:
		from := uint64(0)
		if m.StreamToken == s.token && m.ReceivedBytes <= s.size {
			from = m.ReceivedBytes
		}
		s.serve(m.JobID, m.StorePath, from)
	default:
		return false
	}
	return true
}

func (s *narServer) serve(jobID, path string, from uint64) {
	gen := s.gen.Add(1)
	go func() {
		s.c.sess.Send(&wire.NarStreamHeader{JobID: jobID, StorePath: path, TotalBytes: s.size, StreamToken: s.token})
		for off := from; ; off += chunkSize {
			if s.gen.Load() != gen {
				return
			}
			end := min(off+chunkSize, s.size)
			final := end == s.size
			if err := s.c.sess.Send(&wire.NarPush{JobID: jobID, StorePath: path, Data: s.bytesAt(off, end), Offset: off, IsFinal: final}); err != nil || final {
				return
			}
		}
	}()
}

// dialSlow is a protocol-level worker session the test reads itself.
func dialSlow(t *testing.T, url, id, token string) *session.WorkerSession {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	tr, err := session.Dial(t.Context(), url, session.DialOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
	est, err := session.RunPeer(t.Context(), c, session.PeerConfig{WorkerID: id, Capabilities: wire.GradientCapabilities{Build: true},
		Tokens: map[string]string{id: token}})
	if err != nil {
		t.Fatal(err)
	}
	s := session.SplitWorker(c, est, session.Options{Logger: quiet})
	t.Cleanup(func() { s.Close(session.CloseNormal, "test over") })
	s.Send(&wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, MaxConcurrentBuilds: 1})
	return s
}

// A worker that reads a 256 MiB NAR much slower than the tenant's server
// sends it (it stops reading for a while, then reads slowly) is not cut
// off: the proxy pauses the pull and resumes it where the worker is, and
// the worker gets every byte once, in order, under one header. The
// tenant's other worker completes jobs while the slow one reads nothing.
func TestSlowWorkerGetsALargeNarThroughTheProxy(t *testing.T) {
	const size = 256 << 20
	ctx := t.Context()
	up := newRawUpstream(t)
	store, tenant := linkedTenant(t, up)
	proxyURL, logs := runProxy(t, store, 0)
	upConn := <-up.conns
	object := make([]byte, size)
	rand.NewChaCha8([32]byte{18}).Read(object)
	want := sha256.Sum256(object)
	srv := &narServer{c: upConn, size: size, token: fmt.Sprintf("len-%d", size),
		bytesAt: func(off, end uint64) []byte { return object[off:end] }}
	host := wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, MaxConcurrentBuilds: 1}

	row, token, err := store.CreateWorker(ctx, tenant.ID, "slow", proxystore.Capabilities{Build: true})
	if err != nil {
		t.Fatal(err)
	}
	slow := dialSlow(t, proxyURL, row.ID, token)
	slow.Send(&wire.RequestJob{Kind: wire.JobKindBuild})
	next[*wire.RequestJob](t, "the slow worker's poll", upConn.msgs)
	upConn.sess.Send(&wire.AssignJob{JobID: "big", AssignmentID: "a", Job: buildJob})
	recvSlow := func() wire.ServerMessage {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		m, err := slow.Recv(rctx)
		if err != nil {
			t.Fatalf("the slow worker's session: %v (cut off?)", err)
		}
		return m
	}
	for {
		if a, ok := recvSlow().(*wire.AssignJob); ok && a.JobID == "big" {
			break
		}
	}
	slow.Send(&wire.AssignJobResponse{JobID: "big", Accepted: true})
	next[*wire.AssignJobResponse](t, "the slow worker's answer", upConn.msgs)

	row, token, err = store.CreateWorker(ctx, tenant.ID, "fast", proxystore.Capabilities{Build: true})
	if err != nil {
		t.Fatal(err)
	}
	fast := dialProto(t, proxyURL, row.ID, token, host)
	go func() { // the fast worker runs each job it gets at once
		for m := range fast.msgs {
			if a, ok := m.(*wire.AssignJob); ok {
				fast.sess.Send(&wire.AssignJobResponse{JobID: a.JobID, Accepted: true})
				fast.sess.Send(&wire.JobCompleted{JobID: a.JobID, AssignmentID: a.AssignmentID})
				fast.sess.Send(&wire.RequestJob{Kind: wire.JobKindBuild})
			}
		}
	}()
	fast.send(t, &wire.RequestJob{Kind: wire.JobKindBuild})

	// The server: NAR requests and resumes are streamed, every poll
	// gets a job, completions are counted.
	completed := make(chan string, 1024)
	go func() {
		jobs := 0
		for m := range upConn.msgs {
			if srv.handle(m) {
				continue
			}
			switch m := m.(type) {
			case *wire.RequestJob:
				if jobs == 200 {
					break // enough: completed never fills
				}
				jobs++
				upConn.sess.Send(&wire.AssignJob{JobID: fmt.Sprint("fast-", jobs), AssignmentID: "a", Job: buildJob})
			case *wire.JobCompleted:
				completed <- m.JobID
			case *wire.JobFailed:
				t.Errorf("job %s failed upstream: %s", m.JobID, m.Error)
			}
		}
	}()

	slow.Send(&wire.NarRequest{JobID: "big", Paths: []string{"/nix/store/big"}})
	hash := sha256.New()
	var got uint64
	headers := 0
	take := func(m wire.ServerMessage) bool {
		t.Helper()
		switch m := m.(type) {
		case *wire.NarStreamHeader:
			headers++
		case *wire.NarPush:
			if m.Offset != got {
				t.Fatalf("chunk at offset %d, the worker has %d bytes", m.Offset, got)
			}
			hash.Write(m.Data)
			got += uint64(len(m.Data))
			slow.Reader.Release()
			return m.IsFinal
		case *wire.NarAbort:
			t.Fatalf("the pull was aborted at %d bytes: %s", got, m.Reason)
		}
		return false
	}
	for got == 0 {
		take(recvSlow())
	}
	// The slow worker reads nothing until the other worker completed
	// 20 jobs: the server keeps streaming meanwhile.
	for i := range 20 {
		select {
		case <-completed:
		case <-time.After(time.Minute):
			t.Fatalf("the fast worker completed %d jobs while the slow one stalled", i)
		}
	}
	// ... and until the proxy paused its pull (how fast the fast worker's
	// jobs go decides nothing then).
	waitfor.True(t, "the proxy pauses the slow worker's pull", func() bool {
		return strings.Contains(logs.String(), "pausing a NAR pull")
	})
	for !take(recvSlow()) {
		time.Sleep(time.Millisecond) // then reads slowly
	}
	if got != size || !bytes.Equal(hash.Sum(nil), want[:]) {
		t.Fatalf("the slow worker got %d bytes (sha256 match: %v), want %d", got, bytes.Equal(hash.Sum(nil), want[:]), size)
	}
	if headers != 1 {
		t.Errorf("the slow worker got %d stream headers, want 1", headers)
	}
	slow.Send(&wire.JobCompleted{JobID: "big", AssignmentID: "a"})
	for id := ""; id != "big"; {
		select {
		case id = <-completed:
		case <-time.After(time.Minute):
			t.Fatal("the slow worker's job did not complete upstream")
		}
	}
	l := logs.String()
	if strings.Contains(l, "cutting off a slow worker") {
		t.Error("the proxy cut off a worker")
	}
	if !strings.Contains(l, "NAR pull to a slow worker completed after resumes") {
		t.Error("the pull completed without a resume: the worker was not slow enough to test the flow control")
	}
}
