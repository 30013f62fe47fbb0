package scheduler

import (
	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/storage"
)

var _ authority.JobUploads = (*Scheduler)(nil)

// JobProducts implements authority.JobUploads: what a job the session holds
// may upload. A build job (an import from derivation's too) produces its
// derivation's outputs, a flake job's fetch and evaluation produce
// content-addressed sources, locked inputs and .drv files. A derivation
// whose outputs have no path before the build (content-addressed
// derivations) produces self-certifying paths.
func (s *Scheduler) JobProducts(w *authority.LiveWorker, jobID string) (authority.JobProducts, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.jobs.assignment(jobID)
	if a == nil || a.session != w.Session {
		return authority.JobProducts{}, false
	}
	job := a.job
	p := authority.JobProducts{Project: job.ProjectID}
	if job.Kind == storage.JobFlake {
		p.What = "evaluation of " + describe(job)
		p.ContentAddressed = true
		return p, true
	}
	p.What = "build of " + job.DrvPath
	for _, o := range job.Outputs {
		if o.Path != "" {
			p.Outputs = append(p.Outputs, o.Path)
		}
	}
	p.ContentAddressed = len(p.Outputs) == 0
	return p, true
}
