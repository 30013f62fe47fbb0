package authority

import (
	"maps"
	"slices"

	"gradient.dev/gradient/session/handshake"
)

// Abilities are the job kinds a peer lets the worker run.
type Abilities struct {
	Fetch, Eval, Build bool
}

// Union is what either a or b allows.
func (a Abilities) Union(b Abilities) Abilities {
	return Abilities{a.Fetch || b.Fetch, a.Eval || b.Eval, a.Build || b.Build}
}

// Grant is what an accepted session may do: the decision for the wire and
// the projects and caches behind it. A Policy returns one per handshake
// and per reauth.
type Grant struct {
	Decision handshake.Decision
	// WorkerID is the canonical spelling of the worker ID the grant is
	// for; the registry holds the session under it.
	WorkerID string
	// Known: a peer registered the worker ID, so its failures are kept as
	// its offline reason.
	Known bool
	// Projects whose jobs the worker may run (own registrations and
	// projects granting its team), each with a cache.
	Projects []string
	// Caches the worker may read and write as a cache peer.
	Caches []string
	// Proxies whose pool the worker joined.
	Proxies   []string
	Abilities Abilities
	// ProjectAbilities is what the worker may do per project (the
	// registration's enable_fetch / enable_eval / enable_build, or its
	// team's): a job of a project needs the abilities of that project.
	ProjectAbilities map[string]Abilities
}

// Allow records abilities for project.
func (g *Grant) Allow(project string, a Abilities) {
	if g.ProjectAbilities == nil {
		g.ProjectAbilities = map[string]Abilities{}
	}
	g.ProjectAbilities[project] = g.ProjectAbilities[project].Union(a)
}

// Rejected reports whether the decision rejects the session.
func (g Grant) Rejected() bool { return g.Decision.Reject != nil }

// Clone is a copy that shares nothing with g.
func (g Grant) Clone() Grant {
	g.Projects = slices.Clone(g.Projects)
	g.Caches = slices.Clone(g.Caches)
	g.Proxies = slices.Clone(g.Proxies)
	g.ProjectAbilities = maps.Clone(g.ProjectAbilities)
	return g
}

// merge adds a reauth's grant: reauth never revokes granted peers.
func (g *Grant) merge(more Grant) {
	for _, p := range more.Projects {
		if !slices.Contains(g.Projects, p) {
			g.Projects = append(g.Projects, p)
		}
	}
	for _, p := range more.Caches {
		if !slices.Contains(g.Caches, p) {
			g.Caches = append(g.Caches, p)
		}
	}
	for _, p := range more.Proxies {
		if !slices.Contains(g.Proxies, p) {
			g.Proxies = append(g.Proxies, p)
		}
	}
	g.Abilities = g.Abilities.Union(more.Abilities)
	for p, a := range more.ProjectAbilities {
		g.Allow(p, a)
	}
}
