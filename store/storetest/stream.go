package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// streamWait bounds the wait for an event that should come.
const streamWait = 15 * time.Second

var majority = options.Collection().SetWriteConcern(writeconcern.Majority())

// follower reads a StreamReader in the test's goroutine.
type follower struct {
	t   *testing.T
	r   *store.StreamReader
	buf []store.ChangeEvent // delivered, not yet looked at
}

func openStream(t *testing.T, s *store.Store, p store.StreamParams) *follower {
	t.Helper()
	if p.MaxAwait == 0 {
		p.MaxAwait = 100 * time.Millisecond
	}
	r, err := s.StreamOpen(ctxT(t), p)
	require.NoError(t, err)
	t.Cleanup(r.Close)
	return &follower{t: t, r: r}
}

// until reads events until one satisfies ok and returns it with the events
// before it.
func (f *follower) until(ok func(store.ChangeEvent) bool) (store.ChangeEvent, []store.ChangeEvent) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), streamWait)
	defer cancel()
	var before []store.ChangeEvent
	for {
		for len(f.buf) > 0 {
			ev := f.buf[0]
			f.buf = f.buf[1:]
			if ok(ev) {
				return ev, before
			}
			before = append(before, ev)
		}
		b, err := f.r.Next(ctx)
		require.NoError(f.t, err, "no matching event within %v; before it: %v", streamWait, describe(before))
		require.Empty(f.t, b.Lost, "position lost")
		f.buf = b.Events
	}
}

// next returns the next event, requiring that it is the one ok accepts.
func (f *follower) next(ok func(store.ChangeEvent) bool) store.ChangeEvent {
	f.t.Helper()
	ev, before := f.until(ok)
	require.Empty(f.t, before, "unexpected events before the one awaited: %v", describe(before))
	return ev
}

func describe(evs []store.ChangeEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Op+" "+ev.Coll+" "+ev.ID.String())
	}
	return out
}

func isOp(op, coll string, id any) func(store.ChangeEvent) bool {
	return func(ev store.ChangeEvent) bool {
		if ev.Op != op || ev.Coll != coll {
			return false
		}
		if id, ok := id.(bson.ObjectID); ok {
			got, isID := ev.ID.ObjectIDOK()
			return isID && got == id
		}
		return true
	}
}

// marker inserts a queue, which every profile but signals delivers: the
// event after which a test knows nothing came that it did not see.
func marker(t *testing.T, db *mongo.Database) bson.ObjectID {
	t.Helper()
	id := bson.NewObjectID()
	_, err := db.Collection(schema.CollQueues, majority).InsertOne(ctxT(t), bson.D{{Key: "_id", Value: id}, {Key: "name", Value: "marker-" + id.Hex()}, {Key: "constructor", Value: "C"}})
	require.NoError(t, err)
	return id
}

func set(t *testing.T, db *mongo.Database, coll string, filter bson.D, fields bson.D) {
	t.Helper()
	_, err := db.Collection(coll, majority).UpdateOne(ctxT(t), filter, bson.D{{Key: "$set", Value: fields}})
	require.NoError(t, err)
}

