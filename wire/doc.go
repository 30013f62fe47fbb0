// Package wire is the byte-exact codec of the Gradient worker protocol,
// versions OldestVersion..=NewestVersion (30..=33).
//
// Every WebSocket binary message carries one ClientMessage (worker → server)
// or ServerMessage (server → worker), encoded for the version both sides
// agreed on in their first frame (see Agree). The Go types in messages.go
// and types.go carry the protocol's version annotations:
//
//	//wire:enum [name=WireName] [oldest=N]              on an enum type
//	//wire:variant TAG Name GoType [tuple] [since=N] [until=N] [job|cache] [bulk]
//	`wire:"snake_name[,since=N][,default]"`            on a struct field
//
// since=N on a field: present since N; with default, older peers leave it
// out and decoding fills the zero value; without default it is required and
// raises the oldest version to N. since=N on a variant: the variant is new
// in N, sending it to an older peer is a NewerThanPeerError. until=N: the
// variant exists only below N (Handover and HandoverDone, whose tags 32
// reused). oldest=N on the message enums raises the oldest version.
// job or cache on a message variant: the job loop or the cache handles it
// (ClientMessageClass, ServerMessageClass; neither: the session itself);
// bulk: it rides the session writer's bulk lane (ClientMessageBulk,
// ServerMessageBulk).
//
// wire_gen.go is generated from these annotations by `go generate ./wire`;
// the same command writes schema/v{N}.txt for a new version, deletes files
// below the oldest and refuses to rewrite a published one.
package wire

//go:generate go run ./internal/wiregen
//go:generate go run ./internal/schemagen
