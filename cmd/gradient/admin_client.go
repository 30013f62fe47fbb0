package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// adminClient talks to the server's admin API (/api/v1).
type adminClient struct {
	base  string // e.g. http://127.0.0.1:3000, without a trailing slash
	token string
	http  *http.Client
	// service names what base is in errors: "" is the server, the proxy
	// commands set "proxy".
	service string
}

func (c *adminClient) serviceName() string {
	if c.service == "" {
		return "server"
	}
	return c.service
}

// requestTimeout bounds one admin call; they are small database operations.
const requestTimeout = 30 * time.Second

// apiError is an error answer of the server: its sentence is shown as is.
type apiError struct {
	Status  int
	Message string
}

func (e *apiError) Error() string { return e.Message }

// call sends body (JSON-encoded unless nil) and returns the raw response
// body, decoding it into out when out is not nil. Non-2xx answers become
// *apiError with the server's sentence.
func (c *adminClient) call(ctx context.Context, method, path string, body, out any) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("bad %s URL %q: %w", c.serviceName(), c.base, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// The *url.Error names the URL, never the Authorization header.
		return nil, fmt.Errorf("cannot reach the %s: %w", c.serviceName(), err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the server's answer: %w", err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, answerError(resp.StatusCode, raw)
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("unexpected answer from the server: %w", err)
		}
	}
	return raw, nil
}

// answerError turns an error answer into its sentence; a body without one
// (a proxy's HTML page, say) still says what happened.
func answerError(status int, raw []byte) error {
	var body struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(raw, &body) == nil && body.Error != "" {
		return &apiError{Status: status, Message: body.Error}
	}
	text := strings.TrimSpace(string(raw))
	if len(text) > 200 {
		text = text[:200] + "…"
	}
	msg := fmt.Sprintf("server answered %d %s", status, http.StatusText(status))
	if text != "" {
		msg += ": " + text
	}
	return &apiError{Status: status, Message: msg}
}
