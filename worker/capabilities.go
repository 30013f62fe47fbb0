package worker

import (
	"runtime"
	"slices"

	"gradient.dev/gradient/wire"
)

// Host is this machine's WorkerCapabilities (workersession.Handler).
func (w *Worker) Host() wire.WorkerCapabilities { return w.hw }

// hostCapabilities is this machine's WorkerCapabilities message (docs/protocol/jobs.md
// §2), fixed for the process; zone and endpoint are absent when empty.
func (w *Worker) hostCapabilities() wire.WorkerCapabilities {
	total, _ := memInfo()
	score := w.cfg.CPUCoreScore
	if score == 0 {
		score = CPUCoreScore()
	}
	c := wire.WorkerCapabilities{
		Architectures:       slices.Clone(w.cfg.Architectures),
		SystemFeatures:      slices.Clone(w.cfg.SystemFeatures),
		MaxConcurrentBuilds: uint32(w.cfg.MaxBuilds),
		CPUCount:            uint32(runtime.NumCPU()),
		RAMTotalMB:          total,
		CPUCoreScore:        score,
	}
	if w.cfg.Zone != "" {
		c.Zone = &w.cfg.Zone
	}
	if w.cfg.Endpoint != "" {
		c.Endpoint = &w.cfg.Endpoint
	}
	return c
}

// Load is the heartbeat's WorkerMetrics (workersession.Handler): the
// transfer speeds stay absent until transfers are measured.
func (w *Worker) Load() *wire.WorkerMetrics {
	_, free := memInfo()
	return &wire.WorkerMetrics{CPUUsagePct: w.cpu.usagePct(), RAMFreeMB: free}
}
