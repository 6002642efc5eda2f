package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// testCountFailed: a recount (QueueRecount, QueueCountsGet) counts the
// tasks in 2 through the store's transitions and a raw driver's writes;
// CountersSet sets count_failed and CountersAdvance adds a Failed delta,
// and leaves a queue from before count_failed (the other three counters
// there) alone, naming it for the recount whose set creates it.
func testCountFailed(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q, other := newQueue(t, s, "q", schema.SortFIFO), newQueue(t, s, "other", schema.SortFIFO)
	recount := func(step string, wantQ, wantOther store.QueueCounts) store.Recount {
		t.Helper()
		rc, err := s.QueueRecount(ctx, store.QueueRecountParams{})
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
		Retry: &store.TaskRetryAt{Tries: 1}}))
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
	require.NoError(t, s.CountersSet(ctx, store.CountersSetParams{Lease: ref, Sets: rc.Counts, CheckpointTime: rc.At}))
	all, err := s.QueueCounters(ctx)
	require.NoError(t, err)
	require.Equal(t, &store.CounterPosition{Time: rc.At}, all[q.ID].Applied, "a set queue's counters count every event up to the recount")
	// A queue given a position of its own gets it; the others the
	// recount's moment.
	own := store.CounterPosition{Time: bson.Timestamp{T: rc.At.T + 1}, Token: "82ABC"}
	require.NoError(t, s.CountersSet(ctx, store.CountersSetParams{Lease: ref, Sets: rc.Counts, CheckpointTime: rc.At,
		Positions: map[bson.ObjectID]store.CounterPosition{other.ID: own}}))
	all, err = s.QueueCounters(ctx)
	require.NoError(t, err)
	require.Equal(t, &store.CounterPosition{Time: rc.At}, all[q.ID].Applied)
	require.Equal(t, &own, all[other.ID].Applied, "the position given")
	require.NoError(t, s.CountersSet(ctx, store.CountersSetParams{Lease: ref, Sets: rc.Counts, CheckpointTime: rc.At}))
	stored := func(id bson.ObjectID) store.StoredCounters {
		t.Helper()
		all, err := s.QueueCounters(ctx)
		require.NoError(t, err)
		c := all[id]
		c.Applied = nil // the counts are what this test follows
		return c
	}
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](3), Total: ptr[int64](5), Running: ptr[int64](0), Failed: ptr[int64](1)}, stored(q.ID))
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](0), Total: ptr[int64](1), Running: ptr[int64](0), Failed: ptr[int64](1)}, stored(other.ID))
	// Each batch moves the queues it adds to on to a position of its own.
	setAt := &store.CounterPosition{Time: rc.At}
	next := rc.At
	advance := func(from *store.CounterPosition, deltas ...store.CounterDelta) (store.CountersAdvanced, *store.CounterPosition) {
		t.Helper()
		next.I++
		to := store.CounterPosition{Time: next}
		adv := make([]store.CounterAdvance, len(deltas))
		for i, d := range deltas {
			adv[i] = store.CounterAdvance{Delta: d, From: from}
		}
		res, err := s.CountersAdvance(ctx, to, adv)
		require.NoError(t, err)
		require.Empty(t, res.Moved)
		return res, &to
	}
	ar, _ := advance(setAt,
		store.CounterDelta{Queue: q.ID, Todo: -1, Failed: 1},     // a finish as failed
		store.CounterDelta{Queue: other.ID, Todo: 1, Failed: -1}, // a retry
	)
	require.Empty(t, ar.Missing)
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
	ar, _ = advance(nil, store.CounterDelta{Queue: old, Total: 1, Failed: 1})
	require.Equal(t, []bson.ObjectID{old}, ar.Missing)
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](1), Total: ptr[int64](2), Running: ptr[int64](0)}, stored(old), "not applied")
	_, present := rawDoc(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: old}}).LookupErr(schema.QueueCountFailed)
	require.Error(t, present, "no count_failed from an $inc")

	rc, err = s.QueueRecount(ctx, store.QueueRecountParams{})
	require.NoError(t, err)
	require.Equal(t, store.QueueCounts{Todo: 1, Total: 3, Failed: 2}, rc.Counts[old])
	require.NoError(t, s.CountersSet(ctx, store.CountersSetParams{Lease: ref, Sets: map[bson.ObjectID]store.QueueCounts{old: rc.Counts[old]}, CheckpointTime: rc.At}))
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](1), Total: ptr[int64](3), Running: ptr[int64](0), Failed: ptr[int64](2)}, stored(old), "created by the recount")
	ar, pos := advance(&store.CounterPosition{Time: rc.At}, store.CounterDelta{Queue: old, Todo: 1, Failed: -1})
	require.Empty(t, ar.Missing)
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](2), Total: ptr[int64](3), Running: ptr[int64](0), Failed: ptr[int64](1)}, stored(old), "then followed")

	// A null count_failed is missing too.
	set(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: old}}, bson.D{{Key: schema.QueueCountFailed, Value: nil}})
	ar, _ = advance(pos, store.CounterDelta{Queue: old, Failed: 1})
	require.Equal(t, []bson.ObjectID{old}, ar.Missing)
	require.False(t, stored(old).Complete())
}

