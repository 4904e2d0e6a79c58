package rewrite

import (
	"container/list"
	"sync"
)

// planCache is a bounded LRU of planning results keyed by SQL text. It also
// keeps refusals and "nothing to rewrite", which are as deterministic as plans.
type planCache struct {
	mu    sync.Mutex
	max   int
	ll    *list.List // front = most recently used
	items map[string]*list.Element
}

type cacheEntry struct {
	sql  string
	plan *Plan
	err  error
}

func newPlanCache(max int) *planCache {
	return &planCache{max: max, ll: list.New(), items: make(map[string]*list.Element, max)}
}

func (c *planCache) get(sql string) (*cacheEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[sql]
	if !ok {
		return nil, false
	}
	c.ll.MoveToFront(el)
	return el.Value.(*cacheEntry), true
}

func (c *planCache) put(e *cacheEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[e.sql]; ok {
		// Another goroutine planned the same text concurrently; keep one.
		c.ll.MoveToFront(el)
		return
	}
	c.items[e.sql] = c.ll.PushFront(e)
	for c.ll.Len() > c.max {
		old := c.ll.Back()
		c.ll.Remove(old)
		delete(c.items, old.Value.(*cacheEntry).sql)
	}
}

func (c *planCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}
