package projections_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// TestCountFailedFollowsTransitions: count_failed counts the tasks in 2,
// whatever failed them (a plugin, a node that could not run the task, an
// operator's cancel) and whoever writes them (the store's own transitions,
// a raw driver), beside exact count_todo, count_total and count_running.
func TestCountFailedFollowsTransitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newRunningSetup(t)
	q := newQueue(t, b.db, "q", 0, true)
	other := newQueue(t, b.db, "other", 0, true)
	svc := b.start(t)

	ids, err := b.s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q, Parameters: make([]bson.Raw, 4)})
	require.NoError(t, err)
	b.requireCounters(t, "four queued", q, store.QueueCounts{Todo: 4, Total: 4})

	claimStart := func() bson.ObjectID {
		t.Helper()
		task, err := b.s.TaskClaim(ctx, store.TaskClaimParams{Queue: q, Node: "n1", Sort: schema.SortFIFO})
		require.NoError(t, err)
		require.NoError(t, b.s.TaskStart(ctx, store.TaskTransitionParams{ID: task.ID, Node: "n1"}))
		return task.ID
	}
	first := claimStart()
	require.Equal(t, ids[0], first)
	b.requireCounters(t, "one running", q, store.QueueCounts{Todo: 4, Total: 4, Running: 1})
	require.NoError(t, b.s.TaskFinish(ctx, store.TaskFinishParams{ID: first, Node: "n1", Status: schema.StatusFailed, Stderr: "boom"}))
	b.requireCounters(t, "finished as failed 0 → 2", q, store.QueueCounts{Todo: 3, Total: 4, Failed: 1})

	// A failed attempt sent back for a retry is not failed; a task its
	// node fails unrun (from -1) and one an operator cancels are.
	second := claimStart()
	require.NoError(t, b.s.TaskFinish(ctx, store.TaskFinishParams{ID: second, Node: "n1", Status: schema.StatusFailed,
		Retry: &store.TaskRetryAt{Tries: 1}}))
	third, err := b.s.TaskClaim(ctx, store.TaskClaimParams{Queue: q, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.NoError(t, b.s.TaskFail(ctx, store.TaskFailParams{ID: third.ID, Node: "n1", From: schema.StatusClaimed, Reason: "unreadable"}))
	b.requireCounters(t, "a retried attempt, then a claimed task failed -1 → 2", q, store.QueueCounts{Todo: 2, Total: 4, Failed: 2})
	res, err := b.s.TaskCancel(ctx, store.TaskCancelParams{Target: store.TaskTarget{IDs: []bson.ObjectID{ids[3]}}, By: "test"})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Cancelled)
	b.requireCounters(t, "cancelled -2 → 2", q, store.QueueCounts{Todo: 1, Total: 4, Failed: 3})

	// A retry 2 → -2 takes one off.
	rr, err := b.s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{IDs: []bson.ObjectID{first}}, By: "test"})
	require.NoError(t, err)
	require.EqualValues(t, 1, rr.Requeued)
	b.requireCounters(t, "retry 2 → -2", q, store.QueueCounts{Todo: 2, Total: 4, Failed: 2})

	// 2 however stored is failed; "2" is not (nor to do).
	two, err := bson.ParseDecimal128("2")
	require.NoError(t, err)
	i32, dbl, dec, str := b.insert(t, q, int32(2)), b.insert(t, q, 2.0), b.insert(t, q, two), b.insert(t, q, "2")
	b.requireCounters(t, `inserts at 2, 2.0, decimal 2 and "2"`, q, store.QueueCounts{Todo: 2, Total: 8, Failed: 5})

	_, err = b.db.Collection("tasks").DeleteOne(ctx, bson.D{{Key: "_id", Value: i32}})
	require.NoError(t, err)
	b.requireCounters(t, "delete of a failed task", q, store.QueueCounts{Todo: 2, Total: 7, Failed: 4})

	b.update(t, dbl, set("queue", other))
	b.requireCounters(t, "a failed task moved out", q, store.QueueCounts{Todo: 2, Total: 6, Failed: 3})
	b.requireCounters(t, "a failed task moved in", other, store.QueueCounts{Todo: 0, Total: 1, Failed: 1})

	b.update(t, dbl, set("queue", q, "status", int32(-2)))
	b.requireCounters(t, "moved back and requeued at once: failed leaves other", other, store.QueueCounts{})
	b.requireCounters(t, "moved back and requeued at once: not failed in q", q, store.QueueCounts{Todo: 3, Total: 7, Failed: 3})

	b.update(t, dec, set("status", int32(1)))
	b.requireCounters(t, "2 → 1", q, store.QueueCounts{Todo: 3, Total: 7, Failed: 2})

	_, err = b.db.Collection("tasks").ReplaceOne(ctx, bson.D{{Key: "_id", Value: str}}, bson.D{{Key: "queue", Value: q}, {Key: "status", Value: int32(2)}})
	require.NoError(t, err)
	b.requireCounters(t, `"2" replaced by a failed task`, q, store.QueueCounts{Todo: 3, Total: 7, Failed: 3})

	b.update(t, third.ID, bson.D{{Key: "$unset", Value: bson.D{{Key: "status", Value: ""}}}})
	b.requireCounters(t, "status removed: to do, not failed", q, store.QueueCounts{Todo: 4, Total: 7, Failed: 2})

	_, err = b.db.Collection("tasks").DeleteMany(ctx, bson.D{{Key: "queue", Value: q}, {Key: "status", Value: 2}})
	require.NoError(t, err)
	b.requireCounters(t, "deleteMany of the failed", q, store.QueueCounts{Todo: 4, Total: 5, Failed: 0})

	require.Zero(t, svc.Stats().DriftQueues)
	require.NotContains(t, b.logs.String(), "counter drift")
	requireExact(t, b.s, 10*time.Second)
}

