package server_test

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/wire"

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
		e := servertest.NewEnv(t, db, server.Config{})
		id := storage.NewID()
		token := e.Register(storage.PeerProject, e.Project.ID, id)
		upper := strings.ToUpper(id)

		e.ExpectReject(upper, map[string]string{e.Project.ID: "not-the-token"}, 401, "no valid peer tokens provided")
		waitfor.True(t, "the rejected worker's offline reason", func() bool {
			return strings.Contains(e.Srv.WorkerStatus(id).OfflineReason, "no valid peer tokens provided")
		})

		w := e.MustConnect(upper, map[string]string{e.Project.ID: token})
		waitfor.True(t, "the worker to be live", func() bool { return e.Srv.WorkerStatus(id).Live })
		w.Sess.Close(1000, "worker leaving")
		waitfor.True(t, "the reason the session ended", func() bool {
			st := e.Srv.WorkerStatus(id)
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
		e := servertest.NewEnv(t, db, server.Config{})
		id := storage.NewID()
		e.Register(storage.PeerProject, e.Project.ID, id)
		wrong := map[string]string{e.Project.ID: "not-the-token"}
		for range 3 {
			e.ExpectReject(storage.NewID(), wrong, 403, "unknown worker")
		}
		e.ExpectReject("not-a-uuid", wrong, 403, "unknown worker")
		for i := range 4 {
			// Upper-case one more hex letter each time: another spelling.
			spelled := []byte(id)
			for j, letters := 0, 0; j < len(spelled) && letters <= i; j++ {
				if 'a' <= spelled[j] && spelled[j] <= 'f' {
					spelled[j] -= 'a' - 'A'
					letters++
				}
			}
			e.ExpectReject(string(spelled), wrong, 401, "no valid peer tokens provided")
		}
		waitfor.True(t, "the registered worker's offline reason", func() bool { return e.Srv.WorkerStatus(id).OfflineReason != "" })
		kept := e.Srv.AuthForTest().OfflineReasonsKept()
		if kept != 1 {
			t.Errorf("%d offline reasons kept, want 1 (the registered worker ID's)", kept)
		}
	})
}

// The operator's view of a live worker carries what its session last
// reported of its machine: WorkerCapabilities (architectures, features,
// slots, CPUs, RAM, core score) and the heartbeat's load. A figure JSON
// cannot carry (NaN) is left out rather than breaking the view.
func TestWorkerStatusShowsTheSessionsHost(t *testing.T) {
	t.Parallel()
	storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
		e := servertest.NewEnv(t, db, server.Config{})
		id := storage.NewID()
		token := e.Register(storage.PeerProject, e.Project.ID, id)
		w := e.MustConnect(id, map[string]string{e.Project.ID: token})
		waitfor.True(t, "the worker to be live", func() bool { return e.Srv.WorkerStatus(id).Live })
		if h := e.Srv.WorkerStatus(id).Host; h != nil {
			t.Fatalf("host %+v before the worker reported one", h)
		}

		if err := w.Sess.Send(&wire.WorkerMetrics{CPUUsagePct: 12.5, RAMFreeMB: 3000}); err != nil {
			t.Fatal(err)
		}
		waitfor.True(t, "the heartbeat's load in the status", func() bool {
			h := e.Srv.WorkerStatus(id).Host
			return h != nil && h.RAMFreeMB != nil && *h.RAMFreeMB == 3000
		})
		if h := e.Srv.WorkerStatus(id).Host; h.CPUUsagePct == nil || *h.CPUUsagePct != 12.5 || h.MaxConcurrentBuilds != 0 {
			t.Errorf("host %+v, want the load alone", h)
		}

		zone := "fsn1"
		if err := w.Sess.Send(&wire.WorkerCapabilities{Architectures: []string{"x86_64-linux", "i686-linux"}, SystemFeatures: []string{"kvm"},
			MaxConcurrentBuilds: 6, CPUCount: 16, RAMTotalMB: 64000, CPUCoreScore: 420, Zone: &zone}); err != nil {
			t.Fatal(err)
		}
		if err := w.Sess.Send(&wire.WorkerMetrics{CPUUsagePct: float32(math.NaN()), RAMFreeMB: 2000}); err != nil {
			t.Fatal(err)
		}
		waitfor.True(t, "the capabilities and the second heartbeat in the status", func() bool {
			h := e.Srv.WorkerStatus(id).Host
			return h != nil && h.CPUCount == 16 && h.RAMFreeMB != nil && *h.RAMFreeMB == 2000
		})
		st := e.Srv.WorkerStatus(id)
		want := authority.HostStatus{Architectures: []string{"x86_64-linux", "i686-linux"}, SystemFeatures: []string{"kvm"},
			MaxConcurrentBuilds: 6, CPUCount: 16, RAMTotalMB: 64000, CPUCoreScore: 420, Zone: "fsn1", RAMFreeMB: st.Host.RAMFreeMB}
		if !reflect.DeepEqual(*st.Host, want) {
			t.Errorf("host %+v, want %+v (a NaN load left out)", *st.Host, want)
		}
		if _, err := json.Marshal(st); err != nil {
			t.Errorf("the status does not encode: %v", err)
		}

		w.Sess.Close(session.CloseNormal, "worker leaving")
		waitfor.True(t, "the worker offline", func() bool { return !e.Srv.WorkerStatus(id).Live })
		if h := e.Srv.WorkerStatus(id).Host; h != nil {
			t.Errorf("an offline worker shows host %+v", h)
		}
	})
}
