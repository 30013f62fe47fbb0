package forgetest

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"gradient.dev/gradient/server/forge"
)

// The users the deliveries name.
const (
	// Pusher pushes and acts on the base repository.
	Pusher = "maintainer"
	// Contributor opens the pull requests.
	Contributor = "contributor"
)

// zeroID is the object id forges send for "no commit".
const zeroID = "0000000000000000000000000000000000000000"

// PushDelivery is a signed push of sha to branch, with a fresh delivery ID.
func PushDelivery(kind forge.Kind, secret []byte, repo, branch, sha string) (http.Header, []byte) {
	return Deliver(kind, secret, pushEventName(kind), "", PushPayload(kind, repo, "refs/heads/"+branch, randomSHA(), sha))
}

// PRDelivery is a signed pull (merge) request event by Contributor, with
// a fresh delivery ID. fromFork puts the head in Contributor's fork
// (GitLab: another project).
func PRDelivery(kind forge.Kind, secret []byte, repo string, number int, action forge.PRAction, head, base string, fromFork bool) (http.Header, []byte) {
	event, eventType := "pull_request", ""
	switch kind {
	case forge.Gitea:
		eventType = "pull_request"
		if action == forge.PRSynchronized {
			eventType = "pull_request_sync"
		}
	case forge.GitLab:
		event = "Merge Request Hook"
	}
	return Deliver(kind, secret, event, eventType, PRPayload(kind, repo, number, action, head, base, fromFork))
}

// CommentDelivery is a signed new comment on pull (merge) request
// number, with a fresh delivery ID.
func CommentDelivery(kind forge.Kind, secret []byte, repo string, number int, author, body string) (http.Header, []byte) {
	event, eventType := "issue_comment", ""
	switch kind {
	case forge.Gitea:
		eventType = "pull_request_comment"
	case forge.GitLab:
		event = "Note Hook"
	}
	return Deliver(kind, secret, event, eventType, CommentPayload(kind, repo, number, author, body))
}

// PingDelivery is the signed delivery a forge's webhook test sends:
// GitHub's ping; Gitea's and Forgejo's "Test delivery", a push that moves
// nothing; for GitLab a System Hook event (a project hook's test button
// sends a real push of the default branch instead).
func PingDelivery(kind forge.Kind, secret []byte, repo string) (http.Header, []byte) {
	switch kind {
	case forge.GitHub:
		return Deliver(kind, secret, "ping", "", map[string]any{
			"zen":     "Design for failure.",
			"hook_id": 109948940,
			"hook": map[string]any{
				"type": "Repository", "id": 109948940, "name": "web", "active": true,
				"events": []string{"push", "pull_request", "issue_comment"},
				"config": map[string]any{"content_type": "json", "insecure_ssl": "0", "url": "https://ci.example.com/"},
			},
			"repository": hubRepo(repo, 1296269),
			"sender":     hubUser(Pusher, 1),
		})
	case forge.Gitea:
		return Deliver(kind, secret, "push", "push", PushPayload(kind, repo, "refs/heads/main", zeroID, zeroID))
	}
	return Deliver(kind, secret, "System Hook", "", map[string]any{
		"event_name": "repository_update", "user_id": 1, "user_name": "Administrator", "user_username": "root",
		"project_id": projectID, "project": labProject(repo, projectID),
		"changes": []map[string]any{{"before": randomSHA(), "after": randomSHA(), "ref": "refs/heads/main"}},
		"refs":    []string{"refs/heads/main"},
	})
}

// Deliver signs payload as kind does and names event (and, for Gitea,
// its finer event type; "" for the event's own) in the headers, with a
// fresh delivery ID.
func Deliver(kind forge.Kind, secret []byte, event, eventType string, payload any) (http.Header, []byte) {
	body, err := json.Marshal(payload)
	if err != nil {
		panic(fmt.Sprintf("forgetest: encoding a payload: %v", err))
	}
	return Headers(kind, secret, event, eventType, body), body
}

