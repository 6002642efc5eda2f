package claimer

// Rank is rank, for the tests.
var Rank = rank

// Remembered is how many entries the claimer keeps per queue, in all of
// its maps; only after Stop (the loop owns some of them).
func (c *Claimer) Remembered() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slots.mu.Lock()
	defer c.slots.mu.Unlock()
	return len(c.empty) + len(c.due) + len(c.spread) + len(c.noNull) + len(c.queueGen) + len(c.slots.released) + len(c.slots.perQueue)
}

// Listens is listeners, for the tests: q's listeners other than node, and
// whether node is one.
func Listens(node string, q Queue, k int) ([]string, bool) {
	w := listeners(node, q, k)
	return w.peers, w.listens
}

// Reserved is how many slots are reserved for claims still out.
func (c *Claimer) Reserved() int {
	c.slots.mu.Lock()
	defer c.slots.mu.Unlock()
	return c.slots.reservedAll
}
