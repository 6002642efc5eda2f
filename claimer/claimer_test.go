package claimer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/events"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/internal/lifecycle/lifecycletest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// wait bounds every wait for something that should happen.
const wait = 5 * time.Second

// quiet is how long nothing must happen for a test to conclude it will not.
const quiet = 200 * time.Millisecond

// fakeStore records the queues it is asked to claim in and answers with
// claim (ErrNoTask when nil).
type fakeStore struct {
	mu     sync.Mutex
	calls  []store.TaskClaimParams
	capped []store.TaskClaimCappedParams // the capped claims asked
	limits []int                         // the batched claims' limits
	claim  func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error)
}

func (f *fakeStore) TaskClaim(ctx context.Context, p store.TaskClaimParams) (schema.Task, error) {
	f.mu.Lock()
	f.calls = append(f.calls, p)
	claim := f.claim
	f.mu.Unlock()
	if claim == nil {
		return schema.Task{}, store.ErrNoTask
	}
	return claim(ctx, p)
}

// TaskClaimMany answers like that many TaskClaim calls, stopping at the
// first that finds nothing.
func (f *fakeStore) TaskClaimMany(ctx context.Context, p store.TaskClaimManyParams) (store.TaskClaimManyResult, error) {
	f.mu.Lock()
	f.limits = append(f.limits, p.Limit)
	f.mu.Unlock()
	var res store.TaskClaimManyResult
	for range p.Limit {
		t, err := f.TaskClaim(ctx, store.TaskClaimParams{Queue: p.Queue, Node: p.Node, Sort: p.Sort})
		var de *schema.DecodeError
		switch {
		case errors.Is(err, store.ErrNoTask):
			res.Short = true
			return res, nil
		case errors.As(err, &de):
			res.Malformed = append(res.Malformed, t)
			res.Errors = append(res.Errors, err)
		case err != nil:
			if len(res.Tasks)+len(res.Malformed) > 0 {
				return res, nil // what was won is reported; the error comes next time
			}
			return res, err
		default:
			res.Tasks = append(res.Tasks, t)
		}
	}
	return res, nil
}

// TaskClaimCapped is TaskClaimMany: the cap itself is the store's (its
// conformance suite proves it); the claimer only routes capped queues here.
func (f *fakeStore) TaskClaimCapped(ctx context.Context, p store.TaskClaimCappedParams) (store.TaskClaimManyResult, error) {
	f.mu.Lock()
	f.capped = append(f.capped, p)
	f.mu.Unlock()
	return f.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: p.Queue, Node: p.Node, Sort: p.Sort, Limit: p.Limit})
}

// set replaces the answer.
func (f *fakeStore) set(claim func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claim = claim
}

// take returns the queues asked since the last take, in order.
func (f *fakeStore) take() []bson.ObjectID {
	f.mu.Lock()
	defer f.mu.Unlock()
	var qs []bson.ObjectID
	for _, p := range f.calls {
		qs = append(qs, p.Queue)
	}
	f.calls = nil
	return qs
}

// takeLimits returns the batched claims' limits since the last call.
func (f *fakeStore) takeLimits() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.limits
	f.limits = nil
	return l
}

// alwaysTask answers every claim with a new task of the queue.
func alwaysTask(_ context.Context, p store.TaskClaimParams) (schema.Task, error) {
	return schema.Task{ID: bson.NewObjectID(), Queue: p.Queue, Node: p.Node, Status: schema.StatusClaimed}, nil
}

type malformed struct {
	q   claimer.Queue
	t   schema.Task
	err error
}

// harness runs a Claimer over a fakeStore.
type harness struct {
	t      *testing.T
	c      *claimer.Claimer
	st     *fakeStore
	passes chan struct{}

	refreshes atomic.Int64
	mu        sync.Mutex
	queues    []claimer.Queue
	claimed   []schema.Task
	malformed []malformed
}

func newHarness(t *testing.T, edit func(*claimer.Config), queues ...claimer.Queue) *harness {
	h := &harness{t: t, st: &fakeStore{}, passes: make(chan struct{}, 10000), queues: queues}
	cfg := claimer.Config{
		Node:  "n1",
		Store: h.st,
		Refresh: func(context.Context) ([]claimer.Queue, error) {
			h.refreshes.Add(1)
			h.mu.Lock()
			defer h.mu.Unlock()
			return slices.Clone(h.queues), nil
		},
		Dispatch: func(q claimer.Queue, task schema.Task, _ claimer.Timing) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if q.ID != task.Queue {
				t.Errorf("task of queue %s dispatched for queue %s", task.Queue.Hex(), q.ID.Hex())
			}
			h.claimed = append(h.claimed, task)
		},
		Malformed: func(q claimer.Queue, task schema.Task, err error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.malformed = append(h.malformed, malformed{q, task, err})
		},
		Tick: time.Hour,
		Passed: func() {
			select {
			case h.passes <- struct{}{}:
			default:
				t.Error("too many passes")
			}
		},
	}
	if edit != nil {
		edit(&cfg)
	}
	h.c = claimer.New(cfg)
	return h
}

func (h *harness) start() {
	require.NoError(h.t, h.c.Start(context.Background()))
	h.t.Cleanup(h.c.Stop)
}

// pass waits for the end of the next pass.
func (h *harness) pass() {
	h.t.Helper()
	select {
	case <-h.passes:
	case <-time.After(wait):
		h.t.Fatalf("no pass within %v", wait)
	}
}

// noPass checks that no pass ends for a while.
func (h *harness) noPass() {
	h.t.Helper()
	select {
	case <-h.passes:
		h.t.Fatal("unexpected pass")
	case <-time.After(quiet):
	}
}

func (h *harness) setQueues(qs ...claimer.Queue) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.queues = qs
}

func (h *harness) claimedCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.claimed)
}

// block waits for release (then answers ErrNoTask) or the end of ctx.
func block(ctx context.Context, release <-chan struct{}) error {
	select {
	case <-release:
		return store.ErrNoTask
	case <-ctx.Done():
		return ctx.Err()
	}
}

// recv waits for ch to be closed.
func recv(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wait):
		t.Fatalf("nothing within %v", wait)
	}
}

func queue(name string, maxThreads int) claimer.Queue {
	return claimer.Queue{ID: bson.NewObjectID(), Name: name, Constructor: "C", Sort: schema.SortFIFO, MaxThreads: maxThreads}
}

func ids(qs ...claimer.Queue) []bson.ObjectID {
	var out []bson.ObjectID
	for _, q := range qs {
		out = append(out, q.ID)
	}
	return out
}

func TestWakeUpsMerge(t *testing.T) {
	t.Parallel()
	q1, q2 := queue("a", 1), queue("b", 1)
	h := newHarness(t, nil, q1, q2)
	entered, release := make(chan struct{}), make(chan struct{})
	var n atomic.Int32
	h.st.set(func(ctx context.Context, _ store.TaskClaimParams) (schema.Task, error) {
		if n.Add(1) == 1 {
			close(entered)
			return schema.Task{}, block(ctx, release)
		}
		return schema.Task{}, store.ErrNoTask
	})
	h.start()
	recv(t, entered)
	// The first pass is stuck in TaskClaim: these all merge into one more.
	for range 50 {
		h.c.HasWork(q1.ID)
		h.c.HasWork(q2.ID)
		h.c.Finished(q1.ID)
	}
	close(release)
	h.pass()
	h.pass()
	h.noPass()
	// First pass: every queue; second: the queues woken up, once each.
	require.Equal(t, ids(q1, q2, q1, q2), h.st.take())
	require.Empty(t, h.st.take())
	require.Equal(t, int64(1), h.refreshes.Load(), "HasWork does not re-read the queues")
	require.Equal(t, claimer.Stats{EmptyClaims: 4}, withoutPasses(h.c.Stats()))
}

func TestWakeUpClaimsOnlyItsQueue(t *testing.T) {
	t.Parallel()
	q1, q2, q3 := queue("a", 2), queue("b", 2), queue("c", 2)
	q2.Sort = schema.SortLIFO
	h := newHarness(t, nil, q1, q2, q3)
	// A transient error: no queue is taken for empty, all stay eligible.
	transient := func(context.Context, store.TaskClaimParams) (schema.Task, error) {
		return schema.Task{}, errors.New("transient")
	}
	h.st.set(transient)
	h.start()
	h.pass()
	require.Equal(t, ids(q1, q2, q3), h.st.take())

	h.c.HasWork(q2.ID)
	h.pass()
	h.st.mu.Lock()
	calls := slices.Clone(h.st.calls)
	h.st.mu.Unlock()
	require.Equal(t, []store.TaskClaimParams{{Queue: q2.ID, Node: "n1", Sort: schema.SortLIFO}}, calls)
	require.Equal(t, ids(q2), h.st.take())

	// Two wake-ups during a pass: the next pass asks both, in the queues'
	// order.
	entered, release := make(chan struct{}), make(chan struct{})
	h.st.set(func(ctx context.Context, _ store.TaskClaimParams) (schema.Task, error) {
		close(entered)
		return schema.Task{}, block(ctx, release)
	})
	h.c.HasWork(q2.ID)
	recv(t, entered)
	h.st.set(transient)
	h.c.HasWork(q3.ID)
	h.c.HasWork(q1.ID)
	close(release)
	h.pass()
	h.pass()
	require.Equal(t, ids(q2, q1, q3), h.st.take())

	// A queue this node does not serve is not asked.
	h.c.HasWork(bson.NewObjectID())
	h.pass()
	require.Empty(t, h.st.take())
	require.Equal(t, int64(1), h.refreshes.Load())
}