func testStreamWakeups(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	f := openStream(t, s, store.StreamParams{Profile: store.StreamWakeups})
	q := newQueue(t, s, "q", schema.SortFIFO)
	f.next(isOp("insert", schema.CollQueues, q.ID))
	id := insertTasks(t, s, q.ID, 1)[0]
	ev := f.next(isOp("insert", schema.CollTasks, id))
	require.Equal(t, q.ID, ev.Doc.Lookup(schema.TaskQueue).ObjectID())
	require.Equal(t, int32(schema.StatusQueued), ev.Doc.Lookup(schema.TaskStatus).Int32())
	require.Equal(t, bson.Type(0), ev.Doc.Lookup(schema.TaskParameters).Type, "parameters never travel")
	require.False(t, ev.WallTime.IsZero())
	require.False(t, ev.ClusterTime.IsZero())
	require.NotEmpty(t, ev.Token)

	// Claim, start, finish and output are no work for anybody: nothing
	// until the marker.
	_, err := s.TaskClaim(ctxT(t), store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: schema.TaskStdout, Value: "out"}})
	m := marker(t, db)
	f.next(isOp("insert", schema.CollQueues, m))

	// A queue's counters moving are not (every claim and finish moves
	// them): nothing until the marker. A release of an admission, any
	// other field beside the counters, and a counter removed are.
	set(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: q.ID}}, bson.D{{Key: schema.QueueCountTodo, Value: 3}, {Key: schema.QueueCountRunning, Value: 1}})
	set(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: q.ID}}, bson.D{{Key: schema.QueueCountTodo, Value: 2}, {Key: schema.QueueCountFailed, Value: 1}})
	set(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: q.ID}}, bson.D{{Key: schema.QueueCountTodo, Value: 1},
		{Key: schema.QueueCountsApplied, Value: bson.D{{Key: "t", Value: bson.Timestamp{T: 1, I: 1}}, {Key: "token", Value: "82"}}}}) // a projector's batch
	set(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: q.ID}}, bson.D{{Key: schema.QueueNextContinuous, Value: time.Now()}})
	f.next(isOp("insert", schema.CollQueues, marker(t, db)))
	// The release says it moved admissions only (the claimer then keeps
	// the queue's settings); the others do not.
	set(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: q.ID}}, bson.D{{Key: schema.QueueAdmitted, Value: 0}, {Key: schema.QueueCountRunning, Value: 0}})
	require.True(t, f.next(isOp("update", schema.CollQueues, q.ID)).AdmissionsOnly)
	set(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: q.ID}}, bson.D{{Key: schema.QueueAdmitted, Value: 1}, {Key: schema.QueuePriority, Value: 2}})
	require.False(t, f.next(isOp("update", schema.CollQueues, q.ID)).AdmissionsOnly)
	set(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: q.ID}}, bson.D{{Key: schema.QueueCountTodo, Value: 4}, {Key: schema.QueuePriority, Value: 3}})
	require.False(t, f.next(isOp("update", schema.CollQueues, q.ID)).AdmissionsOnly)
	_, err = db.Collection(schema.CollQueues).UpdateOne(ctxT(t), bson.D{{Key: "_id", Value: q.ID}}, bson.D{{Key: "$unset", Value: bson.D{{Key: schema.QueueCountTodo, Value: ""}}}})
	require.NoError(t, err)
	require.False(t, f.next(isOp("update", schema.CollQueues, q.ID)).AdmissionsOnly)
	require.False(t, f.next(isOp("insert", schema.CollQueues, marker(t, db))).AdmissionsOnly)

	// A requeue is.
	set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)}})
	ev = f.next(isOp("update", schema.CollTasks, id))
	require.Equal(t, int32(schema.StatusQueued), ev.Updated.Lookup(schema.TaskStatus).Int32())

	// So is a kill request, whole, for the node it names (running on n1:
	// the start itself is no event).
	set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusRunning)}})
	_, err = s.TaskKill(ctxT(t), store.TaskKillParams{Target: store.TaskTarget{IDs: []bson.ObjectID{id}}, By: "op", Reason: "testing"})
	require.NoError(t, err)
	ev = f.next(isOp("update", schema.CollTasks, id))
	kd, ok := ev.Updated.Lookup(schema.TaskKill).DocumentOK()
	require.True(t, ok, "%s", ev.Updated)
	k := schema.DecodeKillRequest(kd)
	require.Equal(t, "n1", k.Node)
	require.Equal(t, "op", k.By)
	require.Equal(t, "testing", k.Reason)
}

