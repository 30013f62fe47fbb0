package cache

import (
	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/storage"
)

// binaryCacheMetrics count what the plain HTTP binary cache serves.
type binaryCacheMetrics struct {
	narBytes     *prometheus.CounterVec
	narDownloads *prometheus.CounterVec
	narSeconds   *prometheus.HistogramVec
	narSizes     *prometheus.HistogramVec
	narinfos     *prometheus.CounterVec
	narUploads   *prometheus.CounterVec
	// Presigned transfers (S3-backed store).
	narRedirects     *prometheus.CounterVec
	presignedGrants  *prometheus.CounterVec
	presignedCommits *prometheus.CounterVec
	verifySeconds    prometheus.Histogram
}

// narSecondsBuckets span a small NAR over loopback to a large one over a
// slow link.
var narSecondsBuckets = []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900}

// narSizeBuckets span 1 KiB to 4 GiB in steps of four.
var narSizeBuckets = prometheus.ExponentialBuckets(1<<10, 4, 12)

func newBinaryCacheMetrics() *binaryCacheMetrics {
	return &binaryCacheMetrics{
		narBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_cache_nar_bytes_sent_total", Help: "Compressed NAR bytes sent by the HTTP binary cache.",
		}, []string{"cache"}),
		narDownloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_cache_nar_downloads_total", Help: "NAR downloads from the HTTP binary cache.",
		}, []string{"cache"}),
		narSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gradient_cache_nar_download_duration_seconds", Help: "Time to send one NAR download of the HTTP binary cache, whole or not.",
			Buckets: narSecondsBuckets,
		}, []string{"cache"}),
		narSizes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gradient_cache_nar_download_size_bytes", Help: "Compressed bytes sent by one NAR download of the HTTP binary cache.",
			Buckets: narSizeBuckets,
		}, []string{"cache"}),
		narinfos: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_cache_narinfo_requests_total", Help: "narinfo requests by result.",
		}, []string{"cache", "result"}),
		narUploads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_cache_nar_uploads_total", Help: "NAR uploads through the admin API by outcome.",
		}, []string{"outcome"}),
		narRedirects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_cache_nar_redirects_total", Help: "NAR requests of the HTTP binary cache answered with a redirect to a presigned GET.",
		}, []string{"cache"}),
		presignedGrants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_cache_presigned_grants_total", Help: "Upload grants with presigned URLs by kind (put, multipart).",
		}, []string{"kind"}),
		presignedCommits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gradient_cache_presigned_commits_total", Help: "Presigned uploads finished by outcome (ok, rejected, retry).",
		}, []string{"outcome"}),
		verifySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gradient_cache_presigned_verify_duration_seconds", Help: "Time to read back, verify and place one presigned upload.",
			Buckets: narSecondsBuckets,
		}),
	}
}

func (m *binaryCacheMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.narBytes, m.narDownloads, m.narSeconds, m.narSizes, m.narinfos, m.narUploads,
		m.narRedirects, m.presignedGrants, m.presignedCommits, m.verifySeconds}
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
