package session

import (
	"context"
	"testing"
	"unsafe"

	"gradient.dev/gradient/wire"
)

func TestReadBufferClasses(t *testing.T) {
	for _, n := range []int{1, 4 << 10, 4<<10 + 1, BulkChunkSize + 100, MaxProtoMessageSize} {
		b := getReadBuffer(n)
		if len(b) != 0 || cap(b) < n {
			t.Fatalf("getReadBuffer(%d): len %d cap %d", n, len(b), cap(b))
		}
	}
	if b := getReadBuffer(BulkChunkSize + 100); cap(b) != BulkChunkSize+4<<10 {
		t.Fatalf("a bulk chunk gets a %d-byte buffer", cap(b))
	}
	putReadBuffer(make([]byte, 10, 1000)) // not a class size: ignored
	putReadBuffer(nil)
}

// A released bulk buffer receives a later message; a message that was not
// released keeps its bytes, and no decoded payload reaches past its
// message into the rest of a reused buffer.
func TestReleasedBufferIsReused(t *testing.T) {
	ss, ws := establish(t, openPolicy(), nil, Options{}, Options{})
	ctx := context.Background()
	const n = 16
	go func() {
		for i := range n {
			if err := ss.Send(narPush(i, BulkChunkSize)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	held, err := ws.Reader.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	heldData := held.(*wire.NarPush).Data
	seen := map[unsafe.Pointer]bool{}
	reused := false
	for i := 1; i < n; i++ {
		m, err := ws.Reader.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		d := m.(*wire.NarPush).Data
		if d[0] != byte(i) || len(d) != BulkChunkSize {
			t.Fatalf("message %d: payload starts %d, %d bytes", i, d[0], len(d))
		}
		if end := unsafe.Add(unsafe.Pointer(unsafe.SliceData(d)), cap(d)); seen[end] {
			reused = true
		} else {
			seen[end] = true
		}
		if cap(d) > len(d)+64 {
			t.Fatalf("payload capacity %d reaches past its %d-byte message", cap(d), len(d))
		}
		ws.Reader.Release()
	}
	if heldData[0] != 0 || heldData[len(heldData)-1] != 0 {
		t.Fatal("a held payload was overwritten")
	}
	if !reused {
		t.Fatal("no released buffer was reused")
	}
}
