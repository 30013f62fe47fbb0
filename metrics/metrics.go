// Package metrics is what the binaries share for Prometheus: a registry
// that also holds the Go runtime and process collectors. The libraries
// (server, scheduler, worker) take a prometheus.Registerer for their own
// series and never register runtime collectors, so several of them can
// live in one process (gradient up) without registering those twice.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// NewRegistry returns a registry holding the Go runtime (go_*) and
// process (process_*) collectors, for a binary's /metrics.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return r
}