// Headers are the headers kind sends with body, signed with secret, with
// a fresh delivery ID.
func Headers(kind forge.Kind, secret []byte, event, eventType string, body []byte) http.Header {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	id := newUUID()
	sig := forge.Sign(secret, body)
	mac1 := hmac.New(sha1.New, secret)
	mac1.Write(body)
	sig1 := hex.EncodeToString(mac1.Sum(nil))
	switch kind {
	case forge.GitHub:
		h.Set("User-Agent", "GitHub-Hookshot/044aadd")
		h.Set("X-GitHub-Event", event)
		h.Set("X-GitHub-Delivery", id)
		h.Set("X-GitHub-Hook-ID", "109948940")
		h.Set("X-GitHub-Hook-Installation-Target-Type", "repository")
		h.Set("X-Hub-Signature", "sha1="+sig1)
		h.Set("X-Hub-Signature-256", "sha256="+sig)
	case forge.Gitea:
		if eventType == "" {
			eventType = event
		}
		// Gitea's deliveries carry its own headers and Gogs' and GitHub's
		// for compatibility.
		h.Set("User-Agent", "Go-http-client/1.1")
		h.Set("X-Gitea-Delivery", id)
		h.Set("X-Gitea-Event", event)
		h.Set("X-Gitea-Event-Type", eventType)
		h.Set("X-Gitea-Signature", sig)
		h.Set("X-Gogs-Delivery", id)
		h.Set("X-Gogs-Event", event)
		h.Set("X-Gogs-Event-Type", eventType)
		h.Set("X-Gogs-Signature", sig)
		h.Set("X-Hub-Signature", "sha1="+sig1)
		h.Set("X-Hub-Signature-256", "sha256="+sig)
		h["X-GitHub-Delivery"] = []string{id}
		h["X-GitHub-Event"] = []string{event}
		h["X-GitHub-Event-Type"] = []string{eventType}
	case forge.GitLab:
		h.Set("User-Agent", "GitLab/17.5.0")
		h.Set("X-Gitlab-Event", event)
		h.Set("X-Gitlab-Token", string(secret))
		h.Set("X-Gitlab-Event-UUID", id)
		h.Set("X-Gitlab-Webhook-UUID", "2a9ef7c9-7b47-4b6c-9c1a-3a5e0c1bdf3e")
		h.Set("X-Gitlab-Instance", "https://gitlab.example.com")
	}
	return h
}

func pushEventName(kind forge.Kind) string {
	if kind == forge.GitLab {
		return "Push Hook"
	}
	return "push"
}

// PushPayload is a push of ref from before to after, shaped as kind's
// documentation shows it.
func PushPayload(kind forge.Kind, repo, ref, before, after string) map[string]any {
	commit := map[string]any{
		"id": after, "message": "Update flake.lock\n", "timestamp": "2026-12-04T10:00:00+00:00",
		"url":    "https://forge.example.com/" + repo + "/commit/" + after,
		"author": map[string]any{"name": "Maintainer", "email": "maintainer@example.com", "username": Pusher},
		"added":  []string{}, "removed": []string{}, "modified": []string{"flake.lock"},
	}
	switch kind {
	case forge.GitLab:
		checkout := any(after)
		if after == zeroID {
			checkout = nil
		}
		return map[string]any{
			"object_kind": "push", "event_name": "push",
			"before": before, "after": after, "ref": ref, "ref_protected": true, "checkout_sha": checkout,
			"user_id": 4, "user_name": "Maintainer", "user_username": Pusher, "user_email": "",
			"project_id": projectID, "project": labProject(repo, projectID),
			"commits": []any{commit}, "total_commits_count": 1,
			"repository": map[string]any{"name": lastSegment(repo), "homepage": "https://gitlab.example.com/" + repo},
		}
	case forge.Gitea:
		return map[string]any{
			"ref": ref, "before": before, "after": after,
			"compare_url": "https://gitea.example.com/" + repo + "/compare/" + before + "..." + after,
			"commits":     []any{commit}, "total_commits": 1, "head_commit": commit,
			"repository": hubRepo(repo, 1), "pusher": hubUser(Pusher, 4), "sender": hubUser(Pusher, 4),
		}
	}
	return map[string]any{
		"ref": ref, "before": before, "after": after,
		"created": before == zeroID, "deleted": after == zeroID, "forced": false, "base_ref": nil,
		"compare":     "https://github.com/" + repo + "/compare/" + before[:12] + "..." + after[:12],
		"commits":     []any{commit},
		"head_commit": commit,
		"repository":  hubRepo(repo, 1296269),
		"pusher":      map[string]any{"name": Pusher, "email": "maintainer@example.com"},
		"sender":      hubUser(Pusher, 4),
	}
}