// testCountersAdvanceAsEachWould: CountersAdvance adds a batch's deltas
// to all its queues in one bulk write; each queue must end as an $inc of
// its own delta, under the same filter (every counter an int32 or int64),
// would leave it (the same values, types and field order), and the queues
// such an $inc would not touch (a counter missing, null, a string, a
// double or a decimal; no queue at all) are the ones returned as missing.
// A double counter left to an $inc would turn a count into a fraction
// that no recount equals.
func testCountersAdvanceAsEachWould(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	queues := db.Collection(schema.CollQueues)

	decimal, err := bson.ParseDecimal128("7")
	require.NoError(t, err)
	counters := func(todo, total, running, failed any) bson.D {
		d := bson.D{}
		for _, e := range []bson.E{{Key: schema.QueueCountTodo, Value: todo}, {Key: schema.QueueCountTotal, Value: total},
			{Key: schema.QueueCountRunning, Value: running}, {Key: schema.QueueCountFailed, Value: failed}} {
			if e.Value != "absent" {
				d = append(d, e)
			}
		}
		return d
	}
	// Each kind with deltas of its own (a delta applied to the wrong queue
	// shows); "not in the batch" (no delta) must be left alone.
	kinds := []struct {
		name    string
		fields  bson.D
		delta   store.CounterDelta
		missing bool
	}{
		{"not in the batch", counters(int32(5), int32(9), int32(1), int32(0)), store.CounterDelta{}, false},
		{"int32", counters(int32(5), int32(9), int32(1), int32(0)), store.CounterDelta{Todo: -1, Running: 1}, false},
		{"int64", counters(int64(5), int64(9), int64(1), int64(2)), store.CounterDelta{Todo: 2, Total: 2, Running: -1, Failed: 1}, false},
		{"mixed int32 and int64", counters(int32(5), int64(9), int64(1), int32(2)), store.CounterDelta{Todo: -2, Total: -1, Running: 1, Failed: -1}, false},
		{"whole doubles", counters(5.0, 9.0, 1.0, 0.0), store.CounterDelta{Todo: 3, Total: 3}, true},
		{"one decimal", counters(int32(5), decimal, int64(1), int32(2)), store.CounterDelta{Todo: -2, Total: -1, Running: 1, Failed: -1}, true},
		{"a double with a fraction", counters(int32(5), 9.5, int32(1), int32(0)), store.CounterDelta{Todo: -1, Total: 1}, true},
		{"int32 at its top", counters(int32(2147483647), int32(9), int32(1), int32(0)), store.CounterDelta{Todo: 1}, false},
		{"fields after the counters", append(counters(int32(1), int32(1), int32(0), int32(0)), bson.E{Key: "zz", Value: "after"}), store.CounterDelta{Todo: -1, Total: 4, Running: 1}, false},
		{"no count_failed", counters(int32(5), int32(9), int32(1), "absent"), store.CounterDelta{Todo: -1, Running: 2}, true},
		{"a null counter", counters(int32(5), nil, int32(1), int32(0)), store.CounterDelta{Todo: -3}, true},
		{"a string counter", counters(int32(5), int32(9), "1", int32(0)), store.CounterDelta{Total: 5}, true},
	}
	// Each kind twice: one queue for the batch, one for a lone $inc.
	batch, alone := make([]bson.ObjectID, len(kinds)), make([]bson.ObjectID, len(kinds))
	var adv []store.CounterAdvance
	var wantMissing []bson.ObjectID
	for i, k := range kinds {
		for _, id := range []*bson.ObjectID{&batch[i], &alone[i]} {
			*id = bson.NewObjectID()
			doc := append(bson.D{{Key: "_id", Value: *id}, {Key: "name", Value: id.Hex()}, {Key: "constructor", Value: "C"}}, k.fields...)
			_, err := queues.InsertOne(ctx, doc)
			require.NoError(t, err, k.name)
		}
		d := k.delta
		d.Queue = batch[i]
		if k.delta != (store.CounterDelta{}) {
			adv = append(adv, store.CounterAdvance{Delta: d})
		}
		if k.missing {
			wantMissing = append(wantMissing, batch[i])
		}
	}
	gone := bson.NewObjectID() // a queue deleted since its tasks' events
	adv = append(adv, store.CounterAdvance{Delta: store.CounterDelta{Queue: gone, Todo: -1, Total: -1}})
	wantMissing = append(wantMissing, gone)
	rand.Shuffle(len(adv), func(i, j int) { adv[i], adv[j] = adv[j], adv[i] })

	res, err := s.CountersAdvance(ctx, store.CounterPosition{Time: bson.Timestamp{T: 1, I: 1}, Token: "82"}, adv)
	require.NoError(t, err)
	require.ElementsMatch(t, wantMissing, res.Missing)
	require.Empty(t, res.Moved)

	integer := bson.D{{Key: "$type", Value: bson.A{"int", "long"}}}
	for i, k := range kinds {
		d := k.delta
		if d != (store.CounterDelta{}) {
			_, err := queues.UpdateOne(ctx, bson.D{{Key: "_id", Value: alone[i]}, {Key: schema.QueueCountTodo, Value: integer},
				{Key: schema.QueueCountTotal, Value: integer}, {Key: schema.QueueCountRunning, Value: integer}, {Key: schema.QueueCountFailed, Value: integer}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: schema.QueueCountTodo, Value: d.Todo}, {Key: schema.QueueCountTotal, Value: d.Total},
					{Key: schema.QueueCountRunning, Value: d.Running}, {Key: schema.QueueCountFailed, Value: d.Failed}}}})
			require.NoError(t, err, k.name)
		}
		got, want := rawDoc(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: batch[i]}}), rawDoc(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: alone[i]}})
		require.Equal(t, strip(t, want), strip(t, got), "%s: the batch's update left what a lone $inc leaves", k.name)
	}
}

