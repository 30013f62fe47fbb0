package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gradient.dev/gradient/internal/dialguard"
	"gradient.dev/gradient/wire"
	"gradient.dev/gradient/workersession"
)

// Presigned transfers (docs/protocol/cache.md §4.6): the worker moves a
// NAR's bytes straight between its disk and the object store over plain
// HTTP, the server (and a proxy between them) only hands out the URLs.
// Every URL comes from another party: only http and https, no
// link-local or metadata address (internal/dialguard, before the request
// and at every dial, redirects included), at most presignedRedirects
// redirects, and never written anywhere with its query (the signature
// is in it): errors and logs name scheme, host and path only.

const (
	// presignedTries is how often one request (a PUT, a part, a GET's
	// open or a resume without progress) is tried before it fails.
	presignedTries = 4
	// presignedRedirects bounds the redirects one request follows.
	presignedRedirects = 3
	// presignedResumes bounds the Range resumes of one GET in all.
	presignedResumes = 32
	// multipartParallel is how many parts of one upload are sent at once.
	multipartParallel = 4
	// PresignedIdleTimeout fails a presigned request whose bytes stopped
	// moving for this long (a half-open connection); it is then retried.
	PresignedIdleTimeout = 60 * time.Second
	// presignedRetryDelay is the first wait before a retry, doubling up
	// to presignedRetryMax.
	presignedRetryDelay = 250 * time.Millisecond
	presignedRetryMax   = 8 * time.Second
	// errorBodyBytes bounds what is read of an error answer.
	errorBodyBytes = 4 << 10
)

// PresignedError is a presigned request that failed for good (after its
// retries). URL is the request's URL without its query.
type PresignedError struct {
	Op     string // "GET", "PUT", "PUT part 3"
	URL    string
	Status int // the last HTTP status, 0 for none
	Err    error
}

func (e *PresignedError) Error() string {
	return fmt.Sprintf("presigned %s %s: %v", e.Op, e.URL, e.Err)
}

func (e *PresignedError) Unwrap() error { return e.Err }

// URLOpener is a cache that can download an object from a presigned URL
// (CacheClient): a job pulls a Pull answer's url with it and falls back
// to OpenNar when it fails.
type URLOpener interface {
	// OpenURL GETs the compressed object at rawURL; size, when known,
	// is its length (file_size). The stream resumes with Range after a
	// broken connection. Errors are *PresignedError.
	OpenURL(ctx context.Context, rawURL string, size *uint64) (io.ReadCloser, error)
}

// presignedURL parses and checks a URL another party chose.
func presignedURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error repeats the URL, signature included.
		return nil, &PresignedError{Op: "URL", URL: "(malformed)", Err: errors.New("malformed URL")}
	}
	if err := checkPresignedURL(u); err != nil {
		return nil, &PresignedError{Op: "URL", URL: redactURL(u), Err: err}
	}
	return u, nil
}

func checkPresignedURL(u *url.URL) error {
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme %q is not http or https", u.Scheme)
	}
	if u.Host == "" || u.User != nil {
		return errors.New("no host, or credentials in the URL")
	}
	return dialguard.CheckHost(u.Host)
}

// redactURL is u without its query and fragment, fit for logs.
func redactURL(u *url.URL) string {
	return u.Scheme + "://" + u.Host + u.EscapedPath()
}

var errTooManyRedirects = fmt.Errorf("more than %d redirects", presignedRedirects)

// newPresignedClient is the HTTP client of presigned transfers: dials
// checked by dialguard, redirects bounded and checked, no proxy from the
// environment (the dial check would see the proxy, not the target), no
// transparent decompression (the bytes must hash as the cache says).
func newPresignedClient() *http.Client {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: dialguard.Control}
	return &http.Client{
		Transport: &http.Transport{
			DialContext:           d.DialContext,
			TLSHandshakeTimeout:   15 * time.Second,
			ResponseHeaderTimeout: PresignedIdleTimeout,
			ExpectContinueTimeout: time.Second,
			MaxIdleConnsPerHost:   2 * multipartParallel,
			IdleConnTimeout:       90 * time.Second,
			DisableCompression:    true,
			ForceAttemptHTTP2:     true,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > presignedRedirects {
				return errTooManyRedirects
			}
			return checkPresignedURL(req.URL)
		},
	}
}

