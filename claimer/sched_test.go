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
	require.Equal(t, []int{3, 3, 3, 3, 3}, bs.limits, "batches of max_getwork until one comes back short, then again with node null")
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

// TestWaterFillingSizesEachBatch: the slots a queue takes in one go are
// its part of the node's free slots when they are shared out so that the
// cluster-wide shares (running/weight) end level, each queue taking no
// more than it can run here.
func TestWaterFillingSizesEachBatch(t *testing.T) {
	t.Parallel()
	ten := int64(10)
	for _, tc := range []struct {
		name     string
		queues   []claimer.Queue
		nodeMax  int
		limits   []int // the batches asked, after each queue's first single claim
		single   int
		running  []int
		whyLevel string
	}{
		{
			name:    "weights 1:3",
			queues:  []claimer.Queue{sched("a", 100, 0, 1), sched("b", 100, 0, 3)},
			nodeMax: 40, limits: []int{29, 9}, single: 2, running: []int{10, 30},
			whyLevel: "40 slots raise both shares to 10: b (lower with one more task) takes 30, then a 10",
		},
		{
			name: "other nodes run one queue's tasks",
			queues: func() []claimer.Queue {
				a, b := sched("a", 100, 0, 20), sched("b", 100, 0, 20)
				zero := int64(0)
				a.CountRunning, b.CountRunning = &ten, &zero
				return []claimer.Queue{a, b}
			}(),
			nodeMax: 30, limits: []int{19, 9}, single: 2, running: []int{10, 20},
			whyLevel: "b first catches up to a's 10, then both take 10: 20 and 10",
		},
		{
			name:    "a queue that can take only 5 here",
			queues:  []claimer.Queue{sched("a", 100, 0, 20), sched("b", 5, 0, 20)},
			nodeMax: 30, limits: []int{24, 4}, single: 2, running: []int{25, 5},
			whyLevel: "b's 5 are all it can take, so a's part is the other 25 (an equal split would give a 15 and need a third claim)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := &batchStore{left: 1000}
			h := newHarness(t, func(c *claimer.Config) { c.Store = bs; c.Batch = 64 }, tc.queues...)
			require.True(t, h.c.SetNodeMax(&tc.nodeMax))
			h.start()
			h.pass()
			var running []int
			for _, q := range tc.queues {
				running = append(running, h.c.Running(q.ID))
			}
			require.Equal(t, tc.running, running, tc.whyLevel)
			bs.mu.Lock()
			defer bs.mu.Unlock()
			require.Equal(t, tc.single, bs.single, "one first claim each")
			require.Equal(t, tc.limits, bs.limits, tc.whyLevel)
		})
	}
}

// TestEachNodeTakesItsPartOfADeficit: other nodes run 6 of queue a and
// none of b (equal weights), and three nodes serve both. Every node sees
// the same counts and fills its free slots at once; if each gave b the
// whole deficit, b would end 18 to a's 6. Each takes its third: b 4,
// a 2, and the three together leave both at 12.
func TestEachNodeTakesItsPartOfADeficit(t *testing.T) {
	t.Parallel()
	a, b := sched("a", 100, 0, 20), sched("b", 100, 0, 20)
	six, zero := int64(6), int64(0)
	a.CountRunning, b.CountRunning = &six, &zero
	a.Peers, b.Peers = []string{"n2", "n3"}, []string{"n2", "n3"}
	h := newHarness(t, nil, a, b)
	h.st.set(alwaysTask)
	free := 6
	require.True(t, h.c.SetNodeMax(&free))
	h.start()
	h.pass()
	require.Equal(t, []int{2, 4}, []int{h.c.Running(a.ID), h.c.Running(b.ID)})
}

// TestAFinishCountsOnceForTheNodeThatFinished: three nodes serve w1 and
// w4 (weights 1 and 4); the cluster runs 8 and 37 (w1 one short of its
// 9), this node 2 and 13 with every slot taken. When one of its w4 tasks
// finishes, the freed slot goes to w1: its own finish makes w4 one short
// (36, as the cluster is), not three (34, as if every node had finished
// one), which would refill w4 and leave w1 short for good.
func TestAFinishCountsOnceForTheNodeThatFinished(t *testing.T) {
	t.Parallel()
	w1, w4 := sched("w1", 21, 0, 1), sched("w4", 21, 0, 4)
	eight, thirtySeven := int64(8), int64(37)
	w1.CountRunning, w4.CountRunning = &eight, &thirtySeven
	w1.Peers, w4.Peers = []string{"n2", "n3"}, []string{"n2", "n3"}
	h := newHarness(t, nil, w1, w4)
	h.st.set(alwaysTask)
	for range 2 {
		h.c.Adopt(w1.ID)
	}
	for range 13 {
		h.c.Adopt(w4.ID)
	}
	full := 15
	require.True(t, h.c.SetNodeMax(&full))
	h.start()
	h.pass() // reads the queues with this node at 2 and 13; no slot free
	require.Equal(t, []int{2, 13}, []int{h.c.Running(w1.ID), h.c.Running(w4.ID)})
	h.c.Finished(w4.ID)
	h.pass()
	require.Equal(t, []int{3, 12}, []int{h.c.Running(w1.ID), h.c.Running(w4.ID)})
}
