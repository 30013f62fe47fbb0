// Package metrics keeps counters and gauges and writes them in the
// Prometheus text exposition format (version 0.0.4). It is deliberately
// small: the services export a few dozen series, which does not justify
// the client_golang dependency tree.
package metrics

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Registry holds the metric families of one process.
type Registry struct {
	mu       sync.Mutex
	families map[string]*family
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{families: map[string]*family{}} }

type family struct {
	name, help, kind string
	labels           []string
	mu               sync.Mutex
	series           map[string]*series
	funcs            []func() float64 // gauge functions, no labels
}

type series struct {
	labelValues []string
	bits        atomic.Uint64 // float64 bits
}

func (r *Registry) family(name, help, kind string, labels []string) *family {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.families[name]; ok {
		if f.kind != kind || strings.Join(f.labels, ",") != strings.Join(labels, ",") {
			panic(fmt.Sprintf("metrics: %s registered twice with different shapes", name))
		}
		return f
	}
	f := &family{name: name, help: help, kind: kind, labels: labels, series: map[string]*series{}}
	r.families[name] = f
	return f
}

func (f *family) with(values []string) *series {
	if len(values) != len(f.labels) {
		panic(fmt.Sprintf("metrics: %s takes labels %v, got %d values", f.name, f.labels, len(values)))
	}
	key := strings.Join(values, "\xff")
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.series[key]
	if !ok {
		s = &series{labelValues: append([]string(nil), values...)}
		f.series[key] = s
	}
	return s
}

func (s *series) add(d float64) {
	for {
		old := s.bits.Load()
		if s.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+d)) {
			return
		}
	}
}

// Counter is a monotonically increasing value, optionally per label values.
type Counter struct{ f *family }

// NewCounter registers a counter family; name should end in _total.
func (r *Registry) NewCounter(name, help string, labels ...string) Counter {
	return Counter{r.family(name, help, "counter", labels)}
}

// Add adds d (≥ 0) to the series of the label values.
func (c Counter) Add(d float64, labelValues ...string) { c.f.with(labelValues).add(d) }

// Inc adds one.
func (c Counter) Inc(labelValues ...string) { c.Add(1, labelValues...) }

// Gauge is a value that goes up and down.
type Gauge struct{ f *family }

// NewGauge registers a gauge family.
func (r *Registry) NewGauge(name, help string, labels ...string) Gauge {
	return Gauge{r.family(name, help, "gauge", labels)}
}

// Set sets the series of the label values.
func (g Gauge) Set(v float64, labelValues ...string) {
	g.f.with(labelValues).bits.Store(math.Float64bits(v))
}

// Add adds d (may be negative).
func (g Gauge) Add(d float64, labelValues ...string) { g.f.with(labelValues).add(d) }

// NewGaugeFunc registers a label-less gauge read from fn at scrape time.
func (r *Registry) NewGaugeFunc(name, help string, fn func() float64) {
	f := r.family(name, help, "gauge", nil)
	f.mu.Lock()
	f.funcs = append(f.funcs, fn)
	f.mu.Unlock()
}

// WriteText writes every family in the text exposition format, sorted by
// name so scrapes are stable.
func (r *Registry) WriteText(w io.Writer) error {
	r.mu.Lock()
	fams := make([]*family, 0, len(r.families))
	for _, f := range r.families {
		fams = append(fams, f)
	}
	r.mu.Unlock()
	sort.Slice(fams, func(i, j int) bool { return fams[i].name < fams[j].name })
	var b strings.Builder
	for _, f := range fams {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, escapeHelp(f.help), f.name, f.kind)
		f.mu.Lock()
		keys := make([]string, 0, len(f.series))
		for k := range f.series {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			s := f.series[k]
			b.WriteString(f.name)
			if len(f.labels) > 0 {
				b.WriteByte('{')
				for i, l := range f.labels {
					if i > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, "%s=\"%s\"", l, escapeLabel(s.labelValues[i]))
				}
				b.WriteByte('}')
			}
			fmt.Fprintf(&b, " %s\n", formatValue(math.Float64frombits(s.bits.Load())))
		}
		funcs := append([]func() float64(nil), f.funcs...)
		f.mu.Unlock()
		for _, fn := range funcs {
			fmt.Fprintf(&b, "%s %s\n", f.name, formatValue(fn()))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Handler serves the registry at /metrics.
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		r.WriteText(w)
	})
}

func formatValue(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return fmt.Sprintf("%g", v)
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(s) }