func TestEmptyQueueNotAskedOnSlotFreed(t *testing.T) {
	t.Parallel()
	empty, busy := queue("empty", 2), queue("busy", 1)
	h := newHarness(t, nil, empty, busy)
	h.st.set(func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error) {
		if p.Queue == busy.ID {
			return alwaysTask(ctx, p)
		}
		return schema.Task{}, store.ErrNoTask
	})
	h.start()
	h.pass()
	require.Equal(t, ids(empty, busy), h.st.take())

	// empty found nothing: a freed slot does not make it worth asking.
	h.c.Finished(empty.ID)
	h.pass()
	require.Empty(t, h.st.take())
	h.c.Finished(empty.ID)
	h.pass()
	require.Empty(t, h.st.take())
	// New work does.
	h.c.HasWork(empty.ID)
	h.pass()
	require.Equal(t, ids(empty), h.st.take())

	// busy stopped because its slot was full, not because it was empty:
	// when the slot is freed, it is asked again.
	require.Equal(t, 1, h.c.Running(busy.ID))
	h.c.Finished(busy.ID)
	h.pass()
	require.Equal(t, ids(busy), h.st.take())
	require.Equal(t, 2, h.claimedCount())

	// HasWork during a pass that finds the queue empty is not lost.
	entered, release := make(chan struct{}), make(chan struct{})
	h.st.set(func(ctx context.Context, _ store.TaskClaimParams) (schema.Task, error) {
		close(entered)
		return schema.Task{}, block(ctx, release)
	})
	h.c.HasWork(empty.ID)
	recv(t, entered)
	h.c.HasWork(empty.ID)
	h.st.set(nil)
	close(release)
	h.pass()
	h.pass()
	require.Equal(t, ids(empty, empty), h.st.take())
}

func TestLimits(t *testing.T) {
	t.Parallel()
	t.Run("per queue", func(t *testing.T) {
		t.Parallel()
		q := queue("q", 3)
		h := newHarness(t, nil, q)
		h.st.set(alwaysTask)
		h.start()
		h.pass()
		require.Equal(t, ids(q, q, q), h.st.take())
		require.Equal(t, 3, h.claimedCount())
		require.Equal(t, 3, h.c.Running(q.ID))

		// Full: more work waits for a slot.
		h.c.HasWork(q.ID)
		h.pass()
		require.Empty(t, h.st.take())
		h.c.WakeAll()
		h.pass()
		require.Empty(t, h.st.take())

		h.c.Finished(q.ID)
		h.pass()
		require.Equal(t, ids(q), h.st.take(), "exactly one claim for the one freed slot")
		require.Equal(t, 4, h.claimedCount())
		require.Equal(t, 3, h.c.Running(q.ID))
		require.Equal(t, claimer.Stats{Claims: 4, WakePasses: 2, Batches: 1}, withoutPasses(h.c.Stats()), "one claim, then a batch of 2 for the other free slots")
	})
	t.Run("node cap", func(t *testing.T) {
		t.Parallel()
		a, b := queue("a", 3), queue("b", 3)
		h := newHarness(t, nil, a, b)
		h.st.set(alwaysTask)
		two := 2
		require.True(t, h.c.SetNodeMax(&two))
		h.start()
		h.pass()
		require.Equal(t, ids(a, a), h.st.take())
		require.Equal(t, 2, h.c.Total())

		four := 4
		require.True(t, h.c.SetNodeMax(&four))
		h.c.WakeAll()
		h.pass()
		require.Equal(t, ids(a, b), h.st.take())
		require.Equal(t, 4, h.c.Total())
		require.Equal(t, 3, h.c.Running(a.ID))
		require.Equal(t, 1, h.c.Running(b.ID))

		require.True(t, h.c.SetNodeMax(nil))
		h.c.HasWork(b.ID)
		h.pass()
		require.Equal(t, ids(b, b), h.st.take())
		require.Equal(t, 6, h.c.Total())
		require.Equal(t, 6, h.claimedCount())
	})
}

func TestSlotFreedUnderTheNodeCapServesOtherQueues(t *testing.T) {
	t.Parallel()
	// Queue a fills the node cap; b has work but gets no slot. When a task
	// of a finishes (and a has nothing more), the freed slot goes to b at
	// once, not at the next tick.
	a, b := queue("a", 2), queue("b", 2)
	h := newHarness(t, nil, a, b)
	h.st.set(alwaysTask)
	two := 2
	require.True(t, h.c.SetNodeMax(&two))
	h.start()
	h.pass()
	require.Equal(t, ids(a, a), h.st.take())

	h.st.set(func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error) {
		if p.Queue == a.ID {
			return schema.Task{}, store.ErrNoTask
		}
		return alwaysTask(ctx, p)
	})
	h.c.Finished(a.ID)
	h.pass()
	require.Equal(t, ids(a, b), h.st.take(), "a is asked (it may have more), then b gets the slot")
	require.Equal(t, 1, h.c.Running(b.ID))
}

func TestTick(t *testing.T) {
	t.Parallel()
	q1, q2, q3 := queue("a", 1), queue("b", 1), queue("c", 1)
	h := newHarness(t, func(c *claimer.Config) { c.Tick = 50 * time.Millisecond }, q1, q2, q3)
	h.start()
	// Every queue found nothing on the first pass; the tick tries them all
	// again anyway, and re-reads the queues each time.
	const n = 5
	deadline := time.Now().Add(wait)
	counts := map[bson.ObjectID]int{}
	for {
		for _, q := range h.st.take() {
			counts[q]++
		}
		if h.refreshes.Load() > n && counts[q1.ID] > n && counts[q2.ID] > n && counts[q3.ID] > n {
			break
		}
		require.True(t, time.Now().Before(deadline), "refreshes %d, claims per queue %v", h.refreshes.Load(), counts)
		time.Sleep(10 * time.Millisecond)
	}
	// A queue added meanwhile is picked up by the tick.
	q4 := queue("d", 1)
	h.setQueues(q1, q2, q3, q4)
	for !slices.Contains(h.st.take(), q4.ID) {
		require.True(t, time.Now().Before(deadline), "the tick never tried the new queue")
		time.Sleep(10 * time.Millisecond)
	}
	// A tick pass that claims counts as one.
	h.st.set(alwaysTask)
	for h.c.Stats().TickPasses == 0 {
		require.True(t, time.Now().Before(deadline), "no tick pass claimed: %+v", h.c.Stats())
		time.Sleep(10 * time.Millisecond)
	}
}

// publish puts ev on topic of bus.
func publish(t *testing.T, bus *gochannel.GoChannel, topic string, ev any) {
	t.Helper()
	msg, err := events.Encode(ev)
	require.NoError(t, err)
	require.NoError(t, bus.Publish(topic, msg))
}

func newBus(t *testing.T) *gochannel.GoChannel {
	bus := events.NewBus(slog.New(slog.DiscardHandler))
	t.Cleanup(func() { require.NoError(t, bus.Close()) })
	return bus
}

func TestEventsWakeUp(t *testing.T) {
	t.Parallel()
	bus := newBus(t)
	q1, q2, q3 := queue("a", 1), queue("b", 1), queue("c", 1)
	h := newHarness(t, func(c *claimer.Config) { c.Events = bus }, q1, q2)
	h.start()
	h.pass()
	require.Equal(t, ids(q1, q2), h.st.take())
	queued, succeeded, claimed := schema.StatusQueued, schema.StatusSucceeded, schema.StatusClaimed

	// A task queued in q1 wakes q1 only.
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: bson.NewObjectID(), Queue: q1.ID, Status: &queued, At: time.Now()})
	h.pass()
	require.Equal(t, ids(q1), h.st.take())

	// Other statuses, deletes and undecodable messages do nothing: the
	// next pass is the marker's.
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpUpdate, ID: bson.NewObjectID(), Status: &succeeded})
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpUpdate, ID: bson.NewObjectID(), Queue: q1.ID, Status: &succeeded})
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: bson.NewObjectID(), Queue: q1.ID, Status: &claimed})
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: bson.NewObjectID(), Queue: q1.ID}) // no status: not a move
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpDelete, ID: bson.NewObjectID()})
	require.NoError(t, bus.Publish(events.TopicTasks, message.NewMessage("x", []byte("not json"))))
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: bson.NewObjectID(), Queue: q2.ID, Status: &queued})
	h.pass()
	require.Equal(t, ids(q2), h.st.take())
	h.noPass()
	require.Equal(t, int64(1), h.refreshes.Load())

	// A task moved into q1 by an update of its queue alone (no status in
	// its event) may be queued there: it wakes q1.
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpUpdate, ID: bson.NewObjectID(), Queue: q1.ID})
	h.pass()
	require.Equal(t, ids(q1), h.st.take())

	// A queue change re-reads the queues and tries the changed one.
	h.setQueues(q1, q2, q3)
	publish(t, bus, events.TopicQueues, events.QueueChanged{Op: events.OpInsert, ID: q3.ID})
	h.pass()
	require.Equal(t, int64(2), h.refreshes.Load())
	require.Equal(t, ids(q3), h.st.take())

	// A rescan re-reads the queues and tries every one, empty or not.
	publish(t, bus, events.TopicRescan, events.Rescan{Reason: "test"})
	h.pass()
	require.Equal(t, int64(3), h.refreshes.Load())
	require.Equal(t, ids(q1, q2, q3), h.st.take())

	// So does a task put back in a queue the event does not name.
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpUpdate, ID: bson.NewObjectID(), Status: &queued})
	h.pass()
	require.Equal(t, int64(4), h.refreshes.Load())
	require.Equal(t, ids(q1, q2, q3), h.st.take())
	h.noPass()
}

