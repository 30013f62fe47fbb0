package worker

import (
	"time"

	"gradient.dev/gradient/workersession"
)

// Config is a worker's configuration: the build machine's settings and,
// in Session, its session shell's (server URL, worker ID, peers,
// capabilities, listener, timeouts, logger, metrics), with the shell's
// defaults. Zero durations take the defaults of docs/protocol/connection.md
// and docs/protocol/jobs.md §12; tests shorten them.
type Config struct {
	// Session configures the session shell the worker is the handler of.
	// Its Logger and Metrics are the worker's too: Metrics receives the
	// worker's series beside the shell's; nil keeps them in a private
	// registry. Workers sharing one need a label each
	// (prometheus.WrapRegistererWith). Its WorkerID is the persistent ID
	// (see LoadID).
	Session workersession.Config

	MaxBuilds      int // Build slots (1)
	MaxEvals       int // Flake slots (1)
	Architectures  []string
	SystemFeatures []string
	CPUCoreScore   uint32 // 0: measured at start
	Zone, Endpoint string

	// Executor runs accepted jobs. Nil declines every assignment.
	Executor Executor
	// TempDir holds large compressed uploads while they are spooled
	// ("" means os.TempDir()); pulls stream without files.
	TempDir string

	StopReportWait time.Duration // 5 s for the Canceled reports on stop
	// DrainTimeout is the stop's budget (docs/protocol/jobs.md §12.3, the two-stage
	// stop): when Run's ctx ends, each session sends Draining, takes no
	// more jobs and lets its running ones finish and report for up to
	// this long; what still runs then is aborted and reported Canceled.
	// 0 aborts at once (the v33 stop).
	DrainTimeout time.Duration
	// AbortDrain, when closed, ends a drain under way at once (the
	// second signal): the running jobs are aborted as after DrainTimeout.
	AbortDrain <-chan struct{}
}

// setDefaults fills the build machine's settings; the session shell
// fills Session's (workersession.New).
func (c *Config) setDefaults() {
	if c.StopReportWait == 0 {
		c.StopReportWait = 5 * time.Second
	}
	if c.MaxBuilds == 0 {
		c.MaxBuilds = 1
	}
	if c.MaxEvals == 0 {
		c.MaxEvals = 1
	}
	if len(c.Architectures) == 0 {
		c.Architectures = []string{HostSystem()}
	}
	if c.SystemFeatures == nil {
		c.SystemFeatures = []string{}
	}
}
