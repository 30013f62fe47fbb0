package session

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/wire"
)

const narChunk = 512 << 10

// BenchmarkBulkThroughput pushes 512 KiB NarPush messages through one
// loopback session (server writer → worker reader) and, in the same run,
// copies the same bytes over a raw loopback TCP connection, alternating
// (runBulkVsTCP). It reports both rates and session/tcp.
func BenchmarkBulkThroughput(b *testing.B) {
	b.Run("fresh-buffers", func(b *testing.B) { benchBulk(b, false) })
	b.Run("released-buffers", func(b *testing.B) { benchBulk(b, true) })
}

// benchBulk: with release, the reader reuses the buffer of each consumed
// chunk (Reader.Release); without, every chunk gets its own buffer.
func benchBulk(b *testing.B, release bool) {
	b.ReportAllocs()
	ss, ws := establish(b, openPolicy(), nil, Options{SendTimeout: time.Minute}, Options{})
	payload := make([]byte, narChunk)
	ctx := context.Background()
	runBulkVsTCP(b, payload, func(i int) error {
		return ss.Send(&wire.NarPush{JobID: "j", StorePath: "/nix/store/abc", Data: payload, Offset: uint64(i)})
	}, func() error {
		_, err := ws.Reader.Recv(ctx)
		if release {
			ws.Reader.Release()
		}
		return err
	})
}

// bulkRound is how many chunks go through the session, then through raw
// TCP, before the next round: alternating in rounds of 16 MiB exposes both
// to the same machine load (other processes on a shared VM), so the ratio
// is stable even when the absolute rates are not.
const bulkRound = 32

// runBulkVsTCP moves b.N chunks through send/recv (the full session path)
// and b.N copies of payload over a raw loopback TCP connection, in
// alternating rounds, timing each side on its own. It reports both rates
// and their ratio session/tcp.
func runBulkVsTCP(b *testing.B, payload []byte, send func(i int) error, recv func() error) {
	tcp := newRawTCP(b, payload)
	b.SetBytes(int64(len(payload)))
	runtime.GC()
	b.ResetTimer()
	var sessionTime, tcpTime time.Duration
	for done := 0; done < b.N; {
		n := min(bulkRound, b.N-done)
		b.StopTimer() // ns/op, B/s and allocs are the session's alone
		tcpTime += tcp.copy(b, n)
		b.StartTimer()
		start := time.Now()
		errc := make(chan error, 1)
		go func() {
			for i := range n {
				if err := send(done + i); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for range n {
			if err := recv(); err != nil {
				b.Fatal(err)
			}
		}
		sessionTime += time.Since(start)
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		done += n
	}
	b.StopTimer()
	mb := float64(b.N) * float64(len(payload)) / (1 << 20)
	sessionRate, tcpRate := mb/sessionTime.Seconds(), mb/tcpTime.Seconds()
	b.ReportMetric(sessionRate, "session-MiB/s")
	b.ReportMetric(tcpRate, "tcp-MiB/s")
	b.ReportMetric(sessionRate/tcpRate, "ratio")
}

// rawTCP is the baseline: payloads written over a loopback TCP connection
// and read into one reused buffer, the plain copy cost, a stricter
// baseline than the session's buffer per message.
type rawTCP struct {
	c       net.Conn
	buf     []byte
	request chan int
}

func newRawTCP(b *testing.B, payload []byte) *rawTCP {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	r := &rawTCP{buf: make([]byte, len(payload)), request: make(chan int)}
	go func() {
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		defer c.Close()
		for n := range r.request {
			for range n {
				if _, err := c.Write(payload); err != nil {
					return
				}
			}
		}
	}()
	r.c, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { close(r.request); r.c.Close() })
	return r
}

// copy moves n payloads and returns how long reading them took.
func (r *rawTCP) copy(b *testing.B, n int) time.Duration {
	start := time.Now()
	r.request <- n
	for range n {
		if _, err := io.ReadFull(r.c, r.buf); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// BenchmarkHandshakeLatency measures dial → InitAck for a worker dialing an
// authority over loopback (version agreement, challenge round, InitAck).
func BenchmarkHandshakeLatency(b *testing.B) {
	b.ReportAllocs()
	policy := &testPolicy{peers: []string{"p1"}, valid: map[string]string{"p1": "t1"}, allowed: workerCaps}
	srv := httptest.NewServer(Handler(func(r *http.Request, t Transport) {
		RunAuthority(r.Context(), NewConn(t, quiet()), AuthorityConfig{Policy: policy})
	}))
	defer srv.Close()
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/proto"
	tokens := map[string]string{"p1": "t1"}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		t, err := Dial(context.Background(), url, DialOptions{Logger: discardLogger()})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := RunPeer(context.Background(), NewConn(t, quiet()), PeerConfig{WorkerID: "w1", Tokens: tokens}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		closeAsync(t, CloseNormal, "")
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkIdleSessionMemory opens 500 established, idle sessions on one
// listener (both ends live in this process, each with its dispatch reader
// blocked in Recv and its watchdogs armed) and reports heap plus stack bytes
// per session pair; one end is about half of it.
func BenchmarkIdleSessionMemory(b *testing.B) {
	const sessions = 500
	release := make(chan struct{})
	srv := httptest.NewServer(Handler(func(r *http.Request, t Transport) {
		c := NewConn(t, quiet())
		est, err := RunAuthority(r.Context(), c, AuthorityConfig{Policy: openPolicy()})
		if err != nil {
			return
		}
		ss := SplitServer(c, est, Options{HeartbeatTimeout: HeartbeatTimeout, Logger: discardLogger()})
		go ss.Recv(context.Background())
		<-release
		ss.Close(CloseNormal, "")
	}))
	defer srv.Close()
	defer close(release)
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/proto"
	var workers []*WorkerSession
	defer func() {
		for _, ws := range workers {
			ws.Close(CloseNormal, "")
		}
	}()
	for i := 0; i < b.N; i++ {
		before := memInUse()
		for range sessions {
			t, err := Dial(context.Background(), url, DialOptions{Logger: discardLogger()})
			if err != nil {
				b.Fatal(err)
			}
			c := NewConn(t, quiet())
			est, err := RunPeer(context.Background(), c, PeerConfig{WorkerID: "w", Capabilities: workerCaps})
			if err != nil {
				b.Fatal(err)
			}
			ws := SplitWorker(c, est, Options{AckTimeout: AckTimeout, Logger: discardLogger()})
			go ws.Recv(context.Background())
			workers = append(workers, ws)
		}
		after := memInUse()
		b.ReportMetric(float64(after-before)/sessions, "bytes/session-pair")
	}
}

func memInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}