var (
	defaultPresignedOnce   sync.Once
	defaultPresignedClient *http.Client
)

func (c *CacheClient) httpClient() *http.Client {
	if c.HTTPClient != nil {
		return c.HTTPClient
	}
	defaultPresignedOnce.Do(func() { defaultPresignedClient = newPresignedClient() })
	return defaultPresignedClient
}

func (c *CacheClient) presignedIdle() time.Duration {
	if c.PresignedIdleTimeout > 0 {
		return c.PresignedIdleTimeout
	}
	return PresignedIdleTimeout
}

func (c *CacheClient) log() *slog.Logger {
	if c.Log != nil {
		return c.Log
	}
	return slog.New(slog.DiscardHandler)
}

// presignedEvent tells the Presigned hook about one request's end.
func (c *CacheClient) presignedEvent(op, outcome string) {
	if c.Presigned != nil {
		c.Presigned(op, outcome)
	}
}

// retryWait sleeps before try (1-based, > 1) unless ctx ends first.
func (c *CacheClient) retryWait(ctx context.Context, try int) error {
	d := c.PresignedRetryDelay
	if d <= 0 {
		d = presignedRetryDelay
	}
	for i := 2; i < try && d < presignedRetryMax; i++ {
		d *= 2
	}
	t := time.NewTimer(workersession.Jitter(min(d, presignedRetryMax)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retryableStatus: the object store may answer differently next time.
func retryableStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
}

// retryable: a request that failed with this status (0: none) and error
// may succeed when tried again. Refused addresses and redirect loops
// will not.
func retryable(code int, err error) bool {
	if code != 0 {
		return retryableStatus(code)
	}
	return !errors.Is(err, dialguard.ErrRefused) && !errors.Is(err, errTooManyRedirects)
}

// statusError reads the S3 error code of an answer (bounded; the rest of
// the body, which may repeat the request, is never kept).
func statusError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyBytes))
	msg := resp.Status
	if i := bytes.Index(body, []byte("<Code>")); i >= 0 {
		rest := body[i+len("<Code>"):]
		if j := bytes.Index(rest, []byte("</Code>")); j > 0 && j < 64 {
			msg += " (" + string(rest[:j]) + ")"
		}
	}
	return errors.New(msg)
}

// scrubError drops the URL net/http repeats in its errors (with the
// query, so with the signature).
func scrubError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// watchdog cancels a request whose bytes stop moving for its duration.
type watchdog struct {
	t     *time.Timer
	d     time.Duration
	fired atomic.Bool
}

func newWatchdog(d time.Duration, cancel context.CancelFunc) *watchdog {
	w := &watchdog{d: d}
	w.t = time.AfterFunc(d, func() {
		w.fired.Store(true)
		cancel()
	})
	return w
}

func (w *watchdog) kick() { w.t.Reset(w.d) }

func (w *watchdog) stop() { w.t.Stop() }

// errStalled replaces the cancellation a watchdog caused.
func (w *watchdog) explain(err error) error {
	if err != nil && w.fired.Load() {
		return fmt.Errorf("no bytes moved for %s", w.d)
	}
	return err
}

// sendBody is a PUT's body: a section of the packed object, counted and
// kicking the watchdog as the transport reads it.
type sendBody struct {
	r     io.Reader
	wd    *watchdog
	n     *atomic.Uint64
	moved func(download bool, n int)
}

func (b *sendBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		b.wd.kick()
		b.n.Add(uint64(n))
		if b.moved != nil {
			b.moved(false, n)
		}
	}
	return n, err
}

