package admin

import (
	"fmt"
	"net/http"

	"gradient.dev/gradient/internal/jsonapi"
	"gradient.dev/gradient/storage"
)

// MaxBody bounds admin request bodies; they are a few small fields.
const MaxBody = jsonapi.MaxBody

// adminError is an error the admin API raises itself, worded for the
// operator and wrapping the storage error kind that picks its status.
type adminError struct {
	kind error // storage.ErrNotFound, ErrConflict or ErrInvalid
	msg  string
}

func (e *adminError) Error() string { return e.msg }
func (e *adminError) Unwrap() error { return e.kind }

func notFoundf(format string, args ...any) error {
	return &adminError{kind: storage.ErrNotFound, msg: fmt.Sprintf(format, args...)}
}

func invalidf(format string, args ...any) error {
	return &adminError{kind: storage.ErrInvalid, msg: fmt.Sprintf(format, args...)}
}

// ErrorBody is every admin error response.
type ErrorBody = jsonapi.ErrorBody

func writeJSON(w http.ResponseWriter, status int, v any) { jsonapi.Write(w, status, v) }

func writeError(w http.ResponseWriter, status int, msg string) { jsonapi.WriteError(w, status, msg) }

// fail answers err with the status its kind calls for (jsonapi.Fail).
func (a *API) fail(w http.ResponseWriter, r *http.Request, err error) {
	jsonapi.Fail(w, r, a.log, "server", err)
}

// decodeBody reads a JSON request body into v (jsonapi.Decode).
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error { return jsonapi.Decode(w, r, v) }

// handle serves an endpoint that returns its error instead of answering
// it: fail answers the error, so each step of a handler is one line.
func (a *API) handle(h func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			a.fail(w, r, err)
		}
	}
}