func TestClaimErrors(t *testing.T) {
	t.Parallel()
	bad, failing, good := queue("bad", 2), queue("failing", 2), queue("good", 1)
	h := newHarness(t, nil, bad, failing, good)
	badID := bson.NewObjectID()
	decodeErr := &schema.DecodeError{Collection: schema.CollTasks, ID: badID.Hex(), Field: "status", Err: errors.New("not an integer")}
	boom := errors.New("connection refused")
	var badCalls, failingCalls atomic.Int32
	h.st.set(func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error) {
		switch p.Queue {
		case bad.ID:
			if badCalls.Add(1) == 1 {
				return schema.Task{ID: badID, Queue: bad.ID, Node: p.Node, Status: schema.StatusClaimed, Raw: bson.Raw{5, 0, 0, 0, 0}},
					// As the store returns it: wrapped.
					errors.Join(decodeErr)
			}
			return schema.Task{}, store.ErrNoTask
		case failing.ID:
			if failingCalls.Add(1) == 1 {
				return schema.Task{}, boom
			}
			return alwaysTask(ctx, p)
		}
		return alwaysTask(ctx, p)
	})
	h.start()
	h.pass()
	// bad: the malformed task is handed over with its slot, and the claim
	// goes on (finding nothing); failing: the error gives the slot back
	// and the pass goes on with good.
	require.Equal(t, ids(bad, bad, failing, good), h.st.take())
	h.mu.Lock()
	require.Len(t, h.malformed, 1)
	m := h.malformed[0]
	require.Equal(t, bad.ID, m.q.ID)
	require.Equal(t, badID, m.t.ID)
	var de *schema.DecodeError
	require.ErrorAs(t, m.err, &de)
	require.Same(t, decodeErr, de)
	require.Len(t, h.claimed, 1)
	require.Equal(t, good.ID, h.claimed[0].Queue)
	h.mu.Unlock()
	require.Equal(t, 1, h.c.Running(bad.ID), "the malformed task keeps its slot")
	require.Equal(t, 0, h.c.Running(failing.ID), "the failed claim gave its slot back")
	require.Equal(t, 1, h.c.Running(good.ID))
	require.Equal(t, 2, h.c.Total())
	require.Zero(t, h.c.Reserved(), "every claim settled, won or failed")
	require.True(t, h.c.Full(good.ID, good.MaxThreads), "its one slot held")
	require.False(t, h.c.Full(bad.ID, bad.MaxThreads))

	// The failed queue is not taken for empty: a freed slot retries it.
	h.c.Finished(failing.ID)
	h.pass()
	require.Equal(t, ids(failing, failing), h.st.take())
	require.Equal(t, 2, h.c.Running(failing.ID))
	require.Equal(t, claimer.Stats{Claims: 3, WakePasses: 2, EmptyClaims: 1}, withoutPasses(h.c.Stats()))
}

func TestStopLeavesNoGoroutines(t *testing.T) {
	// Not parallel: goleak must see only this claimer's goroutines.
	bus := newBus(t)
	q := queue("q", 1)
	h := newHarness(t, func(c *claimer.Config) { c.Events = bus; c.Tick = 20 * time.Millisecond }, q)
	opts := []goleak.Option{goleak.IgnoreCurrent()}

	require.NoError(t, h.c.Start(context.Background()))
	require.NoError(t, h.c.Start(context.Background()), "a second Start does nothing")
	h.pass()
	queued := schema.StatusQueued
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: bson.NewObjectID(), Queue: q.ID, Status: &queued})
	h.pass()
	h.c.Stop()
	h.c.Stop()
	goleak.VerifyNone(t, opts...)

	// No claim after Stop.
	h.st.take()
	h.c.HasWork(q.ID)
	h.c.WakeAll()
	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: bson.NewObjectID(), Queue: q.ID, Status: &queued})
	time.Sleep(quiet)
	require.Empty(t, h.st.take())
}

func TestStartWhileEventsArePublished(t *testing.T) {
	t.Parallel()
	// The change stream is open before the claimer subscribes, so events
	// may be published between its subscriptions; that must not deadlock
	// (the bus blocks a publisher until every subscriber acknowledged).
	bus := events.NewBus(slog.New(slog.DiscardHandler))
	defer bus.Close()
	stop := make(chan struct{})
	published := make(chan struct{})
	go func() {
		defer close(published)
		status := schema.StatusQueued
		for {
			select {
			case <-stop:
				return
			default:
			}
			msg, err := events.Encode(events.TaskChanged{Op: events.OpInsert, ID: bson.NewObjectID(), Queue: bson.NewObjectID(), Status: &status})
			if err != nil {
				t.Error(err)
				return
			}
			_ = bus.Publish(events.TopicTasks, msg)
		}
	}()
	for i := range 20 {
		h := newHarness(t, func(c *claimer.Config) { c.Events = bus; c.Passed = nil }, queue(fmt.Sprintf("q%d", i), 1))
		h.st.set(func(context.Context, store.TaskClaimParams) (schema.Task, error) {
			return schema.Task{}, store.ErrNoTask
		})
		started := make(chan error, 1)
		go func() { started <- h.c.Start(context.Background()) }()
		select {
		case err := <-started:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			close(stop)
			t.Fatal("Start deadlocked against a publisher")
		}
		h.c.Stop()
	}
	close(stop)
	<-published
}

// batchStore answers TaskClaim with one task and TaskClaimMany with what a
// backlog of size left allows, recording the limits asked.
type batchStore struct {
	mu     sync.Mutex
	left   int
	single int
	limits []int
	skips  []bool // each batch claim's SkipNullNode
	// capFree is what a capped queue's max_running leaves; capped records
	// the capped claims asked.
	capFree int
	capped  []store.TaskClaimCappedParams
	// lost: this many batch claims come back empty though tasks are left
	// (other nodes won every task they read).
	lost int
	// contended: the conflicts each batch claim reports, in turn (then 0);
	// spreads records the Spread each asked.
	contended []int
	spreads   []int
	prefers   []func(bson.ObjectID) bool // each batch claim's Prefer
}

func (b *batchStore) TaskClaimCapped(_ context.Context, p store.TaskClaimCappedParams) (store.TaskClaimManyResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.capped = append(b.capped, p)
	if b.capFree == 0 {
		return store.TaskClaimManyResult{}, store.ErrCapReached
	}
	var res store.TaskClaimManyResult
	for ; b.left > 0 && b.capFree > 0 && len(res.Tasks) < p.Limit; b.left-- {
		b.capFree--
		res.Tasks = append(res.Tasks, schema.Task{ID: bson.NewObjectID(), Queue: p.Queue, Node: p.Node, Status: schema.StatusClaimed})
	}
	return res, nil
}

func (b *batchStore) TaskClaim(_ context.Context, p store.TaskClaimParams) (schema.Task, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.single++
	if b.left == 0 {
		return schema.Task{}, store.ErrNoTask
	}
	b.left--
	return schema.Task{ID: bson.NewObjectID(), Queue: p.Queue, Node: p.Node, Status: schema.StatusClaimed}, nil
}

func (b *batchStore) TaskClaimMany(_ context.Context, p store.TaskClaimManyParams) (store.TaskClaimManyResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.limits = append(b.limits, p.Limit)
	b.skips = append(b.skips, p.SkipNullNode)
	b.spreads = append(b.spreads, p.Spread)
	b.prefers = append(b.prefers, p.Prefer)
	var res store.TaskClaimManyResult
	if len(b.contended) > 0 {
		res.Contended, b.contended = b.contended[0], b.contended[1:]
	}
	if b.lost > 0 {
		b.lost--
		return store.TaskClaimManyResult{Lost: true, Contended: 3 * p.Limit}, nil
	}
	for ; b.left > 0 && len(res.Tasks) < p.Limit; b.left-- {
		res.Tasks = append(res.Tasks, schema.Task{ID: bson.NewObjectID(), Queue: p.Queue, Node: p.Node, Status: schema.StatusClaimed})
	}
	res.Short = len(res.Tasks) < p.Limit
	return res, nil
}

func TestBacklogIsClaimedInBatches(t *testing.T) {
	t.Parallel()
	bs := &batchStore{left: 150}
	q := queue("q", 200)
	h := newHarness(t, func(c *claimer.Config) { c.Store = bs; c.Batch = 64 }, q)
	h.start()
	h.pass()
	bs.mu.Lock()
	defer bs.mu.Unlock()
	require.Equal(t, 1, bs.single, "one findOneAndUpdate first: a lone new task needs no more")
	require.Equal(t, []int{64, 64, 64, 50, 50}, bs.limits, "then batches of 64 (at most the free slots) until one comes back empty")
	// The first batch looks for node null (Disbatch 4.103's unclaimed) too
	// and reads none, so the next ones leave it out; the one that comes
	// back empty is asked again with it before the queue counts as empty.
	require.Equal(t, []bool{false, true, true, true, false}, bs.skips)
	require.Equal(t, 150, h.claimedCount())
	require.Equal(t, 150, h.c.Running(q.ID), "slots of unused batch places are given back")
	require.Zero(t, h.c.Reserved(), "and no reservation is left")
	require.False(t, h.c.Full(q.ID, q.MaxThreads))
	require.True(t, h.c.Full(q.ID, 150))
}

