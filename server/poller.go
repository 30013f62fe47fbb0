package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"gradient.dev/gradient/gitsource"
	"gradient.dev/gradient/storage"
)

// The branch poller: every Config.PollInterval it asks each project's
// repository for the head of the project's branch (git ls-remote) and
// starts an evaluation when the head differs from the commit of the
// project's latest evaluation (or the project has none). It needs a job
// loop that implements EvaluationControl; failures to reach a repository
// are logged at warn and retried on the next round, never fatal.

// EvaluationControl starts and cancels evaluations. The scheduler
// implements it besides JobLoop; the admin API and the branch poller use
// it through Config.Jobs, so the server does not import the scheduler.
type EvaluationControl interface {
	// StartEvaluation queues an evaluation (and its flake job).
	StartEvaluation(ctx context.Context, in storage.NewEvaluation) (storage.Evaluation, error)
	// CancelEvaluation cancels an evaluation and sends AbortJob to the
	// workers running its jobs. A finished evaluation is ErrConflict.
	CancelEvaluation(ctx context.Context, evalID string) error
}

// lsRemoteTimeout bounds one git ls-remote (below the CLI's 30 s request
// timeout, since the API resolves a branch head while the client waits).
const lsRemoteTimeout = 20 * time.Second

// pollConcurrency is how many repositories one poll round asks at once.
const pollConcurrency = 8

// evaluationControl is the job loop's EvaluationControl, if it has one.
func (s *Server) evaluationControl() (EvaluationControl, bool) {
	ctl, ok := s.cfg.Jobs.(EvaluationControl)
	return ctl, ok && ctl != nil
}

// startPoller starts the branch poller when Config.PollInterval is set.
func (s *Server) startPoller() {
	if s.cfg.PollInterval <= 0 {
		return
	}
	if _, ok := s.evaluationControl(); !ok {
		// A cache-only server (no job loop) has nothing to poll for.
		level := slog.LevelInfo
		if s.cfg.Jobs != nil {
			level = slog.LevelWarn
		}
		s.log.Log(s.ctx, level, "branch polling disabled: the job loop cannot start evaluations", "poll_interval", s.cfg.PollInterval)
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.runPoller(s.ctx, s.cfg.PollInterval)
	}()
}

// runPoller polls at once, then every interval until ctx ends. A round
// that outlasts the interval delays the next one (ticks are dropped).
func (s *Server) runPoller(ctx context.Context, interval time.Duration) {
	s.log.Info("branch poller started", "interval", interval)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s.pollBranches(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pollBranches runs one poll round over every project and returns the
// evaluations it started.
func (s *Server) pollBranches(ctx context.Context) []storage.Evaluation {
	ctl, ok := s.evaluationControl()
	if !ok {
		return nil
	}
	projects, err := s.db.ListProjects(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("branch poll: listing projects failed", "error", err)
		}
		return nil
	}
	names := s.projectNames(ctx, projects)
	var (
		mu      sync.Mutex
		started []storage.Evaluation
		wg      sync.WaitGroup
		slots   = make(chan struct{}, pollConcurrency)
	)
	for _, p := range projects {
		if p.Repository == "" || p.Branch == "" {
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return started
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			if ev, ok := s.pollProject(ctx, ctl, p, names[p.ID]); ok {
				mu.Lock()
				started = append(started, ev)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return started
}

// pollLeaseSlack is how much longer than one ls-remote a branch's poll
// lease lasts while the poll runs.
const pollLeaseSlack = 10 * time.Second

// pollProject starts an evaluation of p's branch head if it is new.
//
// With several server instances, a lease per project (instance.TakeFor)
// makes one instance poll the branch at a time and once per interval: it
// is taken for the poll's length and then held until 9/10 of the
// interval after the poll started, so the next round of any instance
// polls it again (the tenth spares ticks that come a little early).
func (s *Server) pollProject(ctx context.Context, ctl EvaluationControl, p storage.Project, name string) (storage.Evaluation, bool) {
	lease := "poll:" + p.ID
	start := time.Now()
	took, err := s.cfg.Instance.TakeFor(ctx, lease, lsRemoteTimeout+pollLeaseSlack)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("branch poll: taking the branch's poll lease failed", "project", name, "error", err)
		}
		return storage.Evaluation{}, false
	}
	if !took {
		s.metrics.branchPolls.WithLabelValues("elsewhere").Inc()
		return storage.Evaluation{}, false
	}
	defer func() {
		// After a stop too: the next instance polls when the interval is up.
		until := start.Add(s.cfg.PollInterval * 9 / 10)
		if _, err := s.cfg.Instance.HoldFor(context.WithoutCancel(ctx), lease, time.Until(until)); err != nil {
			s.log.Warn("branch poll: keeping the branch's poll lease failed", "project", name, "error", err)
		}
	}()
	s.metrics.branchPolls.WithLabelValues("polled").Inc()
	head, err := lsRemote(ctx, p.Repository, p.Branch, s.gitAccess(ctx, p, name))
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("branch poll: cannot read the branch head", "project", name, "project_id", p.ID,
				"repository", gitsource.Redact(p.Repository), "branch", p.Branch, "error", err)
		}
		return storage.Evaluation{}, false
	}
	// A pull request's evaluation is not the branch's; a push webhook's
	// is, so its commit is not evaluated again.
	latest, err := s.queue.LatestBranchEvaluation(ctx, p.ID)
	switch {
	case errors.Is(err, storage.ErrNotFound):
	case err != nil:
		if ctx.Err() == nil {
			s.log.Warn("branch poll: reading the latest evaluation failed", "project", name, "error", err)
		}
		return storage.Evaluation{}, false
	case strings.EqualFold(latest.Commit, head):
		return storage.Evaluation{}, false
	}
	in := p.EvaluationAt(head)
	in.Source = storage.SourcePoll
	ev, err := ctl.StartEvaluation(ctx, in)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("branch poll: starting an evaluation failed", "project", name, "commit", head, "error", err)
		}
		return storage.Evaluation{}, false
	}
	s.log.Info("branch poll: evaluation started", "project", name, "branch", p.Branch,
		"commit", head, "evaluation", ev.ID)
	return ev, true
}

