package hub

import (
	"bytes"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"
)

// relayWorker is a fakeWorker that takes relayed frames over (Relayer).
type relayWorker struct {
	*fakeWorker
	decline bool // Relay does not take the frame (a worker at another version)

	mu      sync.Mutex
	relayed [][]byte
	vers    []uint16
}

func (r *relayWorker) Relay(m wire.ServerMessage, frame []byte, ver uint16) bool {
	r.fakeWorker.Send(m)
	if r.decline {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.relayed = append(r.relayed, frame)
	r.vers = append(r.vers, ver)
	return true
}

// fakeFrames is the upstream reader: the frame of the message handed to
// the hub, and whether the hub released or forgot it.
type fakeFrames struct {
	ver      uint16
	frame    []byte
	decoded  wire.ServerMessage // what frame decodes to
	released int
	forgot   int
	// lastForgot: the last frame was forgotten, not released.
	lastForgot bool
}

func (f *fakeFrames) Version() uint16 { return f.ver }
func (f *fakeFrames) Frame() []byte   { return f.frame }
func (f *fakeFrames) Release()        { f.released++; f.lastForgot = false }
func (f *fakeFrames) Forget()         { f.forgot++; f.lastForgot = true }

// receive hands the hub m as the upstream reader would: decoded from
// its frame at the session's version.
func (f *fakeFrames) receive(t *testing.T, u *Upstream, m wire.ServerMessage) []byte {
	t.Helper()
	frame := f.receiveOnly(t, m)
	u.Handle(f.decoded)
	return frame
}

// receiveOnly makes m the reader's last frame and decoded message.
func (f *fakeFrames) receiveOnly(t testing.TB, m wire.ServerMessage) []byte {
	t.Helper()
	frame, err := wire.AppendServerMessage(nil, m, f.ver)
	if err != nil {
		t.Fatal(err)
	}
	got, err := wire.DecodeServerMessage(frame, f.ver)
	if err != nil {
		t.Fatal(err)
	}
	f.frame, f.decoded = frame, got
	return frame
}

func relaying(t *testing.T, w Downstream) (*Upstream, *fakeFrames) {
	t.Helper()
	h := newHub()
	h.Join(w)
	fr := &fakeFrames{ver: 31}
	u := &fakeUpstream{}
	u.h = h.Attach(u.send, fr)
	u.take()
	var fw *fakeWorker
	switch w := w.(type) {
	case *relayWorker:
		fw = w.fakeWorker
	case *fakeWorker:
		fw = w
	}
	assigned(t, h, u, fw, "j")
	h.FromWorker(w, &wire.NarRequest{JobID: "j", Paths: []string{testPath}})
	u.h.Handle(header("j", testToken))
	fw.take()
	return u.h, fr
}

// A chunk the hub forwards unchanged goes to its worker as the very
// frame it came in (no decoding into a new frame), at the upstream
// session's version, and the upstream reader forgets the frame rather
// than reusing it; a chunk the hub must cut to what the worker lacks
// goes as a new message, and the reader gets its frame back.
func TestUnchangedChunkIsRelayedAsItsFrame(t *testing.T) {
	w := &relayWorker{fakeWorker: buildWorker("w", "x86_64-linux")}
	u, fr := relaying(t, w)

	frame := fr.receive(t, u, chunkAt("j", 0))
	if len(w.relayed) != 1 || &w.relayed[0][0] != &frame[0] || !bytes.Equal(w.relayed[0], frame) || w.vers[0] != 31 {
		t.Fatalf("the worker was not handed the upstream frame itself at version 31 (%d relayed)", len(w.relayed))
	}
	if fr.forgot != 1 || fr.released != 0 {
		t.Fatalf("the reader forgot %d and released %d frames, want 1 and 0", fr.forgot, fr.released)
	}

	// The server's resumed stream overlaps what the worker has: the
	// chunk at 2 is cut to start at 4.
	fr.receive(t, u, &wire.NarPush{JobID: "j", StorePath: testPath, Data: testObject[2:8], Offset: 2})
	if len(w.relayed) != 1 {
		t.Fatal("a cut chunk was relayed as its upstream frame")
	}
	got := of[*wire.NarPush](w.take())
	if last := got[len(got)-1]; last.Offset != 4 || !bytes.Equal(last.Data, testObject[4:8]) {
		t.Fatalf("the cut chunk went at %d with %d bytes, want 4 with 4", last.Offset, len(last.Data))
	}
	if fr.released != 1 {
		t.Fatalf("the reader got %d frames back, want 1", fr.released)
	}

	// An EvalCacheChunk for the job goes the same way.
	frame = fr.receive(t, u, &wire.EvalCacheChunk{JobID: "j", Data: []byte("eval cache bytes")})
	if len(w.relayed) != 2 || &w.relayed[1][0] != &frame[0] {
		t.Fatal("the EvalCacheChunk was not relayed as its frame")
	}
	// A chunk for a job the worker does not hold goes nowhere and its
	// frame back to the reader.
	fr.receive(t, u, &wire.NarPush{JobID: "other", StorePath: testPath, Data: testObject[:4]})
	if len(w.relayed) != 2 || fr.released != 2 || fr.forgot != 2 {
		t.Fatalf("a chunk of another job: relayed %d, released %d, forgot %d", len(w.relayed), fr.released, fr.forgot)
	}
}

// A worker that does not take the frame over (its session's version
// encodes the chunk otherwise) still gets the chunk, and the reader gets
// the frame back; so does a Downstream that cannot relay at all.
func TestChunkNotTakenOverGoesBackToTheReader(t *testing.T) {
	w := &relayWorker{fakeWorker: buildWorker("w", "x86_64-linux"), decline: true}
	u, fr := relaying(t, w)
	fr.receive(t, u, chunkAt("j", 0))
	if got := of[*wire.NarPush](w.take()); len(got) != 1 || !bytes.Equal(got[0].Data, testObject[:testChunk]) {
		t.Fatalf("the worker got %d chunks", len(got))
	}
	if fr.released != 1 || fr.forgot != 0 {
		t.Fatalf("released %d, forgot %d, want 1 and 0", fr.released, fr.forgot)
	}

	plain := buildWorker("p", "x86_64-linux")
	u, fr = relaying(t, plain)
	fr.receive(t, u, chunkAt("j", 0))
	if got := of[*wire.NarPush](plain.take()); len(got) != 1 || fr.released != 1 || fr.forgot != 0 {
		t.Fatalf("plain worker: %d chunks, released %d, forgot %d", len(got), fr.released, fr.forgot)
	}
}

// An Outbox over a session writer relays a chunk's upstream frame as it
// came: the worker's end reads the very bytes the server encoded, in
// order with the encoded messages around it; a closed Outbox takes
// nothing over.
func TestWriterOutboxRelaysTheFrame(t *testing.T) {
	proxyEnd, workerEnd := session.Pipe()
	w := session.NewWriter(proxyEnd, 30, session.ServerCodec, time.Second, slog.New(slog.DiscardHandler))
	defer w.Close()
	o := NewWriterOutbox(w, func(string) { t.Error("cut off") })
	push := &wire.NarPush{JobID: "j", StorePath: testPath, Data: bytes.Repeat([]byte{7}, 100<<10), Offset: 3}
	frame, err := wire.AppendServerMessage(nil, push, 33)
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := wire.DecodeServerMessage(frame, 33)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(frame)
	o.Send(&wire.NarStreamHeader{JobID: "j", StorePath: testPath, TotalBytes: 100 << 10, StreamToken: testToken})
	if !o.Relay(decoded, frame, 33) {
		t.Fatal("the Outbox did not take the frame over")
	}
	o.Send(&wire.NarAbort{JobID: "j", StorePath: testPath, Reason: "after"})
	var names []string
	for range 3 {
		b, err := workerEnd.ReadMessage(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		m, err := wire.DecodeServerMessage(b, 30)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, m.WireName())
		if _, ok := m.(*wire.NarPush); ok && !bytes.Equal(b, want) {
			t.Fatal("the relayed chunk differs from the server's frame")
		}
	}
	if !slices.Equal(names, []string{"NarStreamHeader", "NarPush", "NarAbort"}) {
		t.Fatalf("the worker got %v", names)
	}
	o.Close()
	if o.Relay(decoded, slices.Clone(want), 33) {
		t.Fatal("a closed Outbox took a frame over")
	}
}
