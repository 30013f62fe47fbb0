package worker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/wire"
)

const pullTestPath = "/nix/store/00000000000000000000000000000000-x"

// pullHarness is a CacheClient whose sent messages land in a channel,
// with one pull open on it.
type pullHarness struct {
	t      *testing.T
	c      *CacheClient
	sent   chan wire.ClientMessage
	stream io.ReadCloser
}

func newPullHarness(t *testing.T, setup func(*CacheClient)) *pullHarness {
	h := &pullHarness{t: t, sent: make(chan wire.ClientMessage, 64)}
	h.c = NewCacheClient(func(m wire.ClientMessage) error { h.sent <- m; return nil })
	if setup != nil {
		setup(h.c)
	}
	s, err := h.c.OpenNar(context.Background(), "job", pullTestPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	h.stream = s
	if r, ok := h.next().(*wire.NarRequest); !ok || len(r.Paths) != 1 || r.Paths[0] != pullTestPath {
		t.Fatalf("first message %+v, want a NarRequest for the path", r)
	}
	return h
}

func (h *pullHarness) next() wire.ClientMessage {
	h.t.Helper()
	select {
	case m := <-h.sent:
		return m
	case <-time.After(30 * time.Second):
		h.t.Fatal("nothing sent")
		return nil
	}
}

// feed hands m to the client as the session's dispatch goroutine does.
func (h *pullHarness) feed(m wire.ServerMessage) {
	h.t.Helper()
	if !h.c.HandleMessage(m) {
		h.t.Fatalf("%s not taken by the pull", m.WireName())
	}
}

func (h *pullHarness) push(data string, offset uint64, final bool) {
	h.t.Helper()
	h.feed(&wire.NarPush{JobID: "job", StorePath: pullTestPath, Data: []byte(data), Offset: offset, IsFinal: final})
}

// readAll reads the stream to its end in the background.
func (h *pullHarness) readAll() <-chan result {
	done := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(h.stream)
		done <- result{b, err}
	}()
	return done
}

type result struct {
	b   []byte
	err error
}

// The reader gets the object's bytes once each, also when the server
// resumed the stream at an earlier offset than the worker had reached
// (the overlap is skipped); Moved counts the bytes taken.
func TestPullResumesAfterAbort(t *testing.T) {
	var moved atomic.Int64
	h := newPullHarness(t, func(c *CacheClient) {
		c.Moved = func(download bool, n int) {
			if download {
				moved.Add(int64(n))
			}
		}
	})
	h.feed(&wire.NarStreamHeader{JobID: "job", StorePath: pullTestPath, TotalBytes: 6, StreamToken: "t"})
	h.push("abcd", 0, false)
	h.feed(&wire.NarAbort{JobID: "job", StorePath: pullTestPath, Reason: "storage hiccup"})
	if r, ok := h.next().(*wire.NarRequestResume); !ok || r.ReceivedBytes != 4 || r.StreamToken != "t" {
		t.Fatalf("resume %+v, want one from byte 4 with the token", r)
	}
	h.feed(&wire.NarStreamHeader{JobID: "job", StorePath: pullTestPath, TotalBytes: 6, StreamToken: "t"})
	h.push("cdef", 2, true)
	r := <-h.readAll()
	if r.err != nil || string(r.b) != "abcdef" {
		t.Fatalf("read %q, %v", r.b, r.err)
	}
	if moved.Load() != 6 {
		t.Fatalf("Moved counted %d bytes, want 6", moved.Load())
	}
}

// A reader that does not keep up never blocks the dispatch goroutine:
// chunks beyond the buffer are dropped and, once the reader drained the
// buffer and the server's stream ended, asked for again from where the
// reader is. The reader still gets every byte once, in order.
func TestPullOverflowResumes(t *testing.T) {
	var overflows atomic.Int32
	h := newPullHarness(t, func(c *CacheClient) {
		c.PullBufferBytes, c.PullIdleTimeout = 8, 20*time.Second
		c.Overflowed = func() { overflows.Add(1) }
	})
	h.feed(&wire.NarStreamHeader{JobID: "job", StorePath: pullTestPath, TotalBytes: 16, StreamToken: "t"})
	// Nobody reads yet: 8 bytes fit, the rest is dropped.
	h.push("0123", 0, false)
	h.push("4567", 4, false)
	h.push("89ab", 8, false)
	h.push("cdef", 12, true)
	select {
	case m := <-h.sent:
		t.Fatalf("sent %s before the reader drained the buffer", m.WireName())
	default:
	}
	done := h.readAll()
	if r, ok := h.next().(*wire.NarRequestResume); !ok || r.ReceivedBytes != 8 || r.StreamToken != "t" {
		t.Fatalf("resume %+v, want one from byte 8", r)
	}
	// The resumed stream. Each offset reaches the reader once: the second
	// chunk at 12 (a stream running beside it; marked here by other
	// bytes) is dropped, though its final flag ends the object.
	h.feed(&wire.NarStreamHeader{JobID: "job", StorePath: pullTestPath, TotalBytes: 16, StreamToken: "t"})
	h.push("89ab", 8, false)
	h.push("cdef", 12, false)
	h.push("XXXX", 12, true)
	r := <-done
	if r.err != nil || string(r.b) != "0123456789abcdef" {
		t.Fatalf("read %q, %v", r.b, r.err)
	}
	if overflows.Load() != 1 {
		t.Errorf("Overflowed told %d times, want once", overflows.Load())
	}
}

