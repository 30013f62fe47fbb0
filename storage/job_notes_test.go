package storage

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/storage/sqldb"
)

// The job loops' notes: a listener hears its schema's jobs channel, not
// the worker sessions' one nor another schema's; a payload over
// PostgreSQL's limit is refused before it is sent; SQLite has none.
func TestJobNotes(t *testing.T) {
	t.Parallel()
	url := freshPostgresURL(t)
	listener, sender := openTestDB(t, url), openTestDB(t, url)
	got := make(chan string, 4)
	ready := make(chan struct{})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		done <- listener.ListenJobs(ctx, func() { close(ready) }, func(p string) { got <- p })
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("never listening")
	}
	if err := sender.NotifyWorkerSessions(t.Context(), `{"to":"sessions"}`); err != nil {
		t.Fatal(err)
	}
	if err := openTestDB(t, freshPostgresURL(t)).NotifyJobs(t.Context(), `{"from":"other schema"}`); err != nil {
		t.Fatal(err)
	}
	if err := sender.NotifyJobs(t.Context(), strings.Repeat("x", MaxNotePayload+1)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an oversized note: %v", err)
	}
	if err := sender.NotifyJobs(t.Context(), `{"from":"a"}`); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if p != `{"from":"a"}` {
			t.Fatalf("payload %q", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification")
	}
	cancel()
	<-done
	lite := openTestDB(t, freshSQLiteURL(t))
	if err := lite.NotifyJobs(t.Context(), "x"); !errors.Is(err, sqldb.ErrNoNotifications) {
		t.Fatalf("SQLite notify: %v", err)
	}
}
