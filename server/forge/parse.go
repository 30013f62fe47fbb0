package forge

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"gradient.dev/gradient/gitsource"
)

// maxUserName bounds a user name taken from a delivery; every forge's
// limit is far lower (GitHub 39, GitLab 255).
const maxUserName = 255

// Parse reads a delivery Verify accepted. It validates what the CI will
// use — commits are full hex object ids (gitsource.ValidateCommit),
// numbers positive, branch names by git's rules, user names printable —
// and answers an error for a malformed delivery of an event it acts on;
// events and actions it does not act on are EventIgnored:
//   - GitHub (X-GitHub-Event): ping; push (branch deletions and tags
//     ignored); pull_request opened, reopened, synchronize, closed;
//     issue_comment created on a pull request (issue.pull_request set).
//   - Gitea and Forgejo (X-Gitea-Event or X-Forgejo-Event, with
//     X-Gitea-Event-Type / X-Forgejo-Event-Type telling a pull request's
//     label, assignee or milestone change from the pull request itself):
//     push (a push whose before equals its after is the settings page's
//     test delivery: EventPing); pull_request opened, reopened,
//     synchronized, closed; issue_comment created with is_pull.
//   - GitLab (X-Gitlab-Event): "Push Hook"; "Merge Request Hook" actions
//     open, reopen, update with oldrev (new commits; other updates are
//     edits), close and merge (both PRClosed); "Note Hook" on a
//     MergeRequest; "System Hook" is EventPing. A merge request's Author
//     is the user who acted (GitLab's payload names the author only by ID).
func Parse(k Kind, h http.Header, body []byte) (Event, error) {
	switch k {
	case GitHub:
		return parseGitHub(h.Get("X-GitHub-Event"), body)
	case Gitea:
		event, eventType := h.Get("X-Gitea-Event"), h.Get("X-Gitea-Event-Type")
		if event == "" {
			event, eventType = h.Get("X-Forgejo-Event"), h.Get("X-Forgejo-Event-Type")
		}
		return parseGitea(event, eventType, body)
	case GitLab:
		return parseGitLab(h.Get("X-Gitlab-Event"), body)
	}
	return Event{}, fmt.Errorf("forge: unknown kind %q", k)
}

// The payload shapes below hold only the fields Parse reads; GitHub and
// Gitea share most of them (Gitea's webhooks follow GitHub's).

type hubRepository struct {
	ID       int64  `json:"id"`
	FullName string `json:"full_name"`
}

type hubUser struct {
	Login    string `json:"login"`
	Username string `json:"username"` // Gitea sends both
}

type hubPush struct {
	Ref        string        `json:"ref"`
	Before     string        `json:"before"`
	After      string        `json:"after"`
	Deleted    bool          `json:"deleted"`
	Repository hubRepository `json:"repository"`
}

type hubBranch struct {
	Ref  string         `json:"ref"`
	SHA  string         `json:"sha"`
	Repo *hubRepository `json:"repo"`
}

type hubPullRequest struct {
	Action      string `json:"action"`
	Number      int64  `json:"number"`
	PullRequest *struct {
		Number int64     `json:"number"`
		User   hubUser   `json:"user"`
		Head   hubBranch `json:"head"`
		Base   hubBranch `json:"base"`
	} `json:"pull_request"`
	Repository hubRepository `json:"repository"`
}

type hubComment struct {
	Action string `json:"action"`
	IsPull bool   `json:"is_pull"` // Gitea
	Issue  *struct {
		Number      int64           `json:"number"`
		PullRequest json.RawMessage `json:"pull_request"`
	} `json:"issue"`
	Comment *struct {
		Body string  `json:"body"`
		User hubUser `json:"user"`
	} `json:"comment"`
	Repository hubRepository `json:"repository"`
}

type hubAny struct {
	Repository *hubRepository `json:"repository"`
}

