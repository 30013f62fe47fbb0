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

// TestKilledDuringConcurrentCommitsKeepsAcknowledged kills a process that
// commits small objects from 32 goroutines, as a pipelined evaluation's
// uploads do: every object whose Commit returned before the kill is there,
// whole, after a restart, and only objects that were committed are
// visible.
func TestKilledDuringConcurrentCommitsKeepsAcknowledged(t *testing.T) {
	if dir := os.Getenv("NARSTORE_CONCURRENT_CRASH_DIR"); dir != "" {
		concurrentCommitter(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledDuringConcurrentCommitsKeepsAcknowledged$")
	cmd.Env = append(os.Environ(), "NARSTORE_CONCURRENT_CRASH_DIR="+dir)
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
	// Unacknowledged objects may be visible too (renamed into place before
	// the child died, not yet printed), but only objects it committed:
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

// concurrentCommitter commits objects 0, 1, … from 32 goroutines until killed.
func concurrentCommitter(dir string) {
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
