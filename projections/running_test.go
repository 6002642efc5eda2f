package projections_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/store"
)

// runningSetup is a projector leading over a fresh database.
type runningSetup struct {
	db   *mongo.Database
	s    *store.Store
	svc  *projections.Service
	logs *logBuf
}

func newRunningSetup(t *testing.T) *runningSetup {
	t.Helper()
	db := mongotest.Database(t)
	b := &runningSetup{db: db, s: store.New(db, store.Options{}), logs: &logBuf{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(b.logs.String())
		}
	})
	return b
}

func (b *runningSetup) start(t *testing.T) *projections.Service {
	t.Helper()
	svc := projections.New(projections.Config{Node: "n1", Store: b.s, LeaseTTL: 2 * time.Second, Logger: logger(b.logs)})
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	require.Eventually(t, func() bool { return svc.Stats().Leader }, 10*time.Second, 10*time.Millisecond)
	b.svc = svc
	return svc
}

// requireCounters waits until queue q's stored counters are exactly want.
func (b *runningSetup) requireCounters(t *testing.T, step string, q bson.ObjectID, want store.QueueCounts) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		stored, err := b.s.QueueCounters(context.Background())
		require.NoError(t, err)
		c := stored[q]
		if c.Complete() && *c.Todo == want.Todo && *c.Total == want.Total && *c.Running == want.Running && *c.Failed == want.Failed {
			return
		}
		if time.Now().After(deadline) {
			require.Failf(t, "counters", "%s: want todo %d, total %d, running %d, failed %d; have todo %v, total %v, running %v, failed %v",
				step, want.Todo, want.Total, want.Running, want.Failed, deref(c.Todo), deref(c.Total), deref(c.Running), deref(c.Failed))
		}
	}
}

func (b *runningSetup) insert(t *testing.T, q bson.ObjectID, status any) bson.ObjectID {
	t.Helper()
	id := bson.NewObjectID()
	d := bson.D{{Key: "_id", Value: id}, {Key: "queue", Value: q}, {Key: "node", Value: -1}}
	if status != nil {
		d = append(d, bson.E{Key: "status", Value: status})
	}
	_, err := b.db.Collection("tasks").InsertOne(context.Background(), d)
	require.NoError(t, err)
	return id
}

func (b *runningSetup) update(t *testing.T, id bson.ObjectID, u bson.D) {
	t.Helper()
	res, err := b.db.Collection("tasks").UpdateOne(context.Background(), bson.D{{Key: "_id", Value: id}}, u)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.ModifiedCount)
}

func set(kv ...any) bson.D {
	d := bson.D{}
	for i := 0; i < len(kv); i += 2 {
		d = append(d, bson.E{Key: kv[i].(string), Value: kv[i+1]})
	}
	return bson.D{{Key: "$set", Value: d}}
}

