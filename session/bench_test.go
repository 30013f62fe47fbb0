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
// copies the same bytes over a raw loopback TCP connection. It reports both
// rates and session/tcp.
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
	// The baseline runs first, so garbage left by the session run does not
	// slow it down.
	tcpTime := rawTCPCopy(b, b.N, payload)
	b.SetBytes(narChunk)
	runtime.GC()
	b.ResetTimer()
	start := time.Now()
	go func() {
		for i := 0; i < b.N; i++ {
			if err := ss.Send(&wire.NarPush{JobID: "j", StorePath: "/nix/store/abc", Data: payload, Offset: uint64(i)}); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	for i := 0; i < b.N; i++ {
		if _, err := ws.Reader.Recv(ctx); err != nil {
			b.Fatal(err)
		}
		if release {
			ws.Reader.Release()
		}
	}
	sessionTime := time.Since(start)
	b.StopTimer()
	mb := float64(b.N) * narChunk / (1 << 20)
	sessionRate, tcpRate := mb/sessionTime.Seconds(), mb/tcpTime.Seconds()
	b.ReportMetric(sessionRate, "session-MiB/s")
	b.ReportMetric(tcpRate, "tcp-MiB/s")
	b.ReportMetric(sessionRate/tcpRate, "ratio")
}

// rawTCPCopy writes n payloads over a loopback TCP connection and reads
// them into one reused buffer: the plain copy cost, a stricter baseline than
// the session's buffer per message.
func rawTCPCopy(b *testing.B, n int, payload []byte) time.Duration {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for i := 0; i < n; i++ {
			if _, err := c.Write(payload); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	buf := make([]byte, len(payload))
	for i := 0; i < n; i++ {
		if _, err := io.ReadFull(c, buf); err != nil {
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
