package retention

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/storage"
)

type metrics struct {
	paths, objects, bytes, logBytes prometheus.Counter
	duration                        *prometheus.HistogramVec
	protected                       *prometheus.GaugeVec
	cacheBytes, cachePaths          *prometheus.GaugeVec

	mu     sync.Mutex
	labels map[string]bool // cache labels set, to drop deleted caches'
}

func newMetrics() *metrics {
	return &metrics{
		paths: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_retention_paths_freed_total", Help: "Cache paths (narinfos) deleted by garbage collection."}),
		objects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_retention_objects_freed_total", Help: "NAR objects deleted by garbage collection."}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_retention_bytes_freed_total", Help: "Compressed NAR bytes deleted by garbage collection."}),
		logBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gradient_retention_log_bytes_freed_total", Help: "Job log bytes of evaluations no longer kept, deleted."}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gradient_retention_run_duration_seconds", Help: "Duration of a garbage collection run.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10)}, []string{"mode", "outcome"}),
		protected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gradient_retention_protected_paths", Help: "Cache paths the last run kept, by the kind of root that reached them first."},
			[]string{"kind"}),
		cacheBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gradient_cache_size_bytes", Help: "Compressed bytes of a cache's paths after the last collection (private caches summed as cache=\"private\")."},
			[]string{"cache"}),
		cachePaths: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gradient_cache_paths", Help: "Paths of a cache after the last collection (private caches summed as cache=\"private\")."},
			[]string{"cache"}),
		labels: map[string]bool{},
	}
}

func (m *metrics) register(r prometheus.Registerer) {
	r.MustRegister(m.paths, m.objects, m.bytes, m.logBytes, m.duration, m.protected, m.cacheBytes, m.cachePaths)
}

func (m *metrics) setSizes(sizes []storage.CacheSize) {
	m.mu.Lock()
	defer m.mu.Unlock()
	bytes, paths := map[string]float64{}, map[string]float64{}
	for _, s := range sizes {
		label := s.Name
		if !s.Public {
			label = "private"
		}
		bytes[label] += float64(s.Bytes)
		paths[label] += float64(s.Paths)
	}
	for label := range m.labels {
		if _, ok := bytes[label]; !ok {
			m.cacheBytes.DeleteLabelValues(label)
			m.cachePaths.DeleteLabelValues(label)
			delete(m.labels, label)
		}
	}
	for label, b := range bytes {
		m.cacheBytes.WithLabelValues(label).Set(b)
		m.cachePaths.WithLabelValues(label).Set(paths[label])
		m.labels[label] = true
	}
}
