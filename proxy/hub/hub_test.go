package hub

import (
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"gradient.dev/gradient/wire"
)

// A JobOffer reaches each worker with only the candidates it can run
// (build capability, architecture, features; flake jobs to fetch or eval
// workers), and a worker that joins later gets the current book.
func TestOffersReachOnlyCapableWorkers(t *testing.T) {
	h := newHub()
	x86 := buildWorker("x86", "x86_64-linux")
	arm := buildWorker("arm", "aarch64-linux")
	eval := flakeWorker("eval", false)
	for _, w := range []*fakeWorker{x86, arm, eval} {
		h.Join(w)
	}
	u := attach(t, h)
	u.h.Handle(&wire.JobListChunk{IsFinal: true}) // the answer to the session's first list request
	u.h.Handle(&wire.JobOffer{Candidates: []wire.JobCandidate{
		buildCand("b-x86", "x86_64-linux", "kvm"), buildCand("b-arm", "aarch64-linux"),
		buildCand("b-big", "x86_64-linux", "big-parallel"), buildCand("b-builtin", "builtin"), {JobID: "flake"},
	}})
	for _, tc := range []struct {
		w    *fakeWorker
		want []string
	}{{x86, []string{"b-x86", "b-builtin"}}, {arm, []string{"b-arm", "b-builtin"}}, {eval, []string{"flake"}}} {
		offers := of[*wire.JobOffer](tc.w.take())
		if len(offers) != 1 || !slices.Equal(ids(offers[0].Candidates), tc.want) {
			t.Fatalf("%s got offers %v, want %v", tc.w.workerID, offers, tc.want)
		}
	}
	late := buildWorker("late", "x86_64-linux")
	h.Join(late)
	h.FromWorker(late, &wire.RequestJobList{})
	pages := of[*wire.JobListChunk](late.take())
	if len(pages) != 1 || !pages[0].IsFinal || !slices.Equal(ids(pages[0].Candidates), []string{"b-x86", "b-builtin"}) {
		t.Fatalf("the late worker's list %+v", pages)
	}
	// Its list request refreshes the book upstream, once.
	if got := upOf[*wire.RequestJobList](u.take()); len(got) != 1 {
		t.Fatalf("upstream list requests %d, want 1", len(got))
	}
	h.FromWorker(eval, &wire.RequestJobList{})
	if got := upOf[*wire.RequestJobList](u.take()); len(got) != 0 {
		t.Fatalf("a second list request went upstream while one is outstanding")
	}
	// The full list replaces the book: b-arm is gone, b-new is offered.
	u.h.Handle(&wire.JobListChunk{Candidates: []wire.JobCandidate{buildCand("b-x86", "x86_64-linux")}})
	u.h.Handle(&wire.JobListChunk{Candidates: []wire.JobCandidate{buildCand("b-new", "aarch64-linux")}, IsFinal: true})
	if offers := of[*wire.JobOffer](arm.take()); len(offers) != 1 || !slices.Equal(ids(offers[0].Candidates), []string{"b-new"}) {
		t.Fatalf("arm got %+v after the list, want b-new offered", offers)
	}
	if offers := of[*wire.JobOffer](x86.take()); len(offers) != 0 {
		t.Fatalf("x86 got %+v: nothing new for it", offers)
	}
	h.FromWorker(arm, &wire.RequestJobList{})
	if pages := of[*wire.JobListChunk](arm.take()); len(pages) != 1 || !slices.Equal(ids(pages[0].Candidates), []string{"b-new"}) {
		t.Fatalf("arm's list after the refresh %+v", pages)
	}
}

