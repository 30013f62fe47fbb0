package authority_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"gradient.dev/gradient/authority"
	"gradient.dev/gradient/session"
)

// Connections that arrive while the authority closes either run (and are
// closed by Close) or are refused with 1001 "server stopping"; none is
// left running after Close returns, and none races its wait.
func TestConnectionsDuringCloseAreRefusedWith1001(t *testing.T) {
	for round := 0; round < 20; round++ {
		a := authority.New(authority.Config{Policy: &pool{rows: map[string]poolRow{}}})
		const n = 8
		var served sync.WaitGroup
		peers := make([]session.Transport, n)
		start := make(chan struct{})
		for i := range n {
			ours, theirs := session.Pipe()
			peers[i] = theirs
			served.Go(func() {
				<-start
				a.ServeWorker(ours, "pipe")
				ours.Close(session.CloseNormal, "")
			})
		}
		close(start)
		a.Close()
		served.Wait()
		// After Close returned, a new connection is refused at once.
		ours, theirs := session.Pipe()
		a.ServeWorker(ours, "pipe")
		peers = append(peers, theirs)
		refusedLate := false
		for i, p := range peers {
			_, err := readUntilClosed(p)
			var ce *session.CloseError
			if !errors.As(err, &ce) {
				t.Fatalf("round %d peer %d: want a close, got %v", round, i, err)
			}
			if i == len(peers)-1 {
				refusedLate = ce.Code == session.CloseGoingAway && ce.Reason == authority.ErrStopping.Error()
			}
		}
		if !refusedLate {
			t.Fatalf("round %d: a connection after Close was not refused with 1001 %q", round, authority.ErrStopping.Error())
		}
	}
}

// readUntilClosed reads whatever the authority sent (its agreement frame)
// until the close.
func readUntilClosed(t session.Transport) ([]byte, error) {
	for {
		b, err := t.ReadMessage(context.Background())
		if err != nil {
			return b, err
		}
	}
}
