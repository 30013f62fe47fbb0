package hub

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"gradient.dev/gradient/wire"
)

const (
	testPath  = "/nix/store/big"
	testToken = "sha256:big"
	testChunk = 4 // bytes per chunk of the test object
)

// testObject is the object the fake server streams: byte i is i.
var testObject = func() []byte {
	b := make([]byte, 10*testChunk)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

// chunkAt is the server's chunk of testObject at offset.
func chunkAt(job string, offset int) *wire.NarPush {
	end := min(offset+testChunk, len(testObject))
	return &wire.NarPush{JobID: job, StorePath: testPath, Data: testObject[offset:end], Offset: uint64(offset), IsFinal: end == len(testObject)}
}

func header(job, token string) *wire.NarStreamHeader {
	return &wire.NarStreamHeader{JobID: job, StorePath: testPath, TotalBytes: uint64(len(testObject)), StreamToken: token}
}

// pulling is a hub whose worker w holds job "j" and asked for testPath;
// the header came.
func pulling(t *testing.T) (*Hub, *fakeUpstream, *fakeWorker) {
	t.Helper()
	h := newHub()
	w := buildWorker("w", "x86_64-linux")
	h.Join(w)
	u := attach(t, h)
	assigned(t, h, u, w, "j")
	h.FromWorker(w, &wire.NarRequest{JobID: "j", Paths: []string{testPath}})
	if got := u.take(); len(got) != 1 || got[0].WireName() != "NarRequest" {
		t.Fatalf("upstream got %v", names2(got))
	}
	u.h.Handle(header("j", testToken))
	if got := names(w.take()); !slices.Equal(got, []string{"NarStreamHeader"}) {
		t.Fatalf("the worker got %v", got)
	}
	return h, u, w
}

// received is the pull's bytes the worker got, checked to be in order.
func received(t *testing.T, msgs []wire.ServerMessage, from int) []byte {
	t.Helper()
	var out []byte
	for _, m := range msgs {
		p, ok := m.(*wire.NarPush)
		if !ok {
			continue
		}
		if int(p.Offset) != from+len(out) {
			t.Fatalf("chunk at %d, the worker expects %d", p.Offset, from+len(out))
		}
		out = append(out, p.Data...)
	}
	return out
}

func resumes(msgs []wire.ClientMessage) []*wire.NarRequestResume {
	var out []*wire.NarRequestResume
	for _, m := range msgs {
		if r, ok := m.(*wire.NarRequestResume); ok {
			out = append(out, r)
		}
	}
	return out
}

// A pull whose worker's queue passed the high-water mark is paused: its
// chunks are dropped (other messages still go out) until the queue
// drains; then the hub resumes it upstream at the worker's offset,
// swallows the new header, drops the old stream's late chunks, and the
// worker gets every byte once, in order.
func TestNarPullPausesAndResumesWhereTheWorkerIs(t *testing.T) {
	_, u, w := pulling(t)
	for off := 0; off < 3*testChunk; off += testChunk {
		u.h.Handle(chunkAt("j", off))
	}
	w.setBacklog(narHighWater) // the worker falls behind
	for off := 3 * testChunk; off < len(testObject); off += testChunk {
		u.h.Handle(chunkAt("j", off))
	}
	u.h.Handle(&wire.JobOffer{Candidates: []wire.JobCandidate{buildCand("other", "x86_64-linux")}})
	got := w.take()
	if n := len(of[*wire.JobOffer](got)); n != 1 {
		t.Fatalf("the paused worker got %d offers, want 1", n)
	}
	have := received(t, got, 0)
	if !bytes.Equal(have, testObject[:3*testChunk]) {
		t.Fatalf("before the pause the worker got %d bytes, want %d", len(have), 3*testChunk)
	}
	if r := resumes(u.take()); len(r) != 0 {
		t.Fatalf("resumed before the queue drained: %+v", r[0])
	}

	w.setBacklog(narLowWater) // not below the mark yet
	if r := resumes(u.take()); len(r) != 0 {
		t.Fatal("resumed at the low-water mark, not below it")
	}
	w.setBacklog(0)
	r := resumes(u.take())
	want := wire.NarRequestResume{JobID: "j", StorePath: testPath, ReceivedBytes: 3 * testChunk, StreamToken: testToken}
	if len(r) != 1 || *r[0] != want {
		t.Fatalf("upstream got resumes %+v, want %+v", r, want)
	}
	u.h.Handle(chunkAt("j", 9*testChunk)) // the old stream's last chunk, late
	u.h.Handle(header("j", testToken))
	for off := 3 * testChunk; off < len(testObject); off += testChunk {
		u.h.Handle(chunkAt("j", off))
	}
	got = w.take()
	if n := len(of[*wire.NarStreamHeader](got)); n != 0 {
		t.Fatalf("the worker got %d more headers", n)
	}
	have = append(have, received(t, got, 3*testChunk)...)
	if !bytes.Equal(have, testObject) {
		t.Fatalf("the worker got %d bytes, not the object", len(have))
	}
	if f := of[*wire.NarPush](got); !f[len(f)-1].IsFinal {
		t.Fatal("the last chunk forwarded is not final")
	}
	// The object is complete: stale chunks go nowhere.
	u.h.Handle(chunkAt("j", 9*testChunk))
	if got := w.take(); len(got) != 0 {
		t.Fatalf("after the final chunk the worker got %v", names(got))
	}
}

// A chunk that overlaps the worker's offset is cut to it; duplicates and
// chunks beyond the offset are dropped.
func TestNarPullCutsOverlapsAndDropsStaleChunks(t *testing.T) {
	_, u, w := pulling(t)
	u.h.Handle(chunkAt("j", 0))
	u.h.Handle(chunkAt("j", 2*testChunk)) // a gap: not what the worker expects
	u.h.Handle(chunkAt("j", 0))           // a duplicate
	// A stream resumed at an unaligned offset covers the worker's.
	u.h.Handle(&wire.NarPush{JobID: "j", StorePath: testPath, Data: testObject[2 : 2*testChunk], Offset: 2})
	u.h.Handle(chunkAt("j", 2*testChunk))
	have := received(t, w.take(), 0)
	if !bytes.Equal(have, testObject[:3*testChunk]) {
		t.Fatalf("the worker got %v, want %v", have, testObject[:3*testChunk])
	}
}

// A final chunk of bytes the worker has still ends its stream: the hub
// forwards its end, no bytes.
func TestNarPullForwardsTheEndOfBytesTheWorkerHas(t *testing.T) {
	_, u, w := pulling(t)
	u.h.Handle(&wire.NarPush{JobID: "j", StorePath: testPath, Data: testObject, Offset: 0}) // all bytes, not final
	u.h.Handle(chunkAt("j", 9*testChunk))                                                   // final, from another stream
	got := of[*wire.NarPush](w.take())
	if len(got) != 2 || !got[1].IsFinal || len(got[1].Data) != 0 || got[1].Offset != uint64(len(testObject)) {
		t.Fatalf("the worker got %+v", got)
	}
}

// The worker's own NarRequestResume (its buffer overflowed) goes
// upstream as it is, resets the offset it expects and gets its header.
func TestWorkersOwnResumeResetsTheOffset(t *testing.T) {
	h, u, w := pulling(t)
	for off := 0; off < 3*testChunk; off += testChunk {
		u.h.Handle(chunkAt("j", off))
	}
	w.take()
	own := &wire.NarRequestResume{JobID: "j", StorePath: testPath, ReceivedBytes: testChunk, StreamToken: testToken}
	h.FromWorker(w, own)
	if r := resumes(u.take()); len(r) != 1 || *r[0] != *own {
		t.Fatalf("upstream got %+v, want the worker's resume", r)
	}
	u.h.Handle(chunkAt("j", 3*testChunk)) // the old stream, beyond the worker
	u.h.Handle(header("j", testToken))
	u.h.Handle(chunkAt("j", testChunk))
	got := w.take()
	if n := len(of[*wire.NarStreamHeader](got)); n != 1 {
		t.Fatalf("the worker got %d headers for its resume, want 1", n)
	}
	if have := received(t, got, testChunk); !bytes.Equal(have, testObject[testChunk:2*testChunk]) {
		t.Fatalf("after its resume the worker got %v", have)
	}
}

// A server that answers the hub's resume with another object (a new
// token) restarts from 0: the header goes to the worker, which must
// notice, and so do the chunks from 0.
func TestNarPullRestartedByTheServerGoesToTheWorker(t *testing.T) {
	_, u, w := pulling(t)
	u.h.Handle(chunkAt("j", 0))
	w.setBacklog(narHighWater)
	u.h.Handle(chunkAt("j", testChunk))
	w.take()
	w.setBacklog(0)
	if r := resumes(u.take()); len(r) != 1 || r[0].ReceivedBytes != testChunk {
		t.Fatalf("upstream got %+v", r)
	}
	u.h.Handle(header("j", "sha256:other"))
	u.h.Handle(chunkAt("j", 0))
	got := w.take()
	if hs := of[*wire.NarStreamHeader](got); len(hs) != 1 || hs[0].StreamToken != "sha256:other" {
		t.Fatalf("the worker got %v", names(got))
	}
	if have := received(t, got, 0); !bytes.Equal(have, testObject[:testChunk]) {
		t.Fatalf("after the restart the worker got %v", have)
	}
}

// A pull resumed again and again without forwarding a byte is given up
// with NarAbort to the worker (transient to it); so is one the server
// restarts too often.
func TestNarPullIsGivenUpAfterResumesWithoutProgress(t *testing.T) {
	_, u, w := pulling(t)
	u.h.Handle(chunkAt("j", 0))
	for i := range narIdleResumes + 1 {
		w.setBacklog(narHighWater)
		u.h.Handle(chunkAt("j", testChunk)) // dropped: pauses
		w.setBacklog(0)
		r := resumes(u.take())
		if i < narIdleResumes {
			if len(r) != 1 {
				t.Fatalf("drain %d: %d resumes upstream", i, len(r))
			}
			u.h.Handle(header("j", testToken))
			continue
		}
		if len(r) != 0 {
			t.Fatalf("resumed %d times without progress", narIdleResumes+1)
		}
	}
	got := w.take()
	aborts := of[*wire.NarAbort](got)
	if len(aborts) != 1 || aborts[0].StorePath != testPath || !strings.Contains(aborts[0].Reason, "without progress") {
		t.Fatalf("the worker got %v", names(got))
	}
	if have := received(t, got, 0); len(have) != testChunk {
		t.Fatalf("the worker got %d bytes", len(have))
	}
}

func TestNarPullIsGivenUpAfterRestarts(t *testing.T) {
	_, u, w := pulling(t)
	for i := range narRestarts + 1 {
		u.h.Handle(chunkAt("j", 0))
		w.setBacklog(narHighWater)
		u.h.Handle(chunkAt("j", testChunk))
		w.setBacklog(0)
		if r := resumes(u.take()); len(r) != 1 {
			t.Fatalf("round %d: %d resumes", i, len(r))
		}
		u.h.Handle(header("j", "sha256:restart-"+string(rune('a'+i))))
	}
	got := w.take()
	if n := len(of[*wire.NarStreamHeader](got)); n != narRestarts {
		t.Fatalf("the worker got %d restarted headers, want %d", n, narRestarts)
	}
	if aborts := of[*wire.NarAbort](got); len(aborts) != 1 || !strings.Contains(aborts[0].Reason, "restarted") {
		t.Fatalf("the worker got %v", names(got))
	}
}

// A pull goes with its job: once the job ended, or its worker left, a
// drain resumes nothing and late chunks reach no one.
func TestNarPullsAreForgottenWithTheJob(t *testing.T) {
	h, u, w := pulling(t)
	w.setBacklog(narHighWater)
	u.h.Handle(chunkAt("j", 0))
	h.FromWorker(w, &wire.JobCompleted{JobID: "j", AssignmentID: "as-j"})
	if len(h.jobs) != 0 {
		t.Fatalf("the hub still holds %d jobs", len(h.jobs))
	}
	u.take()
	w.setBacklog(0)
	if got := u.take(); len(got) != 0 {
		t.Fatalf("after the job's end upstream got %v", names2(got))
	}
	u.h.Handle(chunkAt("j", 0))
	if got := w.take(); len(got) != 0 {
		t.Fatalf("after the job's end the worker got %v", names(got))
	}

	h2, u2, w2 := pulling(t)
	w2.setBacklog(narHighWater)
	u2.h.Handle(chunkAt("j", 0))
	h2.Leave(w2, "gone")
	u2.take()
	w2.setBacklog(0)
	if got := u2.take(); len(got) != 0 {
		t.Fatalf("after the worker left upstream got %v", names2(got))
	}
}

// Two pulls of one worker pause and resume each at its own offset.
func TestEveryPausedPullOfTheWorkerResumes(t *testing.T) {
	h, u, w := pulling(t)
	h.FromWorker(w, &wire.NarRequest{JobID: "j", Paths: []string{"/nix/store/other"}})
	u.h.Handle(&wire.NarStreamHeader{JobID: "j", StorePath: "/nix/store/other", TotalBytes: 8, StreamToken: "t2"})
	u.h.Handle(&wire.NarPush{JobID: "j", StorePath: "/nix/store/other", Data: []byte("abc"), Offset: 0})
	u.h.Handle(chunkAt("j", 0))
	w.setBacklog(narHighWater)
	u.h.Handle(&wire.NarPush{JobID: "j", StorePath: "/nix/store/other", Data: []byte("defgh"), Offset: 3, IsFinal: true})
	u.h.Handle(chunkAt("j", testChunk))
	u.take()
	w.setBacklog(0)
	r := resumes(u.take())
	if len(r) != 2 || r[0].StorePath != testPath || r[0].ReceivedBytes != testChunk || r[1].StorePath != "/nix/store/other" || r[1].ReceivedBytes != 3 || r[1].StreamToken != "t2" {
		t.Fatalf("upstream got resumes %+v", r)
	}
}
