// Package testlog gives tests a logger whose output is kept in memory,
// safe for many goroutines, and printed when the test fails.
package testlog

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
)

// Buffer collects log output from many goroutines.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// New is a debug-level text logger into a Buffer, printed under name
// when tb fails.
func New(tb testing.TB, name string) (*slog.Logger, *Buffer) {
	buf := &Buffer{}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("%s log:\n%s", name, buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}
