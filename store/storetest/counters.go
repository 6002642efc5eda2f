package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// testCountFailed: a recount (QueueRecount, QueueCountsGet) counts the
// tasks in 2 through the store's transitions and a raw driver's writes;
// CountersApply sets count_failed and adds a Failed delta, and leaves a
// queue from before count_failed (the other three counters there) alone,
// naming it for the recount whose Sets create it.
func testCountFailed(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q, other := newQueue(t, s, "q", schema.SortFIFO), newQueue(t, s, "other", schema.SortFIFO)
	recount := func(step string, wantQ, wantOther store.QueueCounts) store.Recount {
		t.Helper()
		rc, err := s.QueueRecount(ctx, nil)
		require.NoError(t, err)
		require.Equal(t, map[bson.ObjectID]store.QueueCounts{q.ID: wantQ, other.ID: wantOther}, rc.Counts, step)
		counts, err := s.QueueCountsGet(ctx)
		require.NoError(t, err)
		require.Equal(t, wantQ, counts[q.ID], step)
		require.Equal(t, wantOther, counts[other.ID], step)
		return rc
	}

	ids := insertTasks(t, s, q.ID, 4)
	recount("inserted", store.QueueCounts{Todo: 4, Total: 4}, store.QueueCounts{})
	first := running(t, s, q.ID)
	require.Equal(t, ids[0], first)
	recount("running", store.QueueCounts{Todo: 4, Total: 4, Running: 1}, store.QueueCounts{})
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: first, Node: "n1", Status: schema.StatusFailed, Stderr: "boom"}))
	recount("finished as failed", store.QueueCounts{Todo: 3, Total: 4, Failed: 1}, store.QueueCounts{})

	// A failed attempt sent back for a retry is not failed.
	second := running(t, s, q.ID)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: second, Node: "n1", Status: schema.StatusFailed,
		Retry: &store.TaskRetryAt{NotBefore: time.Now().Add(-time.Second), Tries: 1}}))
	recount("a failed attempt retried", store.QueueCounts{Todo: 3, Total: 4, Failed: 1}, store.QueueCounts{})

	// Failed for any reason: a cancel too.
	res, err := s.TaskCancel(ctx, store.TaskCancelParams{Target: store.TaskTarget{IDs: []bson.ObjectID{ids[3]}}, By: "op"})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Cancelled)
	recount("cancelled", store.QueueCounts{Todo: 2, Total: 4, Failed: 2}, store.QueueCounts{})

	rr, err := s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{IDs: []bson.ObjectID{first}}, By: "op"})
	require.NoError(t, err)
	require.EqualValues(t, 1, rr.Requeued)
	recount("retry 2 → -2", store.QueueCounts{Todo: 3, Total: 4, Failed: 1}, store.QueueCounts{})

	// 2 however stored counts; "2" does not.
	two, err := bson.ParseDecimal128("2")
	require.NoError(t, err)
	dbl := bson.NewObjectID()
	_, err = db.Collection(schema.CollTasks).InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: dbl}, {Key: "queue", Value: q.ID}, {Key: "status", Value: 2.0}},
		bson.D{{Key: "queue", Value: q.ID}, {Key: "status", Value: two}},
		bson.D{{Key: "queue", Value: q.ID}, {Key: "status", Value: "2"}},
	})
	require.NoError(t, err)
	recount("inserted at 2.0, decimal 2 and \"2\"", store.QueueCounts{Todo: 3, Total: 7, Failed: 3}, store.QueueCounts{})

	_, err = db.Collection(schema.CollTasks).DeleteOne(ctx, bson.D{{Key: "_id", Value: dbl}})
	require.NoError(t, err)
	recount("a failed task deleted", store.QueueCounts{Todo: 3, Total: 6, Failed: 2}, store.QueueCounts{})

	set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: ids[3]}}, bson.D{{Key: schema.TaskQueue, Value: other.ID}})
	rc := recount("a failed task moved", store.QueueCounts{Todo: 3, Total: 5, Failed: 1}, store.QueueCounts{Total: 1, Failed: 1})

	// The projector's writes: sets from the recount, then deltas.
	l, err := s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "projector", Owner: "a", TTL: time.Minute})
	require.NoError(t, err)
	ref := store.LeaseRef{Name: "projector", Owner: "a", Epoch: l.Epoch}
	_, err = s.CountersApply(ctx, store.CountersApplyParams{Lease: ref, Sets: rc.Counts, CheckpointTime: rc.At})
	require.NoError(t, err)
	stored := func(id bson.ObjectID) store.StoredCounters {
		t.Helper()
		all, err := s.QueueCounters(ctx)
		require.NoError(t, err)
		return all[id]
	}
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](3), Total: ptr[int64](5), Running: ptr[int64](0), Failed: ptr[int64](1)}, stored(q.ID))
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](0), Total: ptr[int64](1), Running: ptr[int64](0), Failed: ptr[int64](1)}, stored(other.ID))
	missing, err := s.CountersApply(ctx, store.CountersApplyParams{Lease: ref, Deltas: []store.CounterDelta{
		{Queue: q.ID, Todo: -1, Failed: 1},     // a finish as failed
		{Queue: other.ID, Todo: 1, Failed: -1}, // a retry
	}})
	require.NoError(t, err)
	require.Empty(t, missing)
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](2), Total: ptr[int64](5), Running: ptr[int64](0), Failed: ptr[int64](2)}, stored(q.ID))
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](1), Total: ptr[int64](1), Running: ptr[int64](0), Failed: ptr[int64](0)}, stored(other.ID))
	got, err := s.QueueGet(ctx, store.QueueGetParams{Ref: "q"})
	require.NoError(t, err)
	require.Equal(t, ptr[int64](2), got.CountFailed)

	// A queue from before count_failed: a delta for it is not applied (an
	// $inc would create count_failed from nothing) and names it; the
	// recount's set creates it.
	old := bson.NewObjectID()
	_, err = db.Collection(schema.CollQueues).InsertOne(ctx, bson.D{{Key: "_id", Value: old}, {Key: "name", Value: "old"}, {Key: "constructor", Value: "C"},
		{Key: schema.QueueCountTodo, Value: 1}, {Key: schema.QueueCountTotal, Value: 2}, {Key: schema.QueueCountRunning, Value: 0}})
	require.NoError(t, err)
	_, err = db.Collection(schema.CollTasks).InsertMany(ctx, []any{
		bson.D{{Key: "queue", Value: old}, {Key: "status", Value: int32(-2)}},
		bson.D{{Key: "queue", Value: old}, {Key: "status", Value: int32(2)}},
		bson.D{{Key: "queue", Value: old}, {Key: "status", Value: int32(2)}},
	})
	require.NoError(t, err)
	oldStored := stored(old)
	require.False(t, oldStored.Complete())
	require.Nil(t, oldStored.Failed)
	missing, err = s.CountersApply(ctx, store.CountersApplyParams{Lease: ref, Deltas: []store.CounterDelta{{Queue: old, Total: 1, Failed: 1}}})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{old}, missing)
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](1), Total: ptr[int64](2), Running: ptr[int64](0)}, stored(old), "not applied")
	_, present := rawDoc(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: old}}).LookupErr(schema.QueueCountFailed)
	require.Error(t, present, "no count_failed from an $inc")

	rc, err = s.QueueRecount(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, store.QueueCounts{Todo: 1, Total: 3, Failed: 2}, rc.Counts[old])
	_, err = s.CountersApply(ctx, store.CountersApplyParams{Lease: ref, Sets: map[bson.ObjectID]store.QueueCounts{old: rc.Counts[old]}, CheckpointTime: rc.At})
	require.NoError(t, err)
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](1), Total: ptr[int64](3), Running: ptr[int64](0), Failed: ptr[int64](2)}, stored(old), "created by the recount")
	missing, err = s.CountersApply(ctx, store.CountersApplyParams{Lease: ref, Deltas: []store.CounterDelta{{Queue: old, Todo: 1, Failed: -1}}})
	require.NoError(t, err)
	require.Empty(t, missing)
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](2), Total: ptr[int64](3), Running: ptr[int64](0), Failed: ptr[int64](1)}, stored(old), "then followed")

	// A null count_failed is missing too.
	set(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: old}}, bson.D{{Key: schema.QueueCountFailed, Value: nil}})
	missing, err = s.CountersApply(ctx, store.CountersApplyParams{Lease: ref, Deltas: []store.CounterDelta{{Queue: old, Failed: 1}}})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{old}, missing)
	require.False(t, stored(old).Complete())
}
