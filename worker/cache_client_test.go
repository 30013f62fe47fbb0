package worker

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

func randomStorePath(name string) string {
	var b [20]byte
	rand.Read(b[:])
	return storage.StoreDir + "/" + nixbase32.Encode(b[:]) + "-" + name
}

func sha256Nix(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + nixbase32.Encode(sum[:])
}

// dialCacheWorker connects a cache peer of the projects' cache to the
// real server (it may upload without a job) and feeds its session's
// messages to a new CacheClient. chunks counts the UploadChunk frames it
// sent.
func dialCacheWorker(t testing.TB, r *realServer) (*CacheClient, *atomic.Int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // generous: a loaded machine; never waited for when the dial works
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)
	workerID := storage.NewID()
	tokens := map[string]string{r.cache.ID: r.registerAs(storage.Peer{Kind: storage.PeerCache, ID: r.cache.ID}, workerID)}
	tr, err := session.Dial(ctx, r.url, session.DialOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c := session.NewConn(tr, session.ConnOptions{Logger: quiet})
	est, err := session.RunPeer(ctx, c, session.PeerConfig{WorkerID: workerID,
		Capabilities: wire.GradientCapabilities{Fetch: true, Eval: true, Build: true}, Tokens: tokens})
	if err != nil {
		tr.Close(session.CloseNormal, "")
		t.Fatal(err)
	}
	sess := session.SplitWorker(c, est, session.Options{Logger: quiet})
	chunks := &atomic.Int64{}
	client := NewCacheClient(func(m wire.ClientMessage) error {
		if _, ok := m.(*wire.UploadChunk); ok {
			chunks.Add(1)
		}
		return sess.Send(m)
	})
	recvCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := sess.Recv(recvCtx)
			if err != nil {
				return
			}
			client.HandleMessage(m)
		}
	}()
	t.Cleanup(func() {
		stop()
		sess.Close(session.CloseNormal, "test over")
		<-done
	})
	return client, chunks
}

