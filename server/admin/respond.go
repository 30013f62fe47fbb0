package admin

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"gradient.dev/gradient/storage"
)

// MaxBody bounds admin request bodies; they are a few small fields.
const MaxBody = 64 << 10

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
type ErrorBody struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store") // responses may carry a token
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away; nothing left to tell it
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, ErrorBody{Error: msg})
}

// fail answers err with the status its kind calls for. Unexpected errors
// are logged with a reference the response repeats, so the operator can
// find the details without the response leaking them.
func (a *API) fail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, storage.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, storage.ErrConflict):
		writeError(w, http.StatusConflict, withoutKind(err, storage.ErrConflict))
	case errors.Is(err, storage.ErrInvalid):
		writeError(w, http.StatusBadRequest, withoutKind(err, storage.ErrInvalid))
	default:
		ref := incidentRef()
		a.log.Error("admin request failed", "method", r.Method, "path", r.URL.Path, "ref", ref, "error", err)
		writeError(w, http.StatusInternalServerError, "internal error (ref "+ref+"): the server log has the details")
	}
}

// withoutKind drops storage's "conflict: " or "invalid: " prefix: the
// status says that already, and the rest is a full sentence. ("not
// found: team x" keeps its prefix, which the rest needs to read well.)
func withoutKind(err error, kind error) string {
	return strings.TrimPrefix(err.Error(), kind.Error()+": ")
}

func incidentRef() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// decodeBody reads a JSON request body into v, rejecting unknown fields
// so a misspelt option is an error instead of silently ignored.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return invalidf("request body is empty: send a JSON object")
		}
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return invalidf("request body is larger than %d bytes", MaxBody)
		}
		return invalidf("request body is not valid JSON: %v", err)
	}
	if dec.More() {
		return invalidf("request body holds more than one JSON value")
	}
	return nil
}
