package admin

import (
	"context"
	"errors"
	"net/http"
	"time"

	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/server/forgelink"
	"gradient.dev/gradient/storage"
)

// Forge links in the admin API (mounted by routes in admin.go):
//
//	PUT    /api/v1/projects/{project}/forge                {kind, api_url?, repository, token? | app_id + app_private_key,
//	                                                        trust?, per_build_statuses?} → the link, without secrets
//	GET    /api/v1/projects/{project}/forge                the link, without secrets, with the webhook URL
//	POST   /api/v1/projects/{project}/forge/test           can the credentials read the repository and post a status?
//	DELETE /api/v1/projects/{project}/forge
//	POST   /api/v1/projects/{project}/forge/webhook-secret a new webhook secret → secret (once) and webhook URL
//	POST   /api/v1/evaluations/{id}/approve                a pull request's evaluation waiting for approval runs
//
// Credentials and the webhook secret are sealed at rest (they need the
// server's --dial-key-file) and never appear in an answer or a log, but
// for a new webhook secret, once.

// Forges seals and opens projects' forge links (forgelink.Links).
type Forges interface {
	Set(ctx context.Context, p storage.Project, s forgelink.Settings) error
	Client(ctx context.Context, projectID string) (forge.Client, storage.ForgeLink, error)
	Remove(ctx context.Context, projectID string) error
	RotateWebhookSecret(ctx context.Context, projectID string) (string, error)
}

// Approver lets an evaluation waiting for approval run (the job loop).
type Approver interface {
	ApproveEvaluation(ctx context.Context, evalID string) error
}

func (a *API) forgeRoutes(mux *http.ServeMux) {
	mux.HandleFunc("PUT /api/v1/projects/{project}/forge", a.handle(a.setForge))
	mux.HandleFunc("GET /api/v1/projects/{project}/forge", a.handle(a.showForge))
	mux.HandleFunc("POST /api/v1/projects/{project}/forge/test", a.handle(a.testForge))
	mux.HandleFunc("DELETE /api/v1/projects/{project}/forge", a.handle(a.removeForge))
	mux.HandleFunc("POST /api/v1/projects/{project}/forge/webhook-secret", a.handle(a.rotateWebhookSecret))
	mux.HandleFunc("POST /api/v1/evaluations/{id}/approve", a.handle(a.approveEvaluation))
}

// ForgeRequest sets a project's forge link: a token, or a GitHub App's ID
// and private key (PEM).
type ForgeRequest struct {
	Kind             string `json:"kind"`
	APIURL           string `json:"api_url,omitempty"`
	Repository       string `json:"repository"`
	Token            string `json:"token,omitempty"`
	AppID            int64  `json:"app_id,omitempty"`
	AppPrivateKey    string `json:"app_private_key,omitempty"`
	Trust            string `json:"trust,omitempty"`
	PerBuildStatuses bool   `json:"per_build_statuses,omitempty"`
}

// ForgeView is a project's forge link without its secrets.
type ForgeView struct {
	Project          string    `json:"project"`
	Kind             string    `json:"kind"`
	APIURL           string    `json:"api_url"`
	Repository       string    `json:"repository"`
	Credential       string    `json:"credential"` // "token" or "github-app"
	AppID            int64     `json:"app_id,omitempty"`
	Trust            string    `json:"trust"`
	PerBuildStatuses bool      `json:"per_build_statuses"`
	StatusContext    string    `json:"status_context"`
	WebhookSecretSet bool      `json:"webhook_secret_set"`
	WebhookURL       string    `json:"webhook_url"`
	UpdatedAt        time.Time `json:"updated_at"`
}

// WebhookSecretView answers a new webhook secret, shown once.
type WebhookSecretView struct {
	Project    string `json:"project"`
	Secret     string `json:"secret"`
	WebhookURL string `json:"webhook_url"`
}

// ForgeTestView answers a test of the link.
type ForgeTestView struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

func (a *API) forges(w http.ResponseWriter) (Forges, bool) {
	if a.cfg.Forges == nil {
		writeError(w, http.StatusServiceUnavailable, "forge links are not available on this server")
		return nil, false
	}
	return a.cfg.Forges, true
}

// webhookURL is where the forge sends deliveries for the project.
func (a *API) webhookURL(kind, project string) string {
	return a.cfg.ExternalURL + "/api/v1/forge/" + kind + "/" + project
}

