package claimer_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/events"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// nullStore is one queue's queued tasks in claim order, each with node -1
// or null (Disbatch 4.103's unclaimed), claimed as the store claims them:
// in order, node null left out under SkipNullNode, and NullNode counting
// the candidates read with node null.
type nullStore struct {
	mu    sync.Mutex
	tasks []nullTask
	calls []nullCall
	// onClaim, when set, runs in the next TaskClaim, after its read.
	onClaim func()
}

type nullTask struct {
	id   bson.ObjectID
	null bool
}

// nullCall is one claim asked: batched or not, SkipNullNode, From, and
// what it got.
type nullCall struct {
	many, skip bool
	from       bson.ObjectID
	got        []bson.ObjectID
}

func (s *nullStore) add(null bool, n int) []bson.ObjectID {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []bson.ObjectID
	for range n {
		id := bson.NewObjectID()
		s.tasks = append(s.tasks, nullTask{id: id, null: null})
		ids = append(ids, id)
	}
	return ids
}

// insert queues a task with id in its place in the order.
func (s *nullStore) insert(id bson.ObjectID, null bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, _ := slices.BinarySearchFunc(s.tasks, id, func(t nullTask, id bson.ObjectID) int { return bytes.Compare(t.id[:], id[:]) })
	s.tasks = slices.Insert(s.tasks, i, nullTask{id: id, null: null})
}

// take claims up to limit from the task from on; read is how many of the
// candidates had node null, first the first of them.
func (s *nullStore) take(q bson.ObjectID, node string, limit int, skip, many bool, from bson.ObjectID) (tasks []schema.Task, nullRead int, first bson.ObjectID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var left []nullTask
	var got []bson.ObjectID
	for _, t := range s.tasks {
		if len(got) == limit || (skip && t.null) || bytes.Compare(t.id[:], from[:]) < 0 {
			left = append(left, t)
			continue
		}
		if len(got) == 0 {
			first = t.id
		}
		if t.null {
			nullRead++
		}
		got = append(got, t.id)
		tasks = append(tasks, schema.Task{ID: t.id, Queue: q, Node: node, Status: schema.StatusClaimed})
	}
	s.tasks = left
	s.calls = append(s.calls, nullCall{many: many, skip: skip, from: from, got: got})
	return tasks, nullRead, first
}

func (s *nullStore) TaskClaim(_ context.Context, p store.TaskClaimParams) (schema.Task, error) {
	tasks, _, _ := s.take(p.Queue, p.Node, 1, p.SkipNullNode, false, p.From)
	s.mu.Lock()
	f := s.onClaim
	s.onClaim = nil
	s.mu.Unlock()
	if f != nil {
		f()
	}
	if len(tasks) == 0 {
		return schema.Task{}, store.ErrNoTask
	}
	return tasks[0], nil
}

func (s *nullStore) TaskClaimMany(_ context.Context, p store.TaskClaimManyParams) (store.TaskClaimManyResult, error) {
	tasks, nullRead, first := s.take(p.Queue, p.Node, p.Limit, p.SkipNullNode, true, p.From)
	return store.TaskClaimManyResult{Tasks: tasks, NullNode: nullRead, First: first}, nil
}

func (s *nullStore) TaskClaimCapped(context.Context, store.TaskClaimCappedParams) (store.TaskClaimManyResult, error) {
	return store.TaskClaimManyResult{}, errors.New("no capped queue here")
}

// calls returns the claims asked since the last call.
func (s *nullStore) drain() []nullCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.calls
	s.calls = nil
	return out
}

