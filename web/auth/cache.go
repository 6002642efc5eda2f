package auth

import (
	"container/list"
	"crypto/sha256"
	"sync"
	"time"
)

// cache remembers successful verifications for a TTL, at most size of
// them; the oldest goes first. Its keys are HMACs (Users.key), its values
// principals: it holds no secret. A nil cache remembers nothing.
type cache struct {
	size int
	ttl  time.Duration
	now  func() time.Time

	mu    sync.Mutex
	m     map[[sha256.Size]byte]*list.Element
	order *list.List // of *cached, oldest (first to expire) first
}

type cached struct {
	key     [sha256.Size]byte
	p       Principal
	expires time.Time
}

func newCache(size int, ttl time.Duration, now func() time.Time) *cache {
	if now == nil {
		now = time.Now
	}
	return &cache{size: size, ttl: ttl, now: now, m: make(map[[sha256.Size]byte]*list.Element), order: list.New()}
}

func (c *cache) get(k [sha256.Size]byte) (Principal, bool) {
	if c == nil {
		return Principal{}, false
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	el := c.m[k]
	if el == nil {
		return Principal{}, false
	}
	e := el.Value.(*cached)
	if !now.Before(e.expires) {
		c.remove(el)
		return Principal{}, false
	}
	return e.p, true
}

func (c *cache) put(k [sha256.Size]byte, p Principal) {
	if c == nil {
		return
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if el := c.m[k]; el != nil {
		c.remove(el)
	}
	for el := c.order.Front(); el != nil && (c.order.Len() >= c.size || !now.Before(el.Value.(*cached).expires)); el = c.order.Front() {
		c.remove(el)
	}
	c.m[k] = c.order.PushBack(&cached{key: k, p: p, expires: now.Add(c.ttl)})
}

func (c *cache) remove(el *list.Element) {
	delete(c.m, el.Value.(*cached).key)
	c.order.Remove(el)
}

func (c *cache) len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
