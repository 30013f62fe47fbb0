package secret

import (
	"crypto/sha256"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Verifier is Verify for a server that checks the same tokens again and
// again (every reconnect of every worker). An argon2id check costs tens of
// milliseconds of CPU and ~19 MiB, so a restart storm of a thousand
// workers would need seconds of CPU and gigabytes at once. Verifier runs
// at most a few checks at a time and remembers the (hash, token) pairs
// that matched, so each worker costs one argon2id per process, not per
// connection. Failed checks are never remembered: a wrong token always
// pays the full price.
type Verifier struct {
	slots chan struct{}
	// check is the full check (Verify; tests count its calls).
	check func(stored, token string) bool
	// Observe, when set, is told of every argon2 check the Verifier ran
	// (remembered pairs and legacy SHA-256 hashes cost nothing worth
	// telling): how long it took and whether it matched. The server feeds
	// its metrics from it; set it before the first Verify, it must not
	// block.
	Observe func(elapsed time.Duration, matched bool)

	mu      sync.Mutex
	matched map[[sha256.Size]byte]struct{}
	// running are the checks under way by pair: a worker that gave up
	// waiting and dialed again (or two sessions of one worker) waits for
	// the check it already started instead of paying for a second one.
	running map[[sha256.Size]byte]*runningCheck
}

type runningCheck struct {
	done  chan struct{}
	match bool
}

// verifierMemo bounds the remembered pairs; past it the memo starts over.
const verifierMemo = 100_000

// NewVerifier returns a Verifier running at most concurrency argon2id
// checks at once (0: the number of CPUs).
func NewVerifier(concurrency int) *Verifier {
	if concurrency <= 0 {
		concurrency = runtime.NumCPU()
	}
	return &Verifier{slots: make(chan struct{}, concurrency), check: Verify,
		matched: map[[sha256.Size]byte]struct{}{}, running: map[[sha256.Size]byte]*runningCheck{}}
}

// Verify reports whether token matches stored, as the package's Verify.
func (v *Verifier) Verify(stored, token string) bool {
	// The memo key binds the token to this exact stored hash (and its
	// salt): a rotated token has a new hash and is checked anew. Only a
	// digest of the pair is kept, never the token.
	h := sha256.New()
	h.Write([]byte(stored))
	h.Write([]byte{0})
	h.Write([]byte(token))
	var key [sha256.Size]byte
	h.Sum(key[:0])
	v.mu.Lock()
	if _, ok := v.matched[key]; ok {
		v.mu.Unlock()
		return true
	}
	if r := v.running[key]; r != nil {
		v.mu.Unlock()
		<-r.done
		return r.match
	}
	r := &runningCheck{done: make(chan struct{})}
	v.running[key] = r
	v.mu.Unlock()

	v.slots <- struct{}{}
	start := time.Now()
	r.match = v.check(stored, token)
	elapsed := time.Since(start)
	<-v.slots
	if v.Observe != nil && strings.HasPrefix(stored, "$") {
		v.Observe(elapsed, r.match)
	}

	v.mu.Lock()
	delete(v.running, key)
	if r.match {
		if len(v.matched) >= verifierMemo {
			clear(v.matched)
		}
		v.matched[key] = struct{}{}
	}
	v.mu.Unlock()
	close(r.done)
	return r.match
}
