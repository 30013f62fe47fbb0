package hub

import (
	"fmt"
	"testing"

	"gradient.dev/gradient/wire"
)

// BenchmarkHubAssign50 is the hub's own serial work per job, with no
// sockets: 50 waiting build workers (a quarter of them aarch64), one
// AssignJob handed out, accepted, completed and polled for again per op.
// This is what Dispatch50 through the proxy does under the hub's lock.
//
//	go test -run '^$' -bench HubAssign50 -benchmem -count 5 ./proxy/hub
func BenchmarkHubAssign50(b *testing.B) {
	h := newHub()
	u := &fakeUpstream{}
	u.h = h.Attach(u.send, nil)
	byID := map[uint64]*fakeWorker{}
	for i := range 50 {
		arch := "x86_64-linux"
		if i%4 == 0 {
			arch = "aarch64-linux"
		}
		w := buildWorker(fmt.Sprint("w", i), arch)
		byID[w.session] = w
		h.Join(w)
		h.FromWorker(w, &wire.RequestJob{Kind: wire.JobKindBuild})
	}
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = fmt.Sprint("job-", i)
	}
	u.take()
	b.ResetTimer()
	for i := range b.N {
		u.h.Handle(buildAssign(ids[i], "x86_64-linux"))
		h.mu.Lock()
		j := h.jobs[ids[i]]
		h.mu.Unlock()
		if j == nil {
			b.Fatalf("job %d was declined", i)
		}
		w := byID[j.owner]
		w.take()
		h.FromWorker(w, &wire.AssignJobResponse{JobID: ids[i], Accepted: true})
		h.FromWorker(w, &wire.JobCompleted{JobID: ids[i]})
		h.FromWorker(w, &wire.RequestJob{Kind: wire.JobKindBuild})
		if i%1024 == 0 {
			u.take()
		}
	}
}
