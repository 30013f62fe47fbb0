// Package forgehook serves the forges' webhooks:
//
//	POST /api/v1/forge/{kind}/{project}   kind github, gitea (forgejo), gitlab;
//	                                      project its UUID or TEAM/PROJECT
//
// The path needs no admin token: each delivery is verified with the
// project's webhook secret before anything else is done with it. A bad or
// missing signature (or a project without a link of that kind, which
// answers the same) is 401 and counts against the address's failed
// authentications (internal/authgate), so a flood gets 429. A delivery ID
// seen before is 200 and nothing new. The work of a delivery is a few
// database writes done before answering (evaluations are created at
// once); only a comment's approval, which asks the forge whether its
// author may write, runs on a bounded queue after the answer.
package forgehook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/internal/authgate"
	"gradient.dev/gradient/internal/jsonapi"
	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/server/forgelink"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
)

// Evaluations is what a delivery does to evaluations: the job loop.
type Evaluations interface {
	StartEvaluation(ctx context.Context, in storage.NewEvaluation) (storage.Evaluation, error)
	CancelEvaluation(ctx context.Context, evalID string) error
	ApproveEvaluation(ctx context.Context, evalID string) error
}

// ApproveCommand is the comment that approves a pull request's waiting
// evaluations, from a user the forge says may write to the repository.
const ApproveCommand = "/gradient approve"

// queueSize bounds the approvals waiting for their forge check.
const queueSize = 64

// Config is the webhook endpoints' configuration.
type Config struct {
	DB          *storage.DB
	Links       *forgelink.Links
	Evaluations Evaluations
	// Gate counts bad signatures per address; nil counts none.
	Gate    *authgate.Gate
	Logger  *slog.Logger
	Metrics prometheus.Registerer
	// Changed is called after a delivery queued statuses (the poster's
	// nudge); nil calls nothing.
	Changed func()
}

// Hooks serves the webhook endpoints.
type Hooks struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	queue   chan approval
	jobs    *jobqueue.Queue // pull requests' evaluations
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

type approval struct {
	projectID string
	comment   forge.Comment
}

// New makes the endpoints and starts the approvals' goroutine; Close
// stops it.
func New(cfg Config) *Hooks {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Changed == nil {
		cfg.Changed = func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Hooks{cfg: cfg, log: cfg.Logger, metrics: newMetrics(cfg.Metrics), queue: make(chan approval, queueSize),
		jobs: jobqueue.New(cfg.DB), ctx: ctx, cancel: cancel}
	h.wg.Add(1)
	go h.runApprovals()
	return h
}

// Close stops the approvals' goroutine (queued ones are dropped: the
// commenter may comment again).
func (h *Hooks) Close() {
	h.cancel()
	h.wg.Wait()
}

// Mount mounts the endpoints on mux (more specific than the admin API's
// /api/v1/, so they are reached without its token).
func (h *Hooks) Mount(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/v1/forge/{kind}/{project...}", h.serve)
}

func answer(w http.ResponseWriter, status int, msg string) { jsonapi.WriteError(w, status, msg) }

func ok(w http.ResponseWriter, what string) {
	jsonapi.Write(w, http.StatusOK, map[string]string{"result": what})
}

func (h *Hooks) serve(w http.ResponseWriter, r *http.Request) {
	kind, err := forge.ParseKind(r.PathValue("kind"))
	if err != nil {
		answer(w, http.StatusNotFound, "no such forge kind")
		return
	}
	if h.cfg.Gate.HeldBack(w, r, answer) {
		h.metrics.refused(kind, "rate_limited")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, forge.MaxPayload))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			h.metrics.refused(kind, "too_large")
			answer(w, http.StatusRequestEntityTooLarge, "delivery larger than 1 MiB")
			return
		}
		h.metrics.refused(kind, "read")
		answer(w, http.StatusBadRequest, "reading the delivery failed")
		return
	}
	ctx := r.Context()
	p, link, secret := h.lookup(ctx, kind, r.PathValue("project"))
	if secret == nil || forge.Verify(kind, secret, r.Header, body) != nil {
		clear(secret)
		h.cfg.Gate.Failed(r, "forge webhook signature")
		h.metrics.refused(kind, "signature")
		answer(w, http.StatusUnauthorized, "bad or missing webhook signature")
		return
	}
	clear(secret)
	ev, err := forge.Parse(kind, r.Header, body)
	if err != nil {
		h.metrics.refused(kind, "malformed")
		h.log.Warn("forge webhook: malformed delivery", "kind", kind, "project_id", p.ID, "error", err)
		answer(w, http.StatusBadRequest, "malformed delivery")
		return
	}
	id := forge.DeliveryID(kind, r.Header)
	if id == "" {
		sum := sha256.Sum256(body)
		id = "sha256:" + hex.EncodeToString(sum[:])
	}
	fresh, err := h.cfg.DB.RecordForgeDelivery(ctx, p.ID, id)
	if err != nil {
		h.log.Error("forge webhook: recording the delivery failed", "project_id", p.ID, "error", err)
		answer(w, http.StatusInternalServerError, "recording the delivery failed")
		return
	}
	if !fresh {
		h.metrics.received(kind, "duplicate")
		ok(w, "duplicate delivery")
		return
	}
	if ev.Type != forge.EventPing && ev.Type != forge.EventIgnored && !strings.EqualFold(ev.Repository, link.Repository) {
		h.metrics.received(kind, "other_repository")
		h.log.Warn("forge webhook: delivery of another repository ignored", "project_id", p.ID,
			"repository", ev.Repository, "linked", link.Repository)
		ok(w, "ignored: not the linked repository")
		return
	}
	status, result := h.handle(ctx, p, link, ev)
	h.metrics.received(kind, result)
	if status != http.StatusOK {
		// Failed on our side: the forge's retry of it must count.
		if err := h.cfg.DB.ForgetForgeDelivery(context.WithoutCancel(ctx), p.ID, id); err != nil {
			h.log.Warn("forge webhook: forgetting a failed delivery failed", "project_id", p.ID, "error", err)
		}
		answer(w, status, result)
		return
	}
	ok(w, result)
}

