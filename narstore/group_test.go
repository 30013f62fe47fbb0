package narstore

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"gradient.dev/gradient/internal/waitfor"
)

// compressed returns NAR i (small, distinct) and its compressed bytes.
func compressed(i int) (nar, zst []byte) {
	nar = append(payload(400), fmt.Sprintf("object %d", i)...)
	var buf bytes.Buffer
	if _, err := Compress(context.Background(), &buf, bytes.NewReader(nar)); err != nil {
		panic(err) // compressing into memory does not fail
	}
	return nar, buf.Bytes()
}

func upload(s *Local, zst []byte) (Object, error) {
	u, err := s.Create(context.Background())
	if err != nil {
		return Object{}, err
	}
	if _, err := u.Write(zst); err != nil {
		u.Abort()
		return Object{}, err
	}
	return u.Commit(context.Background(), nil, nil)
}

// TestConcurrentCommitsShareOneGroup holds the first flush until every
// other commit waits: those then become visible together in one group,
// each readable, and no temporary file is left.
func TestConcurrentCommitsShareOneGroup(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	const n = 40
	release := make(chan struct{})
	var (
		mu     sync.Mutex
		groups []int
	)
	first := true
	s.group.beforeFlush = func() {
		if first {
			first = false
			<-release
		}
	}
	s.group.onFlush = func(objects int, _ time.Duration) {
		mu.Lock()
		groups = append(groups, objects)
		mu.Unlock()
	}
	nars := make([][]byte, n)
	objs := make([]Object, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	_, zst0 := compressed(0)
	nars[0], _ = compressed(0)
	wg.Go(func() { objs[0], errs[0] = upload(s, zst0) })
	waitfor.True(t, "the first commit to lead a flush", func() bool {
		s.group.mu.Lock()
		defer s.group.mu.Unlock()
		return s.group.flushing
	})
	for i := 1; i < n; i++ {
		nar, zst := compressed(i)
		nars[i] = nar
		wg.Go(func() { objs[i], errs[i] = upload(s, zst) })
	}
	waitfor.True(t, "every other commit to wait for the next group", func() bool {
		s.group.mu.Lock()
		defer s.group.mu.Unlock()
		return len(s.group.pending) == n-1
	})
	close(release)
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("commit %d: %v", i, errs[i])
		}
		if !bytes.Equal(readObject(t, s, objs[i].Key), nars[i]) {
			t.Fatalf("object %d reads back different bytes", i)
		}
	}
	if fmt.Sprint(groups) != fmt.Sprint([]int{1, n - 1}) {
		t.Fatalf("groups %v, want [1 %d]", groups, n-1)
	}
	if temps, _ := filepath.Glob(filepath.Join(dir, "nars", tempPattern)); len(temps) != 0 {
		t.Fatalf("temporary files left: %v", temps)
	}
}

// TestKilledDuringGroupCommitsKeepsAcknowledged kills a process that
// commits small objects from many goroutines: every object whose Commit
// returned before the kill is there, whole, after a restart, and only
// objects that were committed are visible.
func TestKilledDuringGroupCommitsKeepsAcknowledged(t *testing.T) {
	if dir := os.Getenv("NARSTORE_GROUP_CRASH_DIR"); dir != "" {
		groupCommitter(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledDuringGroupCommitsKeepsAcknowledged$")
	cmd.Env = append(os.Environ(), "NARSTORE_GROUP_CRASH_DIR="+dir)
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child prints "i key" after each Commit returned.
	acked := map[int]string{}
	sc := bufio.NewScanner(stdout)
	for len(acked) < 200 && sc.Scan() {
		var i int
		var key string
		if _, err := fmt.Sscan(sc.Text(), &i, &key); err != nil {
			t.Fatalf("child said %q", sc.Text())
		}
		acked[i] = key
	}
	cmd.Process.Kill()
	for sc.Scan() { // what the child acknowledged before it died
		var i int
		var key string
		if _, err := fmt.Sscan(sc.Text(), &i, &key); err == nil {
			acked[i] = key
		}
	}
	cmd.Wait()
	if len(acked) < 200 {
		t.Fatalf("child acknowledged only %d commits", len(acked))
	}
	s := openStore(t, dir)
	for i, key := range acked {
		nar, _ := compressed(i)
		if !bytes.Equal(readObject(t, s, key), nar) {
			t.Fatalf("acknowledged object %d lost or damaged", i)
		}
	}
	// Unacknowledged objects may be visible too (their group was synced,
	// the child died before printing), but only objects it committed:
	// each of 32 goroutines holds at most one unacknowledged number.
	committed := map[string]bool{}
	for i := range len(acked) + 32 {
		_, zst := compressed(i)
		committed[KeyOf(sha256.Sum256(zst))] = true
	}
	keys, _ := s.Keys()
	for _, k := range keys {
		if !committed[k] {
			t.Fatalf("visible object %s is none the child committed", k)
		}
	}
	if temps, _ := filepath.Glob(filepath.Join(dir, "nars", tempPattern)); len(temps) != 0 {
		t.Fatalf("start-up left temporary files: %v", temps)
	}
}

// groupCommitter commits objects 0, 1, … from 32 goroutines until killed.
func groupCommitter(dir string) {
	s, err := OpenLocal(dir, nil)
	if err != nil {
		os.Exit(3)
	}
	var mu sync.Mutex
	next := 0
	out := bufio.NewWriter(os.Stdout)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				_, zst := compressed(i)
				obj, err := upload(s, zst)
				if err != nil {
					os.Exit(5)
				}
				mu.Lock()
				fmt.Fprintln(out, i, obj.Key)
				out.Flush()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}