func testStreamCountersCarryPreImages(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	require.NoError(t, s.TasksPreImagesEnable(ctxT(t)))
	f := openStream(t, s, store.StreamParams{Profile: store.StreamCounters})
	q := newQueue(t, s, "q", schema.SortFIFO)
	f.next(isOp("insert", schema.CollQueues, q.ID))
	id := insertTasks(t, s, q.ID, 1)[0]
	f.next(isOp("insert", schema.CollTasks, id))
	_, err := s.TaskClaim(ctxT(t), store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	ev := f.next(isOp("update", schema.CollTasks, id))
	require.Equal(t, int32(schema.StatusQueued), ev.Before.Lookup(schema.TaskStatus).Int32(), "the status before the change")
	require.Equal(t, q.ID, ev.Before.Lookup(schema.TaskQueue).ObjectID())
	require.Equal(t, int32(schema.StatusClaimed), ev.Updated.Lookup(schema.TaskStatus).Int32())

	// A reason written is an event that carries it; a start removes it.
	set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: schema.TaskReason, Value: schema.ReasonRequeued}})
	ev = f.next(isOp("update", schema.CollTasks, id))
	require.Equal(t, schema.ReasonRequeued, ev.Updated.Lookup(schema.TaskReason).StringValue())
	require.NoError(t, s.TaskStart(ctxT(t), store.TaskTransitionParams{ID: id, Node: "n1"}))
	ev = f.next(isOp("update", schema.CollTasks, id))
	require.Equal(t, int32(schema.StatusRunning), ev.Updated.Lookup(schema.TaskStatus).Int32())
	require.Equal(t, schema.ReasonRequeued, ev.Before.Lookup(schema.TaskReason).StringValue(), "pre-images carry the reason")
	require.Equal(t, []string{schema.TaskReason}, ev.Removed, "a running task has no reason")

	// Output and parameters do not change counters: no event. A queue
	// update neither (only inserts and replaces: a new queue is recounted).
	set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: schema.TaskStdout, Value: "out"}})
	set(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: q.ID}}, bson.D{{Key: schema.QueueMaxThreads, Value: 3}})
	_, err = db.Collection(schema.CollTasks, majority).UpdateOne(ctxT(t), bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$unset", Value: bson.D{{Key: schema.TaskStatus, Value: ""}}}})
	require.NoError(t, err)
	ev = f.next(isOp("update", schema.CollTasks, id))
	require.Equal(t, []string{schema.TaskStatus}, ev.Removed, "a removed status is a transition")
	_, err = db.Collection(schema.CollTasks, majority).DeleteOne(ctxT(t), bson.D{{Key: "_id", Value: id}})
	require.NoError(t, err)
	ev = f.next(isOp("delete", schema.CollTasks, id))
	require.Equal(t, q.ID, ev.Before.Lookup(schema.TaskQueue).ObjectID(), "a delete carries what was deleted")
}

