package session

import (
	"context"
	"runtime"
	"testing"
	"time"

	"gradient.dev/gradient/wire"
)

// BenchmarkUploadThroughput is the worker→server direction (UploadChunk,
// 512 KiB): client frames are masked, which coder/websocket does through
// its 4 KiB write buffer.
func BenchmarkUploadThroughput(b *testing.B) {
	b.ReportAllocs()
	payload := make([]byte, narChunk)
	tcpTime := rawTCPCopy(b, b.N, payload)
	ss, ws := establish(b, openPolicy(), nil, Options{}, Options{SendTimeout: time.Minute})
	ctx := context.Background()
	b.SetBytes(narChunk)
	runtime.GC()
	b.ResetTimer()
	start := time.Now()
	go func() {
		for i := 0; i < b.N; i++ {
			if err := ws.Send(&wire.UploadChunk{RequestID: 1, Data: payload, Offset: uint64(i)}); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	for i := 0; i < b.N; i++ {
		if _, err := ss.Reader.Recv(ctx); err != nil {
			b.Fatal(err)
		}
		ss.Reader.Release()
	}
	elapsed := time.Since(start)
	b.StopTimer()
	mb := float64(b.N) * narChunk / (1 << 20)
	b.ReportMetric(mb/elapsed.Seconds(), "session-MiB/s")
	b.ReportMetric(mb/tcpTime.Seconds(), "tcp-MiB/s")
	b.ReportMetric(tcpTime.Seconds()/elapsed.Seconds(), "ratio")
}