// TestQueueWithoutCountFailedGetsIt: queues from before count_failed (the
// other three counters there, exact) get it by a recount, both when the
// projector starts and when a transition finds it missing; that is not
// drift.
func TestQueueWithoutCountFailedGetsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newRunningSetup(t)
	// An older database: exact count_todo, count_total and count_running,
	// no count_failed.
	old := bson.NewObjectID()
	_, err := b.db.Collection("queues").InsertOne(ctx, bson.D{{Key: "_id", Value: old}, {Key: "name", Value: "old"}, {Key: "constructor", Value: "noop"},
		{Key: "maxthreads", Value: 0}, {Key: "count_todo", Value: 2}, {Key: "count_total", Value: 5}, {Key: "count_running", Value: 1}})
	require.NoError(t, err)
	oldIDs := insertBurst(t, b.db, old, 0, 5, func(i int) any { return []any{int32(-1), int32(-2), int32(2), 2.0, int32(1)}[i] })
	later := newQueue(t, b.db, "later", 0, true)
	laterIDs := insertBurst(t, b.db, later, 0, 2, func(int) any { return int32(-2) })

	svc := b.start(t)
	b.requireCounters(t, "created on start-up", old, store.QueueCounts{Todo: 2, Total: 5, Running: 1, Failed: 2})
	b.requireCounters(t, "a complete queue", later, store.QueueCounts{Todo: 2, Total: 2})
	require.Contains(t, b.logs.String(), `msg="queue counters created by a recount" component=projector queue=`+old.Hex()+` count_todo=2 count_total=5 count_running=1 count_failed=2`+"\n")

	// Later, count_failed disappears (an older program rewrote it away)
	// while the projector runs: the next transition's delta finds it
	// missing and the queue is recounted instead (an $inc would make it 1).
	// Once the start-up recount and the one on catching up with the stream
	// are done.
	require.Eventually(t, func() bool { return svc.Stats().Reconciles == 2 }, 10*time.Second, 10*time.Millisecond)
	b.update(t, laterIDs[0].(bson.ObjectID), set("status", int32(2)))
	b.requireCounters(t, "one failed", later, store.QueueCounts{Todo: 1, Total: 2, Failed: 1})
	_, err = b.db.Collection("queues").UpdateOne(ctx, bson.D{{Key: "_id", Value: later}}, bson.D{{Key: "$unset", Value: bson.D{{Key: "count_failed", Value: ""}}}})
	require.NoError(t, err)
	b.update(t, laterIDs[1].(bson.ObjectID), set("status", int32(2)))
	b.requireCounters(t, "recounted when a delta found it missing", later, store.QueueCounts{Todo: 0, Total: 2, Failed: 2})
	require.Eventually(t, func() bool { return svc.Stats().Reconciles == 3 }, 10*time.Second, 10*time.Millisecond, "one recount of the queue found missing")
	require.Contains(t, b.logs.String(), `msg="queue counters created by a recount" component=projector queue=`+later.Hex()+` count_todo=0 count_total=2 count_running=0 count_failed=2`+"\n")
	b.update(t, laterIDs[0].(bson.ObjectID), set("status", int32(-2)))
	b.requireCounters(t, "then followed again", later, store.QueueCounts{Todo: 1, Total: 2, Failed: 1})

	// The old queue follows from its created count_failed.
	b.update(t, oldIDs[3].(bson.ObjectID), set("status", int32(-2)))
	b.requireCounters(t, "a retry in the old queue", old, store.QueueCounts{Todo: 3, Total: 5, Running: 1, Failed: 1})

	require.Zero(t, svc.Stats().DriftQueues)
	require.NotContains(t, b.logs.String(), "counter drift")
}
