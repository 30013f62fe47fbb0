package metrics

import (
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

func TestTextFormat(t *testing.T) {
	r := NewRegistry()
	c := r.NewCounter("gradient_frames_total", "Frames sent.", "lane")
	g := r.NewGauge("gradient_sessions", "Live sessions.")
	r.NewGaugeFunc("gradient_up", "Always 1.", func() float64 { return 1 })
	c.Inc("control")
	c.Add(2, "bulk")
	c.Inc(`we"ird`)
	g.Set(3)
	g.Add(-1)
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	want := `# HELP gradient_frames_total Frames sent.
# TYPE gradient_frames_total counter
gradient_frames_total{lane="bulk"} 2
gradient_frames_total{lane="control"} 1
gradient_frames_total{lane="we\"ird"} 1
# HELP gradient_sessions Live sessions.
# TYPE gradient_sessions gauge
gradient_sessions 2
# HELP gradient_up Always 1.
# TYPE gradient_up gauge
gradient_up 1
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("content type %q", ct)
	}
}

func TestConcurrentAdds(t *testing.T) {
	r := NewRegistry()
	c := r.NewCounter("x_total", "x")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				c.Inc()
			}
		})
	}
	wg.Wait()
	var b strings.Builder
	r.WriteText(&b)
	if !strings.Contains(b.String(), "x_total 8000\n") {
		t.Errorf("lost increments:\n%s", b.String())
	}
}
