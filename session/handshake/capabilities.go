package handshake

import "gradient.dev/gradient/wire"

// AllCapabilities sets every flag: the server's own capabilities, and a
// policy's Allowed when it restricts nothing.
var AllCapabilities = wire.GradientCapabilities{
	Core: true, Federate: true, Fetch: true, Eval: true, Build: true, Cache: true,
}

// ServerCapabilities is what a server offers: every capability, with the
// reserved federate only when the operator enables it (proto.federate,
// default off).
func ServerCapabilities(federate bool) wire.GradientCapabilities {
	c := AllCapabilities
	c.Federate = federate
	return c
}

// Negotiate is the capability rule: a worker capability is active only when
// the server supports it, the worker advertised it and the policy allows
// it; core and cache are the server's alone (whatever the worker sent).
// Federate grants no access (it is reserved, without behaviour), so no
// policy narrows it: it is active whenever both sides enable it.
func Negotiate(server, worker, allowed wire.GradientCapabilities) wire.GradientCapabilities {
	return wire.GradientCapabilities{
		Core:     server.Core,
		Cache:    server.Cache,
		Federate: server.Federate && worker.Federate,
		Fetch:    server.Fetch && worker.Fetch && allowed.Fetch,
		Eval:     server.Eval && worker.Eval && allowed.Eval,
		Build:    server.Build && worker.Build && allowed.Build,
	}
}

// WorkerAdvertised is what a worker may put in InitConnection: its own
// flags with core and cache cleared (those belong to the server).
func WorkerAdvertised(c wire.GradientCapabilities) wire.GradientCapabilities {
	c.Core, c.Cache = false, false
	return c
}