// lookup finds the project the URL names, its link and its webhook
// secret; a nil secret when any is missing or of another kind (the
// caller answers all of them alike, so the endpoint tells nobody which
// projects exist).
func (h *Hooks) lookup(ctx context.Context, kind forge.Kind, ref string) (storage.Project, storage.ForgeLink, []byte) {
	p, err := h.project(ctx, ref)
	if err != nil {
		return p, storage.ForgeLink{}, nil
	}
	link, err := h.cfg.DB.ForgeLink(ctx, p.ID)
	if err != nil || link.Kind != string(kind) {
		return p, link, nil
	}
	secret, err := h.cfg.Links.WebhookSecret(link)
	if err != nil {
		h.log.Error("forge webhook: opening the webhook secret failed", "project_id", p.ID, "error", err)
		return p, link, nil
	}
	return p, link, secret
}

// project resolves a UUID or TEAM/PROJECT.
func (h *Hooks) project(ctx context.Context, ref string) (storage.Project, error) {
	if team, name, ok := strings.Cut(ref, "/"); ok {
		t, err := h.cfg.DB.TeamByName(ctx, team)
		if err != nil {
			return storage.Project{}, err
		}
		return h.cfg.DB.ProjectByName(ctx, t.ID, name)
	}
	return h.cfg.DB.Project(ctx, ref)
}

// handle acts on a verified, new delivery and returns the answer's
// status and what it did (also the metrics' result label).
func (h *Hooks) handle(ctx context.Context, p storage.Project, link storage.ForgeLink, ev forge.Event) (int, string) {
	switch ev.Type {
	case forge.EventPing:
		return http.StatusOK, "ping"
	case forge.EventPush:
		if ev.Push.Branch != p.Branch {
			return http.StatusOK, "ignored_branch"
		}
		in := p.EvaluationAt(ev.Push.Commit)
		in.Source = storage.SourcePush
		return h.start(ctx, p, in, "push")
	case forge.EventPullRequest:
		return h.pullRequest(ctx, p, link, ev.PR)
	case forge.EventComment:
		if !isApproveCommand(ev.Comment.Body) {
			return http.StatusOK, "ignored_comment"
		}
		select {
		case h.queue <- approval{projectID: p.ID, comment: *ev.Comment}:
			return http.StatusOK, "approval_queued"
		default:
			h.log.Warn("forge webhook: approval queue full, comment dropped", "project_id", p.ID, "pr", ev.Comment.PRNumber)
			return http.StatusServiceUnavailable, "busy"
		}
	}
	return http.StatusOK, "ignored"
}

func (h *Hooks) start(ctx context.Context, p storage.Project, in storage.NewEvaluation, what string) (int, string) {
	ev, err := h.cfg.Evaluations.StartEvaluation(ctx, in)
	if err != nil {
		h.log.Error("forge webhook: starting an evaluation failed", "project_id", p.ID, "commit", in.Commit, "error", err)
		return http.StatusInternalServerError, "starting the evaluation failed"
	}
	h.cfg.Changed()
	h.log.Info("forge webhook: evaluation started", "project_id", p.ID, "source", what, "commit", in.Commit,
		"pr", in.PRNumber, "evaluation", ev.ID, "awaiting_approval", in.AwaitApproval)
	if in.AwaitApproval {
		return http.StatusOK, "waiting_for_approval"
	}
	return http.StatusOK, what
}