// An import that stays stalled fails the pull after pullOverflows
// resumes instead of fetching the object forever.
func TestPullOverflowLimit(t *testing.T) {
	h := newPullHarness(t, func(c *CacheClient) { c.PullBufferBytes = 2 })
	h.feed(&wire.NarStreamHeader{JobID: "job", StorePath: pullTestPath, StreamToken: "t"})
	// The reader takes a byte per step: with 2-byte chunks and room for
	// 2, the second chunk of each stream always overflows.
	type read struct {
		n   int
		err error
	}
	reads, step := make(chan read), make(chan struct{})
	go func() {
		buf := make([]byte, 1)
		for {
			n, err := h.stream.Read(buf)
			reads <- read{n, err}
			if err != nil {
				return
			}
			<-step
		}
	}()
	for i := 0; ; i++ {
		next := uint64(2 * i)
		h.push("ab", next, false)
		h.push("cd", next+2, true) // dropped, and the stream ended
		for range 2 {
			if r := <-reads; r.n != 1 || r.err != nil {
				t.Fatalf("round %d: read %+v", i, r)
			}
			step <- struct{}{}
		}
		if i == pullOverflows {
			if r := <-reads; r.err == nil || !bytes.Contains([]byte(r.err.Error()), []byte("fell behind")) {
				t.Fatalf("after %d overflows: read %+v", i+1, r)
			}
			return
		}
		if r, ok := h.next().(*wire.NarRequestResume); !ok || r.ReceivedBytes != next+2 {
			t.Fatalf("round %d: resume %+v, want one from %d", i, r, next+2)
		}
	}
}

