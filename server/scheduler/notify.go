package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/sqldb"
)

// Notes between the job loops of the server instances sharing one
// PostgreSQL database (README "Several instances"). Each instance's queue
// is a copy of the database's pending jobs, re-read every pass; between
// passes an instance learns of work another one made pending from its
// notes, so an idle worker connected to any instance gets a job that
// became ready anywhere at once:
//
//   - jobs: the IDs of jobs the sender made pending (an evaluation queued
//     or approved, builds readied by a completion, streamed or restarted,
//     a job re-queued after a failure, a decline or a lost session) and
//     still holds queued after serving its own idle workers. The receiver
//     reads those it does not know (PendingJobsByID) and serves its idle
//     workers.
//   - reload: read the whole queue again (the sender had too many IDs for
//     notes).
//   - abort: assignments the sender closed in the database (a cancelled
//     evaluation, a failed evaluation's builds) that no session of its own
//     holds: whichever instance holds one sends its worker AbortJob.
//
// Notes are batched per noteWindow and split to stay under PostgreSQL's
// 8000-byte payload limit. They cross the database: every note is checked
// (size, kind, sender, bounded counts, UUIDs) and a bad one is dropped
// and logged at Debug. What arrives waits in a bounded inbox; past the
// bound its job IDs coalesce into one full reload. After a lost LISTEN
// connection the instance listens again and reloads in full (notes may
// have been missed). The periodic pass stays the safety net for anything
// a note did not carry. SQLite (one process) and a job loop without an
// instance ID send and hear nothing.

const (
	noteJobs   = "jobs"
	noteReload = "reload"
	kindAbort  = "abort"

	// noteWindow gathers what a burst of readying makes pending into
	// few notes.
	noteWindow = 2 * time.Millisecond
	// maxNoteJobs and maxNoteAborts keep a note under PostgreSQL's
	// payload limit (a job ID is 39 bytes in the note, an abort 88).
	maxNoteJobs   = 180
	maxNoteAborts = 80
	// reloadAbove: a window with more job IDs than this sends one
	// reload note instead (the receivers read the queue once).
	reloadAbove = 20 * maxNoteJobs
	// maxInbox bounds the job IDs received and not yet read; beyond it
	// they coalesce into one reload. maxInboxAborts bounds the aborts.
	maxInbox       = 50_000
	maxInboxAborts = 10_000
	// maxNoteInstance and maxNoteReason bound a note's sender and
	// reason.
	maxNoteInstance = 128
	maxNoteReason   = 256
)

// jobNote is one note. It crosses the database: checked by parseNote.
type jobNote struct {
	From   string      `json:"from"`
	Kind   string      `json:"kind"`
	Jobs   []string    `json:"jobs,omitempty"`
	Aborts []noteAbort `json:"aborts,omitempty"`
	Reason string      `json:"reason,omitempty"`
}

type noteAbort struct {
	Job        string `json:"j"`
	Assignment string `json:"a"`
}

// notes is the scheduler's end of the notes: what waits to be sent and
// what was received and waits to be read.
type notes struct {
	wg sync.WaitGroup
	// listening closes once the first LISTEN is in place (tests).
	listening chan struct{}
	readyOnce sync.Once
	// reloads counts the full reads notes caused, once done (tests).
	reloads atomic.Int64
	// alone: the last pass found this instance the only live one, so
	// nobody would hear a note (see checkAlone).
	alone atomic.Bool

	mu        sync.Mutex
	out       []string
	outAborts map[string][]noteAbort // by reason
	outReload bool
	in        []string
	inSet     map[string]struct{}
	inAborts  map[string][]noteAbort // by reason
	inCount   int                    // aborts in inAborts
	inReload  bool
	sendWake  chan struct{}
	recvWake  chan struct{}
}

// notesOn reports whether this job loop talks to other instances.
func (s *Scheduler) notesOn() bool {
	return s.cfg.InstanceID != "" && s.db.Engine() == storage.EnginePostgres
}

// othersLive reports whether notes may have a listener: notes are on and
// the last pass did not find this instance alone.
func (s *Scheduler) othersLive() bool {
	return s.notesOn() && !s.notes.alone.Load()
}