func testStreamTransitions(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	require.NoError(t, s.TasksPreImagesEnable(ctxT(t)))
	f := openStream(t, s, store.StreamParams{Profile: store.StreamTransitions})
	q := newQueue(t, s, "q", schema.SortFIFO)
	ev := f.next(isOp("insert", schema.CollQueues, q.ID))
	require.Equal(t, "q", ev.Doc.Lookup(schema.QueueName).StringValue(), "queues come whole")
	id := insertTasks(t, s, q.ID, 1)[0]
	ev = f.next(isOp("insert", schema.CollTasks, id))
	require.Equal(t, bson.Type(0), ev.Doc.Lookup(schema.TaskParameters).Type, "parameters never travel")
	require.NotEqual(t, bson.Type(0), ev.Doc.Lookup(schema.TaskCTime).Type)

	claimed, err := s.TaskClaim(ctxT(t), store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	ev = f.next(isOp("update", schema.CollTasks, id))
	require.Equal(t, int32(schema.StatusQueued), ev.Before.Lookup(schema.TaskStatus).Int32())
	require.Equal(t, int32(schema.StatusClaimed), ev.Updated.Lookup(schema.TaskStatus).Int32())
	require.Equal(t, "n1", ev.Updated.Lookup(schema.TaskNode).StringValue())
	require.NoError(t, s.TaskStart(ctxT(t), store.TaskTransitionParams{ID: claimed.ID, Node: "n1"}))
	f.next(isOp("update", schema.CollTasks, id))
	require.NoError(t, s.TaskFinish(ctxT(t), store.TaskFinishParams{ID: claimed.ID, Node: "n1", Status: schema.StatusSucceeded, Stdout: strings.Repeat("x", 1000),
		Extra: bson.D{{Key: schema.TaskResult, Value: int32(0)}, {Key: schema.TaskMixedout, Value: strings.Repeat("x", 1000)}}}))
	ev = f.next(isOp("update", schema.CollTasks, id))
	require.Equal(t, int32(schema.StatusSucceeded), ev.Updated.Lookup(schema.TaskStatus).Int32())
	require.Equal(t, bson.Type(0), ev.Updated.Lookup(schema.TaskStdout).Type, "output never travels")
	require.Equal(t, bson.Type(0), ev.Updated.Lookup(schema.TaskMixedout).Type, "output never travels")
	require.Equal(t, int32(0), ev.Updated.Lookup(schema.TaskResult).Int32(), "the exit code does")

	// Heartbeats are not transitions; a drain request is.
	_, err = s.NodeUpsert(ctxT(t), store.NodeUpsertParams{Node: "n1", State: schema.NodeStateRunning})
	require.NoError(t, err)
	ev = f.next(isOp("insert", schema.CollNodes, nil))
	_, err = s.NodeUpsert(ctxT(t), store.NodeUpsertParams{Node: "n1", State: schema.NodeStateRunning})
	require.NoError(t, err)
	set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: schema.TaskStderr, Value: "more output"}})
	_, err = s.NodeDrain(ctxT(t), store.NodeDrainParams{Node: "n1"})
	require.NoError(t, err)
	drain := f.next(isOp("update", schema.CollNodes, nil))
	require.Equal(t, ev.ID, drain.ID)
	require.True(t, drain.Updated.Lookup(schema.NodeDrain).Boolean())
}

func testStreamCheckpointAndPositions(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	q := newQueue(t, s, "q", schema.SortFIFO)
	p := store.StreamParams{Profile: store.StreamWakeups, Name: "cp", Checkpoint: true, SaveEvery: time.Hour}
	f := openStream(t, s, p)
	first := insertTasks(t, s, q.ID, 1)[0]
	ev := f.next(isOp("insert", schema.CollTasks, first))
	f.r.Close()
	tok, err := s.StreamTokenGet(ctxT(t), "cp")
	require.NoError(t, err, "Close saves the position")
	require.Equal(t, ev.Token, tok, "the position after the last event delivered")

	missed := insertTasks(t, s, q.ID, 2)
	f = openStream(t, s, p)
	f.next(isOp("insert", schema.CollTasks, missed[0]))
	f.next(isOp("insert", schema.CollTasks, missed[1]))

	// From a token, or just after a cluster time, without a checkpoint.
	g := openStream(t, s, store.StreamParams{Profile: store.StreamWakeups, From: store.Position{Token: ev.Token}})
	g.next(isOp("insert", schema.CollTasks, missed[0]))
	h := openStream(t, s, store.StreamParams{Profile: store.StreamWakeups, From: store.Position{Time: ev.ClusterTime}})
	h.next(isOp("insert", schema.CollTasks, missed[0]))

	// Present: from now, whatever is saved, and saving from there.
	f.r.Close()
	skipped := insertTasks(t, s, q.ID, 1)[0]
	pp := p
	pp.Present = true
	f = openStream(t, s, pp)
	later := insertTasks(t, s, q.ID, 1)[0]
	ev = f.next(func(ev store.ChangeEvent) bool { return ev.Op == "insert" })
	require.Equal(t, later, ev.ID.ObjectID(), "the first event after the open, not %s written before it", skipped.Hex())
	f.r.Close()
	tok, err = s.StreamTokenGet(ctxT(t), "cp")
	require.NoError(t, err)
	require.Equal(t, ev.Token, tok, "saved from the present on")
}

