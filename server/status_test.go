package server

import (
	"strings"
	"testing"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// A worker that spells its UUID in upper case keeps its offline reason
// under the canonical ID the operator looks up, for a failure before the
// token check and for the end of an established session alike.
func TestOfflineReasonOfAnUpperCaseWorkerID(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newEnv(t, db, Config{})
		id := newWorkerID(t)
		token := e.register(storage.PeerProject, e.project.ID, id)
		upper := strings.ToUpper(id)

		e.expectReject(upper, map[string]string{e.project.ID: "not-the-token"}, 401, "no valid peer tokens provided")
		waitfor.True(t, "the rejected worker's offline reason", func() bool {
			return strings.Contains(e.srv.WorkerStatus(id).OfflineReason, "no valid peer tokens provided")
		})

		w := e.mustConnect(upper, map[string]string{e.project.ID: token})
		waitfor.True(t, "the worker to be live", func() bool { return e.srv.WorkerStatus(id).Live })
		w.sess.Close(1000, "worker leaving")
		waitfor.True(t, "the reason the session ended", func() bool {
			st := e.srv.WorkerStatus(id)
			return !st.Live && st.OfflineReason != "" && !strings.Contains(st.OfflineReason, "no valid peer tokens")
		})
	})
}

// Offline reasons are kept for registered worker IDs only: unregistered
// IDs, IDs that are not UUIDs and other spellings of a registered ID add
// no entry.
func TestOfflineReasonsKeepOnlyRegisteredIDs(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := newEnv(t, db, Config{})
		id := newWorkerID(t)
		e.register(storage.PeerProject, e.project.ID, id)
		wrong := map[string]string{e.project.ID: "not-the-token"}
		for range 3 {
			e.expectReject(newWorkerID(t), wrong, 403, "unknown worker")
		}
		e.expectReject("not-a-uuid", wrong, 403, "unknown worker")
		for i := range 4 {
			// Upper-case one more hex letter each time: another spelling.
			spelled := []byte(id)
			for j, letters := 0, 0; j < len(spelled) && letters <= i; j++ {
				if 'a' <= spelled[j] && spelled[j] <= 'f' {
					spelled[j] -= 'a' - 'A'
					letters++
				}
			}
			e.expectReject(string(spelled), wrong, 401, "no valid peer tokens provided")
		}
		waitfor.True(t, "the registered worker's offline reason", func() bool { return e.srv.WorkerStatus(id).OfflineReason != "" })
		kept := e.srv.auth.ForTest().OfflineReasonsKept()
		if kept != 1 {
			t.Errorf("%d offline reasons kept, want 1 (the registered worker ID's)", kept)
		}
	})
}
