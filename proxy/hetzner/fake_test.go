package hetzner

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

// fakeCloud is a stateful fake of the Hetzner Cloud API at the HTTP
// level (servers, actions, images, server types, locations), for the
// real hcloud-go client. Failures (429, 5xx) are injected on demand.
type fakeCloud struct {
	t   testing.TB
	now func() time.Time
	srv *httptest.Server

	mu          sync.Mutex
	nextID      int64
	servers     map[int64]*fakeServer
	images      []schema.Image
	serverTypes map[string]schema.ServerType
	locations   map[string]schema.Location
	// calls counts requests by "METHOD /path" (no query, IDs as {id}).
	calls map[string]int
	// creates counts create requests per tenant label.
	creates  map[string]int
	failures []failure
	// hideNext hides the next created server from that many lists.
	hideNext int
	onCreate func(s *fakeServer)
	onDelete func(s *fakeServer)
}

type fakeServer struct {
	schema.Server
	UserData    string
	hiddenLists int
}

// failure fails the next n requests of method and path (as counted in
// calls) whose tenant label is tenant ("": any) with status.
type failure struct {
	method, path, tenant string
	status, n            int
}

func newFakeCloud(t testing.TB, now func() time.Time) *fakeCloud {
	f := &fakeCloud{t: t, now: now, nextID: 1000, servers: map[int64]*fakeServer{}, calls: map[string]int{}, creates: map[string]int{},
		serverTypes: map[string]schema.ServerType{
			"cx22":  {ID: 1, Name: "cx22", Architecture: "x86", Cores: 2, Memory: 4, Disk: 40},
			"cax21": {ID: 2, Name: "cax21", Architecture: "arm", Cores: 4, Memory: 8, Disk: 80},
		},
		locations: map[string]schema.Location{"fsn1": {ID: 1, Name: "fsn1"}, "nbg1": {ID: 2, Name: "nbg1"}},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeCloud) addImage(id int64, arch, label string, created time.Time, status string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	desc := fmt.Sprintf("worker %d", id)
	f.images = append(f.images, schema.Image{ID: id, Type: "snapshot", Status: status, Architecture: arch, Created: &created,
		Description: desc, Labels: map[string]string{label: ""}})
}

// fail makes the next n matching requests answer status.
func (f *fakeCloud) fail(method, path, tenant string, status, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = append(f.failures, failure{method, path, tenant, status, n})
}

func (f *fakeCloud) count(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[key]
}

func (f *fakeCloud) createsOf(tenant string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.creates[tenant]
}

// serversOf lists the tenant's servers by ID.
func (f *fakeCloud) serversOf(tenant string) []*fakeServer {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*fakeServer
	for _, s := range f.servers {
		if s.Labels["gradient-tenant"] == tenant {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *fakeServer) int { return int(a.ID - b.ID) })
	return out
}

func (f *fakeCloud) server(id int64) *fakeServer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.servers[id]
}

// addServer creates a server behind the API's back (as a crashed proxy
// or someone else would have).
func (f *fakeCloud) addServer(name string, labels map[string]string, created time.Time) *fakeServer {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	s := &fakeServer{Server: schema.Server{ID: f.nextID, Name: name, Status: "running", Created: created, Labels: labels,
		ServerType: f.serverTypes["cx22"], Location: f.locations["fsn1"]}}
	f.servers[s.ID] = s
	return s
}

// vanish removes a server without the API being asked (a VM deleted in
// the console).
func (f *fakeCloud) vanish(id int64) {
	f.mu.Lock()
	s := f.servers[id]
	delete(f.servers, id)
	onDelete := f.onDelete
	f.mu.Unlock()
	if s != nil && onDelete != nil {
		onDelete(s)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, schema.ErrorResponse{Error: schema.Error{Code: code, Message: msg, DetailsRaw: json.RawMessage("null")}})
}

// matches reports whether labels satisfy a selector of comma-separated
// "key" and "key=value" terms.
func matches(labels map[string]string, selector string) bool {
	for _, term := range strings.Split(selector, ",") {
		if term == "" {
			continue
		}
		k, v, hasValue := strings.Cut(term, "=")
		got, ok := labels[k]
		if !ok || hasValue && got != v {
			return false
		}
	}
	return true
}

