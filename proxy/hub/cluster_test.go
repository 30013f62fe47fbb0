package hub_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gradient.dev/gradient/internal/halfopen"
	"gradient.dev/gradient/proxy/hub"
	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// rawUpstream is a protocol-level tenant server: it accepts the proxy's
// session and lets the test send anything, recording what comes back.
// Our server declines cluster jobs, so the cluster path is driven here.
type rawUpstream struct {
	url   string
	conns chan *rawConn
}

type rawConn struct {
	sess *session.ServerSession
	msgs chan wire.ClientMessage
	// uploaded counts UploadChunk bytes, which are not queued in msgs;
	// uploadDone gets the final chunk's offset.
	uploaded   atomic.Int64
	uploadDone chan uint64
}

type openPolicy struct{}

func (openPolicy) Challenge(context.Context, string) ([]string, error) {
	return []string{"0190a8f0-0000-7000-8000-0000000000aa"}, nil
}
func (openPolicy) Authorize(context.Context, string, []wire.Pair[string, string]) (handshake.Decision, error) {
	return handshake.Accept([]string{"0190a8f0-0000-7000-8000-0000000000aa"}, nil, handshake.AllCapabilities), nil
}

func newRawUpstream(t testing.TB) *rawUpstream { return newRawUpstreamN(t, 4) }

// newRawUpstreamN keeps up to n sessions for the test to take.
func newRawUpstreamN(t testing.TB, n int) *rawUpstream {
	u := &rawUpstream{conns: make(chan *rawConn, n)}
	quiet := slog.New(slog.DiscardHandler)
	hs := httptest.NewServer(session.Handler(func(r *http.Request, tr session.Transport) {
		c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
		est, err := session.RunAuthority(r.Context(), c, session.AuthorityConfig{Policy: openPolicy{}})
		if err != nil {
			return
		}
		rc := &rawConn{sess: session.SplitServer(c, est, session.Options{Logger: quiet}), msgs: make(chan wire.ClientMessage, 1024),
			uploadDone: make(chan uint64, 1)}
		select {
		case u.conns <- rc:
		default: // a reconnect the test does not look at
		}
		for {
			m, err := rc.sess.Recv(r.Context())
			if err != nil {
				return
			}
			if c, ok := m.(*wire.UploadChunk); ok {
				rc.uploaded.Add(int64(len(c.Data)))
				if c.IsFinal {
					rc.uploadDone <- c.Offset
				}
				rc.sess.Reader.Release()
				continue
			}
			rc.msgs <- m
		}
	}))
	t.Cleanup(hs.Close)
	u.url = "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto"
	return u
}

// protoWorker is a protocol-level worker behind the proxy.
type protoWorker struct {
	id   string
	sess *session.WorkerSession
	msgs chan wire.ServerMessage
}

func dialProto(t testing.TB, url, id, token string, host wire.WorkerCapabilities) *protoWorker {
	t.Helper()
	ctx := t.Context()
	quiet := slog.New(slog.DiscardHandler)
	tr, err := session.Dial(ctx, url, session.DialOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
	est, err := session.RunPeer(ctx, c, session.PeerConfig{WorkerID: id, Capabilities: wire.GradientCapabilities{Build: true},
		Tokens: map[string]string{id: token}})
	if err != nil {
		t.Fatal(err)
	}
	p := &protoWorker{id: id, sess: session.SplitWorker(c, est, session.Options{Logger: quiet}), msgs: make(chan wire.ServerMessage, 1024)}
	t.Cleanup(func() { p.sess.Close(session.CloseNormal, "test over") })
	go func() {
		for {
			m, err := p.sess.Recv(context.Background())
			if err != nil {
				close(p.msgs)
				return
			}
			p.msgs <- m
		}
	}()
	p.send(t, &host)
	return p
}

func (p *protoWorker) send(t testing.TB, m wire.ClientMessage) {
	t.Helper()
	if err := p.sess.Send(m); err != nil {
		t.Fatal(err)
	}
}

// next is the next message of type T, skipping offers and lists.
func next[T any, M wire.Message](t testing.TB, what string, c <-chan M) T {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case m, ok := <-c:
			if !ok {
				var zero T
				t.Fatalf("%s: the session ended", what)
				return zero
			}
			if v, ok := any(m).(T); ok {
				return v
			}
		case <-timeout:
			var zero T
			t.Fatalf("%s: nothing within 30 s", what)
			return zero
		}
	}
}

