// Package gctune sets the garbage collector of the server processes.
//
// Every worker that connects costs an argon2id token check, and each check
// allocates 19 MiB (OWASP's minimum memory). With Go's default GOGC=100
// and the live heap of a server holding a thousand sessions, a restart
// storm of 1,000 reconnecting workers spent much of its time collecting
// garbage: 34.9 s, against 28.9–32.7 s with these settings
// (docs/PERFORMANCE.md). A soft memory limit keeps the larger heap target
// bounded: a quarter of the machine's memory, at most 2 GiB, so a small
// machine that also runs the database is not pushed into swap.
package gctune

import "runtime/debug"

const (
	// GCPercent is the GOGC the servers run with unless GOGC is set.
	GCPercent = 400
	// MaxMemoryLimit caps the soft limit they run with unless GOMEMLIMIT
	// is set (a quarter of physical memory otherwise): past it the
	// collector works harder, whatever GOGC says.
	MaxMemoryLimit = 2 << 30
)

// memoryLimit is the soft limit for a machine with physical bytes of
// memory (0: unknown, no change).
func memoryLimit(physical int64) int64 {
	return min(physical/4, MaxMemoryLimit)
}

// Apply sets GCPercent and the memory limit unless the operator set GOGC
// or GOMEMLIMIT (read through getenv), and returns a function that puts
// back what was there before. Where the machine's memory is unknown it
// changes nothing: a larger GC target without a limit could exhaust it.
func Apply(getenv func(string) string) (restore func()) {
	bound := memoryLimit(physicalMemory())
	if bound <= 0 || getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	percent := debug.SetGCPercent(GCPercent)
	limit := debug.SetMemoryLimit(bound)
	return func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	}
}
