package claimer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// sched is queue with scheduling fields.
func sched(name string, maxThreads int, priority, weight float64) claimer.Queue {
	q := queue(name, maxThreads)
	q.Sched = schema.QueueSched{Priority: priority, Weight: weight}
	return q
}

// TestPriorityTakesEverySlotWhileItHasWork: of two queues with work, only
// the higher priority gets the node's slots; the lower one gets them when
// the higher has nothing left.
func TestPriorityTakesEverySlotWhileItHasWork(t *testing.T) {
	t.Parallel()
	lo, hi := sched("a-lo", 10, 0, 20), sched("b-hi", 10, 1, 20)
	h := newHarness(t, func(c *claimer.Config) { c.Batch = 1 }, lo, hi)
	h.st.set(alwaysTask)
	three := 3
	require.True(t, h.c.SetNodeMax(&three))
	h.start()
	h.pass()
	require.Equal(t, ids(hi, hi, hi), h.st.take(), "the higher priority first, though a-lo comes first by name")

	// A slot frees up: the higher priority takes it again.
	h.c.Finished(hi.ID)
	h.pass()
	require.Equal(t, ids(hi), h.st.take())

	// The higher priority runs dry: the lower one gets the freed slot.
	h.st.set(func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error) {
		if p.Queue == hi.ID {
			return schema.Task{}, store.ErrNoTask
		}
		return alwaysTask(ctx, p)
	})
	h.c.Finished(hi.ID)
	h.pass()
	require.Equal(t, ids(hi, lo), h.st.take())
	require.Equal(t, 1, h.c.Running(lo.ID))
}

// TestWeightsShareTheSlots: three queues of one priority with weights
// 1:2:4 and a backlog each share 7 slots 1:2:4, and 14 slots 2:4:8.
func TestWeightsShareTheSlots(t *testing.T) {
	t.Parallel()
	a, b, c := sched("a", 100, 0, 1), sched("b", 100, 0, 2), sched("c", 100, 0, 4)
	h := newHarness(t, nil, a, b, c)
	h.st.set(alwaysTask)
	seven := 7
	require.True(t, h.c.SetNodeMax(&seven))
	h.start()
	h.pass()
	require.Equal(t, []int{1, 2, 4}, []int{h.c.Running(a.ID), h.c.Running(b.ID), h.c.Running(c.ID)})

	fourteen := 14
	require.True(t, h.c.SetNodeMax(&fourteen))
	h.c.WakeAll()
	h.pass()
	require.Equal(t, []int{2, 4, 8}, []int{h.c.Running(a.ID), h.c.Running(b.ID), h.c.Running(c.ID)})
}

// TestMaxGetworkBoundsEachClaim: a queue's max_getwork bounds each batch.
func TestMaxGetworkBoundsEachClaim(t *testing.T) {
	t.Parallel()
	bs := &batchStore{left: 10}
	q := queue("q", 200)
	q.Sched.MaxGetwork = 3
	h := newHarness(t, func(c *claimer.Config) { c.Store = bs; c.Batch = 64 }, q)
	h.start()
	h.pass()
	bs.mu.Lock()
	defer bs.mu.Unlock()
	require.Equal(t, 1, bs.single)
	require.Equal(t, []int{3, 3, 3, 3}, bs.limits, "batches of max_getwork until one comes back short")
	require.Equal(t, 10, h.claimedCount())
}

// TestCappedQueueClaimsOnlyThroughAdmissions: every claim from a queue
// with max_running is a capped claim carrying the cap (never the plain
// findOneAndUpdate), and a cap reached stops the queue without an error.
func TestCappedQueueClaimsOnlyThroughAdmissions(t *testing.T) {
	t.Parallel()
	bs := &batchStore{left: 10, capFree: 4}
	q := queue("q", 200)
	q.Sched.MaxRunning = 4
	h := newHarness(t, func(c *claimer.Config) { c.Store = bs; c.Batch = 64 }, q)
	h.start()
	h.pass()
	require.Equal(t, 4, h.claimedCount())
	bs.mu.Lock()
	require.Zero(t, bs.single, "no uncapped claim")
	require.Empty(t, bs.limits, "no uncapped batch")
	require.Len(t, bs.capped, 3, "1, then a batch of 3, then refused")
	for _, p := range bs.capped {
		require.Equal(t, 4, p.Max)
	}
	require.Equal(t, []int{1, 64}, []int{bs.capped[0].Limit, bs.capped[1].Limit})
	bs.mu.Unlock()
	require.Equal(t, int64(1), h.c.Stats().CapReached)
}

// TestWeightsCountTheWholeCluster: two queues of equal weight, one of which
// other nodes already run 4 tasks of (its count_running): this node's
// free slots go to the other until the cluster-wide shares are level.
func TestWeightsCountTheWholeCluster(t *testing.T) {
	t.Parallel()
	busy, idle := sched("a-busy", 100, 0, 20), sched("b-idle", 100, 0, 20)
	four, zero := int64(4), int64(0)
	busy.CountRunning, idle.CountRunning = &four, &zero
	h := newHarness(t, nil, busy, idle)
	h.st.set(alwaysTask)
	six := 6
	require.True(t, h.c.SetNodeMax(&six))
	h.start()
	h.pass()
	require.Equal(t, []int{1, 5}, []int{h.c.Running(busy.ID), h.c.Running(idle.ID)},
		"idle catches up to 4, then they alternate: 4+1 and 0+5")
}

// TestAWakeUpForALowerPriorityServesTheHigherFirst: a pass woken for a
// lower-priority queue alone (its task inserted, its document changed)
// still gives a free slot to a higher priority that may have work.
func TestAWakeUpForALowerPriorityServesTheHigherFirst(t *testing.T) {
	t.Parallel()
	lo, hi := sched("a-lo", 10, 0, 20), sched("b-hi", 10, 10, 20)
	h := newHarness(t, func(c *claimer.Config) { c.Batch = 1 }, lo, hi)
	h.st.set(alwaysTask)
	two := 2
	require.True(t, h.c.SetNodeMax(&two))
	h.start()
	h.pass()
	require.Equal(t, ids(hi, hi), h.st.take())
	three := 3
	require.True(t, h.c.SetNodeMax(&three)) // a slot frees without a mark
	h.c.HasWork(lo.ID)
	h.pass()
	require.Equal(t, ids(hi), h.st.take(), "the higher priority, though only the lower one was woken")
}

// TestEqualSharesClaimInBatches: two queues of equal weight share a
// node's free slots in two batches, not one task per claim in turn (a
// round trip per task), and end even.
func TestEqualSharesClaimInBatches(t *testing.T) {
	t.Parallel()
	bs := &batchStore{left: 1000}
	a, b := sched("a", 100, 0, 20), sched("b", 100, 0, 20)
	h := newHarness(t, func(c *claimer.Config) { c.Store = bs; c.Batch = 64 }, a, b)
	sixty := 60
	require.True(t, h.c.SetNodeMax(&sixty))
	h.start()
	h.pass()
	require.Equal(t, []int{30, 30}, []int{h.c.Running(a.ID), h.c.Running(b.ID)})
	bs.mu.Lock()
	defer bs.mu.Unlock()
	require.Equal(t, 2, bs.single, "one first claim each")
	require.Equal(t, []int{29, 29}, bs.limits, "then one batch each")
}
