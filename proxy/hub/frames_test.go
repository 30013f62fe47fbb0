package hub_test

import (
	"bytes"
	"testing"

	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/wire"
)

// The proxy reuses the frame of each NAR chunk it forwards for the next
// one: a worker behind it still gets every chunk's own bytes, in order,
// while the server streams them back to back in sizes that span the
// frame buffers' classes.
func TestForwardedNarChunksArriveIntact(t *testing.T) {
	ctx := t.Context()
	up := newRawUpstream(t)
	store, tenant := linkedTenant(t, up)
	proxyURL, _ := runProxy(t, store, 0)
	upConn := <-up.conns
	row, token, err := store.CreateWorker(ctx, tenant.ID, "w0", proxystore.Capabilities{Build: true})
	if err != nil {
		t.Fatal(err)
	}
	w := dialProto(t, proxyURL, row.ID, token, wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, MaxConcurrentBuilds: 1})
	w.send(t, &wire.RequestJob{Kind: wire.JobKindBuild})
	next[*wire.RequestJob](t, "the poll upstream", upConn.msgs)
	upConn.sess.Send(&wire.AssignJob{JobID: "j", AssignmentID: "a", Job: &wire.BuildJob{Requirement: wire.BuildRequirement{Architecture: "x86_64-linux"}}})
	next[*wire.AssignJob](t, "the job", w.msgs)
	w.send(t, &wire.AssignJobResponse{JobID: "j", Accepted: true})
	next[*wire.AssignJobResponse](t, "the answer upstream", upConn.msgs)

	sizes := []int{512 << 10, 100, 512 << 10, 3 << 10, 300 << 10, 512 << 10, 60 << 10, 1}
	var chunks [][]byte
	for i := range 48 {
		chunks = append(chunks, bytes.Repeat([]byte{byte(i + 1)}, sizes[i%len(sizes)]))
	}
	offset := 0
	for i, c := range chunks {
		if err := upConn.sess.Send(&wire.NarPush{JobID: "j", StorePath: "/nix/store/x", Data: c, Offset: uint64(offset), IsFinal: i == len(chunks)-1}); err != nil {
			t.Fatal(err)
		}
		offset += len(c)
	}
	offset = 0
	for i, c := range chunks {
		p := next[*wire.NarPush](t, "a NAR chunk at the worker", w.msgs)
		if p.Offset != uint64(offset) || !bytes.Equal(p.Data, c) {
			t.Fatalf("chunk %d: offset %d, %d bytes starting %v; want offset %d, %d bytes of %d", i, p.Offset, len(p.Data), p.Data[:min(4, len(p.Data))], offset, len(c), c[0])
		}
		offset += len(c)
	}
}