// TestABacklogIsClaimedWithoutNodeNullOnceABatchReadNone: the first claims
// of a queue look for node null too; once a batch read none, the claims
// leave it out, and the task with node null queued behind the batch is
// still claimed before the queue counts as empty.
func TestABacklogIsClaimedWithoutNodeNullOnceABatchReadNone(t *testing.T) {
	t.Parallel()
	st := &nullStore{}
	st.add(false, 10)
	null := st.add(true, 1)[0]
	st.add(false, 10)
	q := queue("q", 100)
	h := newHarness(t, func(c *claimer.Config) { c.Store = st; c.Batch = 4 }, q)
	h.start()
	h.pass()
	require.Equal(t, 21, h.claimedCount(), "every task, node null included")

	calls := st.drain()
	require.False(t, calls[0].skip, "the first claim of a queue looks for node null")
	require.False(t, calls[1].skip, "so does the first batch, which reads none")
	skipped := 0
	for i, c := range calls {
		if c.skip {
			skipped++
			require.NotContains(t, c.got, null)
		}
		if i > 1 && !c.skip {
			// Only after a claim without node null found nothing, or one
			// with it found a task with node null.
			prev := calls[i-1]
			require.True(t, (prev.skip && len(prev.got) == 0) || slices.Contains(prev.got, null), "call %d after %+v", i, prev)
		}
	}
	require.GreaterOrEqual(t, skipped, 4, "the backlog after the first batch is claimed without node null")
	last := calls[len(calls)-1]
	require.False(t, last.skip, "the queue counts as empty only after a claim that looked for node null too")
	require.Empty(t, last.got)
	require.Equal(t, []bson.ObjectID{null}, calls[len(calls)-2].got, "found by the claim that looked for it again")
}

// startOnAFakeClock starts a claimer of one empty queue over a nullStore,
// with the bus's events, a 1 s tick on a fake clock and batches of 4, and
// waits for its first pass.
func startOnAFakeClock(t *testing.T) (*harness, *nullStore, *gochannel.GoChannel, *clock.Fake, claimer.Queue) {
	bus := newBus(t)
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	st := &nullStore{}
	q := queue("q", 100)
	h := newHarness(t, func(c *claimer.Config) {
		c.Store, c.Events, c.Clock, c.Batch, c.Tick, c.Stagger = st, bus, fake, 4, time.Second, -1
	}, q)
	h.start()
	h.pass()
	return h, st, bus, fake, q
}

// TestNodeNullIsLookedForAgainOnItsEventAndOnTheTick: an empty queue's
// claims leave node null out, with no second look, until an event that
// may have queued a task with node null (not showing node -1) or the
// tick.
func TestNodeNullIsLookedForAgainOnItsEventAndOnTheTick(t *testing.T) {
	t.Parallel()
	h, st, bus, fake, q := startOnAFakeClock(t)
	require.Equal(t, []nullCall{{skip: false}}, st.drain(), "the first claim looks for node null too, and finds the queue empty")

	queued := schema.StatusQueued
	ours := st.add(false, 1)
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: ours[0], Queue: q.ID, Status: &queued, NodeMinusOne: true})
	h.pass()
	require.Equal(t, []nullCall{{skip: true, got: ours}, {many: true, skip: true, from: ours[0]}, {many: true, skip: true}}, st.drain(),
		"a task with node -1: node null left out; the empty batch from its bound is asked again from the head, still without node null (the queue had none and no event said otherwise)")

	theirs := st.add(true, 1)
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: theirs[0], Queue: q.ID, Status: &queued})
	h.pass()
	calls := st.drain()
	require.NotEmpty(t, calls)
	require.Equal(t, nullCall{skip: false, got: theirs}, calls[0], "an event that does not show node -1: node null looked for at once")

	// A task with node null that no event announced (one was lost): the
	// tick looks for it.
	h.c.HasWork(q.ID)
	h.pass()
	st.drain()
	hidden := st.add(true, 1)
	h.c.HasWork(q.ID)
	h.pass()
	calls = st.drain()
	require.NotEmpty(t, calls)
	for _, c := range calls {
		require.True(t, c.skip, "no event: node null left out")
	}
	fake.Advance(1200 * time.Millisecond)
	h.pass()
	calls = st.drain()
	require.NotEmpty(t, calls)
	require.Equal(t, nullCall{skip: false, got: hidden}, calls[0], "the tick looks for node null again")
}

// TestNodeNullReadInABatchKeepsItLookedFor: while the batches read tasks
// with node null, the claims keep looking for them, so a queue whose tasks
// come from both kinds of program is claimed in its order.
func TestNodeNullReadInABatchKeepsItLookedFor(t *testing.T) {
	t.Parallel()
	st := &nullStore{}
	var want []bson.ObjectID
	for range 10 {
		want = append(want, st.add(false, 1)...)
		want = append(want, st.add(true, 1)...)
	}
	q := queue("q", 100)
	h := newHarness(t, func(c *claimer.Config) { c.Store = st; c.Batch = 4 }, q)
	h.start()
	h.pass()
	h.mu.Lock()
	defer h.mu.Unlock()
	var got []bson.ObjectID
	for _, task := range h.claimed {
		got = append(got, task.ID)
	}
	require.Equal(t, want, got, "in the queue's order")
	for _, c := range st.drain() {
		require.False(t, c.skip)
	}
}

