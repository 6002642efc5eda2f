package claimer

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestSlotsPause(t *testing.T) {
	t.Parallel()
	s := newSlots()
	q := bson.NewObjectID()
	require.True(t, s.reserve(q, 5))
	require.True(t, s.pause(PauseFenced))
	require.False(t, s.pause(PauseFenced), "already paused for that reason")
	require.True(t, s.pause(PauseDraining))
	require.False(t, s.reserve(q, 5), "paused")
	require.Equal(t, 1, s.total(), "slots in use stay")
	require.True(t, s.resume(PauseFenced))
	require.False(t, s.resume(PauseFenced))
	require.False(t, s.reserve(q, 5), "still draining")
	require.True(t, s.resume(PauseDraining))
	require.True(t, s.reserve(q, 5))
}

func TestSlots(t *testing.T) {
	t.Parallel()
	s := newSlots()
	q1, q2, q3 := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()

	// Per-queue limits.
	require.True(t, s.reserve(q1, 2))
	require.True(t, s.reserve(q1, 2))
	require.False(t, s.reserve(q1, 2))
	require.False(t, s.reserve(q2, 0), "maxthreads 0 runs nothing")
	require.True(t, s.reserve(q2, 5))
	require.Equal(t, 2, s.running(q1))
	require.Equal(t, 1, s.running(q2))
	require.Equal(t, 0, s.running(q3))
	require.Equal(t, 3, s.total())

	// The node-wide cap; SetNodeMax reports changes only.
	two := 2
	require.True(t, s.setNodeMax(&two))
	another := 2
	require.False(t, s.setNodeMax(&another), "same value")
	require.False(t, s.reserve(q3, 5), "node cap (3 in use, cap 2)")
	s.release(q1)
	require.False(t, s.reserve(q3, 5), "node cap (2 in use, cap 2)")
	s.release(q1)
	require.True(t, s.reserve(q3, 5))
	require.Equal(t, 2, s.total())
	m := 3
	require.True(t, s.setNodeMax(&m))
	m = 100 // SetNodeMax copied it
	require.True(t, s.reserve(q3, 5))
	require.False(t, s.reserve(q3, 5), "cap 3 even though the caller's variable changed")
	require.True(t, s.setNodeMax(nil))
	require.False(t, s.setNodeMax(nil))
	require.True(t, s.reserve(q3, 5))
	require.Equal(t, 4, s.total())
	zero := 0
	require.True(t, s.setNodeMax(&zero))
	require.False(t, s.reserve(q1, 5), "cap 0")
	require.True(t, s.setNodeMax(nil))

	// Release never goes below zero, per queue or in all.
	s.release(q1) // has none
	s.release(bson.NewObjectID())
	require.Equal(t, 0, s.running(q1))
	require.Equal(t, 4, s.total())
	for range 10 {
		s.release(q3)
	}
	require.Equal(t, 0, s.running(q3))
	require.Equal(t, 1, s.total())
	s.release(q2)
	s.release(q2)
	require.Equal(t, 0, s.total())
	require.True(t, s.reserve(q1, 1), "released slots are usable again")
	require.Equal(t, 1, s.total())

	// Under concurrency the limits hold.
	s = newSlots()
	five := 5
	s.setNodeMax(&five)
	var wg sync.WaitGroup
	var held, maxHeld atomic.Int64
	for i := range 20 {
		q := []bson.ObjectID{q1, q2}[i%2]
		wg.Go(func() {
			for range 200 {
				if s.reserve(q, 3) {
					n := held.Add(1)
					for {
						old := maxHeld.Load()
						if n <= old || maxHeld.CompareAndSwap(old, n) {
							break
						}
					}
					if r := s.running(q); r > 3 {
						t.Errorf("%d running in a queue of 3", r)
					}
					held.Add(-1)
					s.release(q)
				}
			}
		})
	}
	wg.Wait()
	require.LessOrEqual(t, maxHeld.Load(), int64(5))
	require.Equal(t, 0, s.total())
	require.Equal(t, 0, s.running(q1))
}

// TestSlotsFull: a queue is full at its maxthreads, and every queue at the
// node's cap, whatever the pauses (what a heartbeat says), counting the
// slots held (won claims, adopted tasks).
func TestSlotsFull(t *testing.T) {
	t.Parallel()
	s := newSlots()
	a, b := bson.NewObjectID(), bson.NewObjectID()
	s.take(a)
	require.False(t, s.full(a, 2))
	s.take(a)
	require.True(t, s.full(a, 2))
	require.False(t, s.full(b, 2))
	three := 3
	s.setNodeMax(&three)
	s.take(b)
	require.True(t, s.full(b, 2), "the node's three taken")
	s.release(a)
	require.False(t, s.full(b, 2))
	s.pause(PauseDraining)
	require.False(t, s.full(b, 2), "a pause is not a full queue")
}

// TestSlotsReservedForAClaimAreNotFull: slots reserved for a claim still
// out do not make a queue (or the node) full; once the claim settles,
// the won ones do, and the released ones are free.
func TestSlotsReservedForAClaimAreNotFull(t *testing.T) {
	t.Parallel()
	s := newSlots()
	a, b := bson.NewObjectID(), bson.NewObjectID()
	require.True(t, s.reserve(a, 2))
	require.True(t, s.reserve(a, 2))
	require.False(t, s.reserve(a, 2), "both taken")
	require.False(t, s.full(a, 2), "a claim out: the node had free slots")
	s.settle(a, 1)
	s.releaseReserved(a, 1)
	require.False(t, s.full(a, 2), "one won, one given back")
	require.Equal(t, 1, s.running(a))
	require.True(t, s.reserve(a, 2))
	s.settle(a, 1)
	require.True(t, s.full(a, 2), "both won")

	two := 2
	s.setNodeMax(&two)
	require.True(t, s.full(b, 8), "the node's cap of two is reached")
	s.release(a)
	require.True(t, s.reserve(b, 8))
	require.False(t, s.full(b, 8), "the node's second slot is reserved, not held")
	s.settle(b, 5) // more than reserved: never below zero
	require.True(t, s.full(b, 8))
	s.releaseReserved(b, 1)
	require.Equal(t, 1, s.total())
}

// TestSlotsCapacityLeavesOutOtherQueues: the most a queue could hold at
// once is its limit, or what the node-wide cap leaves beside the slots
// other queues hold; its own held slots count as its capacity.
func TestSlotsCapacityLeavesOutOtherQueues(t *testing.T) {
	t.Parallel()
	s := newSlots()
	a, b := bson.NewObjectID(), bson.NewObjectID()
	require.Equal(t, 8, s.capacity(a, 8), "no node-wide cap: the queue's limit")
	six := 6
	s.setNodeMax(&six)
	require.Equal(t, 6, s.capacity(a, 8), "the node-wide cap when lower")
	s.take(a)
	s.take(a)
	require.Equal(t, 6, s.capacity(a, 8), "its own slots are part of what it could hold")
	s.take(b)
	require.Equal(t, 5, s.capacity(a, 8), "b's slot is not a's to wait for")
	require.Equal(t, 2, s.capacity(b, 2), "b's own limit when lower")
	for range 4 {
		s.take(b)
	}
	require.Equal(t, 1, s.capacity(a, 8), "b's five leave a one of the node's six")
	s.take(b)
	s.take(b)
	require.Equal(t, 0, s.capacity(a, 8), "b's seven, over the cap (adopted tasks): none, not below")
}