func testStreamLostPositionFollowsThePresent(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	q := newQueue(t, s, "q", schema.SortFIFO)
	for name, tok := range map[string]bson.D{
		"corrupt":   {{Key: "_data", Value: "zz"}},
		"no _data":  {{Key: "data", Value: "82"}},
		"in future": {{Key: "_data", Value: "82FFFFFFFF00000001"}},
	} {
		raw, err := bson.Marshal(tok)
		require.NoError(t, err)
		require.NoError(t, s.StreamTokenSave(ctxT(t), "lost-"+name, raw))
		f := openStream(t, s, store.StreamParams{Profile: store.StreamWakeups, Name: "lost-" + name, Checkpoint: true})
		id := insertTasks(t, s, q.ID, 1)[0]
		ctx, cancel := context.WithTimeout(context.Background(), streamWait)
		b, err := f.r.Next(ctx)
		cancel()
		require.NoError(t, err)
		require.NotEmpty(t, b.Lost, "%s: a Lost comes first", name)
		require.Equal(t, int64(1), f.r.Stats().Lost)
		_, before := f.until(isOp("insert", schema.CollTasks, id))
		require.Empty(t, before, name)
		f.r.Close()
		saved, err := s.StreamTokenGet(ctxT(t), "lost-"+name)
		require.NoError(t, err)
		require.NotEqual(t, bson.Raw(raw), saved, "%s: the new position is saved", name)
	}
}

func testStreamBatches(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 1) // the collection exists
	f := openStream(t, s, store.StreamParams{Profile: store.StreamWakeups, MaxBatch: 7, BatchWait: time.Second})
	insertTasks(t, s, q.ID, 30)
	ctx := ctxT(t)
	got := 0
	for got < 30 {
		b, err := f.r.Next(ctx)
		require.NoError(t, err)
		if got == 0 && len(b.Events) == 0 {
			continue // before the inserts reached the stream
		}
		require.LessOrEqual(t, len(b.Events), 7)
		if got+len(b.Events) < 30 {
			require.Len(t, b.Events, 7, "full batches while the events come")
		}
		got += len(b.Events)
		require.NotEmpty(t, b.Token)
	}
	require.Equal(t, 30, got)
	// With nothing new, the position still moves and says so.
	b, err := f.r.Next(ctx)
	require.NoError(t, err)
	require.Empty(t, b.Events)
	require.True(t, b.CaughtUp)
	require.NotEmpty(t, b.Token)
}

func testStreamDropDatabaseThenGoesOn(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	q := newQueue(t, s, "q", schema.SortFIFO)
	f := openStream(t, s, store.StreamParams{Profile: store.StreamWakeups})
	require.NoError(t, db.Drop(ctxT(t)))
	f.until(isOp("invalidate", "", nil))
	id := insertTasks(t, s, q.ID, 1)[0]
	f.until(isOp("insert", schema.CollTasks, id))
}

