package claimer

import (
	"math"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// PauseReason is why a node stops claiming; several may hold at once.
type PauseReason string

// The reasons a node pauses its claims.
const (
	// PauseFenced: no heartbeat was acknowledged for fence-after.
	PauseFenced PauseReason = "fenced"
	// PauseDraining: an operator asked the node to drain.
	PauseDraining PauseReason = "draining"
)

// slots counts this node's tasks (claimed or running) per queue and in all,
// against the per-queue limits and the node-wide cap. The claimer owns it:
// it takes a slot for every claim and gives it back in Finished.
type slots struct {
	mu       sync.Mutex
	perQueue map[bson.ObjectID]int
	released map[bson.ObjectID]int // slots given back per queue, ever
	all      int
	// reserved counts the slots taken for a claim still out (reserve),
	// per queue and in all: full leaves them out.
	reserved    map[bson.ObjectID]int
	reservedAll int
	nodeMax     *int
	pauses      map[PauseReason]bool // reasons no slot may be taken
	// changed is signalled (without blocking) when a slot is given back,
	// a pause starts or ends, or the node-wide cap changes: a lingering
	// claim waits on it.
	changed chan struct{}
}

func newSlots() *slots {
	return &slots{perQueue: map[bson.ObjectID]int{}, released: map[bson.ObjectID]int{}, reserved: map[bson.ObjectID]int{}, changed: make(chan struct{}, 1)}
}

// signal tells a lingering claim that something changed (s.mu held).
func (s *slots) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// left is how many more slots q's limit (queueMax) and the node-wide cap
// leave with heldQ of q's and heldAll in all taken, pauses aside (below 0
// when over); s.mu is held.
func (s *slots) left(queueMax, heldQ, heldAll int) int {
	r := queueMax - heldQ
	if s.nodeMax != nil {
		r = min(r, *s.nodeMax-heldAll)
	}
	return r
}

// room returns how many slots q could take now: what its limit and the
// node-wide cap leave, 0 while paused.
func (s *slots) room(q bson.ObjectID, queueMax int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pauses) > 0 {
		return 0
	}
	return max(0, s.left(queueMax, s.perQueue[q], s.all))
}

// capacity returns the most slots q could hold at once while the other
// queues keep what they hold: its limit, or what the node-wide cap
// leaves beside the others' when lower.
func (s *slots) capacity(q bson.ObjectID, queueMax int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodeMax != nil {
		return max(0, min(queueMax, *s.nodeMax-(s.all-s.perQueue[q])))
	}
	return queueMax
}

// acquire takes a slot for queue q if both limits allow; s.mu is held.
func (s *slots) acquire(q bson.ObjectID, queueMax int) bool {
	if len(s.pauses) > 0 || s.left(queueMax, s.perQueue[q], s.all) <= 0 {
		return false
	}
	s.perQueue[q]++
	s.all++
	return true
}

// reserve takes a slot for queue q, if both limits allow, for a claim
// about to go out: the slot counts as reserved until settle (its task
// won) or releaseReserved (not).
func (s *slots) reserve(q bson.ObjectID, queueMax int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.acquire(q, queueMax) {
		return false
	}
	s.reserved[q]++
	s.reservedAll++
	return true
}

// settle ends k reservations of q whose tasks were won: the slots stay
// taken.
func (s *slots) settle(q bson.ObjectID, k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unreserve(q, k)
}

// releaseReserved gives back k reserved slots of q: their claim won
// nothing for them.
func (s *slots) releaseReserved(q bson.ObjectID, k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unreserve(q, k)
	for range k {
		s.releaseLocked(q)
	}
}

// unreserve drops k of q's reservations (never below zero); s.mu is
// held.
func (s *slots) unreserve(q bson.ObjectID, k int) {
	k = min(k, s.reserved[q])
	s.reserved[q] -= k
	s.reservedAll -= k
	if s.reserved[q] <= 0 {
		delete(s.reserved, q)
	}
}

// pause stops new slots from being taken until resume(reason); slots in
// use are not affected. It reports whether the reason was new.
func (s *slots) pause(reason PauseReason) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pauses == nil {
		s.pauses = map[PauseReason]bool{}
	}
	was := s.pauses[reason]
	s.pauses[reason] = true
	s.signal()
	return !was
}

// resume lifts one reason given to pause; it reports whether it held.
func (s *slots) resume(reason PauseReason) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.pauses[reason]
	delete(s.pauses, reason)
	s.signal()
	return was
}

// isPaused reports whether a reason given to pause holds.
func (s *slots) isPaused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pauses) > 0
}

// take takes a slot of queue q whatever the caps.
func (s *slots) take(q bson.ObjectID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.perQueue[q]++
	s.all++
}

// release gives back a slot of queue q (never below zero).
func (s *slots) release(q bson.ObjectID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked(q)
}

// releaseLocked is release with s.mu held.
func (s *slots) releaseLocked(q bson.ObjectID) {
	if s.perQueue[q] > 0 {
		s.perQueue[q]--
		s.all--
		s.released[q]++
		s.signal()
	}
	if s.perQueue[q] == 0 {
		delete(s.perQueue, q)
	}
}

// setNodeMax sets the node-wide cap (nil: none), keeping a copy. It reports
// whether it changed.
func (s *slots) setNodeMax(max *int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := (s.nodeMax == nil) != (max == nil) || (max != nil && *s.nodeMax != *max)
	if max != nil {
		m := *max
		max = &m
	}
	s.nodeMax = max
	s.signal()
	return changed
}

// nodeFull reports whether the node-wide cap is reached.
func (s *slots) nodeFull() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodeMax != nil && s.all >= *s.nodeMax
}

// free returns how many more slots the node-wide cap allows (MaxInt
// without one).
func (s *slots) free() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodeMax == nil {
		return math.MaxInt
	}
	return max(0, *s.nodeMax-s.all)
}

// full reports whether q's slots are all taken (queueMax), or the node's
// (its cap), pauses aside, and the slots reserved for a claim still out
// left out: a node that claims has free slots (it reserved them), and a
// heartbeat written during the claim's round trip would say otherwise.
func (s *slots) full(q bson.ObjectID, queueMax int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.left(queueMax, s.perQueue[q]-s.reserved[q], s.all-s.reservedAll) <= 0
}

// running returns the slots in use for q.
func (s *slots) running(q bson.ObjectID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perQueue[q]
}

// held is q's slots in use, and how many were ever given back.
func (s *slots) held(q bson.ObjectID) (running, released int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perQueue[q], s.released[q]
}

// forget drops the released count of every queue that holds no slot and
// is not kept (readQueues snapshots it for the queues it read only).
func (s *slots) forget(keep func(bson.ObjectID) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for q := range s.released {
		if s.perQueue[q] == 0 && !keep(q) {
			delete(s.released, q)
		}
	}
}

// total returns all slots in use.
func (s *slots) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.all
}