// TestCountRunningFollowsTransitions: count_running counts the tasks in -1
// or 0, through every kind of transition, whoever writes it (here a raw
// driver, as any program might), beside exact count_todo and count_total.
func TestCountRunningFollowsTransitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newRunningSetup(t)
	q := newQueue(t, b.db, "q", 0, true)
	other := newQueue(t, b.db, "other", 0, true)
	svc := b.start(t)

	a, c, d := b.insert(t, q, int32(-2)), b.insert(t, q, int32(-2)), b.insert(t, q, int32(-2))
	b.requireCounters(t, "three queued", q, store.QueueCounts{Todo: 3, Total: 3, Running: 0})

	b.update(t, a, set("status", int32(-1), "node", "n1"))
	b.requireCounters(t, "claim -2 → -1", q, store.QueueCounts{Todo: 3, Total: 3, Running: 1})

	b.update(t, a, set("status", int32(0)))
	b.requireCounters(t, "start -1 → 0", q, store.QueueCounts{Todo: 3, Total: 3, Running: 1})

	b.update(t, c, set("status", int32(-1), "node", "n2"))
	b.requireCounters(t, "a second claim", q, store.QueueCounts{Todo: 3, Total: 3, Running: 2})

	b.update(t, c, set("status", int32(-2), "node", int32(-1)))
	b.requireCounters(t, "requeue -1 → -2", q, store.QueueCounts{Todo: 3, Total: 3, Running: 1})

	b.update(t, a, set("status", int32(1)))
	b.requireCounters(t, "finish 0 → 1", q, store.QueueCounts{Todo: 2, Total: 3, Running: 0})

	e := b.insert(t, q, int32(0))
	b.requireCounters(t, "insert at 0", q, store.QueueCounts{Todo: 3, Total: 4, Running: 1})

	f := b.insert(t, q, -1.0)
	b.requireCounters(t, "insert at -1.0 (a double)", q, store.QueueCounts{Todo: 4, Total: 5, Running: 2})

	_, err := b.db.Collection("tasks").DeleteOne(ctx, bson.D{{Key: "_id", Value: e}})
	require.NoError(t, err)
	b.requireCounters(t, "delete of a running task", q, store.QueueCounts{Todo: 3, Total: 4, Running: 1})

	b.update(t, f, set("queue", other))
	b.requireCounters(t, "a running task moved out", q, store.QueueCounts{Todo: 2, Total: 3, Running: 0})
	b.requireCounters(t, "a running task moved in", other, store.QueueCounts{Todo: 1, Total: 1, Running: 1})

	b.update(t, f, set("queue", q, "status", int32(2)))
	b.requireCounters(t, "moved back and finished at once: running leaves other", other, store.QueueCounts{Todo: 0, Total: 0, Running: 0})
	b.requireCounters(t, "moved back and finished at once: not running in q, failed", q, store.QueueCounts{Todo: 2, Total: 4, Running: 0, Failed: 1})

	b.update(t, d, set("status", int32(0)))
	b.requireCounters(t, "-2 → 0", q, store.QueueCounts{Todo: 2, Total: 4, Running: 1, Failed: 1})

	b.update(t, d, set("status", "0"))
	b.requireCounters(t, `0 → "0" (not a number: neither running nor to do)`, q, store.QueueCounts{Todo: 1, Total: 4, Running: 0, Failed: 1})

	b.update(t, d, set("status", bson.NewDecimal128(0, 0)))
	b.requireCounters(t, `"0" → decimal 0`, q, store.QueueCounts{Todo: 2, Total: 4, Running: 1, Failed: 1})

	b.update(t, d, bson.D{{Key: "$unset", Value: bson.D{{Key: "status", Value: ""}}}})
	b.requireCounters(t, "status removed: to do, not running", q, store.QueueCounts{Todo: 2, Total: 4, Running: 0, Failed: 1})

	b.update(t, d, set("status", int32(-1)))
	b.requireCounters(t, "missing → -1", q, store.QueueCounts{Todo: 2, Total: 4, Running: 1, Failed: 1})

	_, err = b.db.Collection("tasks").ReplaceOne(ctx, bson.D{{Key: "_id", Value: d}}, bson.D{{Key: "queue", Value: q}, {Key: "status", Value: int32(-6)}})
	require.NoError(t, err)
	b.requireCounters(t, "replaced by an orphaned task", q, store.QueueCounts{Todo: 2, Total: 4, Running: 0, Failed: 1})

	g := b.insert(t, q, -0.5)
	b.requireCounters(t, "insert at -0.5: to do, not running", q, store.QueueCounts{Todo: 3, Total: 5, Running: 0, Failed: 1})
	_, err = b.db.Collection("tasks").DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{g, c}}}}})
	require.NoError(t, err)
	b.requireCounters(t, "deleteMany", q, store.QueueCounts{Todo: 1, Total: 3, Running: 0, Failed: 1})

	require.Zero(t, svc.Stats().DriftQueues)
	require.NotContains(t, b.logs.String(), "counter drift")
	requireExact(t, b.s, 10*time.Second)
}

// TestReconcileRepairsCountRunning: a wrong count_running found by the
// reconcile is drift: logged with both values, counted, and repaired.
func TestReconcileRepairsCountRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newRunningSetup(t)
	q := newQueue(t, b.db, "q", 0, true)
	first := b.start(t)
	ids := insertBurst(t, b.db, q, 0, 6, func(int) any { return int32(-2) })
	for _, id := range ids[:2] {
		b.update(t, id.(bson.ObjectID), set("status", int32(0), "node", "n1"))
	}
	b.update(t, ids[5].(bson.ObjectID), set("status", int32(2), "node", "n1"))
	b.requireCounters(t, "two running, one failed", q, store.QueueCounts{Todo: 5, Total: 6, Running: 2, Failed: 1})
	first.Stop()

	// While no projector runs, count_running and count_failed go wrong (no
	// task event says so).
	_, err := b.db.Collection("queues").UpdateOne(ctx, bson.D{{Key: "_id", Value: q}}, set("count_running", int32(7), "count_failed", int32(0)))
	require.NoError(t, err)

	second := projections.New(projections.Config{Node: "n1", Store: b.s, LeaseTTL: 2 * time.Second, Logger: logger(b.logs)})
	require.NoError(t, second.Start(ctx))
	t.Cleanup(second.Stop)
	b.requireCounters(t, "repaired by the reconcile on catching up", q, store.QueueCounts{Todo: 5, Total: 6, Running: 2, Failed: 1})
	require.Eventually(t, func() bool { return second.Stats().DriftQueues == 1 }, 10*time.Second, 10*time.Millisecond)
	logs := b.logs.String()
	require.Contains(t, logs, `msg="counter drift repaired" component=projector queue=`+q.Hex()+` count_todo=5 recount_todo=5 count_total=6 recount_total=6 count_running=7 recount_running=2 count_failed=0 recount_failed=1`+"\n")

	// It goes on from the repaired values.
	b.update(t, ids[2].(bson.ObjectID), set("status", int32(-1), "node", "n1"))
	b.requireCounters(t, "a claim after the repair", q, store.QueueCounts{Todo: 5, Total: 6, Running: 3, Failed: 1})
	b.update(t, ids[5].(bson.ObjectID), set("status", int32(-2), "node", int32(-1)))
	b.requireCounters(t, "a retry after the repair", q, store.QueueCounts{Todo: 6, Total: 6, Running: 3, Failed: 0})
	require.EqualValues(t, 1, second.Stats().DriftQueues)
}

