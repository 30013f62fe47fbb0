package narstore

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
)

// smallObjects are compressed ~400-byte NARs, the size of a .drv file's.
func smallObjects(b *testing.B, n int) [][]byte {
	b.Helper()
	objs := make([][]byte, n)
	for i := range objs {
		var buf bytes.Buffer
		nar := append(payload(400), fmt.Sprint(i)...)
		if _, err := Compress(context.Background(), &buf, bytes.NewReader(nar)); err != nil {
			b.Fatal(err)
		}
		objs[i] = buf.Bytes()
	}
	return objs
}

// BenchmarkCommitSmall is one upload of a small object after another:
// every commit waits for its own durability.
func BenchmarkCommitSmall(b *testing.B) {
	s := openStoreB(b)
	objs := smallObjects(b, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		commitOne(b, s, objs[i])
	}
}

// BenchmarkCommitSmallConcurrent is 32 uploads in flight, as a pipelined
// evaluation sends them: their fsyncs overlap (a journalled filesystem
// may also join them; this VM's ext4 has no journal).
func BenchmarkCommitSmallConcurrent(b *testing.B) {
	s := openStoreB(b)
	objs := smallObjects(b, b.N+64)
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16) // × GOMAXPROCS goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			commitOne(b, s, objs[next.Add(1)])
		}
	})
}

func openStoreB(b *testing.B) *Local {
	b.Helper()
	s, err := OpenLocal(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func commitOne(b *testing.B, s *Local, obj []byte) {
	u, err := s.Create(context.Background())
	if err != nil {
		b.Error(err)
		return
	}
	if _, err := u.Write(obj); err != nil {
		b.Error(err)
		return
	}
	if _, err := u.Commit(context.Background(), nil, nil); err != nil {
		b.Error(err)
	}
}