// The best score per candidate goes upstream on a flush, only when it
// changed; scores for candidates a worker cannot see are ignored.
func TestScoresForwardTheBestChangesOnly(t *testing.T) {
	h := newHub()
	a, b := buildWorker("a", "x86_64-linux"), buildWorker("b", "x86_64-linux")
	arm := buildWorker("arm", "aarch64-linux")
	h.Join(a)
	h.Join(b)
	h.Join(arm)
	u := attach(t, h)
	u.h.Handle(&wire.JobOffer{Candidates: []wire.JobCandidate{buildCand("j1", "x86_64-linux"), buildCand("j2", "x86_64-linux")}})
	h.FromWorker(a, &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: "j1", MissingCount: 3, MissingNarSize: 300}}, IsFinal: true})
	h.FromWorker(b, &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: "j1", MissingCount: 1, MissingNarSize: 100},
		{JobID: "j2", OutputsPresent: true}}, IsFinal: true})
	// arm cannot run j1: its (better) score is no one's.
	h.FromWorker(arm, &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: "j1", OutputsPresent: true}}, IsFinal: true})
	h.FlushScores()
	chunks := upOf[*wire.RequestJobChunk](u.take())
	if len(chunks) != 1 || !chunks[0].IsFinal || len(chunks[0].Scores) != 2 ||
		chunks[0].Scores[0] != (wire.CandidateScore{JobID: "j1", MissingCount: 1, MissingNarSize: 100}) ||
		!chunks[0].Scores[1].OutputsPresent {
		t.Fatalf("flushed %+v, want b's two scores", chunks)
	}
	h.FlushScores()
	if got := u.take(); len(got) != 0 {
		t.Fatalf("a flush without changes sent %d messages", len(got))
	}
	// a improves but stays worse than b: no change upstream.
	h.FromWorker(a, &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: "j1", MissingCount: 2, MissingNarSize: 200}}, IsFinal: true})
	h.FlushScores()
	if got := u.take(); len(got) != 0 {
		t.Fatalf("an unchanged best sent %d messages", len(got))
	}
	// b leaves: a's score is now the best.
	h.Leave(b, "gone")
	h.FlushScores()
	chunks = upOf[*wire.RequestJobChunk](u.take())
	if len(chunks) != 1 || len(chunks[0].Scores) != 1 || chunks[0].Scores[0].MissingNarSize != 200 {
		t.Fatalf("after b left %+v, want a's j1 score", chunks)
	}
}

// A worker's RequestJob becomes an upstream poll; the AssignJob goes to
// the best waiting worker by score; one nobody waits for is declined.
func TestAssignGoesToTheBestWaitingWorker(t *testing.T) {
	h := newHub()
	a, b := buildWorker("a", "x86_64-linux"), buildWorker("b", "x86_64-linux")
	arm := buildWorker("arm", "aarch64-linux")
	for _, w := range []*fakeWorker{a, b, arm} {
		h.Join(w)
	}
	u := attach(t, h)
	u.h.Handle(&wire.JobOffer{Candidates: []wire.JobCandidate{buildCand("j1", "x86_64-linux")}})
	h.FromWorker(a, &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: "j1", MissingNarSize: 900}}, IsFinal: true})
	h.FromWorker(b, &wire.RequestJobChunk{Scores: []wire.CandidateScore{{JobID: "j1", MissingNarSize: 10}}, IsFinal: true})
	for _, w := range []*fakeWorker{a, b, arm} {
		h.FromWorker(w, &wire.RequestJob{Kind: wire.JobKindBuild})
	}
	if polls := upOf[*wire.RequestJob](u.take()); len(polls) != 3 {
		t.Fatalf("%d upstream polls, want one per worker poll", len(polls))
	}
	u.h.Handle(buildAssign("j1", "x86_64-linux"))
	if got := of[*wire.AssignJob](b.take()); len(got) != 1 || got[0].JobID != "j1" {
		t.Fatalf("b (best score) got %v", got)
	}
	if got := of[*wire.AssignJob](a.take()); len(got) != 0 {
		t.Fatal("a got j1 too")
	}
	h.FromWorker(b, &wire.AssignJobResponse{JobID: "j1", Accepted: true})
	if got := upOf[*wire.AssignJobResponse](u.take()); len(got) != 1 || !got[0].Accepted {
		t.Fatalf("upstream got %+v, want b's acceptance", got)
	}
	// a still waits: j2 goes to a; then nobody x86 waits and j3 is declined.
	u.h.Handle(buildAssign("j2", "x86_64-linux"))
	if got := of[*wire.AssignJob](a.take()); len(got) != 1 {
		t.Fatal("a did not get j2")
	}
	u.h.Handle(buildAssign("j3", "x86_64-linux"))
	got := upOf[*wire.AssignJobResponse](u.take())
	if len(got) != 1 || got[0].Accepted || got[0].JobID != "j3" || *got[0].Reason != ReasonNoWorker {
		t.Fatalf("upstream got %+v, want j3 declined", got)
	}
	if got := of[*wire.AssignJob](arm.take()); len(got) != 0 {
		t.Fatal("the aarch64 worker got an x86_64 job")
	}
	// A worker that declines: the decline goes upstream, the job is free.
	h.FromWorker(a, &wire.AssignJobResponse{JobID: "j2", Accepted: false})
	h.FromWorker(a, &wire.JobCompleted{JobID: "j2"})
	if got := upOf[*wire.JobCompleted](u.take()); len(got) != 0 {
		t.Fatal("a report for a declined job went upstream")
	}
}

