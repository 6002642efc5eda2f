package storetest

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// priorityTasks fills a queue sorted by priority and returns its ids in
// the order claims must take them: the highest priority first, then the
// oldest; the tasks without a priority last, oldest first. One task is
// written as Disbatch 4.103 writes tasks (params, node null), with a
// priority set by hand.
func priorityTasks(t *testing.T, s *store.Store, db *mongo.Database, name string) (schema.Queue, []bson.ObjectID) {
	t.Helper()
	ctx := ctxT(t)
	q := newQueue(t, s, name, schema.SortPriority)
	insert := func(priority int64) bson.ObjectID {
		ids, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil},
			Control: &store.TaskInsertControl{Priority: priority}})
		require.NoError(t, err)
		return ids[0]
	}
	a := insert(0)
	b := insert(5)
	c := insert(1)
	d := insert(0)
	e := insert(5)
	res, err := db.Collection("tasks").InsertOne(ctx, bson.D{{Key: "queue", Value: q.ID}, {Key: "status", Value: -2}, {Key: "node", Value: nil},
		{Key: "params", Value: bson.D{}}, {Key: "ctime", Value: time.Now()}, {Key: "mtime", Value: time.Now()}, {Key: "stdout", Value: nil}, {Key: "stderr", Value: nil},
		{Key: "priority", Value: 3.0}})
	require.NoError(t, err)
	f := res.InsertedID.(bson.ObjectID)
	return q, []bson.ObjectID{b, e, f, c, a, d}
}

// claimedIDs are the ids of the tasks a batched claim won, in its order.
func claimedIDs(res store.TaskClaimManyResult) []bson.ObjectID {
	var got []bson.ObjectID
	for _, task := range res.Tasks {
		got = append(got, task.ID)
	}
	return got
}

func testTaskClaimPriority(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)

	t.Run("one at a time", func(t *testing.T) {
		q, want := priorityTasks(t, s, db, "single")
		var got []bson.ObjectID
		for range want {
			task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortPriority})
			require.NoError(t, err)
			got = append(got, task.ID)
		}
		require.Equal(t, want, got)
		_, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortPriority})
		require.ErrorIs(t, err, store.ErrNoTask)
	})

	t.Run("batches cross from the prioritised to the rest", func(t *testing.T) {
		q, want := priorityTasks(t, s, db, "many")
		first, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortPriority, Limit: 5})
		require.NoError(t, err)
		require.Equal(t, want[:5], claimedIDs(first), "in claim order")
		rest, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortPriority, Limit: 5})
		require.NoError(t, err)
		require.Equal(t, want[5:], claimedIDs(rest))
	})

	t.Run("capped", func(t *testing.T) {
		q, want := priorityTasks(t, s, db, "capped")
		res, err := s.TaskClaimCapped(ctx, store.TaskClaimCappedParams{Queue: q.ID, Node: "n1", Sort: schema.SortPriority, Limit: 5, Max: 4})
		require.NoError(t, err)
		require.Equal(t, want[:4], claimedIDs(res), "the cap takes the best four")
	})

	t.Run("stored only when set, and read back", func(t *testing.T) {
		q, want := priorityTasks(t, s, db, "stored")
		_, has := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: want[4]}}).LookupErr("priority")
		require.Error(t, has, "priority 0 is not written")
		require.Equal(t, int64(5), rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: want[0]}}).Lookup("priority").Int64())
		task, err := s.TaskGet(ctx, want[0])
		require.NoError(t, err)
		require.Equal(t, int64(5), task.Control.Priority)
		task, err = s.TaskGet(ctx, want[2])
		require.NoError(t, err)
		require.Equal(t, int64(3), task.Control.Priority, "a double from another writer")
		require.Equal(t, q.ID, task.Queue)
	})

	t.Run("out of range is refused, nothing inserted", func(t *testing.T) {
		q := newQueue(t, s, "range", schema.SortPriority)
		for _, p := range []int64{-1, math.MaxInt32 + 1} {
			_, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil},
				Control: &store.TaskInsertControl{Priority: p}})
			require.ErrorContains(t, err, "priority must be from 0 to 2147483647")
		}
		require.Zero(t, countWith(t, db, bson.D{{Key: "queue", Value: q.ID}}))
	})

	t.Run("per-task priorities in one insert", func(t *testing.T) {
		q := newQueue(t, s, "own", schema.SortPriority)
		ids, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil, nil, nil},
			Control: &store.TaskInsertControl{Priority: 9, Timeout: time.Minute}, Priorities: []int64{2, 0, 7}})
		require.NoError(t, err)
		res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortPriority, Limit: 3})
		require.NoError(t, err)
		require.Equal(t, []bson.ObjectID{ids[2], ids[0], ids[1]}, claimedIDs(res), "each task's own priority, not the control's")
		require.Equal(t, time.Minute, res.Tasks[0].Control.Timeout, "the rest of the control still applies")

		for _, pr := range [][]int64{{1, -1}, {1}} {
			_, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil, nil}, Priorities: pr})
			require.Error(t, err, "%v", pr)
		}
		require.Equal(t, int64(3), countWith(t, db, bson.D{{Key: "queue", Value: q.ID}}), "nothing more inserted")
	})

	t.Run("the prioritised phase reads its partial index", func(t *testing.T) {
		require.NoError(t, s.IndexesEnsure(ctx))
		q, _ := priorityTasks(t, s, db, "explain")
		var plan bson.Raw
		require.NoError(t, db.RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{
			{Key: "findAndModify", Value: "tasks"},
			{Key: "query", Value: bson.D{{Key: "node", Value: bson.D{{Key: "$in", Value: bson.A{-1, nil}}}}, {Key: "status", Value: -2}, {Key: "queue", Value: q.ID},
				{Key: "priority", Value: bson.D{{Key: "$exists", Value: true}}}}},
			{Key: "sort", Value: bson.D{{Key: "priority", Value: -1}, {Key: "_id", Value: 1}}},
			{Key: "update", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -1}}}}},
		}}}).Decode(&plan))
		winning := plan.Lookup("queryPlanner", "winningPlan").String()
		require.Contains(t, winning, "queue_1_priority_-1__id_1")
		require.NotContains(t, winning, "SORT", "the index gives the order")
		require.NotContains(t, winning, "COLLSCAN")
	})
}