// TestAFIFOBacklogIsClaimedFromTheFirstCandidate: once claims leave node
// null out, each starts where the last one's candidates began (the index
// entries before it are the claimed tasks'), and a task queued below that
// bound, which its event shows, is claimed from the queue's head at once.
func TestAFIFOBacklogIsClaimedFromTheFirstCandidate(t *testing.T) {
	t.Parallel()
	bus := newBus(t)
	st := &nullStore{}
	st.add(false, 40)
	q := queue("q", 100)
	h := newHarness(t, func(c *claimer.Config) { c.Store, c.Events, c.Batch, c.Stagger = st, bus, 4, -1 }, q)
	h.start()
	h.pass()
	require.Equal(t, 40, h.claimedCount())
	calls := st.drain()
	require.Zero(t, calls[0].from, "the first claims start at the head")
	require.Zero(t, calls[1].from)
	for i := 2; i < len(calls)-1; i++ {
		c := calls[i]
		require.True(t, c.skip, "call %d", i)
		if len(calls[i-1].got) > 0 {
			require.Equal(t, calls[i-1].got[0], c.from, "call %d starts at the first task the one before read", i)
		}
	}
	last := calls[len(calls)-1]
	require.Equal(t, nullCall{many: true}, last, "the empty claim from the bound is asked again from the head, with node null")
	require.NotZero(t, calls[len(calls)-2].from)

}

// TestATaskQueuedBelowTheBoundIsClaimedFromTheHead: the event of a task
// queued below a fifo queue's claim bound (an id that sorts lower) sends
// the next claim back to the head, before the tasks above the bound:
// whether it was inserted, or moved in from another queue by an update
// of its queue alone (an event without a status).
func TestATaskQueuedBelowTheBoundIsClaimedFromTheHead(t *testing.T) {
	t.Parallel()
	queued := schema.StatusQueued
	for name, event := range map[string]func(id, q bson.ObjectID) events.TaskChanged{
		"inserted": func(id, q bson.ObjectID) events.TaskChanged {
			return events.TaskChanged{Op: events.OpInsert, ID: id, Queue: q, Status: &queued, NodeMinusOne: true}
		},
		"moved in": func(id, q bson.ObjectID) events.TaskChanged {
			return events.TaskChanged{Op: events.OpUpdate, ID: id, Queue: q} // {$set: {queue: q}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bus := newBus(t)
			st := &nullStore{}
			early := bson.NewObjectID() // sorts before every task below
			st.add(false, 40)
			q := queue("q", 8)
			h := newHarness(t, func(c *claimer.Config) { c.Store, c.Events, c.Batch, c.Stagger = st, bus, 4, -1 }, q)
			h.start()
			h.pass()
			require.Equal(t, 8, h.claimedCount(), "the slots are full")
			calls := st.drain()
			require.NotZero(t, calls[len(calls)-1].from, "the last claim had a bound")

			st.insert(early, false)
			publish(t, bus, events.TopicTasks, event(early, q.ID))
			h.pass() // the event's: no slot free
			h.c.Finished(q.ID)
			h.pass()
			calls = st.drain()
			require.NotEmpty(t, calls)
			require.Equal(t, nullCall{got: []bson.ObjectID{early}}, calls[0], "an id below the bound: from the head")
		})
	}
}

// TestATaskHeardWhileTheBoundWasSetIsClaimed: a task queued below the
// bound a claim is about to set, whose event was checked against the
// bound before (no bound: the queue was empty), is claimed without the
// tick: a claim from the bound that finds nothing asks again from the
// head.
func TestATaskHeardWhileTheBoundWasSetIsClaimed(t *testing.T) {
	t.Parallel()
	h, st, bus, _, q := startOnAFakeClock(t)
	st.drain() // found empty

	below := bson.NewObjectID()
	above := st.add(false, 1)
	queued := schema.StatusQueued
	st.mu.Lock()
	st.onClaim = func() {
		st.insert(below, false)
		publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: below, Queue: q.ID, Status: &queued, NodeMinusOne: true})
	}
	st.mu.Unlock()
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: above[0], Queue: q.ID, Status: &queued, NodeMinusOne: true})
	require.Eventually(t, func() bool { return h.claimedCount() == 2 }, wait, time.Millisecond, "both claimed, no tick")
}