// NarUnavailable fails the read with a *NarUnavailableError naming the
// path; a header with another token after part of the object fails it
// with ErrPullRestarted; a gap in the offsets is a protocol error.
func TestPullFailures(t *testing.T) {
	t.Run("unavailable", func(t *testing.T) {
		h := newPullHarness(t, nil)
		h.feed(&wire.NarUnavailable{JobID: "job", StorePath: pullTestPath, Reason: "gone"})
		r := <-h.readAll()
		var u *NarUnavailableError
		if !errors.As(r.err, &u) || len(u.Paths) != 1 || u.Paths[0] != pullTestPath || u.Reasons[0] != "gone" {
			t.Fatalf("read error %v", r.err)
		}
	})
	t.Run("restarted", func(t *testing.T) {
		h := newPullHarness(t, nil)
		h.feed(&wire.NarStreamHeader{JobID: "job", StorePath: pullTestPath, TotalBytes: 6, StreamToken: "t1"})
		h.push("abc", 0, false)
		h.feed(&wire.NarAbort{JobID: "job", StorePath: pullTestPath, Reason: "hiccup"})
		h.next()
		h.feed(&wire.NarStreamHeader{JobID: "job", StorePath: pullTestPath, TotalBytes: 7, StreamToken: "t2"})
		r := <-h.readAll()
		if string(r.b) != "abc" || !errors.Is(r.err, ErrPullRestarted) {
			t.Fatalf("read %q, %v", r.b, r.err)
		}
	})
	t.Run("gap", func(t *testing.T) {
		h := newPullHarness(t, nil)
		h.feed(&wire.NarStreamHeader{JobID: "job", StorePath: pullTestPath, TotalBytes: 6, StreamToken: "t"})
		h.push("abc", 3, true)
		if r := <-h.readAll(); r.err == nil || !bytes.Contains([]byte(r.err.Error()), []byte("offset 3")) {
			t.Fatalf("read %q, %v", r.b, r.err)
		}
	})
	t.Run("short", func(t *testing.T) {
		h := newPullHarness(t, nil)
		h.feed(&wire.NarStreamHeader{JobID: "job", StorePath: pullTestPath, TotalBytes: 6, StreamToken: "t"})
		h.push("abc", 0, true)
		if r := <-h.readAll(); r.err == nil {
			t.Fatalf("a stream that ended at 3 of 6 bytes read %q", r.b)
		}
	})
	t.Run("idle", func(t *testing.T) {
		h := newPullHarness(t, func(c *CacheClient) { c.PullIdleTimeout = time.Millisecond })
		if r := <-h.readAll(); r.err == nil || !bytes.Contains([]byte(r.err.Error()), []byte("nothing received")) {
			t.Fatalf("read %q, %v", r.b, r.err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		h := newPullHarness(t, nil)
		h.stream.Close()
		if h.c.HandleMessage(&wire.NarPush{JobID: "job", StorePath: pullTestPath, Data: []byte("a")}) {
			t.Error("a closed pull took a chunk")
		}
	})
}

// A server that streams as fast as it can into a pull whose reader only
// starts after the whole first stream went by: the buffer overflows, the
// reader resumes again and again, and still reads the object exactly.
func TestPullThroughRepeatedOverflows(t *testing.T) {
	object := make([]byte, 64<<10)
	for i := range object {
		object[i] = byte(i * 7)
	}
	const chunk = 1 << 10
	var overflows atomic.Int32
	h := newPullHarness(t, func(c *CacheClient) {
		c.PullBufferBytes = 4 << 10
		c.Overflowed = func() { overflows.Add(1) }
	})
	// serve streams the object from offset, as the server's stream does.
	serve := func(offset uint64) {
		h.feed(&wire.NarStreamHeader{JobID: "job", StorePath: pullTestPath, TotalBytes: uint64(len(object)), StreamToken: "t"})
		for o := offset; o < uint64(len(object)); o += chunk {
			end := min(o+chunk, uint64(len(object)))
			h.feed(&wire.NarPush{JobID: "job", StorePath: pullTestPath, Data: object[o:end], Offset: o, IsFinal: end == uint64(len(object))})
		}
	}
	serve(0)
	done := h.readAll()
	for {
		select {
		case r := <-done:
			if r.err != nil || !bytes.Equal(r.b, object) {
				t.Fatalf("read %d bytes, %v", len(r.b), r.err)
			}
			if overflows.Load() == 0 {
				t.Fatal("no overflow: the test did not test it")
			}
			return
		case m := <-h.sent:
			r, ok := m.(*wire.NarRequestResume)
			if !ok {
				t.Fatalf("sent %s", m.WireName())
			}
			serve(r.ReceivedBytes)
		}
	}
}

// FuzzPullStream feeds a pull any sequence of stream messages (headers,
// chunks of one object at any offset and length, aborts) and reads in
// between: whatever the reader gets is the object's bytes in order, once
// each, and nothing panics.
func FuzzPullStream(f *testing.F) {
	f.Add([]byte{8, 0, 1, 0, 16, 1, 4, 16, 4, 255, 1, 8, 16, 4, 255})
	f.Add([]byte{2, 0, 1, 0, 63, 1, 16, 63, 2, 0, 4, 255, 1, 4, 63, 4, 255, 0, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		object := make([]byte, 256)
		for i := range object {
			object[i] = byte(i*31 + 7)
		}
		if len(ops) == 0 {
			return
		}
		c := NewCacheClient(func(wire.ClientMessage) error { return nil })
		c.PullBufferBytes = int(ops[0]%64) + 1
		c.PullIdleTimeout = time.Millisecond
		s, err := c.OpenNar(context.Background(), "job", pullTestPath)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var got []byte
		buf := make([]byte, 256)
		next := func(i *int) byte {
			if *i >= len(ops) {
				return 0
			}
			*i++
			return ops[*i-1]
		}
		for i := 1; i < len(ops); {
			switch op := next(&i); op % 5 {
			case 0:
				token := "t"
				if op&0x80 != 0 {
					token = "u"
				}
				c.HandleMessage(&wire.NarStreamHeader{JobID: "job", StorePath: pullTestPath, TotalBytes: uint64(len(object)), StreamToken: token})
			case 1:
				offset := int(next(&i)) * 4 % len(object)
				end := min(offset+int(next(&i)%64), len(object))
				c.HandleMessage(&wire.NarPush{JobID: "job", StorePath: pullTestPath, Data: object[offset:end], Offset: uint64(offset), IsFinal: end == len(object)})
			case 2:
				c.HandleMessage(&wire.NarAbort{JobID: "job", StorePath: pullTestPath, Reason: "fuzz"})
			case 3:
				if op&0x80 != 0 {
					c.HandleMessage(&wire.NarUnavailable{JobID: "job", StorePath: pullTestPath})
				}
			case 4:
				// Only reads that need not wait for the server (it is this
				// goroutine), or the one that asks for a resume.
				ns := s.(*NarStream)
				ns.mu.Lock()
				ready := len(ns.chunks) > 0 || ns.final || ns.err != nil || ns.unavailable != "" || (ns.dropping && ns.ended)
				ns.mu.Unlock()
				if ready {
					n, _ := s.Read(buf[:int(next(&i))%len(buf)+1])
					got = append(got, buf[:n]...)
				}
			}
			if !bytes.Equal(got, object[:min(len(got), len(object))]) || len(got) > len(object) {
				t.Fatalf("read %d bytes that are not the object's prefix", len(got))
			}
		}
	})
}
