package worker

import (
	"context"
	"os"
	"sync/atomic"
	"testing"

	"gradient.dev/gradient/wire"
)

// A pulled object's hash covers exactly the bytes in its file, also when
// the server resumed the stream at an earlier offset than the worker had
// reached (the file is cut back and the hash computed again).
func TestPullHashesWhatItWrote(t *testing.T) {
	sent := make(chan wire.ClientMessage, 16)
	c := NewCacheClient(func(m wire.ClientMessage) error { sent <- m; return nil })
	var moved atomic.Int64 // what Moved counted, in bytes received
	c.Moved = func(download bool, n int) {
		if download {
			moved.Add(int64(n))
		}
	}
	const path = "/nix/store/00000000000000000000000000000000-x"
	type result struct {
		files map[string]PulledNar
		err   error
	}
	done := make(chan result, 1)
	go func() {
		files, err := c.Pull(context.Background(), "job", []string{path}, t.TempDir())
		done <- result{files, err}
	}()
	if _, ok := (<-sent).(*wire.NarRequest); !ok {
		t.Fatal("no NarRequest")
	}
	feed := func(m wire.ServerMessage) {
		if !c.HandleMessage(m) {
			t.Fatalf("%s not taken by the pull", m.WireName())
		}
	}
	feed(&wire.NarStreamHeader{JobID: "job", StorePath: path, TotalBytes: 6, StreamToken: "t"})
	feed(&wire.NarPush{JobID: "job", StorePath: path, Data: []byte("abXY"), Offset: 0})
	feed(&wire.NarAbort{JobID: "job", StorePath: path, Reason: "storage hiccup"})
	if r, ok := (<-sent).(*wire.NarRequestResume); !ok || r.ReceivedBytes != 4 {
		t.Fatalf("resume %+v, want one from byte 4", r)
	}
	// The server resumes from byte 2: "XY" is replaced.
	feed(&wire.NarPush{JobID: "job", StorePath: path, Data: []byte("cdef"), Offset: 2, IsFinal: true})
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	got, err := os.ReadFile(r.files[path].File)
	if err != nil || string(got) != "abcdef" {
		t.Fatalf("file %q, %v", got, err)
	}
	if want := sha256Nix([]byte("abcdef")); r.files[path].FileHash != want {
		t.Fatalf("file hash %s, want %s (of the bytes in the file)", r.files[path].FileHash, want)
	}
	if moved.Load() != 8 {
		t.Fatalf("Moved counted %d bytes, want the 8 received (4 of them twice)", moved.Load())
	}
}
