package hub_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// The benchmarks (docs/PERFORMANCE.md): the same protocol-level
// tenant server (rawUpstream) and protocol-level workers that finish at
// once, connected directly or through the proxy's legs and hub, side by
// side in one run.
//
//	go test -run '^$' -bench '^Benchmark(JobRoundTrip|Dispatch50|Nar)' -benchmem -count 5 ./proxy/hub
//	go test -run '^$' -bench Shaped -benchmem -count 5 ./proxy/hub

// benchWorker is a protocol-level worker: it accepts every AssignJob,
// completes it at once when auto is set and polls again; it counts the
// NAR bytes pushed to it.
type benchWorker struct {
	sess     *session.WorkerSession
	auto     bool
	narBytes atomic.Int64
	narDone  chan struct{}
	grants   chan *wire.UploadGrant
}

func dialBench(b testing.TB, url, id, token string, auto bool) *benchWorker {
	b.Helper()
	quiet := slog.New(slog.DiscardHandler)
	tr, err := session.Dial(b.Context(), url, session.DialOptions{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
	est, err := session.RunPeer(b.Context(), c, session.PeerConfig{WorkerID: id, Capabilities: wire.GradientCapabilities{Build: true},
		Tokens: map[string]string{id: token}})
	if err != nil {
		b.Fatal(err)
	}
	w := &benchWorker{sess: session.SplitWorker(c, est, session.Options{Logger: quiet}), auto: auto,
		narDone: make(chan struct{}, 1), grants: make(chan *wire.UploadGrant, 16)}
	b.Cleanup(func() { w.sess.Close(session.CloseNormal, "bench over") })
	w.sess.Send(&wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, MaxConcurrentBuilds: 1})
	w.sess.Send(&wire.RequestJob{Kind: wire.JobKindBuild})
	go w.loop()
	return w
}

func (w *benchWorker) loop() {
	for {
		m, err := w.sess.Recv(context.Background())
		if err != nil {
			return
		}
		switch m := m.(type) {
		case *wire.AssignJob:
			w.sess.Send(&wire.AssignJobResponse{JobID: m.JobID, Accepted: true})
			if w.auto {
				w.sess.Send(&wire.JobCompleted{JobID: m.JobID, AssignmentID: m.AssignmentID})
				w.sess.Send(&wire.RequestJob{Kind: wire.JobKindBuild})
			}
		case *wire.NarPush:
			w.narBytes.Add(int64(len(m.Data)))
			w.sess.Reader.Release()
			if m.IsFinal {
				w.narDone <- struct{}{}
			}
		case *wire.UploadGrant:
			w.grants <- m
		}
	}
}

// benchSide is the tenant's server's end of n workers: one session per
// worker when direct, one session for all through the proxy.
type benchSide struct {
	conns   []*rawConn
	workers []*benchWorker
}

var benchToken = strings.Repeat("cd", 32)

func setupDirect(b *testing.B, n int, auto bool) *benchSide { return setupDirectOn(b, n, auto, false) }
func setupProxy(b *testing.B, n int, auto bool) *benchSide  { return setupProxyOn(b, n, auto, false) }

// The shaped variants put the links of a deployment between the parties
// (shape_test.go): direct workers reach the server over the WAN link;
// through the proxy, workers reach it over the LAN link and the proxy
// the server over the WAN link.
func shapedDirect(b *testing.B, n int, auto bool) *benchSide { return setupDirectOn(b, n, auto, true) }
func shapedProxy(b *testing.B, n int, auto bool) *benchSide  { return setupProxyOn(b, n, auto, true) }

func setupDirectOn(b *testing.B, n int, auto, shaped bool) *benchSide {
	up := newRawUpstreamN(b, n+4)
	s := &benchSide{}
	serverURL := up.url
	if shaped {
		serverURL = shape(b, up.url, wan)
	}
	for range n {
		s.workers = append(s.workers, dialBench(b, serverURL, storage.NewID(), benchToken, auto))
		s.conns = append(s.conns, <-up.conns)
	}
	return s
}

func setupProxyOn(b *testing.B, n int, auto, shaped bool) *benchSide {
	ctx := b.Context()
	up := newRawUpstreamN(b, 8)
	serverURL := up.url
	if shaped {
		serverURL = shape(b, up.url, wan)
	}
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		b.Fatal(err)
	}
	store, err := proxystore.Open(ctx, storagetest.SQLiteURL(b), box)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.Close() })
	tenant, err := store.CreateTenant(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := store.SetLink(ctx, tenant.ID, serverURL, storage.NewID(), []proxystore.PeerToken{{PeerID: storage.NewID(), Token: benchToken}}); err != nil {
		b.Fatal(err)
	}
	proxyURL, _ := runProxy(b, store, 0)
	if shaped {
		proxyURL = shape(b, proxyURL, lan)
	}
	s := &benchSide{conns: []*rawConn{<-up.conns}}
	for i := range n {
		row, token, err := store.CreateWorker(ctx, tenant.ID, fmt.Sprintf("w%d", i), proxystore.Capabilities{Build: true})
		if err != nil {
			b.Fatal(err)
		}
		s.workers = append(s.workers, dialBench(b, proxyURL, row.ID, token, auto))
	}
	return s
}

