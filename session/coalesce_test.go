package session

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// countingConn counts the writes that reach the socket.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// countWrites puts a counter under the coalescing layer of t, on both the
// dialed and the accepted side.
func countWrites(t *testing.T, tr Transport) *countingConn {
	t.Helper()
	ws, ok := tr.(*wsTransport)
	if !ok || ws.co == nil {
		t.Fatal("the transport does not coalesce")
	}
	cc := &countingConn{Conn: ws.co.Conn}
	ws.co.Conn = cc
	return cc
}

// A batch of small messages leaves in one write system call, in both
// directions, and arrives whole and in order; a large message in the
// middle goes straight through, between the gathered ones.
func TestBatchOfSmallMessagesIsOneWrite(t *testing.T) {
	a, d := loopback(t)
	ctx := context.Background()
	for _, dir := range []struct {
		name     string
		from, to Transport
	}{{"dialed to accepted", d, a}, {"accepted to dialed", a, d}} {
		t.Run(dir.name, func(t *testing.T) {
			cc := countWrites(t, dir.from)
			var batch [][]byte
			for i := range 20 {
				batch = append(batch, []byte(fmt.Sprintf("message %d", i)))
			}
			if err := dir.from.(batchWriter).WriteMessages(ctx, batch); err != nil {
				t.Fatal(err)
			}
			if n := cc.writes.Load(); n != 1 {
				t.Fatalf("20 small messages took %d writes, want 1", n)
			}
			for i := range 20 {
				m, err := dir.to.ReadMessage(ctx)
				if err != nil || !bytes.Equal(m, batch[i]) {
					t.Fatalf("message %d: %q %v", i, m, err)
				}
			}

			large := bytes.Repeat([]byte{0xa5}, 200<<10)
			mixed := [][]byte{[]byte("before"), large, []byte("after")}
			if err := dir.from.(batchWriter).WriteMessages(ctx, mixed); err != nil {
				t.Fatal(err)
			}
			for i, want := range mixed {
				m, err := dir.to.ReadMessage(ctx)
				if err != nil || !bytes.Equal(m, want) {
					t.Fatalf("mixed message %d: %d bytes, %v", i, len(m), err)
				}
			}
		})
	}
}

// BenchmarkSmallBatch: a batch of 8 small messages written together and
// read, as a busy writer task sends them.
func BenchmarkSmallBatch(b *testing.B) {
	a, d := loopback(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	batch := make([][]byte, 8)
	for i := range batch {
		batch[i] = make([]byte, 100)
	}
	b.ReportAllocs()
	for b.Loop() {
		if bw, ok := d.(batchWriter); ok {
			if err := bw.WriteMessages(ctx, batch); err != nil {
				b.Fatal(err)
			}
		} else {
			for _, m := range batch {
				if err := d.WriteMessage(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
		}
		for range batch {
			if _, err := a.ReadMessage(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// Messages around the size of the first read (which lands in a scratch
// buffer and is copied out) arrive whole, each in a buffer of its own.
func TestReadSizesAroundFirstRead(t *testing.T) {
	a, d := loopback(t)
	ctx := context.Background()
	var got [][]byte
	for _, n := range []int{0, 1, firstRead - 1, firstRead, firstRead + 1, 5000, 3} {
		want := bytes.Repeat([]byte{byte(n)}, n)
		if err := d.WriteMessage(ctx, want); err != nil {
			t.Fatal(err)
		}
		m, err := a.ReadMessage(ctx)
		if err != nil || !bytes.Equal(m, want) || m == nil {
			t.Fatalf("%d bytes: got %d, %v", n, len(m), err)
		}
		got = append(got, m)
	}
	// No later read overwrote an earlier message.
	for i, n := range []int{0, 1, firstRead - 1, firstRead, firstRead + 1, 5000, 3} {
		if !bytes.Equal(got[i], bytes.Repeat([]byte{byte(n)}, n)) {
			t.Fatalf("message %d (%d bytes) changed after later reads", i, n)
		}
	}
}

// recordConn records the writes that reach it instead of sending them.
type recordConn struct {
	net.Conn
	writes [][]byte
}

func (c *recordConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, append([]byte(nil), p...))
	return len(p), nil
}

// The gathered frames leave inside the write of the batch's last frame,
// which gorilla makes under its write lock, never afterwards from done:
// a close frame waiting for that lock then still gives up after its
// deadline when the write is stuck on a peer that stopped reading.
func TestGatheredFramesLeaveWithTheLastFrame(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	rc := &recordConn{Conn: a}
	c := &coalescingConn{Conn: rc}
	c.cork()
	c.Write([]byte("one"))
	c.Write([]byte("two"))
	if len(rc.writes) != 0 {
		t.Fatalf("%d writes while corked", len(rc.writes))
	}
	c.last()
	c.Write([]byte("three"))
	if len(rc.writes) != 1 || string(rc.writes[0]) != "onetwothree" {
		t.Fatalf("after the last frame: %q", rc.writes)
	}
	if err := c.done(); err != nil || len(rc.writes) != 1 {
		t.Fatalf("done wrote again: %q, %v", rc.writes, err)
	}
	// A frame with a deadline (a close frame) does not wait for the batch.
	c.cork()
	c.Write([]byte("data"))
	c.SetWriteDeadline(time.Now().Add(time.Hour))
	c.Write([]byte("close"))
	if len(rc.writes) != 3 || string(rc.writes[1]) != "data" || string(rc.writes[2]) != "close" {
		t.Fatalf("a frame with a deadline: %q", rc.writes)
	}
	c.SetWriteDeadline(time.Time{})
	c.done()
}
