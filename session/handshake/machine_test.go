package handshake

import (
	"errors"
	"testing"

	"gradient.dev/gradient/wire"
)

func TestAuthoritySteps(t *testing.T) {
	m := NewAuthority(AllCapabilities)
	if s := m.Start(); s.Action != Read || s.Send != nil {
		t.Fatalf("start %+v", s)
	}
	s := m.Received(&wire.InitConnection{ID: "w1", Capabilities: wire.GradientCapabilities{Build: true, Core: true}})
	if s.Action != AskChallenge || s.WorkerID != "w1" {
		t.Fatalf("after init %+v", s)
	}
	s = m.Challenged([]string{"p1"}, nil)
	if ch, ok := s.Send.(*wire.AuthChallenge); !ok || len(ch.Peers) != 1 || s.Action != Read {
		t.Fatalf("challenge %+v", s)
	}
	tokens := []wire.Pair[string, string]{{First: "p1", Second: "t"}}
	s = m.Received(&wire.AuthResponse{Tokens: tokens})
	if s.Action != AskAuthorize || len(s.Tokens) != 1 {
		t.Fatalf("after response %+v", s)
	}
	s = m.Decided(Accept([]string{"p1"}, nil, AllCapabilities), nil)
	ack, ok := s.Send.(*wire.InitAck)
	if !ok || s.Action != Done || !ack.Capabilities.Build || !ack.Capabilities.Core || ack.Capabilities.Eval {
		t.Fatalf("decided %+v", s)
	}
	if s.Result.WorkerID != "w1" || ack.FailedPeers == nil {
		t.Fatalf("result %+v", s.Result)
	}
}

func TestCacheSessionGrantsCacheOnly(t *testing.T) {
	m := NewCache()
	m.Start()
	s := m.Received(&wire.InitConnection{ID: "reader", Capabilities: AllCapabilities})
	ack, ok := s.Send.(*wire.InitAck)
	if !ok || s.Action != Done || ack.Capabilities != CacheSessionCapabilities || len(ack.AuthorizedPeers) != 0 {
		t.Fatalf("cache session answered %+v", s)
	}
}

func TestWrongVariantsBecomeRejects(t *testing.T) {
	draining := &wire.ClientDraining{}
	cases := []struct {
		name   string
		step   func() Step
		code   uint16
		reason string
		server bool
	}{
		{"authority first", func() Step { m := NewAuthority(AllCapabilities); m.Start(); return m.Received(draining) }, 400, "expected InitConnection", true},
		{"authority second", func() Step {
			m := NewAuthority(AllCapabilities)
			m.Start()
			m.Received(&wire.InitConnection{ID: "w"})
			m.Challenged(nil, nil)
			return m.Received(draining)
		}, 400, "expected AuthResponse", true},
		{"dialer", func() Step { m := NewDialer("w", nil, AllCapabilities); m.Start(); return m.Received(draining) }, 400, "expected InitConnection", true},
		{"dialer other id", func() Step {
			m := NewDialer("w1", nil, AllCapabilities)
			m.Start()
			return m.Received(&wire.InitConnection{ID: "w2"})
		}, 400, "dialed worker answered as w2", true},
		{"dialed", func() Step {
			m := NewDialed("w", wire.GradientCapabilities{})
			m.Start()
			return m.Received(&wire.ServerDraining{})
		}, 400, "expected Authenticate", false},
		{"dialed other id", func() Step {
			m := NewDialed("w2", wire.GradientCapabilities{})
			m.Start()
			return m.Received(&wire.Authenticate{WorkerID: "w1"})
		}, 401, "unknown worker id or wrong token", false},
		{"dialed bad token", func() Step {
			m := NewDialed("w1", wire.GradientCapabilities{})
			m.Start()
			m.Received(&wire.Authenticate{WorkerID: "w1"})
			return m.Verified(false)
		}, 401, "unknown worker id or wrong token", false},
	}
	for _, tc := range cases {
		s := tc.step()
		if s.Action != Fail || s.Err.Code != tc.code || s.Err.Reason != tc.reason {
			t.Errorf("%s: %+v", tc.name, s)
			continue
		}
		switch r := s.Send.(type) {
		case *wire.ServerReject:
			if !tc.server || r.Code != tc.code || r.Reason != tc.reason {
				t.Errorf("%s: sent %+v", tc.name, r)
			}
		case *wire.ClientReject:
			if tc.server || r.Code != tc.code || r.Reason != tc.reason {
				t.Errorf("%s: sent %+v", tc.name, r)
			}
		default:
			t.Errorf("%s: sent %#v", tc.name, s.Send)
		}
	}
}