// projectNames maps project IDs to TEAM/PROJECT for log lines (the ID
// when the teams cannot be read).
func (s *Server) projectNames(ctx context.Context, projects []storage.Project) map[string]string {
	teams := map[string]string{}
	if list, err := s.db.ListTeams(ctx); err == nil {
		for _, t := range list {
			teams[t.ID] = t.Name
		}
	}
	names := make(map[string]string, len(projects))
	for _, p := range projects {
		if team, ok := teams[p.TeamID]; ok {
			names[p.ID] = team + "/" + p.Name
		} else {
			names[p.ID] = p.ID
		}
	}
	return names
}

// gitAccess is how a poll reaches a project's repository: with its deploy
// key when it has one (else as the server's own user).
type gitAccess struct {
	sshKey     []byte
	ssh        string // the ssh program ("" = ssh)
	allowLocal bool   // Config.AllowLocalRepositories
}

func (s *Server) gitAccess(ctx context.Context, p storage.Project, name string) gitAccess {
	access := gitAccess{ssh: s.cfg.SSH, allowLocal: s.cfg.AllowLocalRepositories}
	if s.deployKeys == nil {
		return access
	}
	key, err := s.deployKeys.Private(ctx, p.ID)
	if err != nil {
		s.log.Warn("branch poll: the project's deploy key is not used", "project", name, "error", err)
	}
	access.sshKey = key
	return access
}

// BranchHead is the commit at the head of p's branch, for the admin API
// (admin.BranchHeads).
func (s *Server) BranchHead(ctx context.Context, p storage.Project) (string, bool, error) {
	commit, err := lsRemote(ctx, p.Repository, p.Branch, s.gitAccess(ctx, p, p.Name))
	return commit, errors.Is(err, errBranchMissing), err
}

// errBranchMissing: the repository answered but has no such branch.
var errBranchMissing = errors.New("no such branch")

// lsRemote returns the commit at the head of branch in repository, with
// `git ls-remote` (bounded by lsRemoteTimeout, never prompting for
// credentials; over SSH with access's key when it has one). A repository
// without the branch is errBranchMissing.
func lsRemote(ctx context.Context, repository, branch string, access gitAccess) (string, error) {
	// Projects stored before the API checked them are checked here.
	if err := gitsource.ValidateRepositoryURL(repository, access.allowLocal); err != nil {
		return "", err
	}
	if err := gitsource.ValidateBranch(branch); err != nil {
		return "", err
	}
	remote := gitsource.Remote(repository)
	ref := "refs/heads/" + branch
	ctx, cancel := context.WithTimeout(ctx, lsRemoteTimeout)
	defer cancel()
	args := append(gitsource.ConfigArgs(access.allowLocal), "ls-remote", "--end-of-options", remote, ref)
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GCM_INTERACTIVE=never")
	ssh := access.ssh
	if ssh == "" {
		ssh = "ssh"
	}
	switch {
	case len(access.sshKey) > 0:
		// The key lives in a file of its own only while git runs.
		dir, err := os.MkdirTemp("", "gradient-poll-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(dir)
		keyFile := filepath.Join(dir, "deploy-key")
		if err := os.WriteFile(keyFile, access.sshKey, 0o600); err != nil {
			return "", fmt.Errorf("writing the deploy key: %w", err)
		}
		// As the worker's fetch does (nix.FetchFlake): the host's key is
		// not checked, the server may never have met the host.
		cmd.Env = append(cmd.Env, "GIT_SSH_COMMAND="+ssh+" -i '"+keyFile+"' -o IdentitiesOnly=yes"+
			" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes")
	case os.Getenv("GIT_SSH_COMMAND") == "":
		cmd.Env = append(cmd.Env, "GIT_SSH_COMMAND="+ssh+" -o BatchMode=yes")
	}
	cmd.WaitDelay = time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("git ls-remote %s: no answer within %s", gitsource.Redact(repository), lsRemoteTimeout)
		}
		msg := strings.TrimSpace(stderr.String())
		msg = strings.ReplaceAll(msg, remote, gitsource.Redact(remote))
		if len(msg) > 500 {
			msg = msg[:500] + "…"
		}
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("git ls-remote %s: %s", gitsource.Redact(repository), msg)
	}
	for line := range strings.Lines(stdout.String()) {
		sha, name, ok := strings.Cut(strings.TrimSpace(line), "\t")
		if ok && name == ref && gitsource.ValidateCommit(sha) == nil {
			return strings.ToLower(sha), nil
		}
	}
	return "", fmt.Errorf("%w %q in %s", errBranchMissing, branch, gitsource.Redact(repository))
}