// PRPayload is a pull (merge) request event by Contributor.
func PRPayload(kind forge.Kind, repo string, number int, action forge.PRAction, head, base string, fromFork bool) map[string]any {
	headRepo := repo
	if fromFork {
		headRepo = Contributor + "/" + lastSegment(repo)
	}
	if kind == forge.GitLab {
		source := projectID
		if fromFork {
			source = projectID + 1
		}
		act := map[forge.PRAction]string{forge.PROpened: "open", forge.PRReopened: "reopen", forge.PRSynchronized: "update", forge.PRClosed: "close"}[action]
		state := map[forge.PRAction]string{forge.PROpened: "opened", forge.PRReopened: "opened", forge.PRSynchronized: "opened", forge.PRClosed: "closed"}[action]
		attrs := map[string]any{
			"id": 90000 + number, "iid": number, "title": "Add a package", "state": state, "action": act,
			"target_branch": base, "source_branch": "feature",
			"source_project_id": source, "target_project_id": projectID, "author_id": 51,
			"merge_status": "unchecked", "draft": false,
			"source":      labProject(headRepo, source),
			"target":      labProject(repo, projectID),
			"last_commit": map[string]any{"id": head, "message": "Add a package\n", "title": "Add a package"},
			"url":         fmt.Sprintf("https://gitlab.example.com/%s/-/merge_requests/%d", repo, number),
		}
		changes := map[string]any{}
		if action == forge.PRSynchronized {
			attrs["oldrev"] = randomSHA()
		}
		return map[string]any{
			"object_kind": "merge_request", "event_type": "merge_request",
			"user":    map[string]any{"id": 51, "name": "Contributor", "username": Contributor, "avatar_url": ""},
			"project": labProject(repo, projectID), "object_attributes": attrs, "changes": changes,
			"repository": map[string]any{"name": lastSegment(repo)},
		}
	}
	act := map[forge.PRAction]string{forge.PROpened: "opened", forge.PRReopened: "reopened", forge.PRSynchronized: "synchronize", forge.PRClosed: "closed"}[action]
	if kind == forge.Gitea && action == forge.PRSynchronized {
		act = "synchronized"
	}
	state := "open"
	if action == forge.PRClosed {
		state = "closed"
	}
	headRepoID := 1296269
	if fromFork {
		headRepoID = 1296270
	}
	pr := map[string]any{
		"id": 279147437 + number, "number": number, "state": state, "title": "Add a package",
		"user":   hubUser(Contributor, 51),
		"head":   map[string]any{"label": strings.Split(headRepo, "/")[0] + ":feature", "ref": "feature", "sha": head, "user": hubUser(strings.Split(headRepo, "/")[0], 51), "repo": hubRepo(headRepo, headRepoID)},
		"base":   map[string]any{"label": strings.Split(repo, "/")[0] + ":" + base, "ref": base, "sha": randomSHA(), "user": hubUser(strings.Split(repo, "/")[0], 1), "repo": hubRepo(repo, 1296269)},
		"merged": false, "draft": false,
		"html_url": fmt.Sprintf("https://forge.example.com/%s/pull/%d", repo, number),
	}
	return map[string]any{
		"action": act, "number": number, "pull_request": pr,
		"repository": hubRepo(repo, 1296269), "sender": hubUser(Contributor, 51),
	}
}

// CommentPayload is a new comment by author on pull (merge) request number.
func CommentPayload(kind forge.Kind, repo string, number int, author, body string) map[string]any {
	if kind == forge.GitLab {
		return map[string]any{
			"object_kind": "note", "event_type": "note",
			"user":       map[string]any{"id": 1, "name": author, "username": author},
			"project_id": projectID, "project": labProject(repo, projectID),
			"object_attributes": map[string]any{
				"id": 1244, "note": body, "noteable_type": "MergeRequest", "author_id": 1, "action": "create",
				"url": fmt.Sprintf("https://gitlab.example.com/%s/-/merge_requests/%d#note_1244", repo, number),
			},
			"merge_request": map[string]any{
				"id": 90000 + number, "iid": number, "target_branch": "main", "source_branch": "feature",
				"source_project_id": projectID, "target_project_id": projectID, "state": "opened",
			},
		}
	}
	issue := map[string]any{
		"id": 1347 + number, "number": number, "title": "Add a package", "state": "open",
		"user": hubUser(Contributor, 51),
		"pull_request": map[string]any{
			"url":      fmt.Sprintf("https://forge.example.com/api/repos/%s/pulls/%d", repo, number),
			"html_url": fmt.Sprintf("https://forge.example.com/%s/pull/%d", repo, number),
		},
	}
	p := map[string]any{
		"action": "created", "issue": issue,
		"comment": map[string]any{
			"id": 1, "body": body, "user": hubUser(author, 7),
			"created_at": time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC).Format(time.RFC3339),
		},
		"repository": hubRepo(repo, 1296269), "sender": hubUser(author, 7),
	}
	if kind == forge.Gitea {
		p["is_pull"] = true
	}
	return p
}

func hubRepo(fullName string, id int) map[string]any {
	owner, name, _ := strings.Cut(fullName, "/")
	return map[string]any{
		"id": id, "name": name, "full_name": fullName, "private": false,
		"owner":          hubUser(owner, id+1),
		"html_url":       "https://forge.example.com/" + fullName,
		"clone_url":      "https://forge.example.com/" + fullName + ".git",
		"default_branch": "main",
	}
}

func hubUser(login string, id int) map[string]any {
	return map[string]any{"login": login, "username": login, "id": id, "type": "User"}
}

func labProject(path string, id int) map[string]any {
	return map[string]any{
		"id": id, "name": lastSegment(path), "path_with_namespace": path,
		"namespace":      path[:max(0, strings.LastIndex(path, "/"))],
		"web_url":        "https://gitlab.example.com/" + path,
		"git_http_url":   "https://gitlab.example.com/" + path + ".git",
		"default_branch": "main", "visibility_level": 20,
	}
}

func lastSegment(path string) string { return path[strings.LastIndex(path, "/")+1:] }

func randomSHA() string { return randomHex(20) }

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	x := hex.EncodeToString(b[:])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}
