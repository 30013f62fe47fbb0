package session

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"gradient.dev/gradient/session/handshake"
)

func TestHandshakeTimeoutOnSilentPeer(t *testing.T) {
	a, d := loopback(t)
	res := goRun(func() (*Established, error) {
		return RunAuthority(context.Background(), NewConn(a, quiet()), AuthorityConfig{Policy: &testPolicy{}, Timeout: 100 * time.Millisecond})
	})
	// The dialed side agrees on a version, then says nothing.
	if _, err := NewConn(d, quiet()).Agree(context.Background()); err != nil {
		t.Fatal(err)
	}
	var he *handshake.Error
	if err := wait(t, res).err; !errors.As(err, &he) || he.Reason != "connection closed before InitConnection" {
		t.Fatalf("got %v", err)
	}
	if !errors.Is(wait(t, goRun(func() (*Established, error) {
		return RunPeer(context.Background(), NewConn(d, quiet()), PeerConfig{WorkerID: "w", Timeout: 100 * time.Millisecond})
	})).err, ErrClosed) {
		t.Fatal("peer on a closed connection did not fail as closed")
	}
}

func TestPeerHandshakeTimeout(t *testing.T) {
	a, d := loopback(t)
	// The accepted side agrees, then never answers the InitConnection.
	go NewConn(a, quiet()).Agree(context.Background())
	_, err := RunPeer(context.Background(), NewConn(d, quiet()), PeerConfig{WorkerID: "w1", Timeout: 100 * time.Millisecond})
	var he *handshake.Error
	if !errors.As(err, &he) || he.Reason != "connection closed before AuthChallenge" {
		t.Fatalf("got %v", err)
	}
}

func TestDialConnectTimeout(t *testing.T) {
	// A TCP listener that never answers the HTTP upgrade.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	start := time.Now()
	_, err = Dial(context.Background(), "ws://"+ln.Addr().String()+"/proto", DialOptions{ConnectTimeout: 100 * time.Millisecond, Logger: discardLogger()})
	if err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("got %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("connect timeout ignored")
	}
}
