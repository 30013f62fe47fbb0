package cache

// AnonymousSessionsForTest is how many client addresses hold anonymous
// cache sessions now (tests only).
func (bc *Cache) AnonymousSessionsForTest() int { return bc.anonymousCache.Tracked() }