// checkAlone runs on each pass: while this instance's row is the only
// live one, it sends no notes and claims with the single instance's
// tries. An instance that starts meanwhile reads the whole queue at its
// start and again at each of its passes, so it misses at most the notes
// of this instance's one pass. Without its own row (a job loop whose
// instance is not registered) it keeps telling, as it cannot know.
func (s *Scheduler) checkAlone(ctx context.Context) {
	if !s.notesOn() {
		return
	}
	live, err := s.db.LiveInstances(ctx)
	if err != nil {
		s.notes.alone.Store(false)
		return
	}
	self := slices.ContainsFunc(live, func(in storage.ServerInstance) bool { return in.ID == s.cfg.InstanceID })
	s.notes.alone.Store(self && len(live) == 1)
}

// startNotes starts sending and hearing notes (PostgreSQL with an
// instance ID only). Called by Start.
func (s *Scheduler) startNotes() {
	if !s.notesOn() {
		return
	}
	n := &s.notes
	n.wg.Add(3)
	go func() { defer n.wg.Done(); s.sendNotes() }()
	go func() { defer n.wg.Done(); s.listenNotes() }()
	go func() { defer n.wg.Done(); s.readNotes() }()
}

// announce has the other instances told about jobs this scheduler made
// pending (those it still holds queued when the window closes).
func (s *Scheduler) announce(ids []string) {
	if len(ids) == 0 || !s.othersLive() {
		return
	}
	n := &s.notes
	n.mu.Lock()
	if !n.outReload {
		if len(n.out)+len(ids) > reloadAbove {
			n.out, n.outReload = nil, true
		} else {
			n.out = append(n.out, ids...)
		}
	}
	n.mu.Unlock()
	wake(n.sendWake)
}

// announceAborts has the instance holding each of open send its worker
// AbortJob with reason.
func (s *Scheduler) announceAborts(open []storage.OpenAssignment, reason string) {
	if len(open) == 0 || !s.othersLive() {
		return
	}
	n := &s.notes
	n.mu.Lock()
	if n.outAborts == nil {
		n.outAborts = map[string][]noteAbort{}
	}
	for _, o := range open {
		if o.InstanceID == s.cfg.InstanceID {
			continue // this instance's own, and no session holds it
		}
		n.outAborts[reason] = append(n.outAborts[reason], noteAbort{Job: o.JobID, Assignment: o.AssignmentID})
	}
	n.mu.Unlock()
	wake(n.sendWake)
}

func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// sendNotes sends what waits, one window after the first of it.
func (s *Scheduler) sendNotes() {
	n := &s.notes
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-n.sendWake:
		}
		t := time.NewTimer(noteWindow)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		n.mu.Lock()
		ids, aborts, reload := n.out, n.outAborts, n.outReload
		n.out, n.outAborts, n.outReload = nil, nil, false
		n.mu.Unlock()
		s.sendBatch(ids, aborts, reload)
	}
}

func (s *Scheduler) sendBatch(ids []string, aborts map[string][]noteAbort, reload bool) {
	if !reload && len(ids) > 0 {
		// Those this instance's workers took meanwhile need no one else.
		s.mu.Lock()
		ids = slices.DeleteFunc(ids, func(id string) bool { return s.jobs.queue.get(id) == nil })
		s.mu.Unlock()
	}
	if reload {
		s.sendNote(jobNote{Kind: noteReload})
	}
	for len(ids) > 0 && !reload {
		k := min(len(ids), maxNoteJobs)
		s.sendNote(jobNote{Kind: noteJobs, Jobs: ids[:k]})
		ids = ids[k:]
	}
	for reason, list := range aborts {
		for len(list) > 0 {
			k := min(len(list), maxNoteAborts)
			s.sendNote(jobNote{Kind: kindAbort, Aborts: list[:k], Reason: reason})
			list = list[k:]
		}
	}
}

