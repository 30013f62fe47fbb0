package hetzner

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	apiCalls     *prometheus.CounterVec
	apiLatency   *prometheus.HistogramVec
	passDuration prometheus.Histogram
	vms          *prometheus.GaugeVec
	actions      *prometheus.CounterVec
	failedBoots  *prometheus.GaugeVec
	bootBackoff  *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		apiCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_proxy_hetzner_api_calls_total",
			Help: "Hetzner Cloud API requests by operation and outcome (ok, not_found, rate_limited, server_error, client_error, network_error).",
		}, []string{"operation", "outcome"}),
		apiLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gradient_proxy_hetzner_api_call_duration_seconds",
			Help:    "Duration of Hetzner Cloud API requests by operation.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
		}, []string{"operation"}),
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gradient_proxy_hetzner_pass_duration_seconds",
			Help:    "Duration of one reconcile pass over every tenant.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
		vms: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gradient_proxy_hetzner_vms",
			Help: "The tenant's VMs after the last pass by state (booting, connected, draining).",
		}, []string{"tenant", "state"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_proxy_hetzner_vm_actions_total",
			Help: "What reconcile passes did to VMs (booted, scaled_down, failed_boot, lost, drained, leaked_server, missing_server, adopted).",
		}, []string{"action"}),
		failedBoots: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gradient_proxy_hetzner_failed_boots",
			Help: "The tenant's consecutive failed boots of a system (VMs whose worker never connected) after the last pass; a VM of the system that connects resets it.",
		}, []string{"tenant", "system"}),
		bootBackoff: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gradient_proxy_hetzner_boot_backoff_seconds",
			Help: "Seconds until the tenant's next VM of a system may boot after failed boots, as of the last pass (0: it may boot).",
		}, []string{"tenant", "system"}),
	}
	if reg != nil {
		reg.MustRegister(m.apiCalls, m.apiLatency, m.passDuration, m.vms, m.actions, m.failedBoots, m.bootBackoff)
	}
	return m
}
