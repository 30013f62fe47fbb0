package wire

// capabilityNames are the capabilities' names as options, logs and the
// admin APIs spell them (their wire field names), in the order Names lists
// them; flags returns the fields in the same order.
var capabilityNames = [...]string{"core", "federate", "fetch", "eval", "build", "cache"}

func (c *GradientCapabilities) flags() [len(capabilityNames)]*bool {
	return [...]*bool{&c.Core, &c.Federate, &c.Fetch, &c.Eval, &c.Build, &c.Cache}
}

// Names lists the capabilities that are on, in the order core, federate,
// fetch, eval, build, cache; nil when none is.
func (c GradientCapabilities) Names() []string {
	var out []string
	for i, on := range c.flags() {
		if *on {
			out = append(out, capabilityNames[i])
		}
	}
	return out
}

// CapabilityNamed is the set holding only the capability with that exact
// name; false for an unknown name. Callers split their lists and decide
// which capabilities they accept.
func CapabilityNamed(name string) (GradientCapabilities, bool) {
	var c GradientCapabilities
	for i, f := range c.flags() {
		if capabilityNames[i] == name {
			*f = true
			return c, true
		}
	}
	return c, false
}

// Or is the union of both sets.
func (c GradientCapabilities) Or(o GradientCapabilities) GradientCapabilities {
	for i, f := range c.flags() {
		*f = *f || *o.flags()[i]
	}
	return c
}
