package storetest

import (
	"testing"

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