// Cluster members reach distinct workers behind the proxy; StartCluster
// names those workers (with zone and endpoint) in the roster; signals
// pass both ways; AbortCluster reaches every holder. When the upstream
// session is lost the workers' jobs are aborted, they get Draining and
// their sessions close.
func TestClusterAndUpstreamLossThroughTheProxy(t *testing.T) {
	ctx := t.Context()
	up := newRawUpstream(t)
	store, tenant := linkedTenant(t, up)
	proxyURL, _ := runProxy(t, store, 0)
	upConn := <-up.conns

	zones := []string{"fsn1", "nbg1"}
	var workers []*protoWorker
	for i, zone := range zones {
		row, token, err := store.CreateWorker(ctx, tenant.ID, "node-"+zone, proxystore.Capabilities{Build: true})
		if err != nil {
			t.Fatal(err)
		}
		endpoint := "10.0.0." + string(rune('1'+i)) + ":7000"
		w := dialProto(t, proxyURL, row.ID, token, wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, MaxConcurrentBuilds: 1,
			Zone: &zone, Endpoint: &endpoint})
		w.send(t, &wire.RequestJob{Kind: wire.JobKindBuild})
		workers = append(workers, w)
		// The poll reached the tenant's server.
		next[*wire.RequestJob](t, "the forwarded poll", upConn.msgs)
	}

	member := func(i uint32) *wire.AssignJob {
		return &wire.AssignJob{JobID: "member-" + string(rune('0'+i)), AssignmentID: "a", Cluster: &wire.ClusterMembership{Attempt: "att", Role: "node", Index: i, HoldSecs: 40},
			Job: &wire.BuildJob{Requirement: wire.BuildRequirement{Architecture: "x86_64-linux"}}}
	}
	upConn.sess.Send(member(0))
	upConn.sess.Send(member(1))
	holder := map[string]*protoWorker{} // job ID → worker
	for _, w := range workers {
		a := next[*wire.AssignJob](t, w.id+"'s member", w.msgs)
		holder[a.JobID] = w
		w.send(t, &wire.AssignJobResponse{JobID: a.JobID, Accepted: true})
	}
	if len(holder) != 2 {
		t.Fatalf("both members went to one worker")
	}
	for range 2 {
		if r := next[*wire.AssignJobResponse](t, "an acceptance upstream", upConn.msgs); !r.Accepted {
			t.Fatalf("member declined: %+v", r)
		}
	}
	upConn.sess.Send(&wire.StartCluster{Attempt: "att", Roster: []wire.ClusterPeer{
		{Role: "node", Index: 0, Worker: rawProxyID}, {Role: "node", Index: 1, Worker: rawProxyID}}})
	for _, w := range workers {
		s := next[*wire.StartCluster](t, w.id+"'s StartCluster", w.msgs)
		for _, p := range s.Roster {
			want := holder["member-"+string(rune('0'+p.Index))]
			if p.Worker != want.id || p.Zone == nil || p.Endpoint == nil {
				t.Fatalf("roster entry %+v, want worker %s with its zone and endpoint", p, want.id)
			}
		}
	}
	upConn.sess.Send(&wire.ServerClusterSignal{Attempt: "att", From: wire.ClusterAddress{Role: "node"}, Payload: []byte("go")})
	for _, w := range workers {
		if s := next[*wire.ServerClusterSignal](t, w.id+"'s signal", w.msgs); string(s.Payload) != "go" {
			t.Fatalf("signal %+v", s)
		}
	}
	workers[0].send(t, &wire.ClientClusterSignal{Attempt: "att", Payload: []byte("ready")})
	if s := next[*wire.ClientClusterSignal](t, "the worker's signal upstream", upConn.msgs); string(s.Payload) != "ready" {
		t.Fatalf("upstream signal %+v", s)
	}

	// The upstream goes away: both workers' members are aborted, then
	// Draining, then the proxy closes their sessions.
	upConn.sess.Close(session.CloseGoingAway, "server stopping")
	for _, w := range workers {
		var got []string
		for m := range w.msgs {
			switch m.(type) {
			case *wire.AbortJob, *wire.ServerDraining:
				got = append(got, m.WireName())
			}
		}
		if !slices.Equal(got, []string{"AbortJob", "Draining"}) {
			t.Fatalf("%s got %v before its session closed, want AbortJob then Draining", w.id, got)
		}
	}
}

