package server

import (
	"gradient.dev/gradient/metrics"
	"gradient.dev/gradient/storage"
)

// binaryCacheMetrics count what the plain HTTP binary cache serves.
type binaryCacheMetrics struct {
	narBytes     metrics.Counter
	narDownloads metrics.Counter
	narinfos     metrics.Counter
	narUploads   metrics.Counter
}

// newBinaryCacheMetrics registers the counters on the server's registry
// (registering again returns the same counters).
func newBinaryCacheMetrics(r *metrics.Registry) *binaryCacheMetrics {
	return &binaryCacheMetrics{
		narBytes:     r.NewCounter("gradient_cache_nar_bytes_sent_total", "Compressed NAR bytes sent by the HTTP binary cache.", "cache"),
		narDownloads: r.NewCounter("gradient_cache_nar_downloads_total", "NAR downloads from the HTTP binary cache.", "cache"),
		narinfos:     r.NewCounter("gradient_cache_narinfo_requests_total", "narinfo requests by result.", "cache", "result"),
		narUploads:   r.NewCounter("gradient_cache_nar_uploads_total", "NAR uploads through the admin API by outcome.", "outcome"),
	}
}

// privateCacheLabel stands for every private cache in the cache label:
// /metrics answers without credentials, and a private cache's name is
// not for everyone to read.
const privateCacheLabel = "private"

// cacheLabel is c's value of the cache label.
func cacheLabel(c storage.Cache) string {
	if !c.Public {
		return privateCacheLabel
	}
	return c.Name
}