func parseGitHub(event string, body []byte) (Event, error) {
	switch event {
	case "ping":
		var p hubAny
		if err := decode(body, &p); err != nil {
			return Event{}, err
		}
		ev := Event{Type: EventPing}
		if p.Repository != nil {
			ev.Repository = p.Repository.FullName
		}
		return ev, nil
	case "push":
		return parseHubPush(body, false)
	case "pull_request":
		return parseHubPullRequest(body, map[string]PRAction{
			"opened": PROpened, "reopened": PRReopened, "synchronize": PRSynchronized, "closed": PRClosed,
		})
	case "issue_comment":
		return parseHubComment(body, false)
	}
	return Event{Type: EventIgnored}, nil
}

func parseGitea(event, eventType string, body []byte) (Event, error) {
	switch event {
	case "push":
		return parseHubPush(body, true)
	case "pull_request":
		// The same event carries a pull request's label, assignee,
		// milestone and review-request changes; only the pull request
		// itself and its new commits (pull_request_sync) matter.
		if eventType != "" && eventType != "pull_request" && eventType != "pull_request_sync" {
			return Event{Type: EventIgnored}, nil
		}
		return parseHubPullRequest(body, map[string]PRAction{
			"opened": PROpened, "reopened": PRReopened, "synchronized": PRSynchronized, "closed": PRClosed,
		})
	case "issue_comment":
		if eventType != "" && eventType != "issue_comment" && eventType != "pull_request_comment" {
			return Event{Type: EventIgnored}, nil
		}
		return parseHubComment(body, true)
	}
	return Event{Type: EventIgnored}, nil
}

func parseHubPush(body []byte, gitea bool) (Event, error) {
	var p hubPush
	if err := decode(body, &p); err != nil {
		return Event{}, err
	}
	if err := checkRepository(p.Repository.FullName); err != nil {
		return Event{}, err
	}
	if gitea && p.Before != "" && p.Before == p.After {
		// Gitea's and Forgejo's "Test delivery" button: a push that moves
		// nothing (the default branch's head, or a zero id, on both sides).
		return Event{Type: EventPing, Repository: p.Repository.FullName}, nil
	}
	return pushEvent(p.Repository.FullName, p.Ref, p.After, p.Deleted)
}

// pushEvent reads a branch push; tags, other refs and deletions (a zero
// new head) are ignored.
func pushEvent(repo, ref, after string, deleted bool) (Event, error) {
	branch, ok := strings.CutPrefix(ref, "refs/heads/")
	if !ok || deleted || isZeroID(after) {
		return Event{Type: EventIgnored, Repository: repo}, nil
	}
	if err := gitsource.ValidateBranch(branch); err != nil {
		return Event{}, fmt.Errorf("forge: push: %w", err)
	}
	if err := gitsource.ValidateCommit(after); err != nil {
		return Event{}, fmt.Errorf("forge: push: %w", err)
	}
	return Event{Type: EventPush, Repository: repo, Push: &Push{Branch: branch, Commit: strings.ToLower(after)}}, nil
}

func parseHubPullRequest(body []byte, actions map[string]PRAction) (Event, error) {
	var p hubPullRequest
	if err := decode(body, &p); err != nil {
		return Event{}, err
	}
	action, ok := actions[p.Action]
	if !ok {
		return Event{Type: EventIgnored, Repository: p.Repository.FullName}, nil
	}
	if err := checkRepository(p.Repository.FullName); err != nil {
		return Event{}, err
	}
	pr := p.PullRequest
	if pr == nil {
		return Event{}, errors.New("forge: pull_request: no pull_request object")
	}
	number := p.Number
	if number == 0 {
		number = pr.Number
	}
	n, err := checkNumber(number)
	if err != nil {
		return Event{}, err
	}
	base := pr.Base.Repo
	if base == nil {
		base = &p.Repository
	}
	head := pr.Head.Repo
	fromFork := head == nil || !strings.EqualFold(head.FullName, base.FullName) ||
		head.ID != 0 && base.ID != 0 && head.ID != base.ID
	return pullRequestEvent(p.Repository.FullName, n, action, pr.Head.SHA, pr.Base.Ref, fromFork, pr.User.name())
}