// putSection PUTs n bytes of data from off to the presigned URL u, tried
// presignedTries times; the ETag of the stored object or part.
func (c *CacheClient) putSection(ctx context.Context, op string, u *url.URL, data io.ReaderAt, off, n int64, sent *atomic.Uint64) (string, error) {
	metric := "put"
	if op != "PUT" {
		metric = "part"
	}
	var last error
	status := 0
	for try := 1; try <= presignedTries; try++ {
		if try > 1 {
			if err := c.retryWait(ctx, try); err != nil {
				return "", err
			}
		}
		etag, code, err := c.putOnce(ctx, u, data, off, n, sent)
		if err == nil {
			c.presignedEvent(metric, "ok")
			return etag, nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		last, status = err, code
		if !retryable(code, err) {
			break
		}
		c.presignedEvent(metric, "retry")
		c.log().Info("presigned upload failed; trying again", "op", op, "url", redactURL(u), "try", try, "error", err)
	}
	c.presignedEvent(metric, "failed")
	return "", &PresignedError{Op: op, URL: redactURL(u), Status: status, Err: last}
}

func (c *CacheClient) putOnce(ctx context.Context, u *url.URL, data io.ReaderAt, off, n int64, sent *atomic.Uint64) (string, int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wd := newWatchdog(c.presignedIdle(), cancel)
	defer wd.stop()
	newBody := func() io.Reader {
		return &sendBody{r: io.NewSectionReader(data, off, n), wd: wd, n: sent, moved: c.PresignedMoved}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.String(), nil)
	if err != nil {
		return "", 0, errors.New("cannot build the request")
	}
	req.ContentLength = n
	// What the HTTP cache serves it as (docs/protocol/cache.md §4.2); not
	// signed, and a part's is ignored.
	req.Header.Set("Content-Type", "application/x-nix-nar")
	req.Body = io.NopCloser(newBody())
	if n == 0 {
		req.Body = http.NoBody
	}
	// A redirect (307/308) sends the body again from its start.
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(newBody()), nil }
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return "", 0, wd.explain(scrubError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", resp.StatusCode, statusError(resp)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, errorBodyBytes))
	return resp.Header.Get("ETag"), resp.StatusCode, nil
}

// uploadPut PUTs the whole packed object (a Put grant).
func (c *CacheClient) uploadPut(ctx context.Context, rawURL string, p *packedNar) error {
	u, err := presignedURL(rawURL)
	if err != nil {
		return err
	}
	var sent atomic.Uint64
	_, err = c.putSection(ctx, "PUT", u, p.data, 0, int64(p.meta.FileSize), &sent)
	p.sent += sent.Load()
	return err
}

// uploadMultipart PUTs the packed object in parts of the grant's part
// size, up to multipartParallel at once, and returns their ETags in part
// order (a Multipart grant). An object of n bytes uses the first
// ceil(n/part_size) URLs (one for an empty object).
func (c *CacheClient) uploadMultipart(ctx context.Context, g *wire.PresignedMultipart, p *packedNar) ([]string, error) {
	size := p.meta.FileSize
	if g.PartSize == 0 {
		return nil, &PresignedError{Op: "multipart", URL: "-", Err: errors.New("part size 0")}
	}
	parts := max(1, (size+g.PartSize-1)/g.PartSize)
	if parts > uint64(len(g.PartURLs)) {
		return nil, &PresignedError{Op: "multipart", URL: "-",
			Err: fmt.Errorf("%d bytes need %d parts of %d, the grant has %d URLs", size, parts, g.PartSize, len(g.PartURLs))}
	}
	urls := make([]*url.URL, parts)
	for i := range urls {
		u, err := presignedURL(g.PartURLs[i])
		if err != nil {
			return nil, err
		}
		urls[i] = u
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	etags := make([]string, parts)
	var (
		sent  atomic.Uint64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, multipartParallel)
	for i := range parts {
		if !acquireSlot(ctx, sem) {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			off := i * g.PartSize
			n := min(g.PartSize, size-off)
			etag, err := c.putSection(ctx, "PUT part "+strconv.FormatUint(i+1, 10), urls[i], p.data, int64(off), int64(n), &sent)
			if err == nil && etag == "" {
				err = &PresignedError{Op: "PUT part " + strconv.FormatUint(i+1, 10), URL: redactURL(urls[i]), Err: errors.New("no ETag in the answer")}
			}
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
				cancel()
				return
			}
			etags[i] = etag
		})
	}
	wg.Wait()
	p.sent += sent.Load()
	if first != nil {
		return nil, first
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return etags, nil
}

func acquireSlot(ctx context.Context, sem chan struct{}) bool {
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	if ctx.Err() != nil {
		<-sem
		return false
	}
	return true
}

// OpenURL GETs the compressed object at rawURL (a Pull answer's url,
// docs/protocol/cache.md §4.6). The first answer is awaited here, so an
// expired or refused URL fails at once and the caller falls back to the
// streamed pull; a connection that breaks later is resumed with Range
// from the bytes read. Checking the bytes against the cache's hashes is
// the caller's (as for OpenNar).
func (c *CacheClient) OpenURL(ctx context.Context, rawURL string, size *uint64) (io.ReadCloser, error) {
	u, err := presignedURL(rawURL)
	if err != nil {
		c.presignedEvent("get", "failed")
		return nil, err
	}
	g := &urlGet{c: c, ctx: ctx, u: u, started: time.Now(), size: -1}
	if size != nil {
		g.size = int64(*size)
	}
	if err := g.open(); err != nil {
		return nil, err
	}
	return g, nil
}

// urlGet is one presigned download: the current answer's body and where
// it stands in the object.
type urlGet struct {
	c       *CacheClient
	ctx     context.Context
	u       *url.URL
	started time.Time
	size    int64 // -1: unknown
	off     int64 // bytes handed to the reader
	resumes int

	body   io.ReadCloser
	cancel context.CancelFunc
	wd     *watchdog
	done   bool
	closed bool
}

// open (re)starts the GET at g.off, tried presignedTries times.
func (g *urlGet) open() error {
	var last error
	status := 0
	for try := 1; try <= presignedTries; try++ {
		if try > 1 {
			if err := g.c.retryWait(g.ctx, try); err != nil {
				return err
			}
		}
		code, err := g.openOnce()
		if err == nil {
			return nil
		}
		if g.ctx.Err() != nil {
			return g.ctx.Err()
		}
		last, status = err, code
		if !retryable(code, err) {
			break
		}
		g.c.presignedEvent("get", "retry")
		g.c.log().Info("presigned download failed; trying again", "url", redactURL(g.u), "offset", g.off, "try", try, "error", err)
	}
	g.c.presignedEvent("get", "failed")
	return &PresignedError{Op: "GET", URL: redactURL(g.u), Status: status, Err: last}
}

func (g *urlGet) openOnce() (int, error) {
	ctx, cancel := context.WithCancel(g.ctx)
	wd := newWatchdog(g.c.presignedIdle(), cancel)
	fail := func(code int, err error) (int, error) {
		wd.stop()
		cancel()
		return code, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.u.String(), nil)
	if err != nil {
		return fail(0, errors.New("cannot build the request"))
	}
	if g.off > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(g.off, 10)+"-")
	}
	resp, err := g.c.httpClient().Do(req)
	if err != nil {
		return fail(0, wd.explain(scrubError(err)))
	}
	skip := int64(0)
	switch {
	case resp.StatusCode == http.StatusOK:
		if resp.ContentLength >= 0 && g.size >= 0 && resp.ContentLength != g.size {
			resp.Body.Close()
			// Not retried: the object is not the one the cache describes.
			return fail(http.StatusConflict, fmt.Errorf("%d bytes, the cache says %d", resp.ContentLength, g.size))
		}
		skip = g.off // the store ignored the Range: skip what was read
	case resp.StatusCode == http.StatusPartialContent && g.off > 0:
		start, total, ok := contentRange(resp.Header.Get("Content-Range"))
		if !ok || start != g.off || (g.size >= 0 && total >= 0 && total != g.size) {
			resp.Body.Close()
			return fail(http.StatusConflict, fmt.Errorf("range answer %q for offset %d", resp.Header.Get("Content-Range"), g.off))
		}
	default:
		err := statusError(resp)
		resp.Body.Close()
		return fail(resp.StatusCode, err)
	}
	if skip > 0 {
		if _, err := io.CopyN(kickWriter{wd}, resp.Body, skip); err != nil {
			resp.Body.Close()
			return fail(0, wd.explain(scrubError(err)))
		}
	}
	g.body, g.cancel, g.wd = resp.Body, cancel, wd
	return resp.StatusCode, nil
}

