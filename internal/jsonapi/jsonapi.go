// Package jsonapi is what the server's and the proxy's admin APIs share
// in how they answer: JSON bodies, {"error": "sentence"} with the status
// of storage's error kind (sqldb.ErrNotFound 404, ErrConflict 409,
// ErrInvalid 400, anything else 500 with a reference into the log), and
// strict decoding of request bodies.
package jsonapi

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"gradient.dev/gradient/storage/sqldb"
)

// MaxBody bounds admin request bodies; they are a few small fields.
const MaxBody = 64 << 10

// ErrorBody is every error response.
type ErrorBody struct {
	Error string `json:"error"`
}

// Write answers v as indented JSON, never cached (answers may carry a
// token shown once).
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away; nothing left to tell it
}

// WriteError answers {"error": msg}.
func WriteError(w http.ResponseWriter, status int, msg string) {
	Write(w, status, ErrorBody{Error: msg})
}

// Fail answers err with the status its kind calls for. Unexpected errors
// are logged with a reference the response repeats, so the operator can
// find the details in the log of the service (program) without the
// response leaking them.
func Fail(w http.ResponseWriter, r *http.Request, log *slog.Logger, program string, err error) {
	switch {
	case errors.Is(err, sqldb.ErrNotFound):
		WriteError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, sqldb.ErrConflict):
		WriteError(w, http.StatusConflict, withoutKind(err, sqldb.ErrConflict))
	case errors.Is(err, sqldb.ErrInvalid):
		WriteError(w, http.StatusBadRequest, withoutKind(err, sqldb.ErrInvalid))
	default:
		ref := incidentRef()
		log.Error("admin request failed", "method", r.Method, "path", r.URL.Path, "ref", ref, "error", err)
		WriteError(w, http.StatusInternalServerError, "internal error (ref "+ref+"): the "+program+" log has the details")
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

// Decode reads a JSON request body into v, rejecting unknown fields so a
// misspelt option is an error instead of silently ignored. Its errors are
// of kind sqldb.ErrInvalid.
func Decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return sqldb.Invalid("request body is empty: send a JSON object")
		}
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return sqldb.Invalid("request body is larger than %d bytes", MaxBody)
		}
		return sqldb.Invalid("request body is not valid JSON: %v", err)
	}
	if dec.More() {
		return sqldb.Invalid("request body holds more than one JSON value")
	}
	return nil
}