func pullRequestEvent(repo string, number int, action PRAction, head, base string, fromFork bool, author string) (Event, error) {
	if err := gitsource.ValidateCommit(head); err != nil {
		return Event{}, fmt.Errorf("forge: pull request head: %w", err)
	}
	if err := gitsource.ValidateBranch(base); err != nil {
		return Event{}, fmt.Errorf("forge: pull request base: %w", err)
	}
	if err := checkUser(author); err != nil {
		return Event{}, err
	}
	return Event{Type: EventPullRequest, Repository: repo, PR: &PullRequest{
		Number: number, Action: action, HeadCommit: strings.ToLower(head), BaseBranch: base,
		FromFork: fromFork, Author: author,
	}}, nil
}

func parseHubComment(body []byte, gitea bool) (Event, error) {
	var p hubComment
	if err := decode(body, &p); err != nil {
		return Event{}, err
	}
	onPull := p.Issue != nil && len(p.Issue.PullRequest) > 0 && string(p.Issue.PullRequest) != "null"
	if gitea {
		onPull = onPull || p.IsPull
	}
	if p.Action != "created" || !onPull {
		return Event{Type: EventIgnored, Repository: p.Repository.FullName}, nil
	}
	if err := checkRepository(p.Repository.FullName); err != nil {
		return Event{}, err
	}
	if p.Comment == nil || p.Issue == nil {
		return Event{}, errors.New("forge: issue_comment: no comment or issue object")
	}
	return commentEvent(p.Repository.FullName, p.Issue.Number, p.Comment.Body, p.Comment.User.name())
}

func commentEvent(repo string, number int64, body, author string) (Event, error) {
	n, err := checkNumber(number)
	if err != nil {
		return Event{}, err
	}
	if err := checkUser(author); err != nil {
		return Event{}, err
	}
	if !utf8.ValidString(body) {
		return Event{}, errors.New("forge: comment body is not UTF-8")
	}
	return Event{Type: EventComment, Repository: repo, Comment: &Comment{PRNumber: n, Body: body, Author: author}}, nil
}

func (u hubUser) name() string {
	if u.Login != "" {
		return u.Login
	}
	return u.Username
}

// GitLab's payloads.

type labProject struct {
	ID                int64  `json:"id"`
	PathWithNamespace string `json:"path_with_namespace"`
}

type labUser struct {
	Username string `json:"username"`
}

type labPush struct {
	Ref         string     `json:"ref"`
	Before      string     `json:"before"`
	After       string     `json:"after"`
	CheckoutSHA *string    `json:"checkout_sha"`
	Project     labProject `json:"project"`
}

type labMergeRequest struct {
	User             labUser    `json:"user"`
	Project          labProject `json:"project"`
	ObjectAttributes *struct {
		IID             int64  `json:"iid"`
		Action          string `json:"action"`
		TargetBranch    string `json:"target_branch"`
		SourceProjectID int64  `json:"source_project_id"`
		TargetProjectID int64  `json:"target_project_id"`
		OldRev          string `json:"oldrev"`
		LastCommit      struct {
			ID string `json:"id"`
		} `json:"last_commit"`
	} `json:"object_attributes"`
}

type labNote struct {
	User             labUser    `json:"user"`
	Project          labProject `json:"project"`
	ObjectAttributes *struct {
		Note         string `json:"note"`
		NoteableType string `json:"noteable_type"`
		Action       string `json:"action"`
	} `json:"object_attributes"`
	MergeRequest *struct {
		IID int64 `json:"iid"`
	} `json:"merge_request"`
}