// withoutPasses is s without the pass counters, which the tests comparing
// whole Stats do not fix (PassTime is on the real clock).
func withoutPasses(s claimer.Stats) claimer.Stats {
	s.Passes, s.PassTime = 0, 0
	return s
}

func TestPassesAreCountedAndTimed(t *testing.T) {
	t.Parallel()
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	q := queue("q", 1)
	h := newHarness(t, func(c *claimer.Config) { c.Clock = fake }, q)
	// Each claim takes 7 ms on the clock and finds nothing.
	h.st.set(func(context.Context, store.TaskClaimParams) (schema.Task, error) {
		fake.Advance(7 * time.Millisecond)
		return schema.Task{}, store.ErrNoTask
	})
	h.start()
	h.pass()
	require.Equal(t, claimer.Stats{EmptyClaims: 1, Passes: 1, PassTime: 7 * time.Millisecond}, h.c.Stats())
	h.c.HasWork(q.ID)
	h.pass()
	require.Equal(t, claimer.Stats{EmptyClaims: 2, Passes: 2, PassTime: 14 * time.Millisecond}, h.c.Stats())
	// A pass that asks no queue (one this node does not serve was woken)
	// counts, and takes no time on the clock.
	h.c.HasWork(bson.NewObjectID())
	h.pass()
	require.Equal(t, claimer.Stats{EmptyClaims: 2, Passes: 3, PassTime: 14 * time.Millisecond}, h.c.Stats())
}

func TestClaimerLifecycle(t *testing.T) {
	// Not parallel: goleak.
	lifecycletest.Check(t, func(t *testing.T) lifecycle.Service {
		bus := newBus(t)
		return claimer.New(claimer.Config{
			Node: "n1", Store: &fakeStore{}, Events: bus, Tick: time.Millisecond,
			Refresh:  func(context.Context) ([]claimer.Queue, error) { return []claimer.Queue{queue("q", 1)}, nil },
			Dispatch: func(claimer.Queue, schema.Task, claimer.Timing) {},
		})
	}, lifecycletest.Options{})
}

// TestABatchLostToOtherNodesIsNotAnEmptyQueue: a batch claim can come
// back empty because other nodes won every task it read; the queue is not
// taken for empty (which would let lower priorities in) until the atomic
// single claim finds nothing.
func TestABatchLostToOtherNodesIsNotAnEmptyQueue(t *testing.T) {
	t.Parallel()
	bs := &batchStore{left: 100, lost: 1}
	q := queue("q", 200)
	h := newHarness(t, func(c *claimer.Config) { c.Store = bs; c.Batch = 64 }, q)
	h.start()
	h.pass()
	require.Equal(t, 100, h.claimedCount(), "the lost batch did not end the queue's turn")
	st := h.c.Stats()
	require.Equal(t, int64(1), st.EmptyClaims, "empty once, at the end")
	require.Equal(t, int64(1), st.LostBatches, "the lost batch is counted")
	require.Equal(t, int64(3*64), st.Contended, "its conflicts are counted: three rounds of 64 taken by others")
}

func TestFinishedAndHasWorkBeforeStartDoNotPanic(t *testing.T) {
	c := claimer.New(claimer.Config{Node: "n", Dispatch: func(claimer.Queue, schema.Task, claimer.Timing) {},
		Refresh: func(context.Context) ([]claimer.Queue, error) { return nil, nil }})
	q := bson.NewObjectID()
	c.Adopt(q)
	require.Equal(t, 1, c.Running(q))
	c.Finished(q)
	c.HasWork(q)
	require.Equal(t, 0, c.Running(q))
}

// TestContendedClaimsSpread: after a batch other nodes contended, the
// queue's next batches pick among 2, then 4, up to 8 times as many
// candidates; an uncontended batch halves it back.
func TestContendedClaimsSpread(t *testing.T) {
	t.Parallel()
	bs := &batchStore{left: 1000, contended: []int{5, 3, 1, 9, 0, 0, 0}}
	q := queue("q", 100)
	h := newHarness(t, func(c *claimer.Config) { c.Store = bs; c.Batch = 4 }, q)
	h.start()
	h.pass() // one single claim, then batches of 4 until the 100 slots are full
	bs.mu.Lock()
	defer bs.mu.Unlock()
	require.GreaterOrEqual(t, len(bs.spreads), 8)
	require.Equal(t, []int{0, 2, 4, 8, 8, 4, 2, 1}, bs.spreads[:8])
}

// TestPeersClaimTheirShareFirst: with peers, a queue's batches read at
// least one batch per node (Spread, doubled as before once contended)
// and prefer the tasks this node ranks first for, as the wake-ups' stagger
// ranks them; alone, or by priority, a node prefers none.
func TestPeersClaimTheirShareFirst(t *testing.T) {
	t.Parallel()
	bs := &batchStore{left: 1000, contended: []int{0, 0, 5, 0, 0}}
	q := queue("q", 100)
	q.Peers = []string{"n0", "n2"}
	h := newHarness(t, func(c *claimer.Config) { c.Store = bs; c.Batch = 4 }, q)
	h.start()
	h.pass()
	bs.mu.Lock()
	defer bs.mu.Unlock()
	require.GreaterOrEqual(t, len(bs.spreads), 6)
	require.Equal(t, []int{3, 3, 3, 6, 3, 3}, bs.spreads[:6], "three nodes: three batches' worth at least, doubled after a contended one, then halved back")
	first := 0
	for range 300 {
		id := bson.NewObjectID()
		mine := claimer.Rank(id, "n1", q.Peers) == 0
		for i, prefer := range bs.prefers {
			require.NotNil(t, prefer, "batch %d", i)
			require.Equal(t, mine, prefer(id), "batch %d prefers the tasks n1 ranks first for", i)
		}
		if mine {
			first++
		}
	}
	require.InDelta(t, 100, first, 40, "n1 first for about a third")

	// Many nodes read a batch for each, as far as store.MaxClaimBatch
	// candidates go (rounded up: the store caps the read itself).
	for _, tc := range []struct{ peers, batch, spread int }{{30, 4, 31}, {30, 16, 16}, {30, 64, 4}, {2, 100, 3}, {30, 37, 7}, {1, 200, 2}} {
		many := &batchStore{left: 100}
		q := queue("many", store.MaxClaimBatch)
		for i := range tc.peers {
			q.Peers = append(q.Peers, fmt.Sprintf("p%d", i))
		}
		h := newHarness(t, func(c *claimer.Config) { c.Store = many; c.Batch = tc.batch }, q)
		h.start()
		h.pass()
		many.mu.Lock()
		require.NotEmpty(t, many.spreads)
		require.Equal(t, tc.batch, many.limits[0], "batch %d", tc.batch)
		require.Equal(t, tc.spread, many.spreads[0], "%d nodes claiming %d each", tc.peers+1, tc.batch)
		many.mu.Unlock()
	}

	for name, mod := range map[string]func(*claimer.Queue){
		"no peers":           func(*claimer.Queue) {},
		"sorted by priority": func(q *claimer.Queue) { q.Peers, q.Sort = []string{"n0", "n2"}, schema.SortPriority },
	} {
		other := &batchStore{left: 100}
		q := queue("other", 20)
		mod(&q)
		h := newHarness(t, func(c *claimer.Config) { c.Store = other; c.Batch = 4 }, q)
		h.start()
		h.pass()
		other.mu.Lock()
		require.NotEmpty(t, other.prefers, name)
		for i, prefer := range other.prefers {
			require.Nil(t, prefer, "%s: no preference", name)
			require.Zero(t, other.spreads[i], "%s: no spread uncontended", name)
		}
		other.mu.Unlock()
	}
}

// TestStaggerRanksArePermutations: for every task the nodes rank
// themselves alike (a permutation of 0..n-1, whoever computes it), and
// each comes first for its share of the tasks.
func TestStaggerRanksArePermutations(t *testing.T) {
	t.Parallel()
	names := []string{"a", "b", "c", "d", "e"}
	first := map[string]int{}
	for range 2000 {
		task := bson.NewObjectID()
		seen := map[int]bool{}
		for _, n := range names {
			peers := slices.DeleteFunc(slices.Clone(names), func(p string) bool { return p == n })
			r := claimer.Rank(task, n, peers)
			require.False(t, seen[r], "rank %d twice", r)
			seen[r] = true
			if r == 0 {
				first[n]++
			}
		}
		require.Len(t, seen, len(names))
	}
	for _, n := range names {
		require.InDelta(t, 400, first[n], 100, "%s first for %d of 2000 tasks", n, first[n])
	}
}

