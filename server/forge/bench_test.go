package forge

import "testing"

// BenchmarkVerifyParse is a webhook endpoint's work per delivery: the
// signature check and the parse of a realistic pull request payload.
func BenchmarkVerifyParse(b *testing.B) {
	for _, k := range []Kind{GitHub, Gitea, GitLab} {
		b.Run(string(k), func(b *testing.B) {
			file := map[Kind]string{
				GitHub: "github/pull_request_synchronize_fork.json",
				Gitea:  "gitea/pull_request_synchronized_fork.json",
				GitLab: "gitlab/merge_request_update_commits.json",
			}[k]
			body := readTestdata(b, file)
			h := headersFor(k, map[Kind]string{GitHub: "pull_request", Gitea: "pull_request", GitLab: "Merge Request Hook"}[k], "")
			h.Set("X-Hub-Signature-256", "sha256="+Sign(testSecret, body))
			h.Set("X-Gitea-Signature", Sign(testSecret, body))
			h.Set("X-Gitlab-Token", string(testSecret))
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := Verify(k, testSecret, h, body); err != nil {
					b.Fatal(err)
				}
				if ev, err := Parse(k, h, body); err != nil || ev.Type != EventPullRequest {
					b.Fatal(ev, err)
				}
			}
		})
	}
}