type side struct {
	name  string
	setup func(*testing.B, int, bool) *benchSide
}

var (
	sides       = []side{{"direct", setupDirect}, {"proxy", setupProxy}}
	shapedSides = []side{{"direct", shapedDirect}, {"proxy", shapedProxy}}
)

// The shaped benchmarks: the same measurements over the links of a
// deployment (WAN 5 ms one-way at 1 Gbit/s, LAN at 10 Gbit/s), not the
// raw loopback.
func BenchmarkShapedJobRoundTrip(b *testing.B) { benchRoundTrip(b, shapedSides) }
func BenchmarkShapedDispatch50(b *testing.B)   { benchDispatch50(b, shapedSides) }
func BenchmarkShapedNarDownload(b *testing.B)  { benchNarDownload(b, shapedSides) }
func BenchmarkShapedNarUpload(b *testing.B)    { benchNarUpload(b, shapedSides) }

func nextMsg[T any](b *testing.B, c *rawConn) T {
	b.Helper()
	return next[T](b, "a message at the server", c.msgs)
}

var buildJob = &wire.BuildJob{Requirement: wire.BuildRequirement{Architecture: "x86_64-linux"}}

// BenchmarkJobRoundTrip: AssignJob to JobCompleted of one worker that
// finishes at once (goal through the proxy: ≤ 1.2× direct at p50, p99).
func BenchmarkJobRoundTrip(b *testing.B) { benchRoundTrip(b, sides) }