func TestCacheClientAgainstServer(t *testing.T) {
	t.Parallel()
	store, err := narstore.OpenLocal(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	db := openSQLite(t)
	r := newRealServer(t, db, server.Config{NarStore: store})
	client, chunks := dialCacheWorker(t, r)
	client.TempDir = t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second) // generous: a loaded CI machine, never waited for when passing
	defer cancel()

	// Random bytes plus a compressible tail: the server only checks the
	// zstd stream against the metadata, and this spans several chunks.
	nar := append(randomNar(1300<<10), bytes.Repeat([]byte("nix "), 4<<20)...)
	path, ref := randomStorePath("hello"), randomStorePath("dep")
	deriver := randomStorePath("hello.drv")
	var uploaded atomic.Int64
	client.Moved = func(download bool, n int) {
		if !download {
			uploaded.Add(int64(n))
		}
	}
	if err := client.Upload(ctx, "job", path, bytes.NewReader(nar), UploadMeta{References: []string{ref}, Deriver: deriver}); err != nil {
		t.Fatal(err)
	}
	if n := chunks.Load(); n < 4 {
		t.Fatalf("the first upload sent %d chunks, want the compressed bytes in ≥3 plus the final one", n)
	}

	missing := randomStorePath("missing")
	got, err := client.Query(ctx, "job", []string{path, missing}, wire.QueryPull)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[0].Cached || got[1].Cached || got[0].Path != path {
		t.Fatalf("pull reply: %+v", got)
	}
	e := got[0]
	if uploaded.Load() != int64(*e.FileSize) {
		t.Fatalf("Moved counted %d uploaded bytes, want the compressed NAR's %d", uploaded.Load(), *e.FileSize)
	}
	if *e.NarSize != uint64(len(nar)) || *e.NarHash != sha256Nix(nar) || *e.FileSize == 0 || *e.FileSize >= uint64(len(nar)) ||
		e.References == nil || len(*e.References) != 1 || (*e.References)[0] != ref || e.Deriver == nil || *e.Deriver != deriver {
		t.Fatalf("pull entry: %+v", e)
	}

	got, err = client.Query(ctx, "job", []string{missing, path}, wire.QueryNormal)
	if err != nil || len(got) != 1 || got[0].Path != path || *got[0].NarSize != uint64(len(nar)) {
		t.Fatalf("normal query: %+v, %v", got, err)
	}
	got, err = client.Query(ctx, "job", []string{path, missing}, wire.QueryPush)
	if err != nil || len(got) != 2 || !got[0].Cached || got[1].Cached {
		t.Fatalf("push query: %+v, %v", got, err)
	}

	// More paths than one query may name: split, answered in order.
	many := make([]string, 2*CacheQueryMaxPaths+5)
	for i := range many {
		many[i] = randomStorePath("p" + strconv.Itoa(i))
	}
	many[len(many)-1] = path
	got, err = client.Query(ctx, "job", many, wire.QueryPull)
	if err != nil || len(got) != len(many) || !got[len(got)-1].Cached || got[len(got)-1].Path != path || got[0].Cached {
		t.Fatalf("split pull query: %d entries, %v", len(got), err)
	}

	// The second upload of the path is granted Skip: no chunks.
	before := chunks.Load()
	if err := client.Upload(ctx, "job", path, bytes.NewReader(nar), UploadMeta{}); err != nil {
		t.Fatal(err)
	}
	if chunks.Load() != before {
		t.Fatal("a stored path was uploaded again")
	}

	// The plain binary cache serves the narinfo and the compressed NAR.
	cache, err := db.CacheByName(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	if err := db.SetCachePublic(ctx, cache.ID, true); err != nil {
		t.Fatal(err)
	}
	base := "http://" + r.addr + "/cache/main/"
	hash := strings.TrimPrefix(path, storage.StoreDir+"/")[:32]
	info := httpGet(t, ctx, base+hash+".narinfo")
	for _, want := range []string{"StorePath: " + path, "NarHash: " + *e.NarHash, "NarSize: " + strconv.Itoa(len(nar)),
		"FileHash: " + *e.FileHash, "FileSize: " + strconv.FormatUint(*e.FileSize, 10), "Compression: zstd", "Sig: "} {
		if !strings.Contains(info, want) {
			t.Fatalf("narinfo lacks %q:\n%s", want, info)
		}
	}
	var narURL string
	for line := range strings.Lines(info) {
		if u, ok := strings.CutPrefix(line, "URL: "); ok {
			narURL = strings.TrimSpace(u)
		}
	}
	zst := []byte(httpGet(t, ctx, base+narURL))
	if uint64(len(zst)) != *e.FileSize || sha256Nix(zst) != *e.FileHash {
		t.Fatalf("served object: %d bytes %s, narinfo says %d %s", len(zst), sha256Nix(zst), *e.FileSize, *e.FileHash)
	}
	dec, err := zstd.NewReader(bytes.NewReader(zst))
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	plain, err := io.ReadAll(dec)
	if err != nil || !bytes.Equal(plain, nar) {
		t.Fatalf("the served NAR differs from the uploaded one (%v)", err)
	}
}

func randomNar(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func httpGet(t *testing.T, ctx context.Context, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v\n%s", url, resp.StatusCode, err, body)
	}
	return string(body)
}

// fakeCacheServer answers the client's messages in-process.
type fakeCacheServer struct {
	mu     sync.Mutex
	sent   []wire.ClientMessage
	client *CacheClient
	answer func(m wire.ClientMessage) []wire.ServerMessage
}

func newFakeCacheClient(answer func(m wire.ClientMessage) []wire.ServerMessage) (*CacheClient, *fakeCacheServer) {
	f := &fakeCacheServer{answer: answer}
	f.client = NewCacheClient(func(m wire.ClientMessage) error {
		f.mu.Lock()
		f.sent = append(f.sent, m)
		f.mu.Unlock()
		for _, reply := range f.answer(m) {
			go f.client.HandleMessage(reply)
		}
		return nil
	})
	return f.client, f
}

func (f *fakeCacheServer) count(match func(wire.ClientMessage) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, m := range f.sent {
		if match(m) {
			n++
		}
	}
	return n
}

func TestCacheClientQueryErrors(t *testing.T) {
	t.Parallel()
	ids := map[string]bool{}
	var mu sync.Mutex
	client, _ := newFakeCacheClient(func(m wire.ClientMessage) []wire.ServerMessage {
		q := m.(*wire.CacheQuery)
		mu.Lock()
		defer mu.Unlock()
		if ids[q.QueryID] || len(q.Paths) > CacheQueryMaxPaths {
			t.Errorf("query %s: reused id or %d paths", q.QueryID, len(q.Paths))
		}
		ids[q.QueryID] = true
		switch q.Paths[0] {
		case "error":
			return []wire.ServerMessage{&wire.CacheError{QueryID: q.QueryID, Message: "db down"}}
		case "silent":
			return nil
		}
		return []wire.ServerMessage{&wire.CacheStatus{QueryID: q.QueryID}}
	})
	client.QueryTimeout = 100 * time.Millisecond
	ctx := t.Context()
	var qe *CacheQueryError
	if _, err := client.Query(ctx, "j", []string{"error"}, wire.QueryPull); !errors.As(err, &qe) || qe.Message != "db down" {
		t.Fatalf("CacheError gave %v", err)
	}
	if _, err := client.Query(ctx, "j", []string{"silent"}, wire.QueryPull); !errors.Is(err, ErrCacheQueryTimeout) {
		t.Fatalf("no reply gave %v", err)
	}
	paths := make([]string, 3*CacheQueryMaxPaths)
	for i := range paths {
		paths[i] = "ok"
	}
	paths[2*CacheQueryMaxPaths] = "error" // the third query fails: the whole call does
	if _, err := client.Query(ctx, "j", paths, wire.QueryNormal); !errors.As(err, &qe) {
		t.Fatalf("a failing part gave %v", err)
	}
	if len(ids) != 2+3 {
		t.Fatalf("%d queries sent, want 5", len(ids))
	}
	if client.HandleMessage(&wire.CacheStatus{QueryID: "unknown"}) {
		t.Fatal("a reply nobody waits for was consumed")
	}
}

func TestCacheClientUploadOutcomes(t *testing.T) {
	t.Parallel()
	isRequest := func(m wire.ClientMessage) bool { _, ok := m.(*wire.UploadRequest); return ok }
	isCancel := func(m wire.ClientMessage) bool { _, ok := m.(*wire.UploadCancel); return ok }
	nar := randomNar(2 << 20)

	// Retry before the grant, then Retry after the chunks, then Ok.
	var attempt atomic.Int64
	client, f := newFakeCacheClient(func(m wire.ClientMessage) []wire.ServerMessage {
		switch m := m.(type) {
		case *wire.UploadRequest:
			if attempt.Add(1) == 1 {
				return []wire.ServerMessage{&wire.UploadCommitted{RequestID: m.RequestID, Outcome: &wire.UploadRetry{Reason: "busy"}}}
			}
			return []wire.ServerMessage{&wire.UploadGrant{RequestID: m.RequestID, Target: &wire.GrantPassthrough{}}}
		case *wire.UploadFinished:
			if attempt.Load() == 2 {
				return []wire.ServerMessage{&wire.UploadCommitted{RequestID: m.RequestID, Outcome: &wire.UploadRetry{Reason: "again"}}}
			}
			return []wire.ServerMessage{&wire.UploadCommitted{RequestID: m.RequestID, Outcome: &wire.UploadOk{}}}
		}
		return nil
	})
	if err := client.Upload(t.Context(), "j", "/nix/store/x", bytes.NewReader(nar), UploadMeta{}); err != nil {
		t.Fatal(err)
	}
	if n := f.count(isRequest); n != 3 {
		t.Fatalf("%d requests, want 3", n)
	}

	// Always Retry: three attempts, then an error.
	client, f = newFakeCacheClient(func(m wire.ClientMessage) []wire.ServerMessage {
		if m, ok := m.(*wire.UploadRequest); ok {
			return []wire.ServerMessage{&wire.UploadCommitted{RequestID: m.RequestID, Outcome: &wire.UploadRetry{Reason: "busy"}}}
		}
		return nil
	})
	if err := client.Upload(t.Context(), "j", "/nix/store/x", bytes.NewReader(nar), UploadMeta{}); !errors.Is(err, ErrUploadRejected) || f.count(isRequest) != 3 {
		t.Fatalf("endless Retry gave %v after %d requests", err, f.count(isRequest))
	}

	// Rejected: the reason is in the error, no retry.
	client, f = newFakeCacheClient(func(m wire.ClientMessage) []wire.ServerMessage {
		if m, ok := m.(*wire.UploadRequest); ok {
			return []wire.ServerMessage{&wire.UploadCommitted{RequestID: m.RequestID, Outcome: &wire.UploadRejected{Reason: "no cache"}}}
		}
		return nil
	})
	if err := client.Upload(t.Context(), "j", "/nix/store/x", bytes.NewReader(nar), UploadMeta{}); !errors.Is(err, ErrUploadRejected) ||
		!strings.Contains(err.Error(), "no cache") || f.count(isRequest) != 1 {
		t.Fatalf("Rejected gave %v", err)
	}

	// A resume offset skips the prefix; cancelling while waiting for the
	// commit sends UploadCancel.
	var firstOffset atomic.Int64
	firstOffset.Store(-1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	client, f = newFakeCacheClient(func(m wire.ClientMessage) []wire.ServerMessage {
		switch m := m.(type) {
		case *wire.UploadRequest:
			return []wire.ServerMessage{&wire.UploadGrant{RequestID: m.RequestID, Target: &wire.GrantPassthrough{ResumeOffset: 1000}}}
		case *wire.UploadChunk:
			firstOffset.CompareAndSwap(-1, int64(m.Offset))
		case *wire.UploadFinished:
			cancel() // the worker gives up while waiting for the commit
		}
		return nil
	})
	if err := client.Upload(ctx, "j", "/nix/store/x", bytes.NewReader(nar), UploadMeta{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled upload gave %v", err)
	}
	if firstOffset.Load() != 1000 || f.count(isCancel) != 1 {
		t.Fatalf("first chunk at %d, %d cancels", firstOffset.Load(), f.count(isCancel))
	}
}

// Packing a small NAR for upload reuses zstd encoders: a new level-6
// encoder allocates about 20 MiB of tables, which made each upload of a
// small build output cost ≈ 14 ms of allocation and zeroing.
func TestPackReusesEncoders(t *testing.T) {
	c := NewCacheClient(nil)
	nar := bytes.Repeat([]byte("small output "), 12)
	pack := func() {
		p, err := c.pack(context.Background(), bytes.NewReader(nar), UploadMeta{})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(io.NewSectionReader(p.data, 0, int64(p.meta.FileSize)))
		p.close()
		if plain, err := zstd.NewReader(bytes.NewReader(got)); err != nil {
			t.Fatal(err)
		} else if back, err := io.ReadAll(plain); err != nil || !bytes.Equal(back, nar) {
			t.Fatalf("packed NAR decompresses to %q, %v", back, err)
		}
	}
	pack() // the pool's first encoder
	const packs = 40
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range packs {
		pack()
	}
	runtime.ReadMemStats(&after)
	// A fresh encoder per pack is ≈ 21 MiB each. The bound leaves room
	// for a pool that drops encoders now and then (a garbage collection;
	// the race detector drops a quarter of them on purpose).
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > packs*12<<20 {
		t.Errorf("%d packs of a %d-byte NAR allocated %d MiB", packs, len(nar), allocated>>20)
	}
}

func BenchmarkPackSmallNar(b *testing.B) {
	c := NewCacheClient(nil)
	nar := bytes.Repeat([]byte("x"), 144)
	b.ReportAllocs()
	for b.Loop() {
		p, err := c.pack(context.Background(), bytes.NewReader(nar), UploadMeta{})
		if err != nil {
			b.Fatal(err)
		}
		p.close()
	}
}