func (s *Scheduler) sendNote(note jobNote) {
	note.From = s.cfg.InstanceID
	if len(note.Reason) > maxNoteReason {
		note.Reason = strings.ToValidUTF8(note.Reason[:maxNoteReason], "")
	}
	b, err := json.Marshal(note)
	if err == nil {
		err = s.db.NotifyJobs(s.ctx, string(b))
	}
	if err != nil {
		if s.ctx.Err() == nil {
			s.log.Warn("telling the other instances about work failed; their next pass finds it", "kind", note.Kind, "error", err)
		}
		return
	}
	s.m.notes.WithLabelValues("sent").Inc()
}

// listenNotes hears the other instances' notes until the scheduler
// closes, listening again after a lost connection.
func (s *Scheduler) listenNotes() {
	n := &s.notes
	backoff := 100 * time.Millisecond
	for {
		err := s.db.ListenJobs(s.ctx, func() {
			n.readyOnce.Do(func() { close(n.listening) })
			backoff = 100 * time.Millisecond
			// Notes sent while nobody listened are lost: read the whole
			// queue once the LISTEN is in place (the first time too:
			// Start's read came before it).
			s.receiveReload()
		}, s.receiveNote)
		if s.ctx.Err() != nil {
			return
		}
		s.log.Warn("listening for other instances' work failed; listening again", "error", err, "in", backoff)
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// receiveNote takes one note off the listening connection; it must not
// block.
func (s *Scheduler) receiveNote(payload string) {
	note, err := parseNote(payload)
	if err != nil {
		s.m.notes.WithLabelValues("dropped").Inc()
		s.log.Debug("a bad note from another instance was dropped", "error", err)
		return
	}
	if note.From == s.cfg.InstanceID {
		return // our own
	}
	s.m.notes.WithLabelValues("received").Inc()
	n := &s.notes
	n.mu.Lock()
	switch note.Kind {
	case noteReload:
		n.in, n.inSet, n.inReload = nil, nil, true
	case noteJobs:
		if n.inReload {
			break
		}
		if n.inSet == nil {
			n.inSet = map[string]struct{}{}
		}
		for _, id := range note.Jobs {
			if _, dup := n.inSet[id]; !dup {
				n.inSet[id] = struct{}{}
				n.in = append(n.in, id)
			}
		}
		if len(n.in) > maxInbox {
			n.in, n.inSet, n.inReload = nil, nil, true
			s.log.Debug("too many noted jobs waiting: the queue is read again instead")
		}
	case kindAbort:
		if n.inCount+len(note.Aborts) > maxInboxAborts {
			n.mu.Unlock()
			s.m.notes.WithLabelValues("dropped").Inc()
			s.log.Warn("too many aborts from other instances waiting: one note is dropped (its workers' reports are refused)", "from", note.From)
			return
		}
		if n.inAborts == nil {
			n.inAborts = map[string][]noteAbort{}
		}
		n.inAborts[note.Reason] = append(n.inAborts[note.Reason], note.Aborts...)
		n.inCount += len(note.Aborts)
	}
	n.mu.Unlock()
	wake(n.recvWake)
}

// receiveReload asks for a full read of the queue.
func (s *Scheduler) receiveReload() {
	n := &s.notes
	n.mu.Lock()
	n.in, n.inSet, n.inReload = nil, nil, true
	n.mu.Unlock()
	wake(n.recvWake)
}

// parseNote checks a note from the database.
func parseNote(payload string) (jobNote, error) {
	var note jobNote
	if len(payload) > storage.MaxNotePayload {
		return note, errors.New("note too large")
	}
	if err := json.Unmarshal([]byte(payload), &note); err != nil {
		return note, err
	}
	if note.From == "" || len(note.From) > maxNoteInstance || !utf8.ValidString(note.From) {
		return note, errors.New("note without a valid sender")
	}
	switch note.Kind {
	case noteReload:
		if len(note.Jobs) > 0 || len(note.Aborts) > 0 {
			return note, errors.New("reload note with a payload")
		}
	case noteJobs:
		if len(note.Jobs) == 0 || len(note.Jobs) > maxNoteJobs || len(note.Aborts) > 0 {
			return note, errors.New("jobs note with a bad count")
		}
		for i, id := range note.Jobs {
			c, err := sqldb.CanonicalUUID("job ID", id)
			if err != nil {
				return note, err
			}
			note.Jobs[i] = c
		}
	case kindAbort:
		if len(note.Aborts) == 0 || len(note.Aborts) > maxNoteAborts || len(note.Jobs) > 0 {
			return note, errors.New("abort note with a bad count")
		}
		if len(note.Reason) > maxNoteReason || !utf8.ValidString(note.Reason) {
			return note, errors.New("abort note with a bad reason")
		}
		for i, a := range note.Aborts {
			j, err := sqldb.CanonicalUUID("job ID", a.Job)
			if err != nil {
				return note, err
			}
			as, err := sqldb.CanonicalUUID("assignment ID", a.Assignment)
			if err != nil {
				return note, err
			}
			note.Aborts[i] = noteAbort{Job: j, Assignment: as}
		}
	default:
		return note, errors.New("note of an unknown kind")
	}
	return note, nil
}

// readNotes acts on what was received: aborts, then a full reload or the
// noted jobs, each followed by serving the idle workers.
func (s *Scheduler) readNotes() {
	n := &s.notes
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-n.recvWake:
		}
		n.mu.Lock()
		ids, aborts, reload := n.in, n.inAborts, n.inReload
		n.in, n.inSet, n.inAborts, n.inCount, n.inReload = nil, nil, nil, 0, false
		n.mu.Unlock()
		for reason, list := range aborts {
			open := make([]storage.OpenAssignment, len(list))
			for i, a := range list {
				open[i] = storage.OpenAssignment{JobID: a.Job, AssignmentID: a.Assignment}
			}
			if told, _ := s.abortHeld(open, reason); told > 0 {
				s.log.Info("aborted jobs another instance closed", "jobs", told, "reason", reason)
			}
		}
		if reload {
			// Every pending job this scheduler does not know, read as
			// other instances' (the periodic pass drops those gone).
			s.m.noteReloads.Inc()
			ids, err := s.queue.PendingJobIDs(s.ctx)
			if err != nil {
				if s.ctx.Err() == nil {
					s.log.Warn("reading the job queue failed; the next pass does", "error", err)
				}
				continue
			}
			s.queueNoted(s.ctx, ids)
			n.reloads.Add(1)
			continue
		}
		s.queueNoted(s.ctx, ids)
	}
}