// TestNewTaskWakeUpsAreStaggered: a wake-up for one new task tries the
// queue at once on the node ranked first for it, and rank x Stagger later
// on the others; without peers, at once.
func TestNewTaskWakeUpsAreStaggered(t *testing.T) {
	t.Parallel()
	bus := newBus(t)
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	q := queue("a", 1)
	q.Peers = []string{"n0", "n2", "n3"}
	lone := queue("b", 1)
	h := newHarness(t, func(c *claimer.Config) { c.Events = bus; c.Clock = fake; c.Stagger = 5 * time.Millisecond }, q, lone)
	h.start()
	h.pass()
	require.Equal(t, ids(q, lone), h.st.take())
	queued := schema.StatusQueued
	taskRanked := func(want int) bson.ObjectID {
		for {
			if id := bson.NewObjectID(); claimer.Rank(id, "n1", q.Peers) == want {
				return id
			}
		}
	}

	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: taskRanked(0), Queue: q.ID, Status: &queued})
	h.pass()
	require.Equal(t, ids(q), h.st.take(), "first for it: at once")

	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: taskRanked(2), Queue: q.ID, Status: &queued})
	h.pass() // the wake-up's own pass: nothing due yet
	require.Empty(t, h.st.take())
	fake.Advance(9 * time.Millisecond)
	h.noPass()
	fake.Advance(time.Millisecond)
	h.pass()
	require.Equal(t, ids(q), h.st.take(), "third for it: 2 x 5 ms later")

	publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: bson.NewObjectID(), Queue: lone.ID, Status: &queued})
	h.pass()
	require.Equal(t, ids(lone), h.st.take(), "no other node serves it: at once")
}

// TestAQueueChangedDuringAPassIsReadAgainBeforeDispatch: a pass read the
// queues, then their change is heard while a claim is under way (tasks
// inserted after the change): every task claimed from then on is
// dispatched with its queue as changed, in the pass's first single claim
// or in a batch, in the other queue of the pass too, and the queues are
// read once for it.
func TestAQueueChangedDuringAPassIsReadAgainBeforeDispatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		during int // the TaskClaim call (1: the single claim; 2: a batch's first) during which the change is heard
		want   map[string]int
	}{
		{"during the single claim", 1, map[string]int{"after": 6}},
		{"during a batch", 2, map[string]int{"before": 1, "after": 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bus := newBus(t)
			a, b := queue("a", 3), queue("b", 3)
			a.Constructor, b.Constructor = "before", "before"
			var mu sync.Mutex
			dispatchedWith := map[string]int{}
			h := newHarness(t, func(c *claimer.Config) {
				c.Events = bus
				c.Dispatch = func(q claimer.Queue, _ schema.Task, _ claimer.Timing) {
					mu.Lock()
					defer mu.Unlock()
					dispatchedWith[q.Constructor]++
				}
			}, a, b)
			h.start()
			h.pass() // read the queues; nothing to claim
			require.Equal(t, int64(1), h.refreshes.Load())

			entered, release := make(chan struct{}), make(chan struct{})
			calls := 0
			left := map[bson.ObjectID]int{a.ID: 3, b.ID: 3}
			h.st.set(func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error) {
				mu.Lock()
				calls++
				if calls == tc.during {
					mu.Unlock()
					close(entered)
					<-release
					mu.Lock()
				}
				defer mu.Unlock()
				if left[p.Queue] == 0 {
					return schema.Task{}, store.ErrNoTask
				}
				left[p.Queue]--
				return alwaysTask(ctx, p)
			})
			h.c.WakeAll() // a pass that reads the queues, then claims in both
			recv(t, entered)
			a2, b2 := a, b
			a2.Constructor, b2.Constructor = "after", "after"
			h.setQueues(a2, b2)
			// The bus returns once the claimer handled each change.
			publish(t, bus, events.TopicQueues, events.QueueChanged{Op: events.OpUpdate, ID: a.ID})
			publish(t, bus, events.TopicQueues, events.QueueChanged{Op: events.OpUpdate, ID: b.ID})
			close(release)
			h.pass()
			mu.Lock()
			require.Equal(t, tc.want, dispatchedWith)
			mu.Unlock()
			require.Equal(t, int64(3), h.refreshes.Load(), "the pass's read, then one more for both changes")

			// The changes' own pass does not read the queues again: the
			// read during the pass holds them.
			h.pass()
			require.Equal(t, int64(3), h.refreshes.Load())
		})
	}
}

// TestStaggeredWakeUpsAreBoundedAndTheEarliestWins: a node ranked far
// down among many peers waits at most maxStaggerRank (10) x Stagger, and
// of two new tasks in one queue the earlier turn stands.
func TestStaggeredWakeUpsAreBoundedAndTheEarliestWins(t *testing.T) {
	t.Parallel()
	bus := newBus(t)
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	q := queue("a", 1)
	for i := range 14 {
		q.Peers = append(q.Peers, fmt.Sprintf("p%02d", i))
	}
	h := newHarness(t, func(c *claimer.Config) { c.Events = bus; c.Clock = fake; c.Stagger = 5 * time.Millisecond }, q)
	h.start()
	h.pass()
	require.Equal(t, ids(q), h.st.take())
	queued := schema.StatusQueued
	taskRanked := func(ok func(int) bool) bson.ObjectID {
		for {
			if id := bson.NewObjectID(); ok(claimer.Rank(id, "n1", q.Peers)) {
				return id
			}
		}
	}
	wake := func(id bson.ObjectID) {
		publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: id, Queue: q.ID, Status: &queued})
		h.pass() // the wake-up's own pass: nothing due yet
		require.Empty(t, h.st.take())
	}

	wake(taskRanked(func(r int) bool { return r >= 12 }))
	fake.Advance(49 * time.Millisecond)
	h.noPass()
	fake.Advance(time.Millisecond)
	h.pass()
	require.Equal(t, ids(q), h.st.take(), "ranked 12 or more: 10 x 5 ms later")

	wake(taskRanked(func(r int) bool { return r == 1 }))
	wake(taskRanked(func(r int) bool { return r == 6 }))
	fake.Advance(5 * time.Millisecond)
	h.pass()
	require.Equal(t, ids(q), h.st.take(), "the earlier turn (5 ms) stands, not the later (30 ms)")
}

// TestNodesWithoutAStreamNeverListenAndFullOnesListenLast: a queue's Deaf
// peers (no wake-up stream) are skipped when its listeners are picked, so
// the nodes ranked after them listen, and they count for nothing in a
// wake-up's stagger; they remain peers (the weights' shares). Full peers
// (no free slot at their last heartbeat), and this node when full, rank
// after the others, so that while every node is full the same three
// listen.
func TestNodesWithoutAStreamNeverListenAndFullOnesListenLast(t *testing.T) {
	t.Parallel()
	q := queue("q", 1)
	for j := range 12 {
		q.Peers = append(q.Peers, fmt.Sprintf("p%02d", j))
	}
	first, ok := claimer.Listens("n1", q, 3)
	require.False(t, ok, "these names rank n1 after three of its peers")
	require.Len(t, first, 3)
	q.Deaf = first[:2]
	then, _ := claimer.Listens("n1", q, 3)
	require.Len(t, then, 3, "two nodes fewer to rank, still three listeners")
	require.NotContains(t, then, first[0])
	require.NotContains(t, then, first[1])
	require.Contains(t, then, first[2], "the one with a stream still listens")

	q.Deaf, q.Full = nil, first[:1]
	then, ok = claimer.Listens("n1", q, 3)
	require.False(t, ok)
	require.Equal(t, first[1:], then[:2], "the full one steps back")
	require.NotContains(t, then, first[0])
	q.Full = q.Peers
	_, ok = claimer.Listens("n1", q, 3)
	require.True(t, ok, "every peer full and n1 not: n1 listens")
	q.Full = append(slices.Clone(q.Peers), "n1")
	then, ok = claimer.Listens("n1", q, 3)
	require.False(t, ok, "all full: the order by hash stands")
	require.Equal(t, first, then)

	few := queue("few", 1)
	few.Peers, few.Deaf = []string{"p1", "p2", "p3", "p4"}, []string{"p2", "p4"}
	peers, ok := claimer.Listens("n1", few, 3)
	require.True(t, ok, "three nodes with streams: all listen")
	require.Equal(t, []string{"p1", "p3"}, peers, "the stagger ranks the nodes that hear wake-ups")
	peers, ok = claimer.Listens("n1", few, 0)
	require.True(t, ok)
	require.Equal(t, []string{"p1", "p3"}, peers, "without a limit too")
	require.Equal(t, []string{"p1", "p2", "p3", "p4"}, few.Peers, "the queue's peers are left as they are")
}

// TestASlotOfAClaimStillOutIsNotFull: while a claim is out, the slot it
// took is reserved and the queue is not full (what the heartbeat says);
// once it comes back with its task, the slot is held and the queue full.
func TestASlotOfAClaimStillOutIsNotFull(t *testing.T) {
	t.Parallel()
	q := queue("q", 1)
	h := newHarness(t, nil, q)
	entered, gate := make(chan struct{}), make(chan struct{})
	var once, opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	h.st.set(func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error) {
		once.Do(func() { close(entered) })
		<-gate
		return alwaysTask(ctx, p)
	})
	h.start()
	defer open() // a failed assertion must not leave the claim (and Stop) hanging
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatal("no claim")
	}
	require.Equal(t, 1, h.c.Reserved(), "the claim's slot")
	require.Equal(t, 1, h.c.Running(q.ID))
	require.False(t, h.c.Full(q.ID, q.MaxThreads), "reserved, not held")
	open()
	h.pass()
	require.Zero(t, h.c.Reserved())
	require.True(t, h.c.Full(q.ID, q.MaxThreads), "its task won: held")
}

