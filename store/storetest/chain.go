package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func outputValue(t *testing.T, v any) bson.RawValue {
	t.Helper()
	raw, err := bson.Marshal(bson.D{{Key: "v", Value: v}})
	require.NoError(t, err)
	return bson.Raw(raw).Lookup("v")
}

// testThenCreateExactlyOnce: a succeeded task's output becomes tasks of the
// then queue once, however often ThenCreate runs (also when the mark was
// put back, as a finish retried after a lost answer would leave it); a
// then naming no queue is refused; a bad output is recorded, not retried.
func testThenCreateExactlyOnce(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	src := newQueue(t, s, "src", schema.SortFIFO)
	dst := newQueue(t, s, "dst", schema.SortFIFO)
	require.ErrorIs(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: src.ID, Then: ptr("missing")}), store.ErrNotFound)
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: src.ID, Then: ptr("dst")}))

	finish := func(output bson.RawValue) bson.ObjectID {
		id := insertTasks(t, s, src.ID, 1)[0]
		task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: src.ID, Node: "n1"})
		require.NoError(t, err)
		require.Equal(t, id, task.ID)
		require.NoError(t, s.TaskStart(ctx, store.TaskTransitionParams{ID: id, Node: "n1"}))
		require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusSucceeded, Output: output, Then: "dst"}))
		return id
	}
	id := finish(outputValue(t, bson.A{bson.D{{Key: "n", Value: 1}}, bson.D{{Key: "n", Value: 2}}}))
	require.Equal(t, "dst", rawDoc(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: id}}).Lookup(schema.TaskThenPending).StringValue())
	r, err := s.ThenCreate(ctx, id)
	require.NoError(t, err)
	require.Equal(t, store.ThenResult{Created: 2}, r)
	r, err = s.ThenCreate(ctx, id)
	require.NoError(t, err)
	require.Equal(t, store.ThenResult{}, r, "the mark is gone: nothing to do")
	// The mark back, as if its removal was lost: the same tasks, not new ones.
	_, err = db.Collection(schema.CollTasks).UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskThenPending, Value: "dst"}}}})
	require.NoError(t, err)
	r, err = s.ThenCreate(ctx, id)
	require.NoError(t, err)
	require.Equal(t, store.ThenResult{Existed: 2}, r)
	require.Equal(t, int64(2), countWith(t, db, bson.D{{Key: schema.TaskQueue, Value: dst.ID}}))
	child := rawDoc(t, db, schema.CollTasks, bson.D{{Key: schema.TaskQueue, Value: dst.ID}, {Key: "parameters.n", Value: 2}})
	require.Equal(t, id, child.Lookup(schema.TaskChainedFrom).ObjectID())
	require.Equal(t, int32(-2), child.Lookup("status").Int32())

	// One object: one task. A list with a non-object: recorded, no task.
	id = finish(outputValue(t, bson.D{{Key: "n", Value: 3}}))
	r, err = s.ThenCreate(ctx, id)
	require.NoError(t, err)
	require.Equal(t, 1, r.Created)
	id = finish(outputValue(t, bson.A{bson.D{}, "x"}))
	r, err = s.ThenCreate(ctx, id)
	require.NoError(t, err)
	require.NotEmpty(t, r.Problem)
	require.NotEmpty(t, rawDoc(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: id}}).Lookup("then_error").StringValue())
	require.Equal(t, int64(3), countWith(t, db, bson.D{{Key: schema.TaskQueue, Value: dst.ID}}))
	pending, err := s.ThenPending(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, pending)

	// A failed task writes no output and no mark.
	fid := insertTasks(t, s, src.ID, 1)[0]
	_, err = s.TaskClaim(ctx, store.TaskClaimParams{Queue: src.ID, Node: "n1"})
	require.NoError(t, err)
	require.NoError(t, s.TaskStart(ctx, store.TaskTransitionParams{ID: fid, Node: "n1"}))
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: fid, Node: "n1", Status: schema.StatusFailed, Output: outputValue(t, bson.D{}), Then: "dst"}))
	doc := rawDoc(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: fid}})
	_, err = doc.LookupErr(schema.TaskThenPending)
	require.Error(t, err)
	_, err = doc.LookupErr(schema.TaskOutput)
	require.Error(t, err)
}

