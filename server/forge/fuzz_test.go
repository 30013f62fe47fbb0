package forge

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// fuzzEvents are the event headers each kind's fuzz target tries.
var fuzzEvents = map[Kind][][2]string{
	GitHub: {{"push", ""}, {"pull_request", ""}, {"issue_comment", ""}, {"ping", ""}},
	Gitea:  {{"push", "push"}, {"pull_request", "pull_request"}, {"pull_request", "pull_request_sync"}, {"issue_comment", "pull_request_comment"}},
	GitLab: {{"Push Hook", ""}, {"Merge Request Hook", ""}, {"Note Hook", ""}, {"System Hook", ""}},
}

func fuzzParse(f *testing.F, k Kind) {
	files, _ := filepath.Glob(filepath.Join("testdata", string(k), "*.json"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		for i := range fuzzEvents[k] {
			f.Add(uint8(i), b)
		}
	}
	f.Add(uint8(0), []byte(`{"ref":"refs/heads/main","after":"`+"0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c"+`","repository":{"full_name":"a/b"}}`))
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		ev := fuzzEvents[k][int(which)%len(fuzzEvents[k])]
		ev0, err := Parse(k, headersFor(k, ev[0], ev[1]), body)
		if err != nil {
			return
		}
		// Whatever Parse accepts is what the CI may hand to git.
		switch ev0.Type {
		case EventPush:
			if ev0.Push == nil || validateRepository(GitLab, ev0.Repository) != nil {
				t.Fatalf("push without a valid repository: %+v", ev0)
			}
			checkAccepted(t, ev0.Push.Commit, ev0.Push.Branch)
		case EventPullRequest:
			if ev0.PR == nil || ev0.PR.Number <= 0 || ev0.PR.Author == "" {
				t.Fatalf("bad pull request accepted: %+v", ev0)
			}
			checkAccepted(t, ev0.PR.HeadCommit, ev0.PR.BaseBranch)
		case EventComment:
			if ev0.Comment == nil || ev0.Comment.PRNumber <= 0 || checkUser(ev0.Comment.Author) != nil {
				t.Fatalf("bad comment accepted: %+v", ev0)
			}
		}
	})
}

func checkAccepted(t *testing.T, commit, branch string) {
	t.Helper()
	if len(commit) != 40 && len(commit) != 64 {
		t.Fatalf("commit %q accepted", commit)
	}
	if len(branch) == 0 || branch[0] == '-' {
		t.Fatalf("branch %q accepted", branch)
	}
}

func FuzzParseGitHub(f *testing.F) { fuzzParse(f, GitHub) }
func FuzzParseGitea(f *testing.F)  { fuzzParse(f, Gitea) }
func FuzzParseGitLab(f *testing.F) { fuzzParse(f, GitLab) }

// FuzzVerify: no header accepts a body unless it carries the secret's
// signature (or, on GitLab, the secret itself).
func FuzzVerify(f *testing.F) {
	body := []byte(`{"zen":"Keep it logically awesome."}`)
	f.Add(uint8(0), "sha256="+Sign(testSecret, body), body)
	f.Add(uint8(1), Sign(testSecret, body), body)
	f.Add(uint8(2), string(testSecret), body)
	f.Add(uint8(0), "sha256=", []byte{})
	f.Fuzz(func(t *testing.T, which uint8, sig string, body []byte) {
		kinds := []Kind{GitHub, Gitea, GitLab}
		k := kinds[int(which)%3]
		h := http.Header{}
		switch k {
		case GitHub:
			h.Set("X-Hub-Signature-256", sig)
		case Gitea:
			h.Set("X-Gitea-Signature", sig)
		case GitLab:
			h.Set("X-Gitlab-Token", sig)
		}
		err := Verify(k, testSecret, h, body)
		if err != nil && !errors.Is(err, ErrSignature) {
			t.Fatalf("Verify error %v is not ErrSignature", err)
		}
		if err == nil {
			good := map[Kind]bool{
				GitHub: hmacMatches(testSecret, sig[len("sha256="):], body),
				Gitea:  hmacMatches(testSecret, sig, body),
				GitLab: sig == string(testSecret),
			}[k]
			if !good {
				t.Fatalf("Verify accepted %q for %s", sig, k)
			}
		}
	})
}
