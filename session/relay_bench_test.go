package session

import (
	"context"
	"testing"
	"time"

	"gradient.dev/gradient/wire"
)

// feedTransport yields one frame over and over, read into a pooled
// buffer as a WebSocket reads a message (wsTransport.readAll).
type feedTransport struct{ frame []byte }

func (f feedTransport) ReadMessage(context.Context) ([]byte, error) {
	return append(getReadBuffer(len(f.frame)), f.frame...), nil
}
func (feedTransport) WriteMessage(context.Context, []byte) error { return nil }
func (feedTransport) Close(int, string) error                    { return nil }

// BenchmarkRelayHop is the proxy's own work per forwarded 512 KiB NAR
// chunk, without the sockets: receive it (one copy in, as from a socket)
// and hand it to the other leg's writer, whose transport discards it,
// either encoded again (Encode: the copy into a new frame) or relayed
// as the received frame (Relay), side by side
// (docs/PERFORMANCE.md, "Job forwarding through the proxy").
func BenchmarkRelayHop(b *testing.B) {
	push := &wire.NarPush{JobID: "0b5c9a4e-53f1-4c1e-9d59-6a3f3c1f2f10", StorePath: "/nix/store/0123456789abcdfghijklmnpqrsvwxyz-x",
		Data: make([]byte, BulkChunkSize), Offset: 1 << 30}
	frame, err := wire.AppendServerMessage(nil, push, 33)
	if err != nil {
		b.Fatal(err)
	}
	for _, relay := range []bool{false, true} {
		name := "path=encode"
		if relay {
			name = "path=relay"
		}
		b.Run(name, func(b *testing.B) {
			r := NewReader(feedTransport{frame}, 33, ServerCodec, discardLogger())
			w := NewWriter(feedTransport{}, 32, ServerCodec, time.Minute, discardLogger())
			ctx := context.Background()
			b.SetBytes(BulkChunkSize)
			b.ReportAllocs()
			for b.Loop() {
				m, err := r.Recv(ctx)
				if err != nil {
					b.Fatal(err)
				}
				var f Frame
				if relay {
					f, _, err = w.Relay(r.Frame(), r.Version(), m)
					r.Forget()
				} else {
					f, err = w.Encode(m)
					r.Release()
				}
				if err != nil {
					b.Fatal(err)
				}
				if err := w.SendFrame(f); err != nil {
					b.Fatal(err)
				}
			}
			w.Close()
			<-w.Done()
		})
	}
}
