package session

import (
	"context"

	"gradient.dev/gradient/wire"
)

// FirstKind is who opened a connection on a listener both workers and
// servers can reach.
type FirstKind uint8

const (
	Neither    FirstKind = iota // anything but the two openings, or an empty frame
	FromWorker                  // an InitConnection
	FromServer                  // an Authenticate
)

// First is a classified first message.
type First struct {
	Kind FirstKind
	Init *wire.InitConnection // FromWorker
	Auth *wire.Authenticate   // FromServer
}

// ClassifyFirst tries frame as a ClientMessage accepted only if it is
// InitConnection, then as a ServerMessage accepted only if it is
// Authenticate.
func ClassifyFirst(frame []byte, ver uint16) First {
	if m, err := wire.DecodeClientMessage(frame, ver); err == nil {
		if init, ok := m.(*wire.InitConnection); ok {
			return First{Kind: FromWorker, Init: init}
		}
	}
	if m, err := wire.DecodeServerMessage(frame, ver); err == nil {
		if auth, ok := m.(*wire.Authenticate); ok {
			return First{Kind: FromServer, Auth: auth}
		}
	}
	return First{Kind: Neither}
}

// RecvFirst agrees if needed, reads the first handshake message (size
// capped) and classifies it; the tests continue with the role's
// handshake from that message (listener_test.go).
func (c *Conn) RecvFirst(ctx context.Context) (First, error) {
	frame, err := c.recvFrame(ctx)
	if err != nil {
		return First{}, err
	}
	return ClassifyFirst(frame, c.ver), nil
}