// The Credential before a fetch job goes with it to the chosen worker,
// and no worker without fetch gets it.
func TestCredentialGoesWithTheFetchJob(t *testing.T) {
	h := newHub()
	evalOnly, fetcher := flakeWorker("eval", false), flakeWorker("fetch", true)
	h.Join(evalOnly)
	h.Join(fetcher)
	u := attach(t, h)
	h.FromWorker(evalOnly, &wire.RequestJob{Kind: wire.JobKindFlake})
	h.FromWorker(fetcher, &wire.RequestJob{Kind: wire.JobKindFlake})
	u.h.Handle(&wire.Credential{Kind: wire.CredentialSSHKey, Data: []byte("secret key")})
	u.h.Handle(flakeAssign("f1", wire.FlakeStepFetchFlake, wire.FlakeStepEvaluateFlake))
	got := fetcher.take()
	if len(got) != 2 || got[0].WireName() != "Credential" || got[1].WireName() != "AssignJob" {
		t.Fatalf("the fetch worker got %v, want Credential then AssignJob", names(got))
	}
	if got := evalOnly.take(); len(got) != 0 {
		t.Fatalf("the eval-only worker got %v", names(got))
	}
	// An eval-only job after it carries no credential.
	u.h.Handle(flakeAssign("f2", wire.FlakeStepEvaluateFlake))
	if got := evalOnly.take(); len(got) != 1 || got[0].WireName() != "AssignJob" {
		t.Fatalf("the eval worker got %v", names(got))
	}
}

func names(msgs []wire.ServerMessage) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.WireName())
	}
	return out
}

// assigned attaches, joins workers and hands job id to w (accepted).
func assigned(t *testing.T, h *Hub, u *fakeUpstream, w *fakeWorker, id string) {
	t.Helper()
	h.FromWorker(w, &wire.RequestJob{Kind: wire.JobKindBuild})
	u.h.Handle(buildAssign(id, "x86_64-linux"))
	if got := of[*wire.AssignJob](w.take()); len(got) != 1 || got[0].JobID != id {
		t.Fatalf("%s did not get %s", w.workerID, id)
	}
	h.FromWorker(w, &wire.AssignJobResponse{JobID: id, Accepted: true})
	u.take()
}

// Reports go upstream only from the job's owner; AbortJob and the job's
// NAR frames go to the owner only.
func TestReportsAreRoutedByJob(t *testing.T) {
	h := newHub()
	a, b := buildWorker("a", "x86_64-linux"), buildWorker("b", "x86_64-linux")
	h.Join(a)
	h.Join(b)
	u := attach(t, h)
	assigned(t, h, u, a, "j1")
	assigned(t, h, u, b, "j2")
	for _, m := range []wire.ClientMessage{
		&wire.LogChunk{JobID: "j1", Data: []byte("b writes into a's log")},
		&wire.JobUpdate{JobID: "j1", AssignmentID: "as-j1", Update: &wire.JobUpdateBuilding{}},
		&wire.JobCompleted{JobID: "j1", AssignmentID: "as-j1"},
		&wire.EvalMessage{JobID: "unknown"},
	} {
		h.FromWorker(b, m)
	}
	if got := u.take(); len(got) != 0 {
		t.Fatalf("b's reports for a's job went upstream: %v", got)
	}
	h.FromWorker(a, &wire.LogChunk{JobID: "j1", Data: []byte("line\n")})
	h.FromWorker(a, &wire.JobCompleted{JobID: "j1", AssignmentID: "as-j1"})
	if got := u.take(); len(got) != 2 || got[1].WireName() != "JobCompleted" {
		t.Fatalf("a's reports upstream: %v", got)
	}
	// j1 ended: a's further reports are dropped.
	h.FromWorker(a, &wire.LogChunk{JobID: "j1", Data: []byte("late")})
	if got := u.take(); len(got) != 0 {
		t.Fatal("a report after the job's end went upstream")
	}
	u.h.Handle(&wire.AbortJob{JobID: "j2", Reason: "api"})
	u.h.Handle(&wire.NarPush{JobID: "j2", StorePath: "/nix/store/x", Data: []byte("nar")})
	u.h.Handle(&wire.NarPush{JobID: "j1", StorePath: "/nix/store/y", Data: []byte("ended")})
	if got := names(b.take()); !slices.Equal(got, []string{"AbortJob", "NarPush"}) {
		t.Fatalf("b got %v", got)
	}
	if got := a.take(); len(got) != 0 {
		t.Fatalf("a got %v", names(got))
	}
}