func benchRoundTrip(b *testing.B, sides []side) {
	for _, side := range sides {
		b.Run(side.name, func(b *testing.B) {
			s := side.setup(b, 1, true)
			c := s.conns[0]
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			// JobCompleted rides the bulk lane: the next RequestJob may
			// overtake it. Count the polls.
			polls, completed := 0, 0
			read := func() {
				switch m := nextMsg[wire.ClientMessage](b, c).(type) {
				case *wire.RequestJob:
					polls++
				case *wire.JobCompleted:
					completed++
				case *wire.JobFailed:
					b.Fatalf("job %s failed: %s", m.JobID, m.Error)
				case *wire.AssignJobResponse:
					if !m.Accepted {
						b.Fatalf("job %s declined: %s", m.JobID, *m.Reason)
					}
				}
			}
			for i := range b.N {
				for polls == 0 {
					read()
				}
				polls--
				start := time.Now()
				c.sess.Send(&wire.AssignJob{JobID: fmt.Sprint("job-", i), AssignmentID: "a", Job: buildJob})
				for completed == i {
					if time.Since(start) > 30*time.Second {
						b.Fatalf("job %d: no JobCompleted within 30 s", i)
					}
					read()
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkDispatch50: jobs through 50 workers, each assigned on its poll
// and finished at once (goal through the proxy: ≥ 0.8× direct).
func BenchmarkDispatch50(b *testing.B) { benchDispatch50(b, sides) }

func benchDispatch50(b *testing.B, sides []side) {
	const workers = 50
	for _, side := range sides {
		b.Run(side.name, func(b *testing.B) {
			s := side.setup(b, workers, true)
			n := int64(b.N)
			var issued, done, polls atomic.Int64
			start, finished := make(chan struct{}), make(chan struct{})
			for _, c := range s.conns {
				go func() {
					assign := func() {
						if id := issued.Add(1); id <= n {
							c.sess.Send(&wire.AssignJob{JobID: fmt.Sprint("job-", id), AssignmentID: "a", Job: buildJob})
						}
					}
					queued := 0
					started := start
					for {
						select {
						case <-started:
							started = nil
							for ; queued > 0; queued-- {
								assign()
							}
						case m := <-c.msgs:
							switch m.(type) {
							case *wire.RequestJob:
								polls.Add(1)
								if started == nil {
									assign()
								} else {
									queued++
								}
							case *wire.JobCompleted:
								if done.Add(1) == n {
									close(finished)
								}
							}
						case <-finished:
							return
						}
					}
				}()
			}
			for polls.Load() < workers {
				time.Sleep(time.Millisecond)
			}
			b.ResetTimer()
			t0 := time.Now()
			close(start)
			<-finished
			b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "jobs/s")
		})
	}
}

const chunkSize = 512 << 10

// assignOne hands the single worker one job that stays open.
func assignOne(b *testing.B, c *rawConn) string {
	nextMsg[*wire.RequestJob](b, c)
	c.sess.Send(&wire.AssignJob{JobID: "nar-job", AssignmentID: "a", Job: buildJob})
	if r := nextMsg[*wire.AssignJobResponse](b, c); !r.Accepted {
		b.Fatal("declined")
	}
	return "nar-job"
}

// BenchmarkNarDownload: a NAR of b.N 512 KiB chunks from the server to
// one worker that asked for it (goal through the proxy: ≥ 0.9× direct).
// The server streams as fast as its session takes the chunks and
// honours NarRequestResume, which the proxy sends for a worker that
// reads slower (issue 18).
func BenchmarkNarDownload(b *testing.B) { benchNarDownload(b, sides) }

func benchNarDownload(b *testing.B, sides []side) {
	for _, side := range sides {
		b.Run(side.name, func(b *testing.B) {
			s := side.setup(b, 1, false)
			c, w := s.conns[0], s.workers[0]
			job := assignOne(b, c)
			chunk := make([]byte, chunkSize)
			size := uint64(b.N) * chunkSize
			srv := &narServer{c: c, size: size, token: fmt.Sprint("len-", size),
				bytesAt: func(off, end uint64) []byte { return chunk[:end-off] }}
			done := make(chan struct{})
			defer close(done)
			go func() {
				for {
					select {
					case m := <-c.msgs:
						srv.handle(m)
					case <-done:
						return
					}
				}
			}()
			b.SetBytes(chunkSize)
			b.ResetTimer()
			if err := w.sess.Send(&wire.NarRequest{JobID: job, Paths: []string{"/nix/store/x"}}); err != nil {
				b.Fatal(err)
			}
			select {
			case <-w.narDone:
			case <-time.After(time.Minute):
				b.Fatalf("the worker got %d of %d bytes", w.narBytes.Load(), size)
			}
			b.StopTimer()
			if got := w.narBytes.Load(); got != int64(size) {
				b.Fatalf("the worker got %d bytes, want %d", got, size)
			}
		})
	}
}

// BenchmarkNarUpload: 512 KiB UploadChunk frames from one worker to the
// server after a passthrough grant (goal through the proxy: ≥ 0.9×).
func BenchmarkNarUpload(b *testing.B) { benchNarUpload(b, sides) }

func benchNarUpload(b *testing.B, sides []side) {
	for _, side := range sides {
		b.Run(side.name, func(b *testing.B) {
			s := side.setup(b, 1, false)
			c, w := s.conns[0], s.workers[0]
			job := assignOne(b, c)
			w.sess.Send(&wire.UploadRequest{JobID: job, RequestID: 1, Object: &wire.UploadNar{StorePath: "/nix/store/x"}, Size: uint64(b.N) * chunkSize})
			req := nextMsg[*wire.UploadRequest](b, c)
			c.sess.Send(&wire.UploadGrant{RequestID: req.RequestID, Target: &wire.GrantPassthrough{}})
			<-w.grants
			chunk := make([]byte, chunkSize)
			b.SetBytes(chunkSize)
			b.ResetTimer()
			for i := range b.N {
				if err := w.sess.Send(&wire.UploadChunk{RequestID: 1, Data: chunk, Offset: uint64(i * chunkSize)}); err != nil {
					b.Fatal(err)
				}
			}
			w.sess.Send(&wire.UploadChunk{RequestID: 1, Offset: uint64(b.N) * chunkSize, IsFinal: true})
			select {
			case <-c.uploadDone:
			case <-time.After(time.Minute):
				b.Fatalf("the server got %d of %d bytes", c.uploaded.Load(), int64(b.N)*chunkSize)
			}
		})
	}
}