// TestAListenerThatFillsUpStepsBack: a node that listens for a queue only
// because a peer ranked before it is full lets its stream go once its own
// heartbeat says it is full too, and wants it back once it says a slot
// is free, each seen at its next read of the queues.
func TestAListenerThatFillsUpStepsBack(t *testing.T) {
	t.Parallel()
	var q claimer.Queue
	for i := 0; q.Full == nil; i++ { // peers among whom n1 ranks fourth
		require.Less(t, i, 1000, "no name set of 1,000 ranks n1 fourth")
		q = queue("q", 1)
		for j := range 12 {
			q.Peers = append(q.Peers, fmt.Sprintf("p%d-%02d", i, j))
		}
		first, ok := claimer.Listens("n1", q, 3)
		q.Full = first[:1]
		if _, now := claimer.Listens("n1", q, 3); ok || !now {
			q.Full = nil
		}
	}
	full := q
	full.Full = append(slices.Clone(q.Full), "n1")
	_, ok := claimer.Listens("n1", full, 3)
	require.False(t, ok, "full itself: after the three")

	h, _, said := quietHarness(t, func(c *claimer.Config) { c.Listeners = 3 }, q)
	h.start()
	h.pass()
	require.Empty(t, said(), "a listener at its read")
	h.setQueues(full)
	h.c.WakeAll()
	h.pass()
	require.Equal(t, []bool{true}, said(), "full at the next read: the stream let go")
	h.setQueues(q)
	h.c.WakeAll()
	h.pass()
	require.Equal(t, []bool{true, false}, said(), "a free slot again: a listener again")
}

// TestOnlyAQueuesFirstListenersKeepTheirWakeUps: with Listeners 3 and
// more nodes than that, a node that is none of its queues' listeners
// lets its stream go (Quiet hears true) with no backlog at all, and
// wants it back once it listens for one queue; with at most Listeners
// nodes every node listens, and queues that keep a quiet node's
// wake-ups (two of one priority) keep a non-listener's too. A listener
// staggers a wake-up among the listeners alone; a node that hears one
// for a queue it does not listen for tries after them, at maxStaggerRank
// (10) x Stagger. Without Listeners, every node listens.
func TestOnlyAQueuesFirstListenersKeepTheirWakeUps(t *testing.T) {
	t.Parallel()
	// peersWhere finds 12 peers among whom n1 listens for a queue, or not.
	peersWhere := func(listens bool) claimer.Queue {
		for i := range 1000 {
			q := queue(fmt.Sprintf("q%d", i), 1)
			for j := range 12 {
				q.Peers = append(q.Peers, fmt.Sprintf("p%d-%02d", i, j))
			}
			if _, ok := claimer.Listens("n1", q, 3); ok == listens {
				return q
			}
		}
		t.Fatalf("no queue of 1,000 has n1 listening: %v", listens)
		return claimer.Queue{}
	}
	deaf, heard := peersWhere(false), peersWhere(true)
	heard.Sched.Priority = 10 // two priorities: quiet may let their wake-ups go
	few := queue("few", 1)
	few.Peers = []string{"p1", "p2"}
	peers, ok := claimer.Listens("n1", few, 3)
	require.True(t, ok, "three nodes: all listen")
	require.Equal(t, few.Peers, peers)
	peers, ok = claimer.Listens("n1", deaf, 0)
	require.True(t, ok, "no limit: all listen")
	require.Equal(t, deaf.Peers, peers)
	peers, _ = claimer.Listens("n1", heard, 3)
	require.Len(t, peers, 2, "n1 and two of its twelve peers")
	peers, _ = claimer.Listens("n1", deaf, 3)
	require.Len(t, peers, 3)
	// Every node picks the same three.
	listenersOf := func(q claimer.Queue) []string {
		var out []string
		for _, n := range append([]string{"n1"}, q.Peers...) {
			others := slices.DeleteFunc(append([]string{"n1"}, q.Peers...), func(m string) bool { return m == n })
			if _, ok := claimer.Listens(n, claimer.Queue{Peers: others}, 3); ok {
				out = append(out, n)
			}
		}
		return out
	}
	require.Len(t, listenersOf(heard), 3)
	require.Contains(t, listenersOf(heard), "n1")
	require.NotContains(t, listenersOf(deaf), "n1")

	bus := newBus(t)
	h, fake, said := quietHarness(t, func(c *claimer.Config) { c.Events = bus; c.Stagger = 5 * time.Millisecond; c.Listeners = 3 }, deaf)
	h.start()
	h.pass()
	require.Equal(t, ids(deaf), h.st.take(), "tried by the first pass, as ever")
	require.Equal(t, []bool{true}, said(), "no queue's listener: no wake-ups wanted, backlog or not")

	h.setQueues(deaf, heard)
	h.c.WakeAll()
	h.pass()
	h.st.take()
	require.Equal(t, []bool{true, false}, said(), "a listener of one queue")

	queued := schema.StatusQueued
	others, _ := claimer.Listens("n1", heard, 3)
	task := func(ok func(id bson.ObjectID) bool) bson.ObjectID {
		for {
			if id := bson.NewObjectID(); ok(id) {
				return id
			}
		}
	}
	wake := func(q claimer.Queue, id bson.ObjectID) {
		publish(t, bus, events.TopicTasks, events.TaskChanged{Op: events.OpInsert, ID: id, Queue: q.ID, Status: &queued})
		h.pass() // the wake-up's own pass: nothing due yet
		require.Empty(t, h.st.take())
	}
	wake(heard, task(func(id bson.ObjectID) bool {
		return claimer.Rank(id, "n1", others) == 2 && claimer.Rank(id, "n1", heard.Peers) >= 6
	}))
	fake.Advance(9 * time.Millisecond)
	h.noPass()
	fake.Advance(time.Millisecond)
	h.pass()
	require.Equal(t, ids(heard), h.st.take(), "third among the listeners, sixth or later among all: 2 x 5 ms")

	wake(deaf, task(func(id bson.ObjectID) bool { return claimer.Rank(id, "n1", deaf.Peers) == 0 }))
	fake.Advance(49 * time.Millisecond)
	h.noPass()
	fake.Advance(time.Millisecond)
	h.pass()
	require.Equal(t, ids(deaf), h.st.take(), "not its listener, first for the task among all: after the listeners, 10 x 5 ms")

	serve := func(qs ...claimer.Queue) []bool {
		h.setQueues(qs...)
		h.c.WakeAll()
		h.pass()
		h.st.take()
		return said()
	}
	require.Equal(t, []bool{true, false, true}, serve(deaf), "no queue's listener again")
	require.Equal(t, []bool{true, false, true, false}, serve(few), "three nodes: every one listens")
	other := deaf
	other.ID, other.Name = bson.NewObjectID(), "other"
	require.Equal(t, []bool{true, false, true, false}, serve(deaf, other), "two queues of one priority keep the wake-ups")

	// Without Listeners, n1 keeps its wake-ups among twelve peers.
	h2, _, said2 := quietHarness(t, nil, deaf)
	h2.start()
	h2.pass()
	require.Empty(t, said2())
}

// TestANonListenerReadsTheQueuesEveryQuietAfterWhileItHoldsATask: its
// stream let go, a node that is no queue's listener hears no queue
// change; while it holds a task (whose end claims more) it reads the
// queues every QuietAfter, as a quiet node does, and holding none it
// claims only by the tick, which reads them first.
func TestANonListenerReadsTheQueuesEveryQuietAfterWhileItHoldsATask(t *testing.T) {
	t.Parallel()
	q := queue("q", 2)
	for j := range 12 {
		q.Peers = append(q.Peers, fmt.Sprintf("p%02d", j))
	}
	for i := 0; ; i++ {
		if _, ok := claimer.Listens("n1", q, 3); !ok {
			break
		}
		require.Less(t, i, 1000, "no name makes n1 a non-listener")
		q.Peers[0] = fmt.Sprintf("x%03d", i)
	}
	h, fake, said := quietHarness(t, func(c *claimer.Config) { c.Listeners = 3 }, q)
	h.start()
	h.pass() // the queue is empty
	require.Equal(t, []bool{true}, said())
	reads := h.refreshes.Load()
	fake.Advance(3 * claimer.QuietAfter)
	h.noPass()
	require.Equal(t, reads, h.refreshes.Load(), "holding nothing: no read before the tick (an hour)")

	// A task arrives; the node claims and holds it.
	h.st.set(func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error) {
		h.st.set(nil) // one task
		return alwaysTask(ctx, p)
	})
	h.c.WakeAll()
	h.pass()
	require.Equal(t, 1, h.claimedCount())
	reads = h.refreshes.Load()
	fake.Advance(claimer.QuietAfter)
	h.pass()
	require.Equal(t, reads+1, h.refreshes.Load(), "holding a task: read again after QuietAfter")
}

