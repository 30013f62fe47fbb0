package dashboard

import (
	"strconv"
	"strings"
	"time"

	"gradient.dev/gradient/proxy/proxystore"
)

// chart is a line of VMs over time, drawn as inline SVG by the template:
// Points is the polyline's coordinates, computed here.
type chart struct {
	Width, Height int
	Points        string
	Max           int
	From, To      string
	// Samples are the counts, for the page's text alternative.
	Samples int
}

const (
	chartWidth   = 720
	chartHeight  = 160
	chartPadding = 24
	chartSamples = 120
)

// vmChart splits [from, min(to, now)] into chartSamples intervals, counts
// the VMs up at some time in each (so a VM shorter than an interval still
// shows) and scales the counts into the chart's box.
func vmChart(vms []proxystore.VMUsage, from, to, now time.Time) chart {
	c := chart{Width: chartWidth, Height: chartHeight, From: from.Format(time.DateOnly), To: to.Format(time.DateOnly)}
	end := to
	if now.Before(end) {
		end = now
	}
	if !end.After(from) {
		return c
	}
	counts := make([]int, chartSamples)
	step := end.Sub(from) / time.Duration(chartSamples)
	for i := range counts {
		lo, hi := from.Add(time.Duration(i)*step), from.Add(time.Duration(i+1)*step)
		for _, vm := range vms {
			if vm.CreatedAt.Before(hi) && (vm.DeletedAt == nil || vm.DeletedAt.After(lo)) {
				counts[i]++
			}
		}
		c.Max = max(c.Max, counts[i])
	}
	c.Samples = len(counts)
	scale := max(c.Max, 1)
	inner := float64(chartHeight - 2*chartPadding)
	var b strings.Builder
	for i, n := range counts {
		x := chartPadding + float64(i)*float64(chartWidth-2*chartPadding)/float64(chartSamples-1)
		y := float64(chartHeight-chartPadding) - float64(n)*inner/float64(scale)
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(x, 'f', 1, 64))
		b.WriteByte(',')
		b.WriteString(strconv.FormatFloat(y, 'f', 1, 64))
	}
	c.Points = b.String()
	return c
}
