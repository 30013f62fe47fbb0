package dashboard

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"time"

	"gradient.dev/gradient/proxy/admin"
	"gradient.dev/gradient/proxy/proxystore"
)

var funcs = map[string]any{
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
	},
	"whenp": func(t *time.Time) string {
		if t == nil || t.IsZero() {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
	},
	"seconds": func(s int64) string { return (time.Duration(s) * time.Second).String() },
	// uptime is a VM's time up, to now while it runs.
	"uptime": func(vm proxystore.VMUsage) string {
		end := time.Now()
		if vm.DeletedAt != nil {
			end = *vm.DeletedAt
		}
		if !end.After(vm.CreatedAt) {
			return "–"
		}
		return end.Sub(vm.CreatedAt).Round(time.Second).String()
	},
	"join": strings.Join,
}

// page is what layout.html renders around each page's content.
type page struct {
	Viewer viewer
	Title  string
	Nav    string
	Data   any
}

func (d *Dashboard) render(w http.ResponseWriter, status int, name string, v viewer, data any) {
	var buf bytes.Buffer
	title := strings.ToUpper(name[:1]) + name[1:]
	if name == "vms" {
		title = "Hetzner VMs"
	}
	if err := d.pages[name].Execute(&buf, page{Viewer: v, Title: title, Nav: name, Data: data}); err != nil {
		d.log.Error("proxy dashboard: rendering failed", "page", name, "error", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type errorData struct{ Message string }

func (d *Dashboard) fail(w http.ResponseWriter, _ *http.Request, v viewer, status int, msg string) {
	d.render(w, status, "error", v, errorData{Message: msg})
}

func (d *Dashboard) internalError(w http.ResponseWriter, r *http.Request, v viewer, err error) {
	d.log.Error("proxy dashboard: request failed", "path", r.URL.Path, "error", err)
	d.fail(w, r, v, http.StatusInternalServerError, "Something went wrong in the proxy; its log has the cause.")
}

// tenants: each tenant, may-run, its link's state (ok, or failing with
// the reason and since when) and its upstream session.
func (d *Dashboard) tenants(w http.ResponseWriter, r *http.Request, v viewer) {
	ts, err := d.api.Tenants(r.Context())
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	d.render(w, http.StatusOK, "tenants", v, ts)
}

// workers: the proxy's workers per tenant, live, draining, holding a job.
func (d *Dashboard) workers(w http.ResponseWriter, r *http.Request, v viewer) {
	ws, err := d.api.Workers(r.Context(), nil)
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	d.render(w, http.StatusOK, "workers", v, ws)
}

func (d *Dashboard) sessionsPage(w http.ResponseWriter, r *http.Request, v viewer) {
	s, err := d.api.Sessions(r.Context())
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	d.render(w, http.StatusOK, "sessions", v, s)
}

type vmsData struct {
	From, To string // the period as the form shows it (dates)
	Error    string
	Tenants  []admin.UsageView
	Chart    chart
}

// vmPeriodDefault is the period the VM page shows without ?from=&to=.
const vmPeriodDefault = 7 * 24 * time.Hour

// vms: each tenant's Hetzner VMs that existed in the period, their state,
// uptime, outcome and billed units, and a chart of VMs over the period.
func (d *Dashboard) vms(w http.ResponseWriter, r *http.Request, v viewer) {
	now := time.Now().UTC()
	to := now.Truncate(24 * time.Hour).Add(24 * time.Hour)
	from := to.Add(-vmPeriodDefault)
	data := vmsData{}
	q := r.URL.Query()
	var bad []string
	if s := q.Get("from"); s != "" {
		if t, err := time.Parse(time.DateOnly, s); err == nil {
			from = t
		} else {
			bad = append(bad, fmt.Sprintf("from %q", s))
		}
	}
	if s := q.Get("to"); s != "" {
		if t, err := time.Parse(time.DateOnly, s); err == nil {
			to = t
		} else {
			bad = append(bad, fmt.Sprintf("to %q", s))
		}
	}
	if len(bad) > 0 {
		data.Error = "Not a date (2026-12-01): " + strings.Join(bad, ", ") + "; showing the last week."
		to = now.Truncate(24 * time.Hour).Add(24 * time.Hour)
		from = to.Add(-vmPeriodDefault)
	} else if !to.After(from) {
		data.Error = "The period ends before it begins; showing the last week."
		to = now.Truncate(24 * time.Hour).Add(24 * time.Hour)
		from = to.Add(-vmPeriodDefault)
	}
	data.From, data.To = from.Format(time.DateOnly), to.Format(time.DateOnly)
	ts, err := d.api.Tenants(r.Context())
	if err != nil {
		d.internalError(w, r, v, err)
		return
	}
	var all []proxystore.VMUsage
	for _, t := range ts {
		u, err := d.api.Usage(r.Context(), t.ID, from, to)
		if err != nil {
			d.internalError(w, r, v, err)
			return
		}
		u.Tenant = t.Name
		data.Tenants = append(data.Tenants, u)
		all = append(all, u.VMs...)
	}
	data.Chart = vmChart(all, from, to, now)
	d.render(w, http.StatusOK, "vms", v, data)
}
