package nixexec

import (
	"sync"
	"time"

	"gradient.dev/gradient/wire"
)

// buildProgress reports one phase of a build's transfers (docs/protocol/jobs.md §9.2):
// at most one BuildProgress a second while the counts change, and the
// final counts at the end of the phase.
type buildProgress struct {
	j       *job
	buildID string
	phase   wire.BuildProgressPhase
	total   *uint32 // paths in the phase, when known

	mu   sync.Mutex
	last time.Time
}

// progressInterval is the least time between two reports of a phase.
const progressInterval = time.Second

func (j *job) progress(buildID string, phase wire.BuildProgressPhase, totalPaths int) *buildProgress {
	p := &buildProgress{j: j, buildID: buildID, phase: phase}
	if totalPaths > 0 {
		total := uint32(totalPaths)
		p.total = &total
	}
	return p
}

// update reports paths and bytes done so far, unless one went out less
// than a second ago; final always reports.
func (p *buildProgress) update(paths int, bytes int64, final bool) {
	if p == nil || p.buildID == "" {
		return
	}
	p.mu.Lock()
	now := time.Now()
	if !final && now.Sub(p.last) < progressInterval {
		p.mu.Unlock()
		return
	}
	p.last = now
	p.mu.Unlock()
	p.j.r.BuildProgress(wire.BuildProgress{BuildID: p.buildID, Phase: p.phase,
		BytesDone: uint64(max(bytes, 0)), PathsDone: uint32(paths), PathsTotal: p.total})
}