// Every query and upload gets a fresh upstream ID; the answers, grants
// and commits come back to the asking worker under its own ID.
func TestCacheIDsAreRemapped(t *testing.T) {
	h := newHub()
	a, b := buildWorker("a", "x86_64-linux"), buildWorker("b", "x86_64-linux")
	h.Join(a)
	h.Join(b)
	u := attach(t, h)
	assigned(t, h, u, a, "j1")
	assigned(t, h, u, b, "j2")
	h.FromWorker(a, &wire.CacheQuery{JobID: "j1", QueryID: "q", Paths: []string{"/nix/store/a"}})
	h.FromWorker(b, &wire.CacheQuery{JobID: "j2", QueryID: "q", Paths: []string{"/nix/store/b"}})
	queries := upOf[*wire.CacheQuery](u.take())
	if len(queries) != 2 || queries[0].QueryID == "q" || queries[0].QueryID == queries[1].QueryID {
		t.Fatalf("upstream queries %+v, want two fresh IDs", queries)
	}
	u.h.Handle(&wire.CacheStatus{QueryID: queries[1].QueryID, Cached: []wire.CachedPath{{Path: "/nix/store/b"}}})
	u.h.Handle(&wire.CacheError{QueryID: queries[0].QueryID, Message: "unknown"})
	if got := of[*wire.CacheStatus](b.take()); len(got) != 1 || got[0].QueryID != "q" || got[0].Cached[0].Path != "/nix/store/b" {
		t.Fatalf("b got %+v", got)
	}
	if got := of[*wire.CacheError](a.take()); len(got) != 1 || got[0].QueryID != "q" {
		t.Fatalf("a got %+v", got)
	}
	// A second answer to a query is no one's.
	u.h.Handle(&wire.CacheStatus{QueryID: queries[1].QueryID})
	if got := b.take(); len(got) != 0 {
		t.Fatal("a stale answer reached b")
	}
	// A query naming another worker's job is refused locally.
	h.FromWorker(a, &wire.CacheQuery{JobID: "j2", QueryID: "sneak"})
	if got := of[*wire.CacheError](a.take()); len(got) != 1 || got[0].Message != reasonNotHeld {
		t.Fatalf("a's query for b's job: %+v", got)
	}
	if got := u.take(); len(got) != 0 {
		t.Fatal("a's query for b's job went upstream")
	}

	nar := &wire.UploadNar{StorePath: "/nix/store/out"}
	h.FromWorker(a, &wire.UploadRequest{JobID: "j1", RequestID: 1, Object: nar, Size: 10})
	h.FromWorker(b, &wire.UploadRequest{JobID: "j2", RequestID: 1, Object: nar, Size: 10})
	reqs := upOf[*wire.UploadRequest](u.take())
	if len(reqs) != 2 || reqs[0].RequestID == reqs[1].RequestID {
		t.Fatalf("upstream uploads %+v, want distinct request IDs", reqs)
	}
	ua, ub := reqs[0].RequestID, reqs[1].RequestID
	u.h.Handle(&wire.UploadGrant{RequestID: ua, Target: &wire.GrantPassthrough{}})
	u.h.Handle(&wire.UploadGrant{RequestID: ub, Target: &wire.GrantSkip{}})
	if got := of[*wire.UploadGrant](a.take()); len(got) != 1 || got[0].RequestID != 1 {
		t.Fatalf("a's grant %+v", got)
	}
	if got := of[*wire.UploadGrant](b.take()); len(got) != 1 || got[0].RequestID != 1 {
		t.Fatalf("b's grant %+v", got)
	}
	payload := []byte("compressed nar")
	h.FromWorker(a, &wire.UploadChunk{RequestID: 1, Data: payload, IsFinal: true, Offset: 0})
	h.FromWorker(a, &wire.UploadFinished{RequestID: 1, Metadata: &wire.EvalCacheUploadMetadata{SizeBytes: 14}})
	// b's upload was skipped: its chunks have no upload any more.
	h.FromWorker(b, &wire.UploadChunk{RequestID: 1, Data: payload})
	sent := u.take()
	chunks := upOf[*wire.UploadChunk](sent)
	if len(sent) != 2 || len(chunks) != 1 || chunks[0].RequestID != ua || &chunks[0].Data[0] != &payload[0] {
		t.Fatalf("upstream got %d messages %+v, want a's chunk (same bytes) and finish under %d", len(sent), sent, ua)
	}
	u.h.Handle(&wire.UploadCommitted{RequestID: ua, Outcome: &wire.UploadOk{}})
	if got := of[*wire.UploadCommitted](a.take()); len(got) != 1 || got[0].RequestID != 1 {
		t.Fatalf("a's commit %+v", got)
	}
}

