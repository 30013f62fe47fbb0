package forge

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// headersFor are the event headers a forge sends with a delivery.
func headersFor(k Kind, event, eventType string) http.Header {
	h := http.Header{}
	switch k {
	case GitHub:
		h.Set("X-GitHub-Event", event)
	case Gitea:
		h.Set("X-Gitea-Event", event)
		if eventType != "" {
			h.Set("X-Gitea-Event-Type", eventType)
		}
	case GitLab:
		h.Set("X-Gitlab-Event", event)
	}
	return h
}

func TestParse(t *testing.T) {
	const (
		ghRepo = "Codertocat/Hello-World"
		gtRepo = "gitea/webhooks"
		glRepo = "mike/diaspora"
		ghHead = "ec26c3e57ca3a959ca5aad62de7213c562f8c821"
		gtHead = "2a6bd1a1cdb3a5c2b3c9a14dc45e26a6d1f5a1a7"
		glHead = "da1560886d4f094c3e6c9ef40349f7d38b5d27d7"
	)
	ignored := func(repo string) Event { return Event{Type: EventIgnored, Repository: repo} }
	tests := []struct {
		kind             Kind
		file             string
		event, eventType string
		want             Event
		wantErr          string
	}{
		// GitHub
		{kind: GitHub, file: "github/ping.json", event: "ping", want: Event{Type: EventPing, Repository: ghRepo}},
		{kind: GitHub, file: "github/push.json", event: "push", want: Event{Type: EventPush, Repository: ghRepo,
			Push: &Push{Branch: "main", Commit: "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"}}},
		{kind: GitHub, file: "github/push_delete.json", event: "push", want: ignored(ghRepo)},
		{kind: GitHub, file: "github/push_tag.json", event: "push", want: ignored(ghRepo)},
		{kind: GitHub, file: "github/push_bad_branch.json", event: "push", wantErr: "starts with '-'"},
		{kind: GitHub, file: "github/pull_request_opened.json", event: "pull_request", want: Event{Type: EventPullRequest, Repository: ghRepo,
			PR: &PullRequest{Number: 2, Action: PROpened, HeadCommit: ghHead, BaseBranch: "main", Author: "Codertocat"}}},
		{kind: GitHub, file: "github/pull_request_reopened.json", event: "pull_request", want: Event{Type: EventPullRequest, Repository: ghRepo,
			PR: &PullRequest{Number: 2, Action: PRReopened, HeadCommit: ghHead, BaseBranch: "main", Author: "Codertocat"}}},
		{kind: GitHub, file: "github/pull_request_synchronize_fork.json", event: "pull_request", want: Event{Type: EventPullRequest, Repository: ghRepo,
			PR: &PullRequest{Number: 7, Action: PRSynchronized, HeadCommit: "34c5c7793cb3b279e22454cb6750c80560547b3a", BaseBranch: "release/2.x", FromFork: true, Author: "octo-fork"}}},
		{kind: GitHub, file: "github/pull_request_deleted_fork.json", event: "pull_request", want: Event{Type: EventPullRequest, Repository: ghRepo,
			PR: &PullRequest{Number: 9, Action: PROpened, HeadCommit: "34c5c7793cb3b279e22454cb6750c80560547b3a", BaseBranch: "main", FromFork: true, Author: "octo-fork"}}},
		{kind: GitHub, file: "github/pull_request_closed.json", event: "pull_request", want: Event{Type: EventPullRequest, Repository: ghRepo,
			PR: &PullRequest{Number: 2, Action: PRClosed, HeadCommit: ghHead, BaseBranch: "main", Author: "Codertocat"}}},
		{kind: GitHub, file: "github/pull_request_labeled.json", event: "pull_request", want: ignored(ghRepo)},
		{kind: GitHub, file: "github/pull_request_short_sha.json", event: "pull_request", wantErr: "not a full"},
		{kind: GitHub, file: "github/pull_request_zero_number.json", event: "pull_request", wantErr: "out of range"},
		{kind: GitHub, file: "github/issue_comment_pr.json", event: "issue_comment", want: Event{Type: EventComment, Repository: ghRepo,
			Comment: &Comment{PRNumber: 1, Body: "/gradient approve", Author: "Codertocat"}}},
		{kind: GitHub, file: "github/issue_comment_issue.json", event: "issue_comment", want: ignored(ghRepo)},
		{kind: GitHub, file: "github/issue_comment_edited.json", event: "issue_comment", want: ignored(ghRepo)},
		{kind: GitHub, file: "github/push.json", event: "release", want: Event{Type: EventIgnored}},
		{kind: GitHub, file: "github/push.json", event: "", want: Event{Type: EventIgnored}},

		// Gitea and Forgejo
		{kind: Gitea, file: "gitea/push.json", event: "push", eventType: "push", want: Event{Type: EventPush, Repository: gtRepo,
			Push: &Push{Branch: "develop", Commit: "bffeb74224043ba2feb48d137756c8a9331c449a"}}},
		{kind: Gitea, file: "gitea/push_test.json", event: "push", eventType: "push", want: Event{Type: EventPing, Repository: gtRepo}},
		{kind: Gitea, file: "gitea/push_delete.json", event: "push", want: ignored(gtRepo)},
		{kind: Gitea, file: "gitea/pull_request_opened.json", event: "pull_request", eventType: "pull_request", want: Event{Type: EventPullRequest, Repository: gtRepo,
			PR: &PullRequest{Number: 3, Action: PROpened, HeadCommit: gtHead, BaseBranch: "master", Author: "gitea"}}},
		{kind: Gitea, file: "gitea/pull_request_synchronized_fork.json", event: "pull_request", eventType: "pull_request_sync", want: Event{Type: EventPullRequest, Repository: gtRepo,
			PR: &PullRequest{Number: 4, Action: PRSynchronized, HeadCommit: "9d5c0b7d8e7a6f5e4d3c2b1a09f8e7d6c5b4a392", BaseBranch: "master", FromFork: true, Author: "stranger"}}},
		{kind: Gitea, file: "gitea/pull_request_reopened.json", event: "pull_request", eventType: "pull_request", want: Event{Type: EventPullRequest, Repository: gtRepo,
			PR: &PullRequest{Number: 3, Action: PRReopened, HeadCommit: gtHead, BaseBranch: "master", Author: "gitea"}}},
		{kind: Gitea, file: "gitea/pull_request_closed.json", event: "pull_request", eventType: "pull_request", want: Event{Type: EventPullRequest, Repository: gtRepo,
			PR: &PullRequest{Number: 3, Action: PRClosed, HeadCommit: gtHead, BaseBranch: "master", Author: "gitea"}}},
		{kind: Gitea, file: "gitea/pull_request_label_updated.json", event: "pull_request", eventType: "pull_request_label", want: Event{Type: EventIgnored}},
		// Even a pull_request_assign type carrying an action we act on is
		// not the pull request's own event.
		{kind: Gitea, file: "gitea/pull_request_opened.json", event: "pull_request", eventType: "pull_request_assign", want: Event{Type: EventIgnored}},
		{kind: Gitea, file: "gitea/issue_comment_pr.json", event: "issue_comment", eventType: "pull_request_comment", want: Event{Type: EventComment, Repository: gtRepo,
			Comment: &Comment{PRNumber: 4, Body: "/gradient approve", Author: "gitea"}}},
		{kind: Gitea, file: "gitea/issue_comment_issue.json", event: "issue_comment", eventType: "issue_comment", want: ignored(gtRepo)},
		{kind: Gitea, file: "gitea/push.json", event: "create", eventType: "create", want: Event{Type: EventIgnored}},

		// GitLab
		{kind: GitLab, file: "gitlab/push.json", event: "Push Hook", want: Event{Type: EventPush, Repository: glRepo,
			Push: &Push{Branch: "master", Commit: glHead}}},
		{kind: GitLab, file: "gitlab/push_subgroup.json", event: "Push Hook", want: Event{Type: EventPush, Repository: "nix/infra/diaspora",
			Push: &Push{Branch: "main", Commit: glHead}}},
		{kind: GitLab, file: "gitlab/push_delete.json", event: "Push Hook", want: ignored(glRepo)},
		{kind: GitLab, file: "gitlab/tag_push.json", event: "Tag Push Hook", want: Event{Type: EventIgnored}},
		{kind: GitLab, file: "gitlab/tag_push.json", event: "Push Hook", want: ignored(glRepo)},
		{kind: GitLab, file: "gitlab/merge_request_open.json", event: "Merge Request Hook", want: Event{Type: EventPullRequest, Repository: glRepo,
			PR: &PullRequest{Number: 1, Action: PROpened, HeadCommit: glHead, BaseBranch: "master", Author: "root"}}},
		{kind: GitLab, file: "gitlab/merge_request_reopen.json", event: "Merge Request Hook", want: Event{Type: EventPullRequest, Repository: glRepo,
			PR: &PullRequest{Number: 1, Action: PRReopened, HeadCommit: glHead, BaseBranch: "master", Author: "root"}}},
		{kind: GitLab, file: "gitlab/merge_request_update_commits.json", event: "Merge Request Hook", want: Event{Type: EventPullRequest, Repository: glRepo,
			PR: &PullRequest{Number: 1, Action: PRSynchronized, HeadCommit: glHead, BaseBranch: "master", Author: "root"}}},
		{kind: GitLab, file: "gitlab/merge_request_update_title.json", event: "Merge Request Hook", want: ignored(glRepo)},
		{kind: GitLab, file: "gitlab/merge_request_close.json", event: "Merge Request Hook", want: Event{Type: EventPullRequest, Repository: glRepo,
			PR: &PullRequest{Number: 1, Action: PRClosed, HeadCommit: glHead, BaseBranch: "master", Author: "root"}}},
		{kind: GitLab, file: "gitlab/merge_request_merge.json", event: "Merge Request Hook", want: Event{Type: EventPullRequest, Repository: glRepo,
			PR: &PullRequest{Number: 1, Action: PRClosed, HeadCommit: glHead, BaseBranch: "master", Author: "root"}}},
		{kind: GitLab, file: "gitlab/merge_request_approved.json", event: "Merge Request Hook", want: ignored(glRepo)},
		{kind: GitLab, file: "gitlab/merge_request_fork.json", event: "Merge Request Hook", want: Event{Type: EventPullRequest, Repository: glRepo,
			PR: &PullRequest{Number: 5, Action: PROpened, HeadCommit: glHead, BaseBranch: "master", FromFork: true, Author: "root"}}},
		{kind: GitLab, file: "gitlab/note_merge_request.json", event: "Note Hook", want: Event{Type: EventComment, Repository: glRepo,
			Comment: &Comment{PRNumber: 1, Body: "/gradient approve", Author: "root"}}},
		{kind: GitLab, file: "gitlab/note_merge_request_update.json", event: "Note Hook", want: ignored(glRepo)},
		{kind: GitLab, file: "gitlab/note_issue.json", event: "Note Hook", want: ignored(glRepo)},
		{kind: GitLab, file: "gitlab/system_hook.json", event: "System Hook", want: Event{Type: EventPing}},
		{kind: GitLab, file: "gitlab/push.json", event: "Pipeline Hook", want: Event{Type: EventIgnored}},
	}
	for _, tt := range tests {
		t.Run(string(tt.kind)+"/"+strings.TrimSuffix(filepath.Base(tt.file), ".json")+"/"+tt.event+"/"+tt.eventType, func(t *testing.T) {
			got, err := Parse(tt.kind, headersFor(tt.kind, tt.event, tt.eventType), readTestdata(t, tt.file))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse = %+v, %v; want an error with %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Parse =\n%s\nwant\n%s", describe(got), describe(tt.want))
			}
		})
	}
}

func describe(e Event) string {
	s := fmt.Sprintf("%s %q", e.Type, e.Repository)
	if e.Push != nil {
		s += fmt.Sprintf(" push %+v", *e.Push)
	}
	if e.PR != nil {
		s += fmt.Sprintf(" pr %+v", *e.PR)
	}
	if e.Comment != nil {
		s += fmt.Sprintf(" comment %+v", *e.Comment)
	}
	return s
}