// queueNoted reads the noted jobs this scheduler does not know yet into
// its queue and serves its idle workers.
func (s *Scheduler) queueNoted(ctx context.Context, ids []string) {
	s.mu.Lock()
	ids = slices.DeleteFunc(ids, s.jobs.known)
	s.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	jobs, err := s.queue.PendingJobsByID(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("reading jobs another instance readied failed; the next pass picks them up", "error", err)
		}
		return
	}
	var added []string
	s.mu.Lock()
	for i := range jobs {
		if s.jobs.enqueueForeign(&jobs[i]) {
			added = append(added, jobs[i].JobID)
		}
	}
	s.m.pending.Set(float64(s.jobs.queue.len()))
	s.mu.Unlock()
	s.dispatch(added)
}

// announceEvaluation announces the queued flake job of an evaluation this
// scheduler just queued or approved (its reload read it in).
func (s *Scheduler) announceEvaluation(evalID string) {
	if !s.notesOn() {
		return
	}
	var ids []string
	s.mu.Lock()
	for _, g := range s.jobs.queue.order {
		if g.key.kind != storage.JobFlake {
			continue
		}
		for _, e := range g.jobs {
			if !e.dead && e.job.EvaluationID == evalID {
				ids = append(ids, e.job.JobID)
			}
		}
	}
	s.mu.Unlock()
	s.announce(ids)
}

// raceTries is claimTries with other instances: their claims make a lost
// race a common outcome (a job this instance has queued that another
// claimed since), and a worker left idle after its tries waits for the
// next dispatch.
const raceTries = 16

func (s *Scheduler) claimTries() int {
	if s.othersLive() {
		return raceTries
	}
	return claimTries
}
