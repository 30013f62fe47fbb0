package upstream

import (
	"math"
	"slices"

	"gradient.dev/gradient/wire"
)

// Member is one of a tenant's downstream workers as the proxy knows it.
type Member struct {
	// Capabilities are those negotiated with the proxy.
	Capabilities wire.GradientCapabilities
	// Host is the worker's latest WorkerCapabilities; nil until it sent
	// one (a worker that may not build never does).
	Host *wire.WorkerCapabilities
	// Metrics is the worker's latest heartbeat; nil until one came.
	Metrics *wire.WorkerMetrics
	// Draining workers take no new jobs and are left out of the
	// aggregate.
	Draining bool
}

// Pool is the proxy's downstream workers by tenant: the connected ones
// only. The downstream leg (proxy/downstream) implements it.
type Pool interface {
	Members(tenantID string) []Member
}

// Hardware is what the proxy reports upstream for one tenant's pool.
type Hardware struct {
	// Capabilities are the members' OR'd; the upstream session still
	// offers the fixed set of GRADIENT_PROXY_UPSTREAM_CAPABILITIES.
	Capabilities wire.GradientCapabilities
	Host         wire.WorkerCapabilities
	Metrics      wire.WorkerMetrics
	// Workers is how many members were counted.
	Workers int
}

// Aggregate combines a tenant's non-draining downstream workers into one
// worker (docs/protocol/federation.md): capabilities OR'd, architectures and system
// features unioned (sorted, so the result does not depend on the order
// of members), build slots, CPUs and RAM summed and saturating at their
// wire type's maximum, the fastest core score. The heartbeat's free RAM
// is summed the same way and its CPU usage is the members' weighted by
// their CPU counts (a usage outside 0..100, or NaN, left out). Zone, endpoint and the measured speeds belong to one
// machine and stay absent.
func Aggregate(members []Member) Hardware {
	h := Hardware{Host: wire.WorkerCapabilities{Architectures: []string{}, SystemFeatures: []string{}}}
	var usageWeighted float64
	var usageCPUs uint64
	for _, m := range members {
		if m.Draining {
			continue
		}
		h.Workers++
		c := &h.Capabilities
		c.Fetch = c.Fetch || m.Capabilities.Fetch
		c.Eval = c.Eval || m.Capabilities.Eval
		c.Build = c.Build || m.Capabilities.Build
		c.Federate = c.Federate || m.Capabilities.Federate
		cpus := uint32(0)
		if host := m.Host; host != nil {
			cpus = host.CPUCount
			h.Host.Architectures = union(h.Host.Architectures, host.Architectures)
			h.Host.SystemFeatures = union(h.Host.SystemFeatures, host.SystemFeatures)
			h.Host.MaxConcurrentBuilds = addSaturating(h.Host.MaxConcurrentBuilds, host.MaxConcurrentBuilds, math.MaxUint32)
			h.Host.CPUCount = addSaturating(h.Host.CPUCount, host.CPUCount, math.MaxUint32)
			h.Host.RAMTotalMB = addSaturating(h.Host.RAMTotalMB, host.RAMTotalMB, math.MaxUint64)
			h.Host.CPUCoreScore = max(h.Host.CPUCoreScore, host.CPUCoreScore)
		}
		if m.Metrics != nil {
			h.Metrics.RAMFreeMB = addSaturating(h.Metrics.RAMFreeMB, m.Metrics.RAMFreeMB, math.MaxUint64)
			// A usage that is no percentage (NaN, out of range) is a
			// worker's bad figure: left out, not passed on.
			if usage := float64(m.Metrics.CPUUsagePct); usage >= 0 && usage <= 100 {
				weight := uint64(max(cpus, 1)) // a worker without a host message counts as one CPU
				usageWeighted += usage * float64(weight)
				usageCPUs += weight
			}
		}
	}
	if usageCPUs > 0 {
		h.Metrics.CPUUsagePct = float32(usageWeighted / float64(usageCPUs))
	}
	return h
}

// union adds the values of add missing from set and keeps it sorted.
func union(set, add []string) []string {
	for _, v := range add {
		if i, found := slices.BinarySearch(set, v); !found {
			set = slices.Insert(set, i, v)
		}
	}
	return set
}

// addSaturating is a+b, or limit when the sum would pass it.
func addSaturating[N uint32 | uint64](a, b, limit N) N {
	if b > limit-a {
		return limit
	}
	return a + b
}