func (f *fakeCloud) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer test-token" {
		apiError(w, http.StatusUnauthorized, "unauthorized", "unable to authenticate")
		return
	}
	path := r.URL.Path
	id := int64(0)
	if parts := strings.Split(strings.Trim(path, "/"), "/"); len(parts) == 2 {
		n, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			apiError(w, http.StatusNotFound, "not_found", "no such path")
			return
		}
		id, path = n, "/"+parts[0]+"/{id}"
	}
	var create schema.ServerCreateRequest
	tenant := ""
	if r.Method == http.MethodPost && path == "/servers" {
		if err := json.NewDecoder(r.Body).Decode(&create); err != nil {
			apiError(w, http.StatusBadRequest, "invalid_input", err.Error())
			return
		}
		if create.Labels != nil {
			tenant = (*create.Labels)["gradient-tenant"]
		}
	}

	f.mu.Lock()
	key := r.Method + " " + path
	f.calls[key]++
	if r.Method == http.MethodPost && path == "/servers" {
		f.creates[tenant]++
	}
	if r.Method == http.MethodDelete && f.servers[id] != nil {
		tenant = f.servers[id].Labels["gradient-tenant"]
	}
	for i := range f.failures {
		fl := &f.failures[i]
		if fl.n > 0 && fl.method == r.Method && fl.path == path && (fl.tenant == "" || fl.tenant == tenant) {
			fl.n--
			f.mu.Unlock()
			if fl.status == http.StatusTooManyRequests {
				apiError(w, fl.status, "rate_limit_exceeded", "limit of 3600 requests per hour reached")
			} else {
				apiError(w, fl.status, "unavailable", "service unavailable")
			}
			return
		}
	}

	switch key {
	case "GET /servers":
		q := r.URL.Query()
		var list []schema.Server
		ids := make([]int64, 0, len(f.servers))
		for id := range f.servers {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			s := f.servers[id]
			if s.hiddenLists > 0 {
				s.hiddenLists--
				continue
			}
			if matches(s.Labels, q.Get("label_selector")) {
				list = append(list, s.Server)
			}
		}
		f.mu.Unlock()
		page, _ := strconv.Atoi(q.Get("page"))
		perPage, _ := strconv.Atoi(q.Get("per_page"))
		page, perPage = max(page, 1), max(min(perPage, 50), 1)
		lo, hi := min((page-1)*perPage, len(list)), min(page*perPage, len(list))
		next := 0
		if hi < len(list) {
			next = page + 1
		}
		body := schema.ServerListResponse{Servers: list[lo:hi]}
		if body.Servers == nil {
			body.Servers = []schema.Server{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"servers": body.Servers,
			"meta": schema.Meta{Pagination: &schema.MetaPagination{Page: page, PerPage: perPage, NextPage: next,
				LastPage: max((len(list)+perPage-1)/perPage, 1), TotalEntries: len(list)}}})
	case "POST /servers":
		st, okType := f.serverTypes[create.ServerType.Name]
		loc, okLoc := f.locations[create.Location]
		if create.Location == "" {
			loc, okLoc = f.locations["fsn1"], true
		}
		var img *schema.Image
		for i := range f.images {
			if f.images[i].ID == create.Image.ID {
				img = &f.images[i]
			}
		}
		switch {
		case !okType:
			f.mu.Unlock()
			apiError(w, http.StatusUnprocessableEntity, "invalid_input", "unknown server type "+create.ServerType.Name)
			return
		case !okLoc:
			f.mu.Unlock()
			apiError(w, http.StatusUnprocessableEntity, "invalid_input", "unknown location "+create.Location)
			return
		case img == nil || img.Architecture != st.Architecture:
			f.mu.Unlock()
			apiError(w, http.StatusUnprocessableEntity, "invalid_input", "image not found for the server type's architecture")
			return
		}
		f.nextID++
		s := &fakeServer{Server: schema.Server{ID: f.nextID, Name: create.Name, Status: "initializing", Created: f.now(),
			ServerType: st, Location: loc, Image: img, Labels: *create.Labels}, UserData: create.UserData, hiddenLists: f.hideNext}
		f.hideNext = 0
		f.servers[s.ID] = s
		onCreate := f.onCreate
		f.mu.Unlock()
		if onCreate != nil {
			onCreate(s)
		}
		writeJSON(w, http.StatusCreated, schema.ServerCreateResponse{Server: s.Server,
			Action: schema.Action{ID: s.ID, Command: "create_server", Status: "running", Started: f.now()}, NextActions: []schema.Action{}})
	case "DELETE /servers/{id}":
		s := f.servers[id]
		delete(f.servers, id)
		onDelete := f.onDelete
		f.mu.Unlock()
		if s == nil {
			apiError(w, http.StatusNotFound, "not_found", "server not found")
			return
		}
		if onDelete != nil {
			onDelete(s)
		}
		writeJSON(w, http.StatusOK, schema.ServerDeleteResponse{Action: schema.Action{ID: id, Command: "delete_server", Status: "running", Started: f.now()}})
	case "GET /images":
		q := r.URL.Query()
		var list []schema.Image
		for _, img := range f.images {
			if matches(img.Labels, q.Get("label_selector")) && (q.Get("type") == "" || q.Get("type") == img.Type) &&
				(q.Get("status") == "" || q.Get("status") == img.Status) &&
				(q.Get("architecture") == "" || q.Get("architecture") == img.Architecture) {
				list = append(list, img)
			}
		}
		f.mu.Unlock()
		if q.Get("sort") == "created:desc" {
			slices.SortFunc(list, func(a, b schema.Image) int { return b.Created.Compare(*a.Created) })
		}
		if n, _ := strconv.Atoi(q.Get("per_page")); n > 0 && len(list) > n {
			list = list[:n]
		}
		if list == nil {
			list = []schema.Image{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"images": list, "meta": schema.Meta{Pagination: &schema.MetaPagination{Page: 1, PerPage: 50, LastPage: 1, TotalEntries: len(list)}}})
	case "GET /server_types":
		var list []schema.ServerType
		for _, st := range f.serverTypes {
			list = append(list, st)
		}
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"server_types": list})
	case "GET /locations":
		var list []schema.Location
		for _, l := range f.locations {
			list = append(list, l)
		}
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"locations": list})
	case "GET /actions/{id}":
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"action": schema.Action{ID: id, Status: "success", Progress: 100, Started: f.now()}})
	default:
		f.mu.Unlock()
		apiError(w, http.StatusNotFound, "not_found", "no such endpoint "+key)
	}
}
