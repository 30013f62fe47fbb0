package session

import (
	"context"
	"io"
	"net"
	"testing"
)

// BenchmarkLoopbackHop is the floor under every forwarded message: one
// small message there and back (two hops) between two goroutines on
// loopback, over raw TCP and over the session's WebSocket transport. A
// proxied round trip crosses four such hops where a direct one crosses two
// (docs/PERFORMANCE.md, "Job forwarding through the proxy").
func BenchmarkLoopbackHop(b *testing.B) {
	msg := make([]byte, 100)
	b.Run("tcp", func(b *testing.B) {
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
			buf := make([]byte, len(msg))
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		buf := make([]byte, len(msg))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("websocket", func(b *testing.B) {
		a, d := loopback(b)
		ctx := context.Background()
		go func() {
			for {
				m, err := a.ReadMessage(ctx)
				if err != nil {
					return
				}
				if err := a.WriteMessage(ctx, m); err != nil {
					return
				}
			}
		}()
		b.ReportAllocs()
		for b.Loop() {
			if err := d.WriteMessage(ctx, msg); err != nil {
				b.Fatal(err)
			}
			if _, err := d.ReadMessage(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
