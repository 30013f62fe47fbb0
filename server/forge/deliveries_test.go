package forge_test

import (
	"net/http"
	"testing"

	"gradient.dev/gradient/server/forge"
	"gradient.dev/gradient/server/forge/forgetest"
)

// forgetest's deliveries verify and parse to what they say, for each
// kind: the server's end-to-end tests post them as the forges would.
func TestForgetestDeliveriesRoundTrip(t *testing.T) {
	secret := []byte("webhook-secret")
	const head = "34c5c7793cb3b279e22454cb6750c80560547b3a"
	for _, kind := range kinds {
		t.Run(string(kind), func(t *testing.T) {
			repo := "owner/repo"
			if kind == forge.GitLab {
				repo = "group/sub/repo"
			}
			parse := func(h http.Header, body []byte) forge.Event {
				t.Helper()
				if err := forge.Verify(kind, secret, h, body); err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if err := forge.Verify(kind, []byte("other"), h, body); err == nil {
					t.Fatal("Verify accepted another secret")
				}
				if forge.DeliveryID(kind, h) == "" {
					t.Fatal("no delivery ID")
				}
				ev, err := forge.Parse(kind, h, body)
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return ev
			}
			h1, b1 := forgetest.PushDelivery(kind, secret, repo, "main", sha1)
			h2, _ := forgetest.PushDelivery(kind, secret, repo, "main", sha1)
			if forge.DeliveryID(kind, h1) == forge.DeliveryID(kind, h2) {
				t.Fatal("two deliveries share an ID")
			}
			if ev := parse(h1, b1); ev.Type != forge.EventPush || ev.Repository != repo || *ev.Push != (forge.Push{Branch: "main", Commit: sha1}) {
				t.Fatalf("push parsed as %+v", ev)
			}
			for _, action := range []forge.PRAction{forge.PROpened, forge.PRSynchronized, forge.PRReopened, forge.PRClosed} {
				for _, fork := range []bool{false, true} {
					ev := parse(forgetest.PRDelivery(kind, secret, repo, 12, action, head, "main", fork))
					want := forge.PullRequest{Number: 12, Action: action, HeadCommit: head, BaseBranch: "main", FromFork: fork, Author: forgetest.Contributor}
					if ev.Type != forge.EventPullRequest || ev.Repository != repo || *ev.PR != want {
						t.Fatalf("%s (fork %v) parsed as %+v %+v", action, fork, ev, ev.PR)
					}
				}
			}
			ev := parse(forgetest.CommentDelivery(kind, secret, repo, 12, "committer", "/gradient approve"))
			if ev.Type != forge.EventComment || *ev.Comment != (forge.Comment{PRNumber: 12, Body: "/gradient approve", Author: "committer"}) {
				t.Fatalf("comment parsed as %+v", ev)
			}
			if ev := parse(forgetest.PingDelivery(kind, secret, repo)); ev.Type != forge.EventPing {
				t.Fatalf("ping parsed as %+v", ev)
			}
		})
	}
}
