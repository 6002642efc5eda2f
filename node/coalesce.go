package node

import (
	"context"
	"sync"
)

// coalescer gathers concurrent writes of one kind into one round trip
// (group commit): a write that finds no flush running is flushed at once,
// so a lone write waits for nothing; writes that arrive while a flush runs
// go together in the next one, up to max. Under load this turns one round
// trip per task into one per batch, which on a small machine is CPU on both
// sides of the socket.
type coalescer[T any] struct {
	max   int
	flush func(items []T) []error // one error per item

	mu      sync.Mutex
	pending []*pendingWrite[T]
	running bool
}

type pendingWrite[T any] struct {
	item T
	done chan error
}

func newCoalescer[T any](max int, flush func([]T) []error) *coalescer[T] {
	return &coalescer[T]{max: max, flush: flush}
}

// do writes item (with others) and returns its error. If ctx ends first it
// returns ctx's error, and the write may still land: writes must be safe to
// retry.
func (c *coalescer[T]) do(ctx context.Context, item T) error {
	w := &pendingWrite[T]{item: item, done: make(chan error, 1)}
	c.mu.Lock()
	c.pending = append(c.pending, w)
	if !c.running {
		c.running = true
		go c.loop()
	}
	c.mu.Unlock()
	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (c *coalescer[T]) loop() {
	for {
		c.mu.Lock()
		if len(c.pending) == 0 {
			c.running = false
			c.mu.Unlock()
			return
		}
		n := min(len(c.pending), c.max)
		batch := c.pending[:n:n]
		c.pending = c.pending[n:]
		c.mu.Unlock()
		items := make([]T, len(batch))
		for i, w := range batch {
			items[i] = w.item
		}
		errs := c.flush(items)
		for i, w := range batch {
			w.done <- errs[i]
		}
	}
}