// A lost worker's jobs fail upstream as transient (an unanswered one is
// declined) and its uploads are cancelled.
func TestWorkerLostFailsItsJobsTransient(t *testing.T) {
	h := newHub()
	a, b := buildWorker("a", "x86_64-linux"), buildWorker("b", "x86_64-linux")
	h.Join(a)
	h.Join(b)
	u := attach(t, h)
	assigned(t, h, u, a, "j1")
	assigned(t, h, u, b, "j2")
	h.FromWorker(a, &wire.RequestJob{Kind: wire.JobKindBuild})
	u.h.Handle(buildAssign("j3", "x86_64-linux")) // a has not answered yet
	h.FromWorker(a, &wire.UploadRequest{JobID: "j1", RequestID: 5, Object: &wire.UploadNar{StorePath: "/nix/store/o"}})
	u.take()
	h.Leave(a, "heartbeat timeout")
	got := u.take()
	failed := upOf[*wire.JobFailed](got)
	declined := upOf[*wire.AssignJobResponse](got)
	cancels := upOf[*wire.UploadCancel](got)
	if len(failed) != 1 || failed[0].JobID != "j1" || failed[0].AssignmentID != "as-j1" || failed[0].Kind != wire.FailureTransient ||
		!strings.Contains(failed[0].Error, "heartbeat timeout") {
		t.Fatalf("JobFailed upstream %+v", failed)
	}
	if len(declined) != 1 || declined[0].JobID != "j3" || declined[0].Accepted {
		t.Fatalf("declines upstream %+v", declined)
	}
	if len(cancels) != 1 {
		t.Fatalf("upload cancels %+v", cancels)
	}
	// b is untouched.
	h.FromWorker(b, &wire.JobCompleted{JobID: "j2", AssignmentID: "as-j2"})
	if got := upOf[*wire.JobCompleted](u.take()); len(got) != 1 {
		t.Fatal("b's report after a left did not go upstream")
	}
}