// skipStore finds every queue empty and records, per queue, whether each
// claim left node null out.
type skipStore struct {
	mu    sync.Mutex
	skips map[bson.ObjectID][]bool
}

func (s *skipStore) record(q bson.ObjectID, skip bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.skips[q] = append(s.skips[q], skip)
}

func (s *skipStore) take(q bson.ObjectID) []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.skips[q]
	delete(s.skips, q)
	return out
}

func (s *skipStore) TaskClaim(_ context.Context, p store.TaskClaimParams) (schema.Task, error) {
	s.record(p.Queue, p.SkipNullNode)
	return schema.Task{}, store.ErrNoTask
}

func (s *skipStore) TaskClaimMany(_ context.Context, p store.TaskClaimManyParams) (store.TaskClaimManyResult, error) {
	s.record(p.Queue, p.SkipNullNode)
	return store.TaskClaimManyResult{}, nil
}

func (s *skipStore) TaskClaimCapped(context.Context, store.TaskClaimCappedParams) (store.TaskClaimManyResult, error) {
	return store.TaskClaimManyResult{}, errors.New("no capped queue here")
}

// TestNodeNullInOneQueueLeavesTheOthersAlone: an event that may queue a
// task with node null in one queue makes that queue's next claim look for
// it, not every queue's.
func TestNodeNullInOneQueueLeavesTheOthersAlone(t *testing.T) {
	t.Parallel()
	bus := newBus(t)
	st := &skipStore{skips: map[bson.ObjectID][]bool{}}
	a, b := queue("a", 10), queue("b", 10)
	h := newHarness(t, func(c *claimer.Config) { c.Store, c.Events, c.Stagger = st, bus, -1 }, a, b)
	h.start()
	h.pass()
	require.Equal(t, []bool{false}, st.take(a.ID), "found empty, node null included")
	require.Equal(t, []bool{false}, st.take(b.ID))

	queued := schema.StatusQueued
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: bson.NewObjectID(), Queue: a.ID, Status: &queued})
	h.pass()
	require.Equal(t, []bool{false}, st.take(a.ID), "a 4.103 task in a: a looks for node null")
	h.c.HasWork(b.ID)
	h.pass()
	require.Equal(t, []bool{true}, st.take(b.ID), "b does not")
}

// TestAQuietReadSendsFifoClaimsToTheHead: a task queued below a fifo
// queue's claim bound (a retry, under an old id) is found through its
// event, which a quiet node does not hear; its queue reads send the next
// claims back to the head, so the task is claimed within a read, not at
// the tick.
func TestAQuietReadSendsFifoClaimsToTheHead(t *testing.T) {
	t.Parallel()
	st := &nullStore{}
	early := bson.NewObjectID()
	st.add(false, 400)
	q := queue("q", 8)
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	var mu sync.Mutex
	var heard []bool
	h := newHarness(t, func(c *claimer.Config) {
		c.Store, c.Batch, c.Stagger, c.Clock, c.Tick = st, 4, -1, fake, time.Hour
		c.Quiet = func(on bool) { mu.Lock(); heard = append(heard, on); mu.Unlock() }
	}, q)
	h.start()
	h.pass()
	fake.Advance(claimer.QuietAfter)
	h.c.Finished(q.ID)
	h.pass()
	mu.Lock()
	require.Equal(t, []bool{true}, heard)
	mu.Unlock()
	st.drain()

	st.insert(early, false) // requeued; its event is not heard
	var got []bson.ObjectID
	for range 3 { // a slot frees at each read
		fake.Advance(claimer.QuietAfter)
		h.c.Finished(q.ID)
		h.pass()
		for _, c := range st.drain() {
			got = append(got, c.got...)
		}
	}
	require.Contains(t, got, early, "%d newer tasks claimed, not the requeued one", len(got))
}
