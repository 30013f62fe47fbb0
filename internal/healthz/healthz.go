// Package healthz is the services' GET /healthz: "ok" while their database
// answers, 503 with the reason when it does not. The server and the proxy
// mount the same handler.
package healthz

import (
	"context"
	"net/http"
)

// Handler answers 200 "ok\n" when ping succeeds, else 503 naming the error.
func Handler(ping func(context.Context) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := ping(r.Context()); err != nil {
			http.Error(w, "database unreachable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	}
}