func (a *API) viewForge(ctx context.Context, p storage.Project, l storage.ForgeLink) ForgeView {
	name := a.projectName(ctx, p)
	v := ForgeView{
		Project: name, Kind: l.Kind, APIURL: l.APIURL, Repository: l.Repository, Credential: "token",
		AppID: l.AppID, Trust: string(l.Trust), PerBuildStatuses: l.PerBuildStatuses, StatusContext: l.StatusContext,
		WebhookSecretSet: len(l.WebhookSecretSealed) > 0, WebhookURL: a.webhookURL(l.Kind, name), UpdatedAt: l.UpdatedAt,
	}
	if l.AppID > 0 {
		v.Credential = "github-app"
	}
	return v
}

func (a *API) setForge(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	forges, ok := a.forges(w)
	if !ok {
		return nil
	}
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	var req ForgeRequest
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	kind, err := forge.ParseKind(req.Kind)
	if err != nil {
		return invalidf("%v", err)
	}
	link := forge.Link{Kind: kind, APIURL: req.APIURL, Repository: req.Repository, Token: req.Token}
	if link.APIURL == "" {
		link.APIURL = forge.DefaultAPIURL(kind)
	}
	if req.AppID != 0 || req.AppPrivateKey != "" {
		link.App = &forge.GitHubApp{AppID: req.AppID, PrivateKeyPEM: []byte(req.AppPrivateKey)}
	}
	trust := storage.ForgeTrust(req.Trust)
	if trust != "" && !trust.Valid() {
		return invalidf("trust %q: approve, all or none", req.Trust)
	}
	if err := forges.Set(ctx, p, forgelink.Settings{Link: link, Trust: trust, PerBuildStatuses: req.PerBuildStatuses}); err != nil {
		return err
	}
	l, err := a.db.ForgeLink(ctx, p.ID)
	if err != nil {
		return err
	}
	v := a.viewForge(ctx, p, l)
	a.log.Info("admin: forge link set", "project", v.Project, "kind", v.Kind, "repository", v.Repository, "credential", v.Credential)
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (a *API) showForge(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	l, err := a.db.ForgeLink(ctx, p.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, a.viewForge(ctx, p, l))
	return nil
}

func (a *API) testForge(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	forges, ok := a.forges(w)
	if !ok {
		return nil
	}
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	client, _, err := forges.Client(ctx, p.ID)
	if err != nil {
		return err
	}
	if err := client.Check(ctx); err != nil {
		writeJSON(w, http.StatusOK, ForgeTestView{Error: err.Error()})
		return nil
	}
	writeJSON(w, http.StatusOK, ForgeTestView{OK: true})
	return nil
}

func (a *API) removeForge(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	forges, ok := a.forges(w)
	if !ok {
		return nil
	}
	p, err := a.project(ctx, r.PathValue("project"))
	if err == nil {
		err = forges.Remove(ctx, p.ID)
	}
	if err != nil {
		return err
	}
	a.log.Info("admin: forge link removed", "project_id", p.ID)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) rotateWebhookSecret(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	forges, ok := a.forges(w)
	if !ok {
		return nil
	}
	p, err := a.project(ctx, r.PathValue("project"))
	if err != nil {
		return err
	}
	secret, err := forges.RotateWebhookSecret(ctx, p.ID)
	if err != nil {
		return err
	}
	l, err := a.db.ForgeLink(ctx, p.ID)
	if err != nil {
		return err
	}
	name := a.projectName(ctx, p)
	a.log.Info("admin: webhook secret generated", "project", name)
	writeJSON(w, http.StatusOK, WebhookSecretView{Project: name, Secret: secret, WebhookURL: a.webhookURL(l.Kind, name)})
	return nil
}

func (a *API) approveEvaluation(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	e, err := a.queue.Evaluation(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	approver, ok := a.cfg.Evaluations.(Approver)
	if !ok || approver == nil {
		writeError(w, http.StatusServiceUnavailable, "this server cannot run evaluations")
		return nil
	}
	if err := approver.ApproveEvaluation(ctx, e.ID); err != nil {
		if errors.Is(err, storage.ErrConflict) {
			writeError(w, http.StatusConflict, "evaluation "+e.ID+" is "+string(e.Status)+", not waiting for approval")
			return nil
		}
		return err
	}
	if a.cfg.StatusesChanged != nil {
		a.cfg.StatusesChanged()
	}
	if e, err = a.queue.Evaluation(ctx, e.ID); err != nil {
		return err
	}
	a.log.Info("admin: evaluation approved", "evaluation", e.ID, "pr", e.PRNumber)
	writeJSON(w, http.StatusOK, viewEvaluation(e, a.projectNameByID(ctx, e.ProjectID)))
	return nil
}