// TestAnAdmissionsOnlyChangeWakesTheQueueWithoutAReread: a release (or a
// capped claim) moves only a queue's admissions: the queue is tried, and
// its settings are not read again, neither before the pass nor before
// the dispatch.
func TestAnAdmissionsOnlyChangeWakesTheQueueWithoutAReread(t *testing.T) {
	t.Parallel()
	bus := newBus(t)
	a := queue("a", 3)
	var dispatched atomic.Int64
	h := newHarness(t, func(c *claimer.Config) {
		c.Events = bus
		c.Dispatch = func(claimer.Queue, schema.Task, claimer.Timing) { dispatched.Add(1) }
	}, a)
	h.start()
	h.pass() // read the queues; nothing to claim
	require.Equal(t, int64(1), h.refreshes.Load())
	var once sync.Once
	h.st.set(func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error) {
		var task schema.Task
		err := store.ErrNoTask
		once.Do(func() { task, err = alwaysTask(ctx, p) })
		return task, err
	})
	publish(t, bus, events.TopicQueues, events.QueueChanged{Op: events.OpUpdate, ID: a.ID, AdmissionsOnly: true})
	h.pass()
	require.Equal(t, int64(1), dispatched.Load(), "the queue was tried")
	require.Equal(t, int64(1), h.refreshes.Load(), "its settings were not read again")
}

// A node outlives many queues (a queue per job is common): what it keeps
// per queue goes when the queues' read no longer returns it.
func TestQueuesNoLongerServedAreForgotten(t *testing.T) {
	t.Parallel()
	many := make([]claimer.Queue, 50)
	for i := range many {
		many[i] = queue(fmt.Sprint("q", i), 1)
	}
	run := func(after []claimer.Queue) int {
		h := newHarness(t, nil, many...)
		h.start()
		h.pass() // every queue tried, each found empty
		h.setQueues(after...)
		read := h.refreshes.Load()
		h.c.WakeAll()
		deadline := time.Now().Add(wait)
		for h.refreshes.Load() == read {
			require.True(t, time.Now().Before(deadline), "the queues were not read again")
			time.Sleep(time.Millisecond)
		}
		h.pass()
		h.c.Stop()
		return h.c.Remembered()
	}
	kept := run(many)
	require.GreaterOrEqual(t, kept, 2*len(many), "kept while served: empty, and node null's generation, at least")
	require.LessOrEqual(t, run(many[:1]), kept/len(many), "one queue left: one queue's entries")
}

// quietHarness is a harness on a fake clock whose Config.Quiet records
// what it hears; said returns that, in order. edit, when set, edits the
// config further.
func quietHarness(t *testing.T, edit func(*claimer.Config), queues ...claimer.Queue) (h *harness, fake *clock.Fake, said func() []bool) {
	fake = clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	var mu sync.Mutex
	var heard []bool
	h = newHarness(t, func(c *claimer.Config) {
		c.Clock = fake
		c.Quiet = func(on bool) {
			mu.Lock()
			defer mu.Unlock()
			heard = append(heard, on)
		}
		if edit != nil {
			edit(c)
		}
	}, queues...)
	return h, fake, func() []bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(heard)
	}
}

// quietOn is a quietHarness serving q alone, every claim answered, that
// has gone quiet: a claim, then QuietAfter of backlog.
func quietOn(t *testing.T, q claimer.Queue) (h *harness, fake *clock.Fake, said func() []bool) {
	t.Helper()
	return quietOnWith(t, nil, q)
}

// quietOnWith is quietOn with the config edited and qs served (the
// first of them claimed in after QuietAfter).
func quietOnWith(t *testing.T, edit func(*claimer.Config), qs ...claimer.Queue) (h *harness, fake *clock.Fake, said func() []bool) {
	t.Helper()
	h, fake, said = quietHarness(t, edit, qs...)
	h.st.set(alwaysTask)
	h.start()
	h.pass()
	fake.Advance(claimer.QuietAfter)
	h.c.Finished(qs[0].ID)
	h.pass()
	require.Equal(t, []bool{true}, said())
	return h, fake, said
}

// TestQuietWhileEveryQueueHasABacklog: the node's wake-ups are let go
// (Config.Quiet true) once every queue it serves has had a backlog for
// QuietAfter, and wanted again (false) at the first claim that finds a
// queue short; a queue without one, a capped queue, or two queues of one
// priority keep them.
func TestQuietWhileEveryQueueHasABacklog(t *testing.T) {
	t.Parallel()
	q, other := queue("q", 2), queue("other", 2)
	h, fake, said := quietHarness(t, nil, q)
	// serve has the node serve qs, claim in them all, and claim in one
	// (finished gives a slot back) QuietAfter later: what was heard then.
	serve := func(finished claimer.Queue, qs ...claimer.Queue) []bool {
		h.setQueues(qs...)
		h.c.WakeAll()
		h.pass()
		fake.Advance(claimer.QuietAfter) // not the tick (an hour): no pass of its own
		h.c.Finished(finished.ID)
		h.pass()
		return said()
	}
	h.st.set(alwaysTask)
	h.start()
	h.pass()
	require.Equal(t, 2, h.claimedCount(), "both slots taken")
	require.Empty(t, said(), "a backlog, not yet for QuietAfter")
	fake.Advance(claimer.QuietAfter - time.Millisecond)
	h.c.Finished(q.ID)
	h.pass()
	require.Empty(t, said(), "a backlog, for less than QuietAfter")
	fake.Advance(time.Millisecond)
	h.c.Finished(q.ID)
	h.pass()
	require.Equal(t, []bool{true}, said(), "a backlog for QuietAfter")
	h.c.Finished(q.ID)
	h.pass()
	require.Equal(t, []bool{true}, said(), "said once")

	// The queue runs dry: wake-ups are wanted again at once.
	h.st.set(nil)
	h.c.Finished(q.ID)
	h.pass()
	require.Equal(t, []bool{true, false}, said(), "a claim found the queue short")

	// Work again, beside a second queue that has none: not quiet.
	h.st.set(func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error) {
		if p.Queue == other.ID {
			return schema.Task{}, store.ErrNoTask
		}
		return alwaysTask(ctx, p)
	})
	require.Equal(t, []bool{true, false}, serve(q, q, other), "the other queue has no backlog")

	// A capped queue is never quiet: its room comes from other nodes'
	// releases, which only wake-ups tell.
	capped := queue("capped", 2)
	capped.Sched.MaxRunning = 10
	h.st.set(alwaysTask)
	require.Equal(t, []bool{true, false}, serve(capped, capped), "capped")

	// Two queues of one priority share the slots by their running tasks
	// across the cluster, which their changes tell: not quiet.
	a, b := queue("a", 2), queue("b", 2)
	require.Equal(t, []bool{true, false}, serve(a, a, b), "two queues of one priority")

	// Of two priorities, both with a backlog: quiet.
	b.Sched.Priority = 10
	require.Equal(t, []bool{true, false, true}, serve(b, a, b), "two priorities")
}

// TestQuietWithinOneLongPass: a backlog drained in one pass (each slot
// freed as soon as its task is dispatched) lets the wake-ups go once it
// has lasted QuietAfter, and wants them back when it runs out, before
// the pass ends.
func TestQuietWithinOneLongPass(t *testing.T) {
	t.Parallel()
	q := queue("q", 4)
	var h *harness
	h, fake, said := quietHarness(t, func(c *claimer.Config) {
		c.Dispatch = func(q claimer.Queue, _ schema.Task, _ claimer.Timing) { h.c.Finished(q.ID) }
	}, q)
	left := 40
	h.st.set(func(ctx context.Context, p store.TaskClaimParams) (schema.Task, error) {
		if left == 0 {
			return schema.Task{}, store.ErrNoTask
		}
		left--
		fake.Advance(50 * time.Millisecond)
		return alwaysTask(ctx, p)
	})
	h.start()
	h.pass()
	require.Equal(t, []bool{true, false}, said())
}

// TestQuietReadsTheQueuesEveryQuietAfter: a quiet node hears no queue
// change, so it reads the queues every QuietAfter, even with every slot
// busy: a queue paused meanwhile (no longer returned) is claimed no more.
func TestQuietReadsTheQueuesEveryQuietAfter(t *testing.T) {
	t.Parallel()
	q := queue("q", 2)
	h, fake, said := quietOn(t, q)

	// Every slot busy, no claim: the timer reads the queues.
	reads := h.refreshes.Load()
	h.st.take()
	fake.Advance(claimer.QuietAfter)
	h.pass()
	require.Equal(t, reads+1, h.refreshes.Load(), "read again after QuietAfter")
	require.Empty(t, h.st.take(), "no slot free: no claim")

	// The queue is paused (the read no longer returns it).
	h.setQueues()
	fake.Advance(claimer.QuietAfter)
	h.pass()
	require.Equal(t, reads+2, h.refreshes.Load())
	h.c.Finished(q.ID)
	h.pass()
	require.Empty(t, h.st.take(), "a paused queue is claimed no more")
	require.Equal(t, []bool{true, false}, said(), "no queue with a backlog: wake-ups wanted again")
}