// TestQueueWithoutCountRunningGetsIt: queues from before count_running (or
// made by 4.103, or by a client) get it by a recount, both when the
// projector starts and when a transition finds it missing; that is not
// drift.
func TestQueueWithoutCountRunningGetsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newRunningSetup(t)
	// An older database: exact count_todo and count_total, no count_running.
	old := bson.NewObjectID()
	_, err := b.db.Collection("queues").InsertOne(ctx, bson.D{{Key: "_id", Value: old}, {Key: "name", Value: "old"}, {Key: "constructor", Value: "noop"},
		{Key: "maxthreads", Value: 0}, {Key: "count_todo", Value: 3}, {Key: "count_total", Value: 4}})
	require.NoError(t, err)
	insertBurst(t, b.db, old, 0, 4, func(i int) any { return []any{int32(-1), int32(0), int32(-2), int32(1)}[i] })
	later := newQueue(t, b.db, "later", 0, true)
	laterIDs := insertBurst(t, b.db, later, 0, 2, func(int) any { return int32(-2) })

	svc := b.start(t)
	b.requireCounters(t, "created on start-up", old, store.QueueCounts{Todo: 3, Total: 4, Running: 2})
	b.requireCounters(t, "a complete queue", later, store.QueueCounts{Todo: 2, Total: 2, Running: 0})
	require.Contains(t, b.logs.String(), `msg="queue counters created by a recount" component=projector queue=`+old.Hex()+` count_todo=3 count_total=4 count_running=2 count_failed=0`+"\n")

	// Later, count_running disappears (an older program rewrote it away)
	// while the projector runs: the next transition's delta finds it
	// missing and the queue is recounted instead (an $inc would make it 1).
	// Once the start-up recount and the one on catching up with the stream
	// are done.
	require.Eventually(t, func() bool { return svc.Stats().Reconciles == 2 }, 10*time.Second, 10*time.Millisecond)
	b.update(t, laterIDs[0].(bson.ObjectID), set("status", int32(-1), "node", "n1"))
	b.requireCounters(t, "one claimed", later, store.QueueCounts{Todo: 2, Total: 2, Running: 1})
	_, err = b.db.Collection("queues").UpdateOne(ctx, bson.D{{Key: "_id", Value: later}}, bson.D{{Key: "$unset", Value: bson.D{{Key: "count_running", Value: ""}}}})
	require.NoError(t, err)
	b.update(t, laterIDs[1].(bson.ObjectID), set("status", int32(0), "node", "n1"))
	b.requireCounters(t, "recounted when a delta found it missing", later, store.QueueCounts{Todo: 2, Total: 2, Running: 2})
	require.Eventually(t, func() bool { return svc.Stats().Reconciles == 3 }, 10*time.Second, 10*time.Millisecond, "one recount of the queue found missing")
	require.Contains(t, b.logs.String(), `msg="queue counters created by a recount" component=projector queue=`+later.Hex()+` count_todo=2 count_total=2 count_running=2 count_failed=0`+"\n")
	b.update(t, laterIDs[0].(bson.ObjectID), set("status", int32(1)))
	b.requireCounters(t, "then followed again", later, store.QueueCounts{Todo: 1, Total: 2, Running: 1})

	require.Zero(t, svc.Stats().DriftQueues)
	require.NotContains(t, b.logs.String(), "counter drift")
}
