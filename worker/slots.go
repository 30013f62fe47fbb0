package worker

import (
	"sync"

	"gradient.dev/gradient/wire"
)

// slots counts the running jobs per kind against the configured limits
// (docs/protocol/jobs.md §5.1). They are the worker's, not a session's: a job of a lost
// session holds its slot until its executor has returned.
type slots struct {
	mu   sync.Mutex
	max  map[wire.JobKind]int
	used map[wire.JobKind]int
}

func newSlots(maxFlake, maxBuild int) *slots {
	return &slots{
		max:  map[wire.JobKind]int{wire.JobKindFlake: maxFlake, wire.JobKindBuild: maxBuild},
		used: map[wire.JobKind]int{},
	}
}

// take claims a slot of kind; when none is free it returns the fill for
// the decline reason.
func (s *slots) take(kind wire.JobKind) (ok bool, used, max int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used[kind] >= s.max[kind] {
		return false, s.used[kind], s.max[kind]
	}
	s.used[kind]++
	return true, s.used[kind], s.max[kind]
}

func (s *slots) release(kind wire.JobKind) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used[kind]--
}

func (s *slots) free(kind wire.JobKind) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used[kind] < s.max[kind]
}

// jobKinds are the slot kinds in the order the session start requests them.
var jobKinds = []wire.JobKind{wire.JobKindFlake, wire.JobKindBuild}

// kindEnabled reports whether negotiated capabilities allow jobs of kind.
func kindEnabled(c wire.GradientCapabilities, kind wire.JobKind) bool {
	if kind == wire.JobKindBuild {
		return c.Build
	}
	return c.Fetch || c.Eval
}
