package main

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// The first signal ends the run context (drain), only the second closes
// abort (abort the drain).
func TestTwoStageStopOnSignals(t *testing.T) {
	signals := make(chan os.Signal, 2)
	ctx, abort := onSignals(signals)
	signals <- syscall.SIGTERM
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the first signal did not end the run")
	}
	select {
	case <-abort:
		t.Fatal("the first signal aborted the drain")
	default:
	}
	signals <- os.Interrupt
	select {
	case <-abort:
	case <-time.After(10 * time.Second):
		t.Fatal("the second signal did not abort the drain")
	}
}
