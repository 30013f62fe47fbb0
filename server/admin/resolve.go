package admin

import (
	"context"
	"errors"
	"strings"

	"gradient.dev/gradient/storage"
)

// Operators name records the way they think of them; these turn a name
// or UUID into the record.

// team resolves a team UUID or name. A UUID is tried first; a team whose
// name looks like a UUID is still found by name.
func (a *API) team(ctx context.Context, ref string) (storage.Team, error) {
	t, err := a.db.Team(ctx, ref)
	if err == nil || !isLookupMiss(err) {
		return t, err
	}
	t, err = a.db.TeamByName(ctx, ref)
	if errors.Is(err, storage.ErrNotFound) {
		return t, notFoundf("team %q does not exist", ref)
	}
	return t, err
}

// cache resolves a cache UUID or name.
func (a *API) cache(ctx context.Context, ref string) (storage.Cache, error) {
	c, err := a.db.Cache(ctx, ref)
	if err == nil || !isLookupMiss(err) {
		return c, err
	}
	c, err = a.db.CacheByName(ctx, ref)
	if errors.Is(err, storage.ErrNotFound) {
		return c, notFoundf("cache %q does not exist", ref)
	}
	return c, err
}

// project resolves TEAM/PROJECT (team by name or UUID) or a project UUID.
func (a *API) project(ctx context.Context, ref string) (storage.Project, error) {
	if teamRef, name, ok := strings.Cut(ref, "/"); ok {
		t, err := a.team(ctx, teamRef)
		if err != nil {
			return storage.Project{}, err
		}
		p, err := a.db.ProjectByName(ctx, t.ID, name)
		if errors.Is(err, storage.ErrNotFound) {
			return p, notFoundf("project %q does not exist in team %q", name, t.Name)
		}
		return p, err
	}
	p, err := a.db.Project(ctx, ref)
	switch {
	case errors.Is(err, storage.ErrInvalid):
		return p, invalidf("project %q: name it TEAM/PROJECT or by its UUID", ref)
	case errors.Is(err, storage.ErrNotFound):
		return p, notFoundf("project %s does not exist", ref)
	}
	return p, err
}

// peer resolves the registering side of a worker registration. Proxies
// have no table yet, so a proxy is its UUID.
func (a *API) peer(ctx context.Context, kind, ref string) (storage.Peer, error) {
	switch storage.PeerKind(kind) {
	case storage.PeerProject, storage.PeerCache, storage.PeerProxy:
	default:
		return storage.Peer{}, invalidf("peer kind %q: want project, cache or proxy", kind)
	}
	if ref == "" {
		return storage.Peer{}, invalidf("peer is empty: name the %s", kind)
	}
	switch storage.PeerKind(kind) {
	case storage.PeerProject:
		p, err := a.project(ctx, ref)
		return storage.Peer{Kind: storage.PeerProject, ID: p.ID}, err
	case storage.PeerCache:
		c, err := a.cache(ctx, ref)
		return storage.Peer{Kind: storage.PeerCache, ID: c.ID}, err
	default: // proxy
		id, err := parseUUID("proxy ID", ref)
		return storage.Peer{Kind: storage.PeerProxy, ID: id}, err
	}
}

// parseWorkerID validates a worker ID and returns its canonical lowercase form,
// the form live sessions are keyed by.
func parseWorkerID(ref string) (string, error) { return parseUUID("worker ID", ref) }

// isLookupMiss: the reference was not a UUID, or no record has that UUID;
// either way it may still be a name.
func isLookupMiss(err error) bool {
	return errors.Is(err, storage.ErrInvalid) || errors.Is(err, storage.ErrNotFound)
}

func parseUUID(what, s string) (string, error) {
	if !isUUID(s) {
		return "", invalidf("%s %q is not a UUID", what, s)
	}
	return strings.ToLower(s), nil
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return false
			}
			continue
		}
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}