// testStreamCloseKillsTheCursor: a reader stopped while the server holds
// its getMore (the usual way a node stops) leaves no cursor open on the
// server, where it would stay for ten minutes.
func testStreamCloseKillsTheCursor(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	q := newQueue(t, s, "q", schema.SortFIFO)
	for _, profile := range []store.StreamProfile{store.StreamWakeups, store.StreamCounters} {
		const maxAwait = time.Second
		r, err := s.StreamOpen(ctxT(t), store.StreamParams{Profile: profile, MaxAwait: maxAwait})
		require.NoError(t, err)
		id := insertTasks(t, s, q.ID, 1)[0]
		ctx, cancel := context.WithCancel(context.Background())
		for delivered := false; !delivered; {
			b, err := r.Next(ctx)
			require.NoError(t, err)
			for _, ev := range b.Events {
				got, ok := ev.ID.ObjectIDOK()
				delivered = delivered || (ok && got == id)
			}
		}
		go func() {
			time.Sleep(300 * time.Millisecond) // the server holds the next getMore
			cancel()
		}()
		_, err = r.Next(ctx)
		require.ErrorIs(t, err, context.Canceled)
		closed := time.Now()
		r.Close()
		// The getMore the server was holding ends with its cursor...
		require.Eventually(t, func() bool { return len(mongotest.ChangeStreamCursors(t, db)) == 0 }, 2*time.Second, 20*time.Millisecond,
			"%s: a getMore still runs after Close", profile)
		// ...and no cursor is left idle once it would have ended by itself.
		time.Sleep(time.Until(closed.Add(maxAwait + 500*time.Millisecond)))
		require.Empty(t, mongotest.ChangeStreamCursors(t, db), "%s: a change stream cursor is left open after Close", profile)
	}
}

// pacedNext runs one Next of a reader on the fake clock clk, advancing clk
// by pace whenever the reader waits on it, and says how many advances the
// batch took.
func pacedNext(t *testing.T, r *store.StreamReader, clk *clock.Fake, pace time.Duration) (store.StreamBatch, int) {
	t.Helper()
	type result struct {
		b   store.StreamBatch
		err error
	}
	ch := make(chan result, 1)
	go func() {
		b, err := r.Next(ctxT(t))
		ch <- result{b, err}
	}()
	advances := 0
	deadline := time.After(streamWait)
	for {
		select {
		case res := <-ch:
			require.NoError(t, res.err)
			return res.b, advances
		case <-deadline:
			require.FailNow(t, "Next did not return", "within %v, after %d advances of the clock", streamWait, advances)
		case <-time.After(5 * time.Millisecond):
			if clk.Waiters() > 0 {
				clk.Advance(pace)
				advances++
			}
		}
	}
}

func testStreamPaced(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 1) // the collection exists
	clk := clock.NewFake(time.Now())
	const pace = time.Hour
	r, err := s.StreamOpen(ctxT(t), store.StreamParams{Profile: store.StreamWakeups, MaxBatch: 3, MaxAwait: 3 * pace, Clock: clk, Pace: pace})
	require.NoError(t, err)
	t.Cleanup(r.Close)

	ids := insertTasks(t, s, q.ID, 5)
	var got []bson.ObjectID
	full := false // the last batch came from a full reply
	for len(got) < len(ids) {
		b, advances := pacedNext(t, r, clk, pace)
		require.Empty(t, b.Lost)
		if full {
			require.Zero(t, advances, "after a full reply the reader asks again at once")
		}
		require.LessOrEqual(t, len(b.Events), 3)
		for _, ev := range b.Events {
			got = append(got, ev.ID.ObjectID())
		}
		full = len(b.Events) == 3
		if len(b.Events) > 0 && !full {
			require.True(t, b.CaughtUp, "a short paced reply is all there was")
		}
	}
	require.Equal(t, ids, got)

	// Idle, it asks every pace, the server answering at once (a getMore
	// held for MaxAwait, 3 h, would not return within the test), and
	// delivers its advance every MaxAwait, caught up.
	b, advances := pacedNext(t, r, clk, pace)
	require.Empty(t, b.Events)
	require.True(t, b.CaughtUp)
	require.NotEmpty(t, b.Token)
	require.GreaterOrEqual(t, advances, 2, "an idle advance every MaxAwait (3 paces), not every pace")

	// A task inserted now comes with the next ask, when the clock moves
	// on, not before.
	more := insertTasks(t, s, q.ID, 1)
	b, advances = pacedNext(t, r, clk, pace)
	for len(b.Events) == 0 {
		var n int
		b, n = pacedNext(t, r, clk, pace)
		advances += n
	}
	require.Positive(t, advances, "the ask waited for the pace")
	require.Len(t, b.Events, 1)
	require.Equal(t, more[0], b.Events[0].ID.ObjectID())
}

