package forge

// EventType is what a delivery asks of the CI.
type EventType int

// The event types Parse tells apart; everything else is EventIgnored.
const (
	EventIgnored EventType = iota
	EventPing
	EventPush
	EventPullRequest
	EventComment
)

func (t EventType) String() string {
	switch t {
	case EventIgnored:
		return "ignored"
	case EventPing:
		return "ping"
	case EventPush:
		return "push"
	case EventPullRequest:
		return "pull_request"
	case EventComment:
		return "comment"
	}
	return "unknown"
}

// Event is a parsed delivery. Exactly the field of its Type is set.
type Event struct {
	Type EventType
	// Repository is the full name as the forge sends it: "owner/name",
	// GitLab's path_with_namespace. Empty for pings that carry none.
	Repository string
	Push       *Push
	PR         *PullRequest
	Comment    *Comment
}

// Push is a branch's new head. Branch has no refs/heads/ prefix; Commit
// is the full object id. Deleted branches and tags are EventIgnored.
type Push struct {
	Branch string
	Commit string
}

// PRAction is what happened to a pull or merge request.
type PRAction int

// The pull request actions the CI acts on; others are EventIgnored.
const (
	PROpened PRAction = iota + 1
	PRSynchronized
	PRReopened
	PRClosed
)

func (a PRAction) String() string {
	switch a {
	case PROpened:
		return "opened"
	case PRSynchronized:
		return "synchronized"
	case PRReopened:
		return "reopened"
	case PRClosed:
		return "closed"
	}
	return "unknown"
}

// PullRequest is a pull (GitHub, Gitea) or merge (GitLab) request event.
type PullRequest struct {
	Number     int
	Action     PRAction
	HeadCommit string
	BaseBranch string
	// FromFork: the head repository is not the base repository (or was
	// deleted), so the code comes from someone without write access here.
	FromFork bool
	Author   string
}

// Comment is a new comment on a pull or merge request; comments on
// issues, commits and snippets are EventIgnored.
type Comment struct {
	PRNumber int
	Body     string
	Author   string
}