// The upstream lost: AbortJob to the jobs' owners, errors for open
// queries, Draining and close for every worker; then no polls go
// anywhere until a new upstream session attaches.
func TestUpstreamLostAbortsAndClosesTheWorkers(t *testing.T) {
	h := newHub()
	a, idle := buildWorker("a", "x86_64-linux"), buildWorker("idle", "x86_64-linux")
	h.Join(a)
	h.Join(idle)
	u := attach(t, h)
	assigned(t, h, u, a, "j1")
	h.FromWorker(a, &wire.CacheQuery{JobID: "j1", QueryID: "open"})
	u.take()
	u.h.Ended("connection lost")
	if got := names(a.take()); !slices.Equal(got, []string{"AbortJob", "CacheError", "Draining"}) {
		t.Fatalf("a got %v", got)
	}
	if got := names(idle.take()); !slices.Equal(got, []string{"Draining"}) {
		t.Fatalf("idle got %v", got)
	}
	if a.closed == "" || idle.closed == "" {
		t.Fatal("the tenant's workers were not closed")
	}
	// Without an upstream a poll goes nowhere and a query fails at once.
	h.FromWorker(idle, &wire.RequestJob{Kind: wire.JobKindBuild})
	h.FromWorker(idle, &wire.CacheQuery{QueryID: "q"})
	if got := u.take(); len(got) != 0 {
		t.Fatalf("the dead upstream got %v", got)
	}
	if got := of[*wire.CacheError](idle.take()); len(got) != 1 {
		t.Fatal("a query without upstream got no error")
	}
	// A new session asks for the book and for the waiting worker's job.
	u2 := &fakeUpstream{}
	u2.h = h.Attach(u2.send, nil)
	got := u2.take()
	if len(upOf[*wire.RequestJobList](got)) != 1 || len(upOf[*wire.RequestJob](got)) != 1 {
		t.Fatalf("a new upstream session got %v", got)
	}
	// The old session's late messages are ignored.
	u.h.Handle(buildAssign("old", "x86_64-linux"))
	if got := idle.take(); len(got) != 0 {
		t.Fatal("the ended session's AssignJob was forwarded")
	}
}

// Upstream Draining stops the polls; running jobs still report.
func TestUpstreamDrainingStopsPolls(t *testing.T) {
	h := newHub()
	a := buildWorker("a", "x86_64-linux")
	h.Join(a)
	u := attach(t, h)
	assigned(t, h, u, a, "j1")
	u.h.Handle(&wire.ServerDraining{})
	h.FromWorker(a, &wire.RequestJob{Kind: wire.JobKindBuild})
	h.FromWorker(a, &wire.JobCompleted{JobID: "j1", AssignmentID: "as-j1"})
	got := u.take()
	if len(upOf[*wire.RequestJob](got)) != 0 || len(upOf[*wire.JobCompleted](got)) != 1 {
		t.Fatalf("upstream got %v while draining", got)
	}
}