func TestRemoteRejectAndAborts(t *testing.T) {
	m := NewPeer("w1", AllCapabilities, nil)
	if s := m.Start(); s.Send.(*wire.InitConnection).Capabilities.Core {
		t.Fatal("a worker advertised core")
	}
	s := m.Received(&wire.ServerReject{Code: 496, Reason: "worker already connected"})
	if s.Action != Fail || s.Send != nil || !s.Err.Remote || s.Err.Error() != "server rejected connection (code 496): worker already connected" {
		t.Fatalf("%+v %v", s, s.Err)
	}
	m = NewDialer("w1", nil, AllCapabilities)
	m.Start()
	s = m.Received(&wire.ClientReject{Code: 401, Reason: "unknown worker id or wrong token"})
	if s.Action != Fail || s.Send != nil || s.Err.Code != 401 || s.Err.WorkerID != "w1" {
		t.Fatalf("%+v", s)
	}
	m = NewAuthority(AllCapabilities)
	m.Start()
	s = m.Lost(errors.New("eof"))
	if s.Err.Reason != "connection closed before InitConnection" || s.Err.Code != 0 {
		t.Fatalf("%+v", s.Err)
	}
	m = NewDialed("w1", wire.GradientCapabilities{})
	m.Start()
	m.Received(&wire.Authenticate{WorkerID: "w1"})
	m.Verified(true)
	s = m.Received(&wire.AuthUpdate{})
	if s.Err.Reason != "expected InitAck, got AuthUpdate" {
		t.Fatalf("%+v", s.Err)
	}
}

func TestPeerAnswersOnlyHeldTokens(t *testing.T) {
	m := NewPeer("w1", wire.GradientCapabilities{}, map[string]string{"p1": "a", "p3": "c"})
	m.Start()
	s := m.Received(&wire.AuthChallenge{Peers: []string{"p1", "p2"}})
	resp := s.Send.(*wire.AuthResponse)
	if len(resp.Tokens) != 1 || resp.Tokens[0] != (wire.Pair[string, string]{First: "p1", Second: "a"}) {
		t.Fatalf("%+v", resp.Tokens)
	}
}

func TestNegotiateTable(t *testing.T) {
	type caps = wire.GradientCapabilities
	cases := []struct {
		name                    string
		server, worker, allowed caps
		want                    caps
	}{
		{"both support", AllCapabilities, caps{Build: true, Eval: true}, AllCapabilities, caps{Core: true, Cache: true, Build: true, Eval: true}},
		{"worker lacks", AllCapabilities, caps{}, AllCapabilities, caps{Core: true, Cache: true}},
		{"server lacks", caps{Core: true, Cache: true, Build: true}, caps{Build: true, Fetch: true}, AllCapabilities, caps{Core: true, Cache: true, Build: true}},
		{"not authorized", AllCapabilities, caps{Build: true, Fetch: true}, caps{Fetch: true}, caps{Core: true, Cache: true, Fetch: true}},
		{"worker claims core and cache", caps{Core: true, Cache: false, Eval: true}, caps{Core: true, Cache: true, Eval: true}, AllCapabilities, caps{Core: true, Eval: true}},
		{"federate", AllCapabilities, caps{Federate: true}, AllCapabilities, caps{Core: true, Cache: true, Federate: true}},
		{"federate needs no policy", ServerCapabilities(true), caps{Federate: true, Build: true}, caps{}, caps{Core: true, Cache: true, Federate: true}},
		{"federate off on the server", ServerCapabilities(false), caps{Federate: true}, AllCapabilities, caps{Core: true, Cache: true}},
		{"federate not offered", ServerCapabilities(true), caps{Build: true}, AllCapabilities, caps{Core: true, Cache: true, Build: true}},
	}
	for _, tc := range cases {
		if got := Negotiate(tc.server, tc.worker, tc.allowed); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
