package secret

import (
	"crypto/sha256"
	"encoding/hex"
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestVerifierMatchesLikeVerify(t *testing.T) {
	token, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := Generate()
	stored, err := Hash(token)
	if err != nil {
		t.Fatal(err)
	}
	v := NewVerifier(2)
	for i := range 3 { // the second and third come from the memo
		if !v.Verify(stored, token) {
			t.Fatalf("round %d: the right token did not verify", i)
		}
		if v.Verify(stored, other) {
			t.Fatalf("round %d: a wrong token verified", i)
		}
	}
	// A remembered pair is bound to its hash: the token against another
	// token's hash never matches.
	otherStored, _ := Hash(other)
	if v.Verify(otherStored, token) {
		t.Fatal("a token verified against another token's hash")
	}
	if len(v.matched) != 1 {
		t.Fatalf("memo holds %d pairs, want 1 (failures are never kept)", len(v.matched))
	}
}

// Checks of one pair that overlap (a worker that gave up waiting and
// dialed again) share one argon2id run; other pairs still run their own.
func TestVerifierSharesRunningChecks(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	runs := map[string]int{}
	v := NewVerifier(4)
	v.check = func(stored, token string) bool {
		mu.Lock()
		runs[stored]++
		mu.Unlock()
		<-release
		return token == "right"
	}
	var wg sync.WaitGroup
	results := make([]bool, 12)
	for i := range results {
		stored, token := "hash-a", "right"
		if i == 0 {
			stored, token = "hash-b", "wrong"
		}
		wg.Go(func() { results[i] = v.Verify(stored, token) })
	}
	for {
		v.mu.Lock()
		n := len(v.running)
		v.mu.Unlock()
		if n == 2 {
			break
		}
		runtime.Gosched()
	}
	time.Sleep(50 * time.Millisecond) // let the rest join the running check
	close(release)
	wg.Wait()
	for i, ok := range results {
		if ok != (i != 0) {
			t.Errorf("check %d = %v", i, ok)
		}
	}
	if runs["hash-a"] != 1 || runs["hash-b"] != 1 {
		t.Fatalf("full checks run %v, want one per pair", runs)
	}
	// A failed pair is not remembered: asked again, it is checked again.
	if v.Verify("hash-b", "wrong") || runs["hash-b"] != 2 {
		t.Fatalf("a failed pair was answered from memory (%d runs)", runs["hash-b"])
	}
}

// Observe hears of each argon2 check that ran, with its outcome, and of
// nothing the memo answered or a legacy SHA-256 hash settled.
func TestVerifierObservesArgon2Checks(t *testing.T) {
	token, _ := Generate()
	other, _ := Generate()
	stored, err := Hash(token)
	if err != nil {
		t.Fatal(err)
	}
	type check struct {
		matched bool
		elapsed time.Duration
	}
	var mu sync.Mutex
	var seen []check
	v := NewVerifier(1)
	v.Observe = func(elapsed time.Duration, matched bool) {
		mu.Lock()
		seen = append(seen, check{matched, elapsed})
		mu.Unlock()
	}
	v.Verify(stored, token) // argon2id, matched
	v.Verify(stored, token) // the memo
	v.Verify(stored, other) // argon2id, no match
	sum := sha256.Sum256([]byte(token))
	v.Verify(hex.EncodeToString(sum[:]), token) // SHA-256: not an argon2 check
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || !seen[0].matched || seen[1].matched {
		t.Fatalf("observed %+v, want one matched and one failed argon2 check", seen)
	}
	for _, c := range seen {
		if c.elapsed <= 0 {
			t.Fatalf("observed a check without its duration: %+v", seen)
		}
	}
}
