package scheduler

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
)

// Notes cross the database: whatever another process wrote on the
// channel is checked before the job loop acts on it.
func TestParseNoteRefusesBadNotes(t *testing.T) {
	id := storage.NewID()
	ids := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = storage.NewID()
		}
		return out
	}
	enc := func(n jobNote) string {
		b, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	bad := map[string]string{
		"not JSON":            `{"from":"a","kind":"jobs","jobs":[`,
		"too large":           `{"from":"a","kind":"reload","reason":"` + strings.Repeat("x", storage.MaxNotePayload) + `"}`,
		"no sender":           enc(jobNote{Kind: noteJobs, Jobs: []string{id}}),
		"long sender":         enc(jobNote{From: strings.Repeat("a", maxNoteInstance+1), Kind: noteReload}),
		"unknown kind":        enc(jobNote{From: "a", Kind: "delete"}),
		"no jobs":             enc(jobNote{From: "a", Kind: noteJobs}),
		"too many jobs":       enc(jobNote{From: "a", Kind: noteJobs, Jobs: ids(maxNoteJobs + 1)}),
		"job ID not a UUID":   enc(jobNote{From: "a", Kind: noteJobs, Jobs: []string{id, "'; DROP TABLE jobs"}}),
		"reload with jobs":    enc(jobNote{From: "a", Kind: noteReload, Jobs: []string{id}}),
		"abort without IDs":   enc(jobNote{From: "a", Kind: kindAbort}),
		"abort bad ID":        enc(jobNote{From: "a", Kind: kindAbort, Aborts: []noteAbort{{Job: id, Assignment: "x"}}}),
		"abort long reason":   enc(jobNote{From: "a", Kind: kindAbort, Aborts: []noteAbort{{Job: id, Assignment: id}}, Reason: strings.Repeat("r", maxNoteReason+1)}),
		"abort too many":      enc(jobNote{From: "a", Kind: kindAbort, Aborts: make([]noteAbort, maxNoteAborts+1)}),
		"abort invalid UTF-8": `{"from":"a","kind":"abort","aborts":[{"j":"` + id + `","a":"` + id + `"}],"reason":"\xff"}`,
	}
	for what, payload := range bad {
		if _, err := parseNote(payload); err == nil {
			t.Errorf("%s: accepted", what)
		}
	}
	// The largest notes the sender makes fit PostgreSQL's limit.
	full := make([]noteAbort, maxNoteAborts)
	for i := range full {
		full[i] = noteAbort{Job: storage.NewID(), Assignment: storage.NewID()}
	}
	for _, n := range []jobNote{
		{From: strings.Repeat("a", maxNoteInstance), Kind: noteJobs, Jobs: ids(maxNoteJobs)},
		{From: strings.Repeat("a", maxNoteInstance), Kind: kindAbort, Aborts: full, Reason: strings.Repeat("r", maxNoteReason)},
	} {
		p := enc(n)
		if len(p) > storage.MaxNotePayload {
			t.Errorf("a full %s note is %d bytes, over the limit", n.Kind, len(p))
		}
		if _, err := parseNote(p); err != nil {
			t.Errorf("a full %s note refused: %v", n.Kind, err)
		}
	}
	// IDs come out canonical.
	n, err := parseNote(enc(jobNote{From: "a", Kind: noteJobs, Jobs: []string{strings.ToUpper(id)}}))
	if err != nil || n.Jobs[0] != id {
		t.Errorf("note %+v, %v; want the canonical ID %s", n, err, id)
	}
}

// What the listener hands over is bounded: a bad note is dropped and
// counted, and past maxInbox job IDs the inbox becomes one full reload.
func TestNotesInboxIsBounded(t *testing.T) {
	db, err := storage.Open(t.Context(), storagetest.SQLiteURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := New(db, Config{InstanceID: "me"})
	s.receiveNote(`{"from":"other","kind":"jobs","jobs":["not a UUID"]}`)
	s.receiveNote(`{"from":"me","kind":"jobs","jobs":["` + storage.NewID() + `"]}`) // own: ignored
	if got := testutil.ToFloat64(s.m.notes.WithLabelValues("dropped")); got != 1 {
		t.Errorf("dropped %v notes, want 1", got)
	}
	if got := testutil.ToFloat64(s.m.notes.WithLabelValues("received")); got != 0 {
		t.Errorf("received %v notes, want 0", got)
	}
	note := func() string {
		ids := make([]string, maxNoteJobs)
		for i := range ids {
			ids[i] = storage.NewID()
		}
		b, _ := json.Marshal(jobNote{From: "other", Kind: noteJobs, Jobs: ids})
		return string(b)
	}
	for range maxInbox / maxNoteJobs {
		s.receiveNote(note())
	}
	s.notes.mu.Lock()
	held, reload := len(s.notes.in), s.notes.inReload
	s.notes.mu.Unlock()
	if held == 0 || held > maxInbox || reload {
		t.Fatalf("inbox holds %d IDs, reload %v: want them held below the bound", held, reload)
	}
	s.receiveNote(note())
	s.receiveNote(note())
	s.notes.mu.Lock()
	held, reload = len(s.notes.in), s.notes.inReload
	s.notes.mu.Unlock()
	if held != 0 || !reload {
		t.Fatalf("inbox holds %d IDs, reload %v: want one reload instead", held, reload)
	}
}
