package cache

import (
	"context"
	"slices"
	"sync"

	"gradient.dev/gradient/storage"
)

// subscriptionMemo keeps each project's subscribed caches (what
// storage.ProjectCaches returns), which every upload reads twice (at the
// grant and at the commit) and every cache query once per project: an
// evaluation of thousands of derivations made it one of the server's
// largest costs (docs/PERFORMANCE.md). Subscriptions change only through
// the admin API, which tells the cache (SubscriptionsChanged, Forget), so
// an entry is exact, never stale: a fill that read the database before a
// change is not kept.
type subscriptionMemo struct {
	mu       sync.Mutex
	projects map[string][]storage.Cache
	// changes counts invalidations, like cacheMemo.forgets.
	changes uint64
}

// maxMemoProjects bounds the memo; past it the memo starts over.
const maxMemoProjects = 1 << 14

func newSubscriptionMemo() *subscriptionMemo {
	return &subscriptionMemo{projects: map[string][]storage.Cache{}}
}

// ProjectCaches returns the caches project subscribes to, by name, as
// storage.ProjectCaches does, from the memo when it has them. The caller
// gets its own slice.
func (bc *Cache) ProjectCaches(ctx context.Context, projectID string) ([]storage.Cache, error) {
	m := bc.subscriptions
	m.mu.Lock()
	cs, ok := m.projects[projectID]
	stamp := m.changes
	m.mu.Unlock()
	if ok {
		return slices.Clone(cs), nil
	}
	cs, err := bc.db.ProjectCaches(ctx, projectID)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.changes == stamp {
		if len(m.projects) >= maxMemoProjects {
			clear(m.projects)
		}
		m.projects[projectID] = slices.Clone(cs)
	}
	m.mu.Unlock()
	return cs, nil
}

// SubscriptionsChanged drops what the cache keeps of a project's
// subscriptions: the admin API calls it after subscribing, unsubscribing
// or deleting the project, before it answers.
func (bc *Cache) SubscriptionsChanged(projectID string) {
	m := bc.subscriptions
	m.mu.Lock()
	defer m.mu.Unlock()
	m.changes++
	delete(m.projects, projectID)
}

// forgetAll drops every project's subscriptions: a deleted
// cache leaves the lists of all projects subscribed to it.
func (m *subscriptionMemo) forgetAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.changes++
	clear(m.projects)
}