// pullRequest evaluates a pull request's new head (cancelling its older
// heads' evaluations) or cancels them when it closes.
func (h *Hooks) pullRequest(ctx context.Context, p storage.Project, link storage.ForgeLink, pr *forge.PullRequest) (int, string) {
	open, err := h.jobs.PullRequestEvaluations(ctx, p.ID, pr.Number)
	if err != nil {
		h.log.Error("forge webhook: reading the pull request's evaluations failed", "project_id", p.ID, "error", err)
		return http.StatusInternalServerError, "reading evaluations failed"
	}
	if pr.Action == forge.PRClosed {
		h.cancelOthers(ctx, open, "")
		return http.StatusOK, "pr_closed"
	}
	if link.Trust == storage.ForgeTrustNone {
		return http.StatusOK, "ignored_untrusted"
	}
	h.cancelOthers(ctx, open, pr.HeadCommit)
	for _, e := range open {
		if strings.EqualFold(e.Commit, pr.HeadCommit) {
			return http.StatusOK, "already_evaluating"
		}
	}
	in := p.EvaluationAt(pr.HeadCommit)
	in.Source, in.PRNumber, in.TargetBranch = storage.SourcePR, pr.Number, pr.BaseBranch
	in.AwaitApproval = pr.FromFork && link.Trust != storage.ForgeTrustAll
	return h.start(ctx, p, in, "pr")
}

// cancelOthers cancels the evaluations except those of commit keep.
func (h *Hooks) cancelOthers(ctx context.Context, evals []storage.Evaluation, keep string) {
	for _, e := range evals {
		if keep != "" && strings.EqualFold(e.Commit, keep) {
			continue
		}
		if err := h.cfg.Evaluations.CancelEvaluation(ctx, e.ID); err != nil && !errors.Is(err, storage.ErrConflict) {
			h.log.Warn("forge webhook: cancelling an older evaluation failed", "evaluation", e.ID, "error", err)
			continue
		}
		h.log.Info("forge webhook: evaluation cancelled", "evaluation", e.ID, "pr", e.PRNumber, "commit", e.Commit)
	}
	if len(evals) > 0 {
		h.cfg.Changed()
	}
}

// isApproveCommand: the comment's first line is the command.
func isApproveCommand(body string) bool {
	first, _, _ := strings.Cut(strings.TrimSpace(body), "\n")
	return strings.TrimSpace(first) == ApproveCommand
}

func (h *Hooks) runApprovals() {
	defer h.wg.Done()
	for {
		select {
		case <-h.ctx.Done():
			return
		case a := <-h.queue:
			h.approve(h.ctx, a)
		}
	}
}

// approve approves the pull request's waiting evaluations when the
// forge says the comment's author may write to the repository.
func (h *Hooks) approve(ctx context.Context, a approval) {
	client, _, err := h.cfg.Links.Client(ctx, a.projectID)
	if err != nil {
		h.log.Warn("forge webhook: no forge client for an approval", "project_id", a.projectID, "error", err)
		return
	}
	can, err := client.CanWrite(ctx, a.comment.Author)
	if err != nil {
		h.log.Warn("forge webhook: asking the forge about the commenter failed", "project_id", a.projectID,
			"user", a.comment.Author, "error", err)
		return
	}
	if !can {
		h.log.Info("forge webhook: approval by a user without write access ignored", "project_id", a.projectID,
			"user", a.comment.Author, "pr", a.comment.PRNumber)
		h.metrics.approvals.WithLabelValues("refused").Inc()
		return
	}
	evals, err := h.jobs.PullRequestEvaluations(ctx, a.projectID, a.comment.PRNumber)
	if err != nil {
		h.log.Warn("forge webhook: reading the pull request's evaluations failed", "error", err)
		return
	}
	for _, e := range evals {
		if e.Status != storage.EvaluationWaiting {
			continue
		}
		if err := h.cfg.Evaluations.ApproveEvaluation(ctx, e.ID); err != nil {
			h.log.Warn("forge webhook: approving failed", "evaluation", e.ID, "error", err)
			continue
		}
		h.metrics.approvals.WithLabelValues("approved").Inc()
		h.log.Info("forge webhook: evaluation approved by comment", "evaluation", e.ID, "user", a.comment.Author,
			"pr", a.comment.PRNumber)
	}
	h.cfg.Changed()
}