// A worker that stops reading (its connection dies half-open) while the
// server streams a NAR to it is cut off once its queue overflows; the
// tenant's other worker keeps getting its frames meanwhile, and the cut
// off worker's job fails upstream as transient.
func TestSlowWorkerIsCutOffWithoutStallingTheOthers(t *testing.T) {
	ctx := t.Context()
	up := newRawUpstream(t)
	store, tenant := linkedTenant(t, up)
	proxyURL, logs := runProxy(t, store, 0)
	upConn := <-up.conns
	cut := halfopen.New(t, strings.TrimPrefix(proxyURL, "ws://"))
	host := wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, MaxConcurrentBuilds: 1}
	var workers []*protoWorker
	for i, url := range []string{"ws://" + cut.Addr(), proxyURL} {
		row, token, err := store.CreateWorker(ctx, tenant.ID, fmt.Sprintf("w%d", i), proxystore.Capabilities{Build: true})
		if err != nil {
			t.Fatal(err)
		}
		w := dialProto(t, url, row.ID, token, host)
		w.send(t, &wire.RequestJob{Kind: wire.JobKindBuild})
		next[*wire.RequestJob](t, "the poll upstream", upConn.msgs)
		workers = append(workers, w)
	}
	slow, fast := workers[0], workers[1]
	owner := map[*protoWorker]string{}
	for _, id := range []string{"j-a", "j-b"} {
		upConn.sess.Send(&wire.AssignJob{JobID: id, AssignmentID: "a", Job: &wire.BuildJob{Requirement: wire.BuildRequirement{Architecture: "x86_64-linux"}}})
	}
	for _, w := range workers {
		owner[w] = next[*wire.AssignJob](t, "a job", w.msgs).JobID
		w.send(t, &wire.AssignJobResponse{JobID: owner[w], Accepted: true})
		next[*wire.AssignJobResponse](t, "the answer upstream", upConn.msgs)
	}
	cut.Freeze() // the slow worker reads nothing more
	chunk := make([]byte, 512<<10)
	for i := range 2 * hub.OutboxBytes / len(chunk) {
		if err := upConn.sess.Send(&wire.NarPush{JobID: owner[slow], StorePath: "/nix/store/big", Data: chunk, Offset: uint64(i * len(chunk))}); err != nil {
			t.Fatal(err)
		}
	}
	upConn.sess.Send(&wire.NarPush{JobID: owner[fast], StorePath: "/nix/store/small", Data: []byte("small"), IsFinal: true})
	if p := next[*wire.NarPush](t, "the fast worker's NAR", fast.msgs); p.StorePath != "/nix/store/small" {
		t.Fatalf("the fast worker got %+v", p)
	}
	f := next[*wire.JobFailed](t, "the slow worker's job failed upstream", upConn.msgs)
	if f.JobID != owner[slow] || f.Kind != wire.FailureTransient {
		t.Fatalf("upstream got %+v, want %s failed as transient", f, owner[slow])
	}
	if !strings.Contains(logs.String(), "cutting off a slow worker") {
		t.Error("the proxy did not log the cut off")
	}
}

// rawProxyID is the proxy's worker ID on the protocol-level upstream.
const rawProxyID = "0190a8f0-0000-7000-8000-000000000001"

// linkedTenant is a proxy store (SQLite) holding tenant "acme" linked
// to the protocol-level upstream up.
func linkedTenant(t *testing.T, up *rawUpstream) (*proxystore.Store, proxystore.Tenant) {
	t.Helper()
	ctx := t.Context()
	box, err := sealbox.New(sealbox.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	store, err := proxystore.Open(ctx, storagetest.SQLiteURL(t), box)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	tenant, err := store.CreateTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetLink(ctx, tenant.ID, up.url, rawProxyID,
		[]proxystore.PeerToken{{PeerID: "0190a8f0-0000-7000-8000-0000000000aa", Token: strings.Repeat("ab", 32)}}); err != nil {
		t.Fatal(err)
	}
	return store, tenant
}
