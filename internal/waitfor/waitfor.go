// Package waitfor polls a condition with a deadline, for tests: no test
// asserts a time, it waits for what it expects to happen.
package waitfor

import (
	"testing"
	"time"
)

// Deadline is how long True waits.
const Deadline = 10 * time.Second

// True polls cond until it holds, failing t after Deadline.
func True(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Within(t, Deadline, what, cond)
}

// Within polls cond until it holds, failing t after limit.
func Within(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
