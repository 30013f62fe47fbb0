package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// logTimeout bounds fetching one log: logs can be large, so it is longer
// than an admin call's requestTimeout.
const logTimeout = 10 * time.Minute

// copyText GETs a text/plain answer (a job log) and streams it to w,
// without the size limit of call. Error answers become *apiError.
func (c *adminClient) copyText(ctx context.Context, path string, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, logTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", c.base+path, nil)
	if err != nil {
		return fmt.Errorf("bad server URL %q: %w", c.base, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "text/plain")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the server: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return answerError(resp.StatusCode, raw)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("reading the log: %w", err)
	}
	return nil
}