// Cluster members go to distinct workers; StartCluster reaches each
// holder with a roster naming the workers behind the proxy (zone,
// endpoint); signals go both ways only for holders; AbortCluster before
// the start frees the held members.
func TestClusterMessagesReachTheHolders(t *testing.T) {
	h := newHub()
	zone, ep := "fsn1", "10.0.0.2:7000"
	a, b, other := buildWorker("a", "x86_64-linux"), buildWorker("b", "x86_64-linux"), buildWorker("other", "aarch64-linux")
	b.host.Zone, b.host.Endpoint = &zone, &ep
	for _, w := range []*fakeWorker{a, b, other} {
		h.Join(w)
	}
	u := attach(t, h)
	member := func(id string, i uint32) *wire.AssignJob {
		m := buildAssign(id, "x86_64-linux")
		m.Cluster = &wire.ClusterMembership{Attempt: "att", Role: "node", Index: i, HoldSecs: 40}
		return m
	}
	u.h.Handle(member("m0", 0))
	u.h.Handle(member("m1", 1))
	ga, gb := of[*wire.AssignJob](a.take()), of[*wire.AssignJob](b.take())
	if len(ga) != 1 || len(gb) != 1 {
		t.Fatalf("members went a:%d b:%d, want one each", len(ga), len(gb))
	}
	h.FromWorker(a, &wire.AssignJobResponse{JobID: ga[0].JobID, Accepted: true})
	h.FromWorker(b, &wire.AssignJobResponse{JobID: gb[0].JobID, Accepted: true})
	u.take()
	proxyID := "proxy-worker-id"
	u.h.Handle(&wire.StartCluster{Attempt: "att", Roster: []wire.ClusterPeer{
		{Role: "node", Index: 0, Worker: proxyID}, {Role: "node", Index: 1, Worker: proxyID}, {Role: "head", Index: 0, Worker: "elsewhere"}}})
	for _, w := range []*fakeWorker{a, b} {
		got := of[*wire.StartCluster](w.take())
		if len(got) != 1 {
			t.Fatalf("%s got no StartCluster", w.workerID)
		}
		byIndex := map[uint32]wire.ClusterPeer{}
		for _, p := range got[0].Roster[:2] {
			byIndex[p.Index] = p
		}
		holderOf := map[string]uint32{ga[0].JobID: ga[0].Cluster.Index, gb[0].JobID: gb[0].Cluster.Index}
		pa, pb := byIndex[holderOf[ga[0].JobID]], byIndex[holderOf[gb[0].JobID]]
		if pa.Worker != "a" || pb.Worker != "b" || pb.Zone == nil || *pb.Zone != zone || *pb.Endpoint != ep || pa.Zone != nil {
			t.Fatalf("roster %+v", got[0].Roster)
		}
		if got[0].Roster[2].Worker != "elsewhere" {
			t.Fatal("a member elsewhere was renamed")
		}
	}
	u.h.Handle(&wire.ServerClusterSignal{Attempt: "att", Payload: []byte("hi")})
	if len(of[*wire.ServerClusterSignal](a.take())) != 1 || len(of[*wire.ServerClusterSignal](b.take())) != 1 {
		t.Fatal("the signal did not reach both holders")
	}
	h.FromWorker(a, &wire.ClientClusterSignal{Attempt: "att", Payload: []byte("up")})
	h.FromWorker(other, &wire.ClientClusterSignal{Attempt: "att", Payload: []byte("spoof")})
	if got := upOf[*wire.ClientClusterSignal](u.take()); len(got) != 1 || string(got[0].Payload) != "up" {
		t.Fatalf("upstream signals %+v", got)
	}
	if got := other.take(); len(got) != 0 {
		t.Fatalf("a non-holder got %v", names(got))
	}

	// A second attempt aborted before its start: the members are free.
	u.h.Handle(&wire.AssignJob{JobID: "n0", AssignmentID: "x", Job: &wire.BuildJob{Requirement: wire.BuildRequirement{Architecture: "x86_64-linux"}},
		Cluster: &wire.ClusterMembership{Attempt: "att2"}})
	holder := a
	if len(of[*wire.AssignJob](b.take())) == 1 {
		holder = b
	} else {
		a.take()
	}
	h.FromWorker(holder, &wire.AssignJobResponse{JobID: "n0", Accepted: true})
	u.h.Handle(&wire.AbortCluster{Attempt: "att2", Reason: "prepare timeout"})
	if len(of[*wire.AbortCluster](holder.take())) != 1 {
		t.Fatal("AbortCluster did not reach the holder")
	}
	u.take()
	h.FromWorker(holder, &wire.JobFailed{JobID: "n0", Kind: wire.FailureAborted})
	if got := u.take(); len(got) != 0 {
		t.Fatal("a report for a dropped held member went upstream")
	}
}

// A report may overtake the worker's AssignJobResponse (the bulk lane):
// it goes upstream, and so does the late answer, once.
func TestReportBeforeTheAnswerIsForwarded(t *testing.T) {
	h := newHub()
	a := buildWorker("a", "x86_64-linux")
	h.Join(a)
	u := attach(t, h)
	h.FromWorker(a, &wire.RequestJob{Kind: wire.JobKindBuild})
	u.h.Handle(buildAssign("j1", "x86_64-linux"))
	a.take()
	u.take()
	h.FromWorker(a, &wire.LogChunk{JobID: "j1", Data: []byte("fast")})
	h.FromWorker(a, &wire.JobCompleted{JobID: "j1", AssignmentID: "as-j1"})
	h.FromWorker(a, &wire.AssignJobResponse{JobID: "j1", Accepted: true})
	if got := names2(u.take()); !slices.Equal(got, []string{"LogChunk", "JobCompleted", "AssignJobResponse"}) {
		t.Fatalf("upstream got %v", got)
	}
	// The job is over: a second answer or report goes nowhere, and the
	// worker's loss fails nothing.
	h.FromWorker(a, &wire.AssignJobResponse{JobID: "j1", Accepted: true})
	h.FromWorker(a, &wire.JobCompleted{JobID: "j1"})
	h.Leave(a, "gone")
	if got := u.take(); len(got) != 0 {
		t.Fatalf("upstream got %v after the job's end", names2(got))
	}
}

func names2(msgs []wire.ClientMessage) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.WireName())
	}
	return out
}