// testStreamOwnWritesSayWhereTheTaskStood: without pre-images, an update
// of ours still says where its task stood (schema.TaskPrior), and a write
// of another program does not.
func testStreamOwnWritesSayWhereTheTaskStood(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	f := openStream(t, s, store.StreamParams{Profile: store.StreamCounters})
	q := newQueue(t, s, "q", schema.SortFIFO)
	f.next(isOp("insert", schema.CollQueues, q.ID))
	ids := insertTasks(t, s, q.ID, 3)
	for _, id := range ids {
		f.next(isOp("insert", schema.CollTasks, id))
	}
	stood := func(ev store.ChangeEvent, status schema.Status, node string) {
		t.Helper()
		require.NotNil(t, ev.Before, "where the task stood")
		require.True(t, ev.Prior, "said by the write itself")
		require.Equal(t, q.ID, ev.Before.Lookup(schema.TaskQueue).ObjectID())
		require.Equal(t, int32(status), ev.Before.Lookup(schema.TaskStatus).Int32())
		if node == "" {
			require.Equal(t, bson.Type(0), ev.Before.Lookup(schema.TaskNode).Type, "no node when the writer did not know it")
			return
		}
		require.Equal(t, node, ev.Before.Lookup(schema.TaskNode).StringValue())
	}

	// A batched claim straight into running, then a finish of both.
	won, err := s.TaskClaimMany(ctxT(t), store.TaskClaimManyParams{Queue: q.ID, Node: "n 1", Sort: schema.SortFIFO, Limit: 2, Start: true})
	require.NoError(t, err)
	require.Len(t, won.Tasks, 2)
	for range 2 {
		stood(f.next(isOp("update", schema.CollTasks, nil)), schema.StatusQueued, "")
	}
	errs := s.TaskFinishMany(ctxT(t), []store.TaskFinishParams{
		{ID: won.Tasks[0].ID, Node: "n 1", Status: schema.StatusSucceeded},
		{ID: won.Tasks[1].ID, Node: "n 1", Status: schema.StatusFailed},
	})
	require.Equal(t, []error{nil, nil}, errs)
	for range 2 {
		ev := f.next(isOp("update", schema.CollTasks, nil))
		stood(ev, schema.StatusRunning, "n 1") // a node name may hold spaces
		require.NotEqual(t, int32(schema.StatusRunning), ev.Updated.Lookup(schema.TaskStatus).Int32())
	}

	// A single claim, and its start.
	_, err = s.TaskClaim(ctxT(t), store.TaskClaimParams{Queue: q.ID, Node: "n2", Sort: schema.SortFIFO})
	require.NoError(t, err)
	stood(f.next(isOp("update", schema.CollTasks, ids[2])), schema.StatusQueued, "")
	require.NoError(t, s.TaskStart(ctxT(t), store.TaskTransitionParams{ID: ids[2], Node: "n2"}))
	stood(f.next(isOp("update", schema.CollTasks, ids[2])), schema.StatusClaimed, "n2")

	// The leader's release of a delayed task.
	held := insertTasks(t, s, q.ID, 1)[0]
	f.next(isOp("insert", schema.CollTasks, held))
	set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: held}}, bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusBlocked)}, {Key: schema.TaskNotBefore, Value: time.Now().Add(-time.Second)}})
	f.next(isOp("update", schema.CollTasks, held))
	n, err := s.TaskReleaseDue(ctxT(t), store.TaskTimersParams{Now: time.Now()})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	stood(f.next(isOp("update", schema.CollTasks, held)), schema.StatusBlocked, "")

	// Another program's write says nothing of where the task stood.
	set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: ids[2]}}, bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)}, {Key: schema.TaskNode, Value: schema.Unclaimed}})
	ev := f.next(isOp("update", schema.CollTasks, ids[2]))
	require.Nil(t, ev.Before, "no pre-image, no prior: unknown")
	require.False(t, ev.Prior)
}