// strip returns a queue document without its _id, name and counts_applied
// (which only CountersAdvance writes), element by element with each
// value's BSON type, in order.
func strip(t *testing.T, raw bson.Raw) []string {
	t.Helper()
	els, err := raw.Elements()
	require.NoError(t, err)
	var out []string
	for _, e := range els {
		if k := e.Key(); k != "_id" && k != "name" && k != schema.QueueCountsApplied {
			out = append(out, k+" "+e.Value().Type.String()+" "+e.Value().String())
		}
	}
	return out
}

// testCountersAdvance: a batch's deltas are added to each queue whose
// position is still the one the batch was folded from, and move it to the
// batch's end, all at once; a queue another term moved is left and named
// with the position found, one at the batch's end already counts as
// applied, and one without counters, or gone, is named missing. The
// lease's checkpoint is written only while the lease is held.
func testCountersAdvance(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	queues := db.Collection(schema.CollQueues)
	counters := bson.D{{Key: schema.QueueCountTodo, Value: int32(5)}, {Key: schema.QueueCountTotal, Value: int32(9)}, {Key: schema.QueueCountRunning, Value: int32(1)},
		{Key: schema.QueueCountFailed, Value: int32(0)}}
	fresh, moved, already, noCounters, gone := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	for i, id := range []bson.ObjectID{fresh, moved, already} {
		_, err := queues.InsertOne(ctx, append(bson.D{{Key: "_id", Value: id}, {Key: "name", Value: fmt.Sprintf("adv%d", i)}}, counters...))
		require.NoError(t, err)
	}
	_, err := queues.InsertOne(ctx, bson.D{{Key: "_id", Value: noCounters}, {Key: "name", Value: "bare"}})
	require.NoError(t, err)
	stored := func(id bson.ObjectID) store.StoredCounters {
		t.Helper()
		all, err := s.QueueCounters(ctx)
		require.NoError(t, err)
		return all[id]
	}
	p1 := store.CounterPosition{Time: bson.Timestamp{T: 100, I: 1}, Token: "8200000064000000012B"}
	p2 := store.CounterPosition{Time: bson.Timestamp{T: 100, I: 2}, Token: "8200000064000000022B"}
	p3 := store.CounterPosition{Time: bson.Timestamp{T: 101, I: 1}, Token: "8200000065000000012B"}
	d := func(q bson.ObjectID) store.CounterDelta {
		return store.CounterDelta{Queue: q, Todo: -1, Total: 0, Running: 1, Failed: 0}
	}

	// The first batch: none of them has a position yet.
	res, err := s.CountersAdvance(ctx, p1, []store.CounterAdvance{{Delta: d(fresh)}, {Delta: d(moved)}, {Delta: d(already)}})
	require.NoError(t, err)
	require.Empty(t, res.Moved)
	require.Empty(t, res.Missing)
	for _, id := range []bson.ObjectID{fresh, moved, already} {
		require.Equal(t, store.StoredCounters{Todo: ptr[int64](4), Total: ptr[int64](9), Running: ptr[int64](2), Failed: ptr[int64](0), Applied: &p1}, stored(id))
	}
	// Another term moves two of them on (one to the very batch this term
	// applies next).
	res, err = s.CountersAdvance(ctx, p2, []store.CounterAdvance{{Delta: d(moved), From: &p1}})
	require.NoError(t, err)
	require.Empty(t, res.Moved)
	res, err = s.CountersAdvance(ctx, p3, []store.CounterAdvance{{Delta: d(already), From: &p1}})
	require.NoError(t, err)
	require.Empty(t, res.Moved)

	// This term's next batch, folded from p1 everywhere.
	res, err = s.CountersAdvance(ctx, p3, []store.CounterAdvance{{Delta: d(fresh), From: &p1}, {Delta: d(moved), From: &p1}, {Delta: d(already), From: &p1},
		{Delta: d(noCounters)}, {Delta: d(gone), From: &p1}})
	require.NoError(t, err)
	require.Equal(t, map[bson.ObjectID]*store.CounterPosition{moved: &p2}, res.Moved, "moved by another term: named with the position found")
	require.ElementsMatch(t, []bson.ObjectID{noCounters, gone}, res.Missing)
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](3), Total: ptr[int64](9), Running: ptr[int64](3), Failed: ptr[int64](0), Applied: &p3}, stored(fresh))
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](3), Total: ptr[int64](9), Running: ptr[int64](3), Failed: ptr[int64](0), Applied: &p2}, stored(moved), "not added again")
	require.Equal(t, store.StoredCounters{Todo: ptr[int64](3), Total: ptr[int64](9), Running: ptr[int64](3), Failed: ptr[int64](0), Applied: &p3}, stored(already), "at the batch's end already: applied once, not twice")
	_, present := rawDoc(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: noCounters}}).LookupErr(schema.QueueCountTodo)
	require.Error(t, present, "no counters from an $inc")

	// The checkpoint: the lease holder's, not a deposed one's.
	l, err := s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "projector", Owner: "a", TTL: time.Minute})
	require.NoError(t, err)
	ref := store.LeaseRef{Name: "projector", Owner: "a", Epoch: l.Epoch}
	token := bson.Raw(bsoncoreDoc(t, bson.D{{Key: "_data", Value: p3.Token}}))
	require.NoError(t, s.LeaseCheckpoint(ctx, ref, token, p3.Time))
	got, err := s.LeaseGet(ctx, "projector")
	require.NoError(t, err)
	require.Equal(t, token, got.Checkpoint)
	require.Equal(t, p3.Time, got.CheckpointTime)
	stale := ref
	stale.Epoch--
	require.ErrorIs(t, s.LeaseCheckpoint(ctx, stale, nil, p1.Time), store.ErrLeaseLost)
	got, err = s.LeaseGet(ctx, "projector")
	require.NoError(t, err)
	require.Equal(t, p3.Time, got.CheckpointTime, "a deposed term's checkpoint is not written")
}

