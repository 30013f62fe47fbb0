package worker

import (
	"context"
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/workersession"
)

// Worker is the build machine: its session shell (workersession) dials
// the server (or is dialed) and keeps one session alive with reconnects;
// the worker is the shell's Handler and runs the jobs it is assigned
// through its Executor.
type Worker struct {
	cfg   Config
	log   *slog.Logger
	slots *slots
	m     *workerMetrics
	cpu   cpuSampler
	hw    wire.WorkerCapabilities
	shell *workersession.Shell
}

// New checks the configuration and reads the peers.
func New(cfg Config) (*Worker, error) {
	cfg.setDefaults()
	if cfg.MaxBuilds < 0 || cfg.MaxEvals < 0 {
		return nil, errors.New("max concurrent builds and evals may not be negative")
	}
	if cfg.Session.Metrics == nil {
		cfg.Session.Metrics = prometheus.NewRegistry() // the shell's and the worker's series
	}
	w := &Worker{
		cfg:   cfg,
		slots: newSlots(cfg.MaxEvals, cfg.MaxBuilds),
	}
	var err error
	if w.shell, err = workersession.New(cfg.Session, w); err != nil {
		return nil, err
	}
	w.log = w.shell.Logger()
	if w.m, err = newWorkerMetrics(cfg.Session.Metrics); err != nil {
		return nil, err
	}
	w.hw = w.hostCapabilities() // measures the core score
	w.cpu.usagePct()            // the first sample is the baseline of the first heartbeat
	return w, nil
}

// ID is the worker's ID.
func (w *Worker) ID() string { return w.shell.ID() }

// Connected reports whether a session with a server is established now.
func (w *Worker) Connected() bool { return w.shell.Connected() }

// Run serves until ctx ends: dials the server URL with reconnects, serves
// the listener for server-dialed sessions, and watches the peers file.
// On ctx's end every session is stopped (Draining, running jobs reported
// Canceled) before Run returns. Only local errors (a listener that cannot
// start) end it early.
func (w *Worker) Run(ctx context.Context) error {
	w.log.Info("worker starting", "server", w.shell.ServerLabel(), "peers", w.shell.Peers(),
		"capabilities", w.shell.Capabilities().Names(), "architectures", w.hw.Architectures)
	return w.shell.Run(ctx)
}

// SetPeers replaces the tokens (peer ID → token) the worker holds
// (workersession.Shell.SetPeers).
func (w *Worker) SetPeers(tokens map[string]string) { w.shell.SetPeers(tokens) }

// capabilityNames is session_loop.go's name for GradientCapabilities.Names.
func capabilityNames(c wire.GradientCapabilities) []string { return c.Names() }