// A second upstream session ends the first one's jobs before it takes
// over: nothing of the old session's lingers in the new one.
func TestANewUpstreamSessionReplacesTheOld(t *testing.T) {
	h := newHub()
	a := buildWorker("a", "x86_64-linux")
	h.Join(a)
	u := attach(t, h)
	assigned(t, h, u, a, "j1")
	u2 := attach(t, h)
	if got := names(a.take()); !slices.Equal(got, []string{"AbortJob", "Draining"}) || a.closed == "" {
		t.Fatalf("a got %v (closed %q) when the session was replaced", got, a.closed)
	}
	h.FromWorker(a, &wire.JobCompleted{JobID: "j1", AssignmentID: "as-j1"})
	if got := u2.take(); len(got) != 0 {
		t.Fatalf("the new session got the old session's report %v", got)
	}
}

// The book's build candidates count as pending per system (the Hetzner
// reconciler's demand); a worker holding a forwarded job is busy; a
// refresh asks for the full list once.
func TestPendingHoldsAndRefresh(t *testing.T) {
	s := NewSet(slog.New(slog.DiscardHandler), nil)
	h := s.Tenant("t1")
	a := buildWorker("a", "x86_64-linux")
	h.Join(a)
	u := attach(t, h)
	u.h.Handle(&wire.JobListChunk{IsFinal: true})
	u.h.Handle(&wire.JobOffer{Candidates: []wire.JobCandidate{buildCand("x1", "x86_64-linux"), buildCand("x2", "x86_64-linux"),
		buildCand("arm", "aarch64-linux"), buildCand("sub", "builtin"), {JobID: "flake"}}})
	if got := s.PendingJobs("t1"); len(got) != 2 || got["x86_64-linux"] != 2 || got["aarch64-linux"] != 1 {
		t.Fatalf("pending %v", got)
	}
	if len(s.PendingJobs("other")) != 0 {
		t.Fatal("another tenant has pending jobs")
	}
	if h.Holds("a") {
		t.Fatal("a idle worker holds a job")
	}
	h.FromWorker(a, &wire.RequestJob{Kind: wire.JobKindBuild})
	u.h.Handle(buildAssign("x1", "x86_64-linux"))
	if !h.Holds("a") || s.PendingJobs("t1")["x86_64-linux"] != 1 {
		t.Fatalf("after the assignment: holds %v, pending %v", h.Holds("a"), s.PendingJobs("t1"))
	}
	h.FromWorker(a, &wire.AssignJobResponse{JobID: "x1", Accepted: true})
	h.FromWorker(a, &wire.JobCompleted{JobID: "x1"})
	if h.Holds("a") {
		t.Fatal("a holds a completed job")
	}
	u.take()
	h.RefreshBook()
	h.RefreshBook()
	if got := upOf[*wire.RequestJobList](u.take()); len(got) != 1 {
		t.Fatalf("%d list requests, want 1 while one is outstanding", len(got))
	}
}

// A deleted tenant's hub leaves the set with its series, and a message
// still in flight on the removed hub brings none back.
func TestRemoveForgetsTheTenant(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	s := NewSet(slog.New(slog.DiscardHandler), m)
	gone, kept := s.Tenant("gone"), s.Tenant("kept")
	for _, h := range []*Hub{gone, kept} {
		u := attach(t, h)
		u.h.Handle(buildAssign("x1", "x86_64-linux")) // declined: nobody waits
	}
	series := func(tenant string) int {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range families {
			for _, metric := range f.GetMetric() {
				for _, l := range metric.GetLabel() {
					if l.GetName() == "tenant" && l.GetValue() == tenant {
						n++
					}
				}
			}
		}
		return n
	}
	if series("gone") == 0 || series("kept") == 0 {
		t.Fatal("no series before the removal")
	}
	s.Remove("gone")
	if s.Len() != 1 || series("gone") != 0 || series("kept") == 0 {
		t.Fatalf("after the removal: %d hubs, %d series of the removed tenant, %d of the other", s.Len(), series("gone"), series("kept"))
	}
	u := attach(t, gone)
	u.h.Handle(buildAssign("x2", "x86_64-linux"))
	u.h.Ended("stopped")
	if series("gone") != 0 {
		t.Fatal("the removed hub recorded series again")
	}
	if s.PendingJobs("gone") != nil || s.Len() != 1 {
		t.Fatal("asking a removed tenant's demand made a hub")
	}
}