// TestAQuietReadTriesEveryQueue: no event says what changed while the
// node is quiet, so the queue read that stands for them tries every
// queue. A maxthreads raised meanwhile is claimed into at the read, and,
// under a node-wide cap, the slots of a queue paused meanwhile go to the
// queue with a backlog.
func TestAQuietReadTriesEveryQueue(t *testing.T) {
	t.Parallel()
	t.Run("maxthreads raised", func(t *testing.T) {
		t.Parallel()
		q := queue("q", 2)
		h, fake, _ := quietOn(t, q)
		before := h.claimedCount()

		q.MaxThreads = 10
		h.setQueues(q)
		fake.Advance(claimer.QuietAfter)
		h.pass()
		require.Equal(t, before+8, h.claimedCount(), "the eight new slots claimed at the first read")
	})
	t.Run("a paused queue's slots under a node-wide cap", func(t *testing.T) {
		t.Parallel()
		q1, q2 := queue("q1", 2), queue("q2", 4)
		q1.Sched.Priority, q2.Sched.Priority = 2, 1
		h, fake, said := quietHarness(t, nil, q1, q2)
		four := 4
		h.c.SetNodeMax(&four)
		h.st.set(alwaysTask)
		h.start()
		h.pass()
		require.Equal(t, 4, h.claimedCount())
		fake.Advance(claimer.QuietAfter)
		h.c.Finished(q2.ID)
		h.pass()
		require.Equal(t, []bool{true}, said())

		h.setQueues(q2) // q1 paused
		fake.Advance(claimer.QuietAfter)
		h.pass() // the read that finds it paused
		h.c.Finished(q1.ID)
		h.pass()
		h.c.Finished(q1.ID)
		h.pass()
		fake.Advance(claimer.QuietAfter)
		h.pass()
		require.Equal(t, 4, h.c.Total(), "q2 took the node's two slots q1 freed, by the next read at the latest")
	})
}

// TestAQuietNodesBatchedClaimsLingerForABatch: on a quiet node a
// batched claim waits, at most Config.Linger on the clock, until all it
// could take is free, instead of claiming the few that are; a
// node that is not quiet, or has no Linger, claims what is free at once;
// after a linger in vain the claims rest from waiting.
func TestAQuietNodesBatchedClaimsLingerForABatch(t *testing.T) {
	t.Parallel()
	// Small, so that the fake clock's advances stay within QuietAfter of
	// the quiet timer's arming (its pass would come between).
	const linger = 2 * time.Millisecond
	ctx := context.Background()
	setup := func(t *testing.T, linger time.Duration, batch int) (*harness, *clock.Fake, claimer.Queue) {
		q := queue("q", 8)
		h, fake, said := quietHarness(t, func(c *claimer.Config) { c.Batch = batch; c.Linger = linger }, q)
		h.st.set(alwaysTask)
		h.start()
		h.pass()
		batches := []int{7}
		if batch < 7 {
			batches = []int{batch, 7 - batch}
		}
		require.Equal(t, batches, h.st.takeLimits(), "not quiet: one claim, then batches for the seven free slots, at once")
		fake.Advance(claimer.QuietAfter)
		waiters := fake.Waiters()
		h.c.Finished(q.ID)
		if linger > 0 {
			// Quiet from the pass's first claim: the batched one after
			// it lingers, every slot taken, in vain.
			require.NoError(t, fake.BlockUntil(ctx, waiters+1))
			fake.Advance(linger)
		}
		h.pass()
		require.Equal(t, []bool{true}, said())
		fake.Advance(claimer.LingerRests * linger) // the rest after it
		h.st.takeLimits()
		return h, fake, q
	}
	// lingering is setup, then a slot freed: the pass's first claim takes
	// it alone, and the batched claim after it lingers (every slot
	// taken). waiters is the fake clock's count before the linger.
	lingering := func(t *testing.T, batch int) (h *harness, fake *clock.Fake, q claimer.Queue, waiters int) {
		h, fake, q = setup(t, linger, batch)
		waiters = fake.Waiters()
		h.c.Finished(q.ID)
		require.NoError(t, fake.BlockUntil(ctx, waiters+1), "the batched claim lingers")
		return h, fake, q, waiters
	}

	t.Run("until a whole batch is free", func(t *testing.T) {
		t.Parallel()
		h, fake, q, waiters := lingering(t, 8)
		before := h.c.Stats() // the linger in progress is counted at its end
		for range 7 {
			h.c.Finished(q.ID)
		}
		h.noPass()
		require.Empty(t, h.st.takeLimits(), "seven free slots of a batch of eight: still waiting")
		h.c.Finished(q.ID)
		require.Equal(t, []int{8}, limitsSoon(t, h), "the eighth freed: one claim of eight")
		require.NoError(t, fake.BlockUntil(ctx, waiters+1), "the next batched claim lingers in turn")
		fake.Advance(linger) // nothing frees: the linger ends, with no slot to claim into
		h.pass()
		require.Empty(t, h.st.takeLimits())
		s := h.c.Stats()
		require.Equal(t, before.Lingers+2, s.Lingers)
		require.Equal(t, before.LingerTime+linger, s.LingerTime, "the first ended by the slots, the second by the clock")
		require.Equal(t, before.LingersTimedOut+1, s.LingersTimedOut)
	})
	t.Run("at most Linger, then a rest", func(t *testing.T) {
		t.Parallel()
		h, fake, q, waiters := lingering(t, 8)
		h.c.Finished(q.ID)
		h.c.Finished(q.ID)
		fake.Advance(linger - time.Millisecond)
		h.noPass()
		require.Empty(t, h.st.takeLimits(), "two free slots, within Linger: waiting")
		fake.Advance(time.Millisecond)
		require.Equal(t, []int{2}, limitsSoon(t, h), "Linger passed: the two free slots claimed")
		idle(h) // the next batched claim rests: no wait, no slot, the pass ends

		// The second linger in vain in a row (the setup's was the
		// first): a rest twice as long.
		rest := 2 * claimer.LingerRests * linger
		lingers, claimed := h.c.Stats().Lingers, h.claimedCount()
		fake.Advance(rest - time.Millisecond)
		h.c.Finished(q.ID)
		require.Eventually(t, func() bool { return h.claimedCount() == claimed+1 }, wait, time.Millisecond)
		idle(h)
		require.Equal(t, lingers, h.c.Stats().Lingers, "resting: no claim waits")
		require.Equal(t, waiters, fake.Waiters())
		fake.Advance(time.Millisecond)
		h.c.Finished(q.ID)
		require.NoError(t, fake.BlockUntil(ctx, waiters+1), "rested: the batched claim lingers again")
		for range 8 {
			h.c.Finished(q.ID)
		}
		require.Equal(t, []int{8}, limitsSoon(t, h))
		require.NoError(t, fake.BlockUntil(ctx, waiters+1), "a linger that got its slots ends the rests")
		fake.Advance(linger)
		h.pass()
	})
	// The queue has eight slots: a claim waits for what it could take,
	// one slot short of it is still waiting.
	for _, c := range []struct {
		name         string
		batch, takes int
	}{
		{"all the queue's slots when fewer than a batch", 64, 8},
		{"a batch when smaller than the queue's slots", 4, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h, fake, q, waiters := lingering(t, c.batch)
			for range c.takes - 1 {
				h.c.Finished(q.ID)
			}
			h.noPass()
			require.Empty(t, h.st.takeLimits(), "batch %d: %d free slots, still waiting", c.batch, c.takes-1)
			h.c.Finished(q.ID)
			require.Equal(t, []int{c.takes}, limitsSoon(t, h), "batch %d of eight slots: one claim of %d once they are free", c.batch, c.takes)
			require.NoError(t, fake.BlockUntil(ctx, waiters+1))
			fake.Advance(linger)
			h.pass()
		})
	}
	t.Run("a pause ends it, not in vain", func(t *testing.T) {
		t.Parallel()
		h, _, _, _ := lingering(t, 8)
		before := h.c.Stats()
		h.c.Pause(claimer.PauseDraining)
		h.pass() // on its own: the pause ends the wait, and nothing is claimed
		require.Empty(t, h.st.takeLimits())
		s := h.c.Stats()
		require.Equal(t, before.Lingers+1, s.Lingers)
		require.Equal(t, before.LingersTimedOut, s.LingersTimedOut, "a pause is no wait in vain")
	})
	t.Run("not with two queues", func(t *testing.T) {
		t.Parallel()
		// Both backlogged, of two priorities: quiet. A wait for one
		// would hold back the slots the other could take meanwhile.
		q1, q2 := queue("q1", 8), queue("q2", 8)
		q1.Sched.Priority = 2
		h, _, _ := quietOnWith(t, func(c *claimer.Config) { c.Batch = 8; c.Linger = linger }, q1, q2)
		h.c.Finished(q1.ID)
		h.pass() // on its own
		require.Zero(t, h.c.Stats().Lingers)
	})
	t.Run("no Linger", func(t *testing.T) {
		t.Parallel()
		h, _, q := setup(t, 0, 8)
		h.c.Finished(q.ID)
		h.pass() // on its own: no claim waits for the clock
		require.Zero(t, h.c.Stats().Lingers)
	})
}

// idle waits until the claimer has had nothing to do for a while, and
// forgets the passes it ran meanwhile.
func idle(h *harness) {
	time.Sleep(quiet)
	for {
		select {
		case <-h.passes:
		default:
			return
		}
	}
}

// limitsSoon waits for a batched claim and returns the limits asked.
func limitsSoon(t *testing.T, h *harness) []int {
	t.Helper()
	var l []int
	require.Eventually(t, func() bool { l = append(l, h.st.takeLimits()...); return len(l) > 0 }, wait, time.Millisecond, "no batched claim")
	return l
}
