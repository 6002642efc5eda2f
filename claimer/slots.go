package claimer

import (
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Slots counts this node's tasks (claimed or running) per queue and in all,
// against the per-queue limits and the node-wide cap.
type Slots struct {
	mu       sync.Mutex
	perQueue map[bson.ObjectID]int
	total    int
	nodeMax  *int
	paused   map[string]bool // reasons no slot may be taken
}

// NewSlots returns empty slots with no node-wide cap.
func NewSlots() *Slots { return &Slots{perQueue: map[bson.ObjectID]int{}} }

// TryAcquire takes a slot for queue q if both limits allow.
func (s *Slots) TryAcquire(q bson.ObjectID, queueMax int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.paused) > 0 || s.perQueue[q] >= queueMax || (s.nodeMax != nil && s.total >= *s.nodeMax) {
		return false
	}
	s.perQueue[q]++
	s.total++
	return true
}

// Pause stops new slots from being taken until Resume(reason); slots in
// use are not affected. Several reasons may hold at once (e.g. "fenced"
// and "draining"). It reports whether the reason was new.
func (s *Slots) Pause(reason string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.paused == nil {
		s.paused = map[string]bool{}
	}
	was := s.paused[reason]
	s.paused[reason] = true
	return !was
}

// Resume lifts one reason given to Pause; it reports whether it held.
func (s *Slots) Resume(reason string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.paused[reason]
	delete(s.paused, reason)
	return was
}

// Paused reports whether reason holds.
func (s *Slots) Paused(reason string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused[reason]
}

// Release gives back a slot of queue q.
func (s *Slots) Release(q bson.ObjectID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.perQueue[q] > 0 {
		s.perQueue[q]--
		s.total--
	}
	if s.perQueue[q] == 0 {
		delete(s.perQueue, q)
	}
}

// SetNodeMax sets the node-wide cap (nil: none). It reports whether it
// changed.
func (s *Slots) SetNodeMax(max *int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := (s.nodeMax == nil) != (max == nil) || (max != nil && *s.nodeMax != *max)
	if max != nil {
		m := *max
		max = &m
	}
	s.nodeMax = max
	return changed
}

// NodeFull reports whether the node-wide cap is reached.
func (s *Slots) NodeFull() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodeMax != nil && s.total >= *s.nodeMax
}

// Running returns the slots in use for q.
func (s *Slots) Running(q bson.ObjectID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perQueue[q]
}

// Total returns all slots in use.
func (s *Slots) Total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}
