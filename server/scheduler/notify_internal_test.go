package scheduler

import (
	"encoding/json"
	"strings"
	"testing"

	"gradient.dev/gradient/storage"
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
