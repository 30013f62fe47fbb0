package session

import (
	"context"
	"testing"
	"time"

	"gradient.dev/gradient/session/handshake"
	"gradient.dev/gradient/wire"
)

// FuzzAuthorityHandshake sends arbitrary frames to the authority after a
// valid version frame: it must neither panic nor hang, and it always ends
// with an error or an accepted handshake.
func FuzzAuthorityHandshake(f *testing.F) {
	enc := func(m wire.ClientMessage) []byte {
		b, _ := wire.AppendClientMessage(nil, m, wire.NewestVersion)
		return b
	}
	f.Add(enc(&wire.InitConnection{ID: "w1"}), enc(&wire.AuthResponse{Tokens: []wire.Pair[string, string]{{First: "p1", Second: "t1"}}}))
	f.Add(enc(&wire.AuthResponse{}), []byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, []byte{0})
	f.Add([]byte{}, []byte{1, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, first, second []byte) {
		a, b := Pipe()
		policy := &testPolicy{peers: []string{"p1"}, valid: map[string]string{"p1": "t1"}, allowed: handshake.AllCapabilities}
		done := goRun(func() (*Established, error) {
			return RunAuthority(context.Background(), NewConn(a, quiet()), AuthorityConfig{Policy: policy, Timeout: 5 * time.Second})
		})
		ctx := context.Background()
		b.WriteMessage(ctx, wire.VersionFrame(wire.Supported))
		b.WriteMessage(ctx, first)
		b.WriteMessage(ctx, second)
		b.Close(CloseNormal, "fuzz over")
		select {
		case r := <-done:
			if r.err == nil && r.est == nil {
				t.Fatal("neither a result nor an error")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("authority hung")
		}
	})
}

// FuzzMachineReceives decodes arbitrary frames and feeds them to every
// role's machine in every reachable state: no panics, every step is a
// known action.
func FuzzMachineReceives(f *testing.F) {
	f.Add([]byte{0, 0, 0})
	f.Add([]byte{25, 1, 'w', 0})
	f.Fuzz(func(t *testing.T, frame []byte) {
		var msgs []wire.Message
		if m, err := wire.DecodeClientMessage(frame, wire.NewestVersion); err == nil {
			msgs = append(msgs, m)
		}
		if m, err := wire.DecodeServerMessage(frame, wire.NewestVersion); err == nil {
			msgs = append(msgs, m)
		}
		for _, m := range msgs {
			for _, mk := range []func() *handshake.Machine{
				func() *handshake.Machine { return handshake.NewAuthority(handshake.AllCapabilities) },
				func() *handshake.Machine { return handshake.NewDialer("w1", nil, handshake.AllCapabilities) },
				func() *handshake.Machine { return handshake.NewPeer("w1", workerCaps, nil) },
				func() *handshake.Machine { return handshake.NewDialed("w1", workerCaps) },
			} {
				mach := mk()
				mach.Start()
				for range 3 {
					s := mach.Received(m)
					if s.Action < handshake.Read || s.Action > handshake.Fail {
						t.Fatalf("unknown action %d", s.Action)
					}
					if s.Action == handshake.Fail && s.Err == nil {
						t.Fatal("failure without an error")
					}
				}
			}
		}
	})
}
