package hetzner

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
)

// Labels the proxy puts on every server it creates.
const (
	// LabelTenant holds the tenant's ID; the one list per pass selects
	// servers by it.
	LabelTenant = "gradient-tenant"
	// LabelVM holds the server's VM usage row ID.
	LabelVM = "gradient-vm"
)

// NewClient is the official client for endpoint (empty: Hetzner's) with
// token. It does not retry on its own: the reconciler backs the tenant
// off instead, and counts every call.
func NewClient(endpoint, token string, httpClient *http.Client) *hcloud.Client {
	opts := []hcloud.ClientOption{
		hcloud.WithToken(token),
		hcloud.WithApplication("gradient-proxy", ""),
		hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0}),
	}
	if endpoint != "" {
		opts = append(opts, hcloud.WithEndpoint(endpoint))
	}
	if httpClient != nil {
		opts = append(opts, hcloud.WithHTTPClient(httpClient))
	}
	return hcloud.NewClient(opts...)
}

// Operations of the API calls metric.
const (
	opListServers  = "list_servers"
	opCreateServer = "create_server"
	opDeleteServer = "delete_server"
	opListImages   = "list_images"
)

// outcome classifies an API call's result for the metric and the
// backoff: retryable outcomes back the tenant off.
type outcome string

const (
	outcomeOK          outcome = "ok"
	outcomeNotFound    outcome = "not_found"
	outcomeRateLimited outcome = "rate_limited"
	outcomeServerError outcome = "server_error"
	outcomeClientError outcome = "client_error"
	outcomeNetwork     outcome = "network_error"
)

func classify(resp *hcloud.Response, err error) outcome {
	if err == nil {
		return outcomeOK
	}
	status := 0
	if resp != nil && resp.Response != nil {
		status = resp.StatusCode
	}
	switch {
	case status == http.StatusTooManyRequests || hcloud.IsError(err, hcloud.ErrorCodeRateLimitExceeded):
		return outcomeRateLimited
	case status >= 500:
		return outcomeServerError
	case status == http.StatusNotFound || hcloud.IsError(err, hcloud.ErrorCodeNotFound):
		return outcomeNotFound
	case status >= 400:
		return outcomeClientError
	default:
		return outcomeNetwork
	}
}

// cloud is the API as the reconciler calls it: every call counted and
// timed, and classified.
type cloud struct {
	c *hcloud.Client
	m *metrics
}

func (c *cloud) observe(op string, start time.Time, resp *hcloud.Response, err error) outcome {
	o := classify(resp, err)
	c.m.apiCalls.WithLabelValues(op, string(o)).Inc()
	c.m.apiLatency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	return o
}

// listServers lists every server labelled gradient-tenant, one request
// per page of 50.
func (c *cloud) listServers(ctx context.Context) ([]*hcloud.Server, outcome, error) {
	var all []*hcloud.Server
	opts := hcloud.ServerListOpts{ListOpts: hcloud.ListOpts{LabelSelector: LabelTenant, PerPage: 50, Page: 1}}
	for {
		start := time.Now()
		page, resp, err := c.c.Server.List(ctx, opts)
		if o := c.observe(opListServers, start, resp, err); err != nil {
			return nil, o, err
		}
		all = append(all, page...)
		if resp == nil || resp.Meta.Pagination == nil || resp.Meta.Pagination.NextPage == 0 || len(page) == 0 {
			return all, outcomeOK, nil
		}
		opts.Page = resp.Meta.Pagination.NextPage
	}
}

// newestSnapshot is the newest available snapshot matching selector for
// the architecture.
func (c *cloud) newestSnapshot(ctx context.Context, selector string, arch hcloud.Architecture) (*hcloud.Image, outcome, error) {
	start := time.Now()
	images, resp, err := c.c.Image.List(ctx, hcloud.ImageListOpts{
		ListOpts: hcloud.ListOpts{LabelSelector: selector, PerPage: 1},
		Type:     []hcloud.ImageType{hcloud.ImageTypeSnapshot}, Status: []hcloud.ImageStatus{hcloud.ImageStatusAvailable},
		Architecture: []hcloud.Architecture{arch}, Sort: []string{"created:desc"},
	})
	o := c.observe(opListImages, start, resp, err)
	if err != nil {
		return nil, o, err
	}
	if len(images) == 0 {
		return nil, outcomeClientError, errors.New("no available " + string(arch) + " snapshot is labelled " + selector)
	}
	return images[0], o, nil
}

func (c *cloud) createServer(ctx context.Context, opts hcloud.ServerCreateOpts) (*hcloud.Server, outcome, error) {
	start := time.Now()
	res, resp, err := c.c.Server.Create(ctx, opts)
	o := c.observe(opCreateServer, start, resp, err)
	if err != nil {
		return nil, o, err
	}
	if res.Server == nil || res.Server.ID <= 0 {
		return nil, outcomeClientError, errors.New("the API created no server")
	}
	return res.Server, o, nil
}

// deleteServer deletes the server; one already gone counts as deleted.
func (c *cloud) deleteServer(ctx context.Context, id int64) (outcome, error) {
	start := time.Now()
	_, resp, err := c.c.Server.DeleteWithResult(ctx, &hcloud.Server{ID: id})
	o := c.observe(opDeleteServer, start, resp, err)
	if o == outcomeNotFound {
		return o, nil
	}
	return o, err
}
