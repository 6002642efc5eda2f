package graph

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.uber.org/goleak"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

type bundle struct {
	t      *testing.T
	db     *mongo.Database
	store  *store.Store
	clock  *clock.Fake
	sweeps chan store.TaskGraphResult
	settle chan store.TaskGraphResult
	queue  bson.ObjectID
}

// setup returns the bundle; at the end of the test, once the duty has
// stopped, nothing of it may be left running (the tests are not parallel
// for this check).
func setup(t *testing.T) *bundle {
	db := mongotest.Database(t)
	opts := append(mongotest.ClientGoroutines(), goleak.IgnoreCurrent())
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
	b := &bundle{t: t, db: db, store: store.New(db, store.Options{}), clock: clock.NewFake(time.Now()),
		sweeps: make(chan store.TaskGraphResult, 100), settle: make(chan store.TaskGraphResult, 100)}
	ctx := context.Background()
	require.NoError(t, b.store.IndexesEnsure(ctx))
	one := 1
	q, err := b.store.QueueCreate(ctx, store.QueueCreateParams{Name: "q", Constructor: "C", MaxThreads: &one})
	require.NoError(t, err)
	b.queue = q.ID
	return b
}

// lead runs the duty until the test ends, and waits for its first sweep.
func (b *bundle) lead() {
	b.t.Helper()
	g := New(Config{Store: b.store, Every: time.Minute, Clock: b.clock, Settled: func(res store.TaskGraphResult, sweep bool) {
		if sweep {
			b.sweeps <- res
		} else {
			b.settle <- res
		}
	}})
	ctx, cancel := context.WithCancel(context.Background())
	r, err := b.store.StreamOpen(ctx, store.StreamParams{Profile: store.StreamLeader, GraphEnds: true, Pace: store.Patient})
	require.NoError(b.t, err)
	done := make(chan error, 1)
	go func() { done <- g.Lead(ctx, leadership.Term{}, r) }()
	b.t.Cleanup(func() {
		cancel()
		require.NoError(b.t, <-done)
		r.Close()
	})
	b.nextSweep()
}

func (b *bundle) nextSweep() store.TaskGraphResult {
	b.t.Helper()
	select {
	case res := <-b.sweeps:
		return res
	case <-time.After(20 * time.Second):
		b.t.Fatal("no sweep")
	}
	return store.TaskGraphResult{}
}

func (b *bundle) status(id bson.ObjectID) schema.Status {
	raw, err := b.db.Collection("tasks").FindOne(context.Background(), bson.D{{Key: "_id", Value: id}}).Raw()
	require.NoError(b.t, err)
	return schema.Status(raw.Lookup("status").AsInt64())
}

func (b *bundle) setStatus(id bson.ObjectID, st schema.Status) {
	_, err := b.db.Collection("tasks").UpdateOne(context.Background(), bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: int32(st)}}}})
	require.NoError(b.t, err)
}

// TestLeadSettlesChildrenOnTheirParentsFinishEvents: no sweep is due (the
// fake clock never moves), so the finish event is what queues the child,
// and what fails the other one.
func TestLeadSettlesChildrenOnTheirParentsFinishEvents(t *testing.T) {
	b := setup(t)
	ok, okc, bad, badc := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	_, err := b.store.TaskInsertGraph(context.Background(), store.TaskInsertGraphParams{Tasks: []store.GraphTask{
		{ID: ok, Queue: b.queue}, {ID: okc, Queue: b.queue, Parents: []bson.ObjectID{ok}},
		{ID: bad, Queue: b.queue}, {ID: badc, Queue: b.queue, Parents: []bson.ObjectID{bad}},
	}})
	require.NoError(t, err)
	b.lead()
	b.setStatus(ok, schema.StatusSucceeded)
	require.Eventually(t, func() bool { return b.status(okc) == schema.StatusQueued }, 20*time.Second, 10*time.Millisecond)
	b.setStatus(bad, schema.StatusFailed)
	require.Eventually(t, func() bool { return b.status(badc) == schema.StatusFailed }, 20*time.Second, 10*time.Millisecond)
	require.Empty(t, b.sweeps, "no sweep besides the first")
}

// TestLeadSweepsEveryPeriod: a child whose parent's end the stream cannot
// carry (written before the term, here as raw inserts, which the stream
// does not follow) is queued by the periodic sweep when the clock reaches
// it, not before.
func TestLeadSweepsEveryPeriod(t *testing.T) {
	b := setup(t)
	b.lead()
	parent, child := bson.NewObjectID(), bson.NewObjectID()
	_, err := b.db.Collection("tasks").InsertMany(context.Background(), []any{
		bson.D{{Key: "_id", Value: parent}, {Key: "queue", Value: b.queue}, {Key: "status", Value: int32(1)}, {Key: "node", Value: "n1"}},
		bson.D{{Key: "_id", Value: child}, {Key: "queue", Value: b.queue}, {Key: "status", Value: int32(-4)}, {Key: "node", Value: int32(-1)},
			{Key: "parents", Value: bson.A{parent}}, {Key: "awaiting_parents", Value: true}},
	})
	require.NoError(t, err)
	require.NoError(t, b.clock.BlockUntil(context.Background(), 1))
	require.Equal(t, schema.StatusBlocked, b.status(child), "nothing but the sweep would queue it")
	b.clock.Advance(59 * time.Second)
	select {
	case res := <-b.sweeps:
		t.Fatalf("a sweep 59s into the period: %+v", res)
	case <-time.After(500 * time.Millisecond):
	}
	require.Equal(t, schema.StatusBlocked, b.status(child))
	b.clock.Advance(time.Second)
	res := b.nextSweep()
	require.Equal(t, int64(1), res.Queued)
	require.Zero(t, res.Held+res.Failed)
	require.Equal(t, schema.StatusQueued, b.status(child))
}
