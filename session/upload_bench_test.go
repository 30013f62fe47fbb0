package session

import (
	"context"
	"testing"
	"time"

	"gradient.dev/gradient/wire"
)

// BenchmarkUploadThroughput is the worker→server direction (UploadChunk,
// 512 KiB): client frames are masked, which gorilla does through the
// dialer's pooled write buffer (clientWriteBufferSize).
func BenchmarkUploadThroughput(b *testing.B) {
	b.ReportAllocs()
	payload := make([]byte, narChunk)
	ss, ws := establish(b, openPolicy(), nil, Options{}, Options{SendTimeout: time.Minute})
	ctx := context.Background()
	runBulkVsTCP(b, payload, func(i int) error {
		return ws.Send(&wire.UploadChunk{RequestID: 1, Data: payload, Offset: uint64(i)})
	}, func() error {
		_, err := ss.Reader.Recv(ctx)
		ss.Reader.Release()
		return err
	})
}
