package session

import (
	"context"
	"errors"
	"testing"

	"gradient.dev/gradient/wire"
)

func TestAgreementOverLoopback(t *testing.T) {
	a, d := loopback(t)
	server := NewConn(a, ConnOptions{Versions: wire.VersionRange{Oldest: 30, Newest: 33}, Logger: discardLogger()})
	worker := NewConn(d, ConnOptions{Versions: wire.VersionRange{Oldest: 30, Newest: 31}, Logger: discardLogger()})
	ctx := context.Background()
	sent := make(chan error, 1)
	go func() { sent <- worker.SendClient(ctx, &wire.InitConnection{ID: "w1"}) }()
	m, err := server.RecvClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if init, ok := m.(*wire.InitConnection); !ok || init.ID != "w1" {
		t.Fatalf("got %#v", m)
	}
	if server.Version() != 31 || worker.Version() != 31 {
		t.Fatalf("versions %d %d, want 31", server.Version(), worker.Version())
	}
}

func TestAgreementNoSharedVersion(t *testing.T) {
	a, d := loopback(t)
	ours := wire.Supported
	peerRange := wire.VersionRange{Oldest: ours.Newest + 1, Newest: ours.Newest + 2}
	server := NewConn(a, ConnOptions{Versions: peerRange, Logger: discardLogger()})
	worker := NewConn(d, quiet())
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { _, err := server.RecvClient(ctx); done <- err }()

	err := worker.SendClient(ctx, &wire.InitConnection{ID: "w1"})
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("send: %v, want ErrClosed", err)
	}
	var refusal *wire.RefusalError
	if !errors.As(err, &refusal) {
		t.Fatalf("send error %v carries no refusal", err)
	}
	want := "no shared protocol version: ours 30..=33, peer 34..=35"
	if worker.Refusal() != want {
		t.Fatalf("worker refusal %q, want %q", worker.Refusal(), want)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("server receive: %v", err)
	}
	if want := "no shared protocol version: ours 34..=35, peer 30..=33"; server.Refusal() != want {
		t.Fatalf("server refusal %q, want %q", server.Refusal(), want)
	}
}

func TestAgreementOlderPeer(t *testing.T) {
	a, d := loopback(t)
	server := NewConn(a, quiet())
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { _, err := server.RecvClient(ctx); done <- err }()

	// An old worker opens with an rkyv greeting instead of a GRAD frame.
	if err := d.WriteMessage(ctx, append([]byte{0, 1}, "rkyv-greeting"...)); err != nil {
		t.Fatal(err)
	}
	frame, err := d.ReadMessage(ctx) // the server's own version frame
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := wire.ParseVersionFrame(frame); !ok {
		t.Fatalf("first frame %x is not a version frame", frame)
	}
	_, err = d.ReadMessage(ctx)
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != 1002 || ce.Reason != "peer protocol is older than 30" {
		t.Fatalf("got %v, want close 1002 %q", err, "peer protocol is older than 30")
	}
	if err := <-done; err == nil {
		t.Fatal("receive yielded a message")
	}
	if server.Refusal() != "peer protocol is older than 30" {
		t.Fatalf("refusal %q", server.Refusal())
	}
}

func TestAgreementOverPipe(t *testing.T) {
	a, b := Pipe()
	x := NewConn(a, ConnOptions{Versions: wire.VersionRange{Oldest: 27, Newest: 30}})
	y := NewConn(b, ConnOptions{Versions: wire.VersionRange{Oldest: 28, Newest: 31}})
	ch := make(chan uint16, 1)
	go func() { v, _ := y.Agree(context.Background()); ch <- v }()
	v, err := x.Agree(context.Background())
	if err != nil || v != 30 || <-ch != 30 {
		t.Fatalf("agree: %d %v", v, err)
	}
}

// docs/protocol/session.md §10 items 9 and 10 through the session path (a Conn over a
// pipe), with the reference's ranges.
func TestAgreementRefusalTexts(t *testing.T) {
	a, b := Pipe()
	x := NewConn(a, ConnOptions{Versions: wire.VersionRange{Oldest: 27, Newest: 27}, Logger: discardLogger()})
	b.WriteMessage(context.Background(), wire.VersionFrame(wire.VersionRange{Oldest: 30, Newest: 31}))
	if _, err := x.Agree(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("agree: %v", err)
	}
	if want := "no shared protocol version: ours 27..=27, peer 30..=31"; x.Refusal() != want {
		t.Fatalf("refusal %q", x.Refusal())
	}

	a, b = Pipe()
	y := NewConn(a, ConnOptions{Versions: wire.VersionRange{Oldest: 27, Newest: 28}, Logger: discardLogger()})
	b.WriteMessage(context.Background(), append([]byte{0, 1}, "rkyv-greeting"...))
	if _, err := y.RecvClient(context.Background()); err == nil {
		t.Fatal("receive yielded a message")
	}
	if want := "peer protocol is older than 27"; y.Refusal() != want {
		t.Fatalf("refusal %q", y.Refusal())
	}
	b.ReadMessage(context.Background()) // y's version frame
	var ce *CloseError
	if _, err := b.ReadMessage(context.Background()); !errors.As(err, &ce) || ce.Code != 1002 || ce.Reason != "peer protocol is older than 27" {
		t.Fatalf("peer saw %v", err)
	}
}
