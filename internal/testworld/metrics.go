package testworld

import (
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is a scrape of a /metrics endpoint by family name.
type Metrics map[string]*dto.MetricFamily

// Scrape GETs url, a /metrics endpoint, as Prometheus would and parses
// the text exposition.
func Scrape(tb testing.TB, url string) Metrics {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("GET %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		tb.Fatalf("GET %s: not the text exposition format: %v", url, err)
	}
	return families
}

// HistogramCount is the number of observations of histogram name, summed
// over its series whose labels include every pair in labels.
func (m Metrics) HistogramCount(name string, labels map[string]string) uint64 {
	var n uint64
	for _, s := range m.series(name, labels) {
		n += s.GetHistogram().GetSampleCount()
	}
	return n
}

// Value is the value of counter or gauge name, summed over its series
// whose labels include every pair in labels.
func (m Metrics) Value(name string, labels map[string]string) float64 {
	var v float64
	for _, s := range m.series(name, labels) {
		v += s.GetCounter().GetValue() + s.GetGauge().GetValue() + s.GetUntyped().GetValue()
	}
	return v
}

func (m Metrics) series(name string, labels map[string]string) []*dto.Metric {
	f := m[name]
	if f == nil {
		return nil
	}
	var out []*dto.Metric
	for _, s := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range s.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range labels {
			if have[k] != v {
				match = false
			}
		}
		if match {
			out = append(out, s)
		}
	}
	return out
}