// testThenFollowsItsQueue: a then queue renamed (either dialect) is
// followed by the queues whose then names it and by the outputs still to
// become its tasks; deleting it is refused while a then names it. A retry
// of a task whose output is still pending makes it tasks first, and a
// later resolve makes none twice (the chained ids do not move with the
// task's mtime).
func testThenFollowsItsQueue(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	src := newQueue(t, s, "src", schema.SortFIFO)
	dst := newQueue(t, s, "dst", schema.SortFIFO)
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: src.ID, Then: ptr("dst")}))
	finish := func(then string, n int) bson.ObjectID {
		t.Helper()
		id := insertTasks(t, s, src.ID, 1)[0]
		task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: src.ID, Node: "n1"})
		require.NoError(t, err)
		require.Equal(t, id, task.ID)
		require.NoError(t, s.TaskStart(ctx, store.TaskTransitionParams{ID: id, Node: "n1"}))
		require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusSucceeded,
			Output: outputValue(t, bson.D{{Key: "n", Value: n}}), Then: then}))
		return id
	}
	thenOf := func(q bson.ObjectID) string {
		t.Helper()
		got, err := s.QueueGet(ctx, store.QueueGetParams{Ref: q.Hex()})
		require.NoError(t, err)
		return got.Sched.Then
	}
	inDst := func() int64 { t.Helper(); return countWith(t, db, bson.D{{Key: schema.TaskQueue, Value: dst.ID}}) }

	pending := finish("dst", 1)
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: dst.ID, Name: ptr("dst2")}))
	require.Equal(t, "dst2", thenOf(src.ID))
	r, err := s.ThenCreate(ctx, pending)
	require.NoError(t, err)
	require.Equal(t, store.ThenResult{Created: 1}, r, "the pending output went to the renamed queue")
	pending = finish("dst2", 2)
	_, err = s.QueueSet(ctx, store.QueueSetParams{Ref: "dst2", Name: ptr("dst3")})
	require.NoError(t, err)
	require.Equal(t, "dst3", thenOf(src.ID), "4.103's rename too")
	r, err = s.ThenCreate(ctx, pending)
	require.NoError(t, err)
	require.Equal(t, store.ThenResult{Created: 1}, r)
	require.Equal(t, int64(2), inDst())

	// A task that ran across the rename: its node read the old then.
	pending = finish("dst3", 21)
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: dst.ID, Name: ptr("dst4")}))
	_, err = db.Collection(schema.CollTasks).UpdateOne(ctx, bson.D{{Key: "_id", Value: pending}}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskThenPending, Value: "dst3"}}}})
	require.NoError(t, err)
	r, err = s.ThenCreate(ctx, pending)
	require.NoError(t, err)
	require.Equal(t, store.ThenResult{Created: 1}, r, "to the queue its queue's then names now")
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: dst.ID, Name: ptr("dst3")}))
	require.Equal(t, int64(3), inDst())

	_, err = s.QueueDelete(ctx, store.QueueDeleteParams{ID: dst.ID, Force: true})
	require.ErrorIs(t, err, store.ErrThenQueue)
	require.ErrorContains(t, err, `queue "dst3" is the then queue of "src"`)

	// A pending output, then its task retried: made tasks first.
	pending = finish("dst3", 3)
	res, err := s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{IDs: []bson.ObjectID{pending}}, By: "op"})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Requeued)
	require.Equal(t, int64(4), inDst())
	_, err = db.Collection(schema.CollTasks).UpdateOne(ctx, bson.D{{Key: "_id", Value: pending}},
		bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskThenPending, Value: "dst3"}, {Key: schema.TaskMTime, Value: time.Now().Add(time.Hour)}}}})
	require.NoError(t, err)
	r, err = s.ThenCreate(ctx, pending)
	require.NoError(t, err)
	require.Equal(t, store.ThenResult{Existed: 1}, r, "the mark back, its mtime moved (a claim): the same task, not a new one")
	require.Equal(t, int64(4), inDst())

	// Its queue's then cleared, the queue may go.
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: src.ID, Then: ptr("")}))
	_, err = s.QueueDelete(ctx, store.QueueDeleteParams{ID: dst.ID, Force: true})
	require.NoError(t, err)
}
