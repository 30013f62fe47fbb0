package scheduler

import (
	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/wire"
)

// Offers (docs/protocol/jobs.md §3): new pending jobs are announced to every session
// that may run them, once per session, so workers score them before they
// ask. Idle workers do not wait for offers: they were served already.
// A session holds at most offerWindow offered jobs at a time (the oldest
// first): enough to choose from, without sending every worker the whole
// queue when a large evaluation becomes runnable.

const offerWindow = 256

// offer offers each session those of the pending jobs ids (every pending
// job when all is set) it may run and was not offered yet. The full pass
// also forgets the offered marks of jobs no longer pending. Takes s.mu,
// and under it each session's lock (newEligibility); sends after it.
func (s *Scheduler) offer(ids []string, all bool) {
	if len(ids) == 0 && !all {
		return
	}
	if !all {
		s.fillRequiredPaths(ids) // a full pass follows a reload, which reads them
	}
	type offer struct {
		w          *authority.LiveWorker
		candidates []wire.JobCandidate
	}
	var offers []offer
	s.mu.Lock()
	var jobs []*storage.PendingJob
	for _, id := range ids {
		if j := s.jobs.queue.get(id); j != nil {
			jobs = append(jobs, j)
		}
	}
	for _, ws := range s.sessions {
		if ws.ended {
			continue
		}
		if all {
			for id := range ws.offered {
				if s.jobs.queue.get(id) == nil {
					delete(ws.offered, id)
				}
			}
		}
		room := offerWindow - len(ws.offered)
		if room <= 0 {
			continue
		}
		e := newEligibility(ws.w)
		var candidates []wire.JobCandidate
		consider := func(job *storage.PendingJob) bool {
			if !ws.offered[job.JobID] {
				ws.offered[job.JobID] = true
				candidates = append(candidates, candidate(job))
			}
			return len(candidates) < room
		}
		if all {
			s.jobs.queue.each(e.mayAny, consider)
		} else {
			for _, job := range jobs {
				if e.mayAny(job) && !consider(job) {
					break
				}
			}
		}
		if len(candidates) > 0 {
			offers = append(offers, offer{ws.w, candidates})
		}
	}
	s.mu.Unlock()
	for _, o := range offers {
		for _, page := range wire.CandidatePages(o.candidates) {
			if err := o.w.Send(&wire.JobOffer{Candidates: page}); err != nil {
				break
			}
		}
	}
}

// fillRequiredPaths reads the required paths of those of the build jobs
// ids still queued that have none yet. Jobs join the queue without them,
// so an idle worker's assignment does not wait for the query; offers,
// which carry them, do (and a reload reads those of jobs new to it).
func (s *Scheduler) fillRequiredPaths(ids []string) {
	s.mu.Lock()
	var jobs []storage.PendingJob
	for _, id := range ids {
		if j := s.jobs.queue.get(id); j != nil && j.Kind == storage.JobBuild && j.RequiredPaths == nil {
			jobs = append(jobs, storage.PendingJob{JobID: j.JobID, Kind: j.Kind, BuildID: j.BuildID, ProjectID: j.ProjectID})
		}
	}
	s.mu.Unlock()
	if len(jobs) == 0 {
		return
	}
	if err := s.queue.FillRequiredPaths(s.ctx, jobs); err != nil {
		s.log.Warn("reading the inputs of ready builds failed; they are offered without", "error", err)
		return
	}
	s.mu.Lock()
	for _, read := range jobs {
		if j := s.jobs.queue.get(read.JobID); j != nil {
			j.RequiredPaths = read.RequiredPaths
		}
	}
	s.mu.Unlock()
}

// reoffer clears a job's offered marks, so a job back in the queue
// (declined, lost, retried) is offered again.
func (s *Scheduler) reoffer(jobIDs []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ws := range s.sessions {
		for _, id := range jobIDs {
			delete(ws.offered, id)
		}
	}
}