func bsoncoreDoc(t *testing.T, d bson.D) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(d)
	require.NoError(t, err)
	return b
}

// testQueueRecountOfSomeQueues: a recount of some queues counts those that
// exist, with zeros for an empty one, and reads their tasks alone (the
// server's profiler says what the aggregation examined).
func testQueueRecountOfSomeQueues(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx))
	q1, q2, q3 := newQueue(t, s, "q1", schema.SortFIFO), newQueue(t, s, "q2", schema.SortFIFO), newQueue(t, s, "q3", schema.SortFIFO)
	insertTasks(t, s, q1.ID, 2)
	insertTasks(t, s, q2.ID, 50)
	require.NoError(t, db.RunCommand(ctx, bson.D{{Key: "profile", Value: 2}}).Err())
	t.Cleanup(func() { _ = db.RunCommand(context.Background(), bson.D{{Key: "profile", Value: 0}}).Err() })
	rc, err := s.QueueRecount(ctx, store.QueueRecountParams{Queues: []bson.ObjectID{q1.ID, q3.ID, bson.NewObjectID()}})
	require.NoError(t, err)
	require.Equal(t, map[bson.ObjectID]store.QueueCounts{q1.ID: {Todo: 2, Total: 2}, q3.ID: {}}, rc.Counts)
	require.NoError(t, db.RunCommand(ctx, bson.D{{Key: "profile", Value: 0}}).Err())

	var op struct {
		DocsExamined int64 `bson:"docsExamined"`
		KeysExamined int64 `bson:"keysExamined"`
	}
	require.NoError(t, db.Collection("system.profile").FindOne(ctx, bson.D{{Key: "ns", Value: db.Name() + ".tasks"}, {Key: "command.aggregate", Value: "tasks"}}).Decode(&op))
	require.LessOrEqual(t, op.DocsExamined, int64(2), "q1's tasks alone are read, not q2's 50")
	require.LessOrEqual(t, op.KeysExamined, int64(10), "through an index on queue")
}

