package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"gradient.dev/gradient/server"
	"gradient.dev/gradient/server/servertest"

	"gradient.dev/gradient/internal/waitfor"
	"gradient.dev/gradient/session"
	"gradient.dev/gradient/storage"
	"gradient.dev/gradient/storage/storagetest"
	"gradient.dev/gradient/wire"
)

// The reserved federate capability is active only when both sides enable
// it: the server with proto.federate, the worker by offering it. A plain
// project registration is enough (no proxy).
func TestFederateNegotiatedOnlyWhenBothEnableIt(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		server, worker, want bool
	}{{false, false, false}, {false, true, false}, {true, false, false}, {true, true, true}} {
		t.Run(fmt.Sprintf("server %v worker %v", c.server, c.worker), func(t *testing.T) {
			t.Parallel()
			storagetest.ForEachEngine(t, func(t *testing.T, db *storage.DB) {
				e := servertest.NewEnv(t, db, server.Config{Federate: c.server})
				id := storage.NewID()
				token := e.Register(storage.PeerProject, e.Project.ID, id)
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				tr, err := session.Dial(ctx, e.URL, session.DialOptions{Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					cancel()
					t.Fatal(err)
				}
				conn := session.NewConn(tr, session.ConnOptions{Logger: slog.New(slog.DiscardHandler)})
				offer := wire.GradientCapabilities{Build: true, Federate: c.worker}
				est, err := session.RunPeer(ctx, conn, session.PeerConfig{WorkerID: id, Capabilities: offer, Tokens: map[string]string{e.Project.ID: token}})
				cancel()
				if err != nil {
					t.Fatalf("server federate %v, worker %v: %v", c.server, c.worker, err)
				}
				if est.Capabilities.Federate != c.want || !est.Capabilities.Build {
					t.Errorf("server federate %v, worker %v: negotiated %+v, want federate %v", c.server, c.worker, est.Capabilities, c.want)
				}
				waitfor.True(t, "the server to list the capability", func() bool {
					return slices.Contains(e.Srv.WorkerStatus(id).Capabilities, "federate") == c.want && e.Srv.WorkerStatus(id).Live
				})
				tr.Close(session.CloseNormal, "")
			})
		})
	}
}
