package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// The moments of a task's pickup.
const (
	stInsert  = iota // insert sent
	stAck            // insert acknowledged
	stEvent          // change event received (floor)
	stClaimed        // claim acknowledged (floor)
	stRunning        // status 0 acknowledged (floor) or plugin started (node)
	nStamps
)

// pickupClock records when each task passed each moment.
type pickupClock struct {
	mu      sync.Mutex
	tasks   map[bson.ObjectID]*[nStamps]time.Time
	order   []bson.ObjectID // measured tasks (not warm-up), in submission order
	running int
	changed chan struct{} // signalled on every stRunning
}

func newPickupClock() *pickupClock {
	return &pickupClock{tasks: map[bson.ObjectID]*[nStamps]time.Time{}, changed: make(chan struct{}, 1)}
}

// begin records an insert about to be sent.
func (c *pickupClock) begin(id bson.ObjectID, t0 time.Time, warmUp bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tasks[id] = &[nStamps]time.Time{stInsert: t0}
	if !warmUp {
		c.order = append(c.order, id)
	}
}

// stamp records moment st of task id (first time only).
func (c *pickupClock) stamp(id bson.ObjectID, st int, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.tasks[id]
	if !ok || !s[st].IsZero() {
		return
	}
	s[st] = at
	if st == stRunning {
		c.running++
		select {
		case c.changed <- struct{}{}:
		default:
		}
	}
}

// wait returns when every task begun is running.
func (c *pickupClock) wait(ctx context.Context, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		c.mu.Lock()
		running, all := c.running, len(c.tasks)
		c.mu.Unlock()
		if running == all {
			return nil
		}
		select {
		case <-c.changed:
		case <-t.C:
			return fmt.Errorf("only %d of %d tasks started within %s of the last insert", running, all, timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// latencies returns insert → running and insert → acknowledged of the
// measured tasks.
func (c *pickupClock) latencies() (pickup, ack []time.Duration) {
	return c.between(stInsert, stRunning), c.between(stInsert, stAck)
}

// between returns, for each measured task with both moments, b - a.
func (c *pickupClock) between(a, b int) []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]time.Duration, 0, len(c.order))
	for _, id := range c.order {
		s := c.tasks[id]
		if !s[a].IsZero() && !s[b].IsZero() {
			out = append(out, s[b].Sub(s[a]))
		}
	}
	return out
}

// floorSteps breaks the floor loop down as PERFORMANCE.md does.
func (c *pickupClock) floorSteps() []FloorStep {
	step := func(name string, a, b int) FloorStep {
		l := summarize(c.between(a, b))
		return FloorStep{Step: name, P50: l.P50, P99: l.P99}
	}
	return []FloorStep{
		step("insert acknowledged (from insert start)", stInsert, stAck),
		step("change event received (from insert start)", stInsert, stEvent),
		step("claim: findOneAndUpdate to -1 (from event)", stEvent, stClaimed),
		step("running: guarded updateOne to 0 (from claim)", stClaimed, stRunning),
		step("insert -> event -> claim -> running", stInsert, stRunning),
	}
}
