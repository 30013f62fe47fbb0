package dashboard

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	"gradient.dev/gradient/internal/jsonapi"
	"gradient.dev/gradient/server/admin"
)

// Actions call the admin API's own handlers (admin.API.Internal) with the
// request the CLI would send, so both clients get the same checks and
// the same errors; the dashboard shows the error sentence or goes to the
// page of what changed.

// callAPI runs one admin API request in process and decodes its answer
// into out; on an error answer it returns the API's sentence.
func (d *Dashboard) callAPI(r *http.Request, method, path string, body any, out any) (status int, errMsg string) {
	var rd *bytes.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		rd = bytes.NewReader(j)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequestWithContext(r.Context(), method, path, rd)
	if err != nil {
		return http.StatusBadRequest, err.Error()
	}
	req.RemoteAddr = r.RemoteAddr
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := &recorder{header: http.Header{}, Code: http.StatusOK}
	d.cfg.API.Internal().ServeHTTP(rec, req)
	if rec.Code >= 300 {
		var e jsonapi.ErrorBody
		if json.Unmarshal(rec.Body.Bytes(), &e) == nil && e.Error != "" {
			return rec.Code, e.Error
		}
		return rec.Code, strings.TrimSpace(rec.Body.String())
	}
	if out != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			return http.StatusInternalServerError, "unreadable answer of the admin API: " + err.Error()
		}
	}
	return rec.Code, ""
}

func (d *Dashboard) startEvaluation(w http.ResponseWriter, r *http.Request, v viewer) {
	body := map[string]string{}
	if c := strings.TrimSpace(r.PostFormValue("commit")); c != "" {
		body["commit"] = c
	}
	var ev admin.EvaluationView
	status, msg := d.callAPI(r, "POST", "/api/v1/projects/"+url.PathEscape(r.PathValue("project"))+"/evaluations", body, &ev)
	if msg != "" {
		d.fail(w, r, v, status, "The evaluation did not start: "+msg)
		return
	}
	http.Redirect(w, r, "/evaluations/"+ev.ID, http.StatusSeeOther)
}

// evaluationAction is an action on an evaluation that the admin API
// does at POST /api/v1/evaluations/{id}/<verb>; the page of the
// evaluation follows, or failed (e.g. "was not cancelled") with the
// API's reason.
func (d *Dashboard) evaluationAction(verb, failed string) func(http.ResponseWriter, *http.Request, viewer) {
	return func(w http.ResponseWriter, r *http.Request, v viewer) {
		id := r.PathValue("id")
		status, msg := d.callAPI(r, "POST", "/api/v1/evaluations/"+url.PathEscape(id)+"/"+verb, nil, nil)
		if msg != "" {
			d.fail(w, r, v, status, failed+": "+msg)
			return
		}
		http.Redirect(w, r, "/evaluations/"+url.PathEscape(id), http.StatusSeeOther)
	}
}

// recorder keeps an in-process answer of the admin API.
type recorder struct {
	header http.Header
	Code   int
	Body   bytes.Buffer
	wrote  bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.Code, r.wrote = code, true
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.wrote = true
	return r.Body.Write(p)
}