func parseGitLab(event string, body []byte) (Event, error) {
	switch event {
	case "System Hook":
		// A system hook pointed at a project's endpoint: acknowledged,
		// never acted on (it speaks for every project of the instance).
		return Event{Type: EventPing}, nil
	case "Push Hook":
		var p labPush
		if err := decode(body, &p); err != nil {
			return Event{}, err
		}
		repo := p.Project.PathWithNamespace
		if err := checkRepository(repo); err != nil {
			return Event{}, err
		}
		return pushEvent(repo, p.Ref, p.After, p.CheckoutSHA == nil && isZeroID(p.After))
	case "Merge Request Hook":
		var p labMergeRequest
		if err := decode(body, &p); err != nil {
			return Event{}, err
		}
		repo := p.Project.PathWithNamespace
		a := p.ObjectAttributes
		if a == nil {
			return Event{}, errors.New("forge: merge request: no object_attributes")
		}
		var action PRAction
		switch a.Action {
		case "open":
			action = PROpened
		case "reopen":
			action = PRReopened
		case "update":
			// An update without oldrev changed the title, labels or
			// description, not the commits.
			if a.OldRev == "" {
				return Event{Type: EventIgnored, Repository: repo}, nil
			}
			action = PRSynchronized
		case "close", "merge":
			action = PRClosed
		default:
			return Event{Type: EventIgnored, Repository: repo}, nil
		}
		if err := checkRepository(repo); err != nil {
			return Event{}, err
		}
		n, err := checkNumber(a.IID)
		if err != nil {
			return Event{}, err
		}
		if a.SourceProjectID <= 0 || a.TargetProjectID <= 0 {
			return Event{}, errors.New("forge: merge request: source or target project ID missing")
		}
		return pullRequestEvent(repo, n, action, a.LastCommit.ID, a.TargetBranch, a.SourceProjectID != a.TargetProjectID, p.User.Username)
	case "Note Hook":
		var p labNote
		if err := decode(body, &p); err != nil {
			return Event{}, err
		}
		repo := p.Project.PathWithNamespace
		a := p.ObjectAttributes
		// GitLab 16 and later say "create" or "update"; older ones send no
		// action, only for new notes.
		if a == nil || a.NoteableType != "MergeRequest" || p.MergeRequest == nil || a.Action != "" && a.Action != "create" {
			return Event{Type: EventIgnored, Repository: repo}, nil
		}
		if err := checkRepository(repo); err != nil {
			return Event{}, err
		}
		return commentEvent(repo, p.MergeRequest.IID, a.Note, p.User.Username)
	}
	return Event{Type: EventIgnored}, nil
}

func decode(body []byte, v any) error {
	if len(body) > MaxPayload {
		return fmt.Errorf("forge: payload larger than %d bytes", MaxPayload)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("forge: payload is not the expected JSON: %v", err)
	}
	return nil
}

func isZeroID(s string) bool {
	return s != "" && strings.Trim(s, "0") == ""
}

// checkRepository accepts the full name a delivery names (owner/name, or
// GitLab's group/sub/name), by the same rules as a Link's repository.
func checkRepository(repo string) error {
	if len(repo) > maxRepositoryLength {
		return errors.New("forge: the delivery's repository name is too long")
	}
	if err := validateRepository(GitLab, repo); err != nil {
		return fmt.Errorf("forge: the delivery's repository %q is not a repository path", repo)
	}
	return nil
}

// maxNumber bounds pull request numbers to what an int32 holds.
const maxNumber = 1<<31 - 1

func checkNumber(n int64) (int, error) {
	if n <= 0 || n > maxNumber {
		return 0, fmt.Errorf("forge: pull request number %d out of range", n)
	}
	return int(n), nil
}

func checkUser(name string) error {
	if name == "" {
		return errors.New("forge: the delivery names no user")
	}
	if len(name) > maxUserName {
		return errors.New("forge: user name too long")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c == 0x7f || c == '/' {
			return fmt.Errorf("forge: user name %q has a forbidden character", name)
		}
	}
	return nil
}