// testQueueRecountReadsTheIndexAlone: a recount of every queue reads
// (queue, status) from the {queue, status} index, never the tasks
// themselves, which can be large (parameters, output) and which a
// collection scan would pull through the server's cache (the profiler
// says what the aggregation examined).
func testQueueRecountReadsTheIndexAlone(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx))
	q1, q2 := newQueue(t, s, "q1", schema.SortFIFO), newQueue(t, s, "q2", schema.SortFIFO)
	insertTasks(t, s, q1.ID, 3)
	insertTasks(t, s, q2.ID, 20)
	_, err := db.Collection("tasks").InsertOne(ctx, bson.D{{Key: "queue", Value: q1.ID}}) // no status: to do
	require.NoError(t, err)
	require.NoError(t, db.RunCommand(ctx, bson.D{{Key: "profile", Value: 2}}).Err())
	t.Cleanup(func() { _ = db.RunCommand(context.Background(), bson.D{{Key: "profile", Value: 0}}).Err() })
	rc, err := s.QueueRecount(ctx, store.QueueRecountParams{})
	require.NoError(t, err)
	require.Equal(t, map[bson.ObjectID]store.QueueCounts{q1.ID: {Todo: 4, Total: 4}, q2.ID: {Todo: 20, Total: 20}}, rc.Counts)
	require.NoError(t, db.RunCommand(ctx, bson.D{{Key: "profile", Value: 0}}).Err())

	var op struct {
		DocsExamined int64 `bson:"docsExamined"`
		KeysExamined int64 `bson:"keysExamined"`
	}
	require.NoError(t, db.Collection("system.profile").FindOne(ctx, bson.D{{Key: "ns", Value: db.Name() + ".tasks"}, {Key: "command.aggregate", Value: "tasks"}}).Decode(&op))
	require.Zero(t, op.DocsExamined, "no task read: the index covers the count")
	require.GreaterOrEqual(t, op.KeysExamined, int64(24), "every task's index entry")
}