// kickWriter discards what it is given, kicking a watchdog.
type kickWriter struct{ wd *watchdog }

func (k kickWriter) Write(p []byte) (int, error) {
	k.wd.kick()
	return len(p), nil
}

// contentRange reads "bytes start-end/total" (total -1 when "*").
func contentRange(h string) (start, total int64, ok bool) {
	rest, found := strings.CutPrefix(h, "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, tot, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	s, _, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	start, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	total = -1
	if tot != "*" {
		if total, err = strconv.ParseInt(tot, 10, 64); err != nil {
			return 0, 0, false
		}
	}
	return start, total, true
}

func (g *urlGet) closeBody() {
	if g.body != nil {
		g.body.Close()
		g.wd.stop()
		g.cancel()
		g.body = nil
	}
}

// Read returns the object's next bytes, resuming with Range when the
// connection breaks or ends short.
func (g *urlGet) Read(p []byte) (int, error) {
	if g.closed {
		return 0, errors.New("presigned GET: read after close")
	}
	for {
		if g.done {
			return 0, io.EOF
		}
		if g.body == nil {
			if g.resumes >= presignedResumes {
				return 0, &PresignedError{Op: "GET", URL: redactURL(g.u), Err: fmt.Errorf("resumed %d times", g.resumes)}
			}
			g.resumes++
			if err := g.open(); err != nil {
				return 0, err
			}
		}
		if g.size >= 0 && int64(len(p)) > g.size-g.off+1 {
			// One byte more than is left: a longer object is noticed.
			p = p[:g.size-g.off+1]
		}
		n, err := g.body.Read(p)
		if n > 0 {
			g.wd.kick()
			g.off += int64(n)
			if g.c.PresignedMoved != nil {
				g.c.PresignedMoved(true, n)
			}
		}
		if g.size >= 0 && g.off > g.size {
			g.closeBody()
			return 0, &PresignedError{Op: "GET", URL: redactURL(g.u), Err: fmt.Errorf("more than the %d bytes the cache says", g.size)}
		}
		switch {
		case err == nil:
			return n, nil
		case err == io.EOF && (g.size < 0 || g.off == g.size):
			g.closeBody()
			g.done = true
			g.c.presignedEvent("get", "ok")
			if g.c.Transferred != nil {
				g.c.Transferred(true, uint64(g.off), time.Since(g.started))
			}
			if n > 0 {
				return n, nil
			}
			return 0, io.EOF
		case g.ctx.Err() != nil:
			g.closeBody()
			return n, g.ctx.Err()
		}
		// Broken or short: resume from g.off on the next Read.
		err = g.wd.explain(scrubError(err))
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		g.c.log().Info("presigned download broke off; resuming", "url", redactURL(g.u), "offset", g.off, "error", err)
		g.c.presignedEvent("get", "resume")
		g.closeBody()
		if n > 0 {
			return n, nil
		}
	}
}

// Close ends the download.
func (g *urlGet) Close() error {
	g.closeBody()
	g.closed = true
	return nil
}

// presignedUpload runs a Put or Multipart grant's transfer and returns
// the metadata UploadFinished reports (Multipart's ETags in it). An
// UploadCommitted arriving meanwhile on ch (the server gave up on the
// request) stops the transfer and is returned instead.
func (c *CacheClient) presignedUpload(ctx context.Context, target wire.GrantTarget, p *packedNar, ch chan wire.ServerMessage) (*wire.NarUploadMetadata, *wire.UploadCommitted, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := make(chan struct{})
	watched := make(chan *wire.UploadCommitted, 1)
	go func() {
		// Only while the transfer runs: afterwards ch is awaitCommit's.
		defer close(watched)
		for {
			select {
			case m := <-ch:
				if m, ok := m.(*wire.UploadCommitted); ok {
					watched <- m
					cancel()
					return
				}
			case <-stop:
				return
			}
		}
	}()
	meta := p.meta
	var err error
	switch t := target.(type) {
	case *wire.GrantPut:
		err = c.uploadPut(ctx, t.URL, p)
	case *wire.PresignedMultipart:
		var etags []string
		if etags, err = c.uploadMultipart(ctx, t, p); err == nil {
			meta.Multipart = &wire.CompletedMultipart{UploadID: t.UploadID, ETags: etags}
		}
	}
	close(stop)
	if done := <-watched; done != nil {
		return nil, done, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return &meta, nil, nil
}
