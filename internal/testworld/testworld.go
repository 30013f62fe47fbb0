// Package testworld sets up what tests of the job path share: a project
// subscribed to a public cache, a real server on loopback over a real
// database and NAR store, and worker registrations.
package testworld

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/narstore"
	"gradient.dev/gradient/server"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/jobqueue"
	"gradient.dev/gradient/worker"
)

// Open opens (and migrates) the database at url for the test.
func Open(tb testing.TB, url string) *storage.DB {
	tb.Helper()
	db, err := storage.Open(context.Background(), url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// Project creates team "ops", public cache "main" and project "demo" of
// repository, subscribed to the cache.
func Project(tb testing.TB, db *storage.DB, repository string) (storage.Project, storage.Cache) {
	tb.Helper()
	ctx := context.Background()
	team, err := db.CreateTeam(ctx, "ops")
	if err != nil {
		tb.Fatal(err)
	}
	cache, err := db.CreateCache(ctx, storage.NewCache{Name: "main", Public: true})
	if err != nil {
		tb.Fatal(err)
	}
	project, err := db.CreateProject(ctx, storage.NewProject{TeamID: team.ID, Name: "demo", Repository: repository, Branch: "master"})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := db.SubscribeProject(ctx, project.ID, cache.ID); err != nil {
		tb.Fatal(err)
	}
	return project, cache
}

// Serve runs a server over db with a NAR store in a temporary directory
// (cfg.NarStore and cfg.Logger are filled in when unset) and returns its
// /proto WebSocket URL and its HTTP base URL.
func Serve(tb testing.TB, db *storage.DB, cfg server.Config) (wsURL, httpURL string) {
	tb.Helper()
	quiet := slog.New(slog.DiscardHandler)
	if cfg.NarStore == nil {
		store, err := narstore.OpenLocal(tb.TempDir(), quiet)
		if err != nil {
			tb.Fatal(err)
		}
		cfg.NarStore = store
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	srv := server.New(db, cfg)
	hs := httptest.NewServer(srv.Handler())
	tb.Cleanup(func() { srv.Close(); hs.Close() })
	return "ws" + strings.TrimPrefix(hs.URL, "http") + "/proto", hs.URL
}

// Register registers a new worker ID for project and returns it with the
// peers line ("project:token") the worker authenticates with.
func Register(tb testing.TB, db *storage.DB, projectID string) (workerID, peers string) {
	tb.Helper()
	workerID = storage.NewID()
	_, token, err := db.CreateRegistration(context.Background(), storage.Peer{Kind: storage.PeerProject, ID: projectID}, workerID, storage.DefaultWorkerSettings())
	if err != nil {
		tb.Fatal(err)
	}
	return workerID, projectID + ":" + token
}

// RunWorker runs a worker with cfg until the test ends (then stops it as
// SIGTERM would and waits for it).
func RunWorker(tb testing.TB, cfg worker.Config) {
	tb.Helper()
	if cfg.Session.Logger == nil {
		cfg.Session.Logger = slog.New(slog.DiscardHandler)
	}
	w, err := worker.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			tb.Error("worker did not stop within 30 s")
		}
	})
}

// WaitForEvaluation polls evaluation id until cond holds and returns what
// it saw; after timeout it fails with the builds' states and the
// evaluation's log.
func WaitForEvaluation(tb testing.TB, db *storage.DB, id, what string, timeout time.Duration,
	cond func(storage.Evaluation, []storage.Build) bool) (storage.Evaluation, []storage.Build) {
	tb.Helper()
	jobs := jobqueue.New(db)
	deadline := time.Now().Add(timeout)
	for {
		ev, err := jobs.Evaluation(tb.Context(), id)
		if err != nil {
			tb.Fatal(err)
		}
		builds, err := jobs.EvaluationBuilds(tb.Context(), id)
		if err != nil {
			tb.Fatal(err)
		}
		if cond(ev, builds) {
			return ev, builds
		}
		if time.Now().After(deadline) {
			var states []string
			for _, b := range builds {
				states = append(states, b.Attr+"="+string(b.Status)+"/"+string(b.FailureKind)+" "+b.Error)
			}
			log, _ := jobs.EvaluationLog(tb.Context(), id)
			tb.Fatalf("evaluation %s: %s did not happen within %s (status %s, error %q, builds %v)\nlog:\n%s",
				id, what, timeout, ev.Status, ev.Error, states, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
