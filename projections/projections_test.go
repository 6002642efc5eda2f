package projections_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/internal/lifecycle/lifecycletest"
	"github.com/disbatch-go/disbatch/internal/mongod"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/internal/syncbuf"
	"github.com/disbatch-go/disbatch/node"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

type logBuf = syncbuf.Buffer

func logger(l *logBuf) *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// requireExact waits until every queue's counters equal a recount.
func requireExact(t *testing.T, s *store.Store, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	var last string
	require.Eventually(t, func() bool {
		counts, err := s.QueueCountsGet(ctx)
		require.NoError(t, err)
		stored, err := s.QueueCounters(ctx)
		require.NoError(t, err)
		for q, c := range stored {
			want := counts[q]
			if !c.Complete() || *c.Todo != want.Todo || *c.Total != want.Total || *c.Running != want.Running || *c.Failed != want.Failed {
				last = fmt.Sprintf("queue %s: counters %v/%v/%v/%v, recount %d/%d/%d/%d (todo/total/running/failed)", q.Hex(),
					deref(c.Todo), deref(c.Total), deref(c.Running), deref(c.Failed), want.Todo, want.Total, want.Running, want.Failed)
				return false
			}
		}
		return true
	}, within, 50*time.Millisecond, "counters never equalled a recount; last: %s", func() string { return last }())
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

func newQueue(t *testing.T, db *mongo.Database, name string, maxThreads int, counters bool) bson.ObjectID {
	t.Helper()
	id := bson.NewObjectID()
	doc := bson.D{{Key: "_id", Value: id}, {Key: "name", Value: name}, {Key: "constructor", Value: "noop"}, {Key: "maxthreads", Value: maxThreads}, {Key: "sort", Value: "fifo"}}
	if counters {
		doc = append(doc, bson.E{Key: "count_todo", Value: 0}, bson.E{Key: "count_total", Value: 0}, bson.E{Key: "count_running", Value: 0},
			bson.E{Key: "count_failed", Value: 0})
	}
	_, err := db.Collection("queues").InsertOne(context.Background(), doc)
	require.NoError(t, err)
	return id
}

// insertBurst inserts n tasks with a raw driver client, the way any client
// might: with varying statuses.
func insertBurst(t *testing.T, db *mongo.Database, q bson.ObjectID, start, n int, status func(i int) any) []any {
	t.Helper()
	docs := make([]any, n)
	ids := make([]any, n)
	for i := range n {
		id := bson.NewObjectID()
		ids[i] = id
		d := bson.D{{Key: "_id", Value: id}, {Key: "queue", Value: q}, {Key: "node", Value: -1}, {Key: "parameters", Value: bson.D{{Key: "i", Value: start + i}}}, {Key: "ctime", Value: time.Now()}, {Key: "mtime", Value: time.Now()}}
		if s := status(start + i); s != nil {
			d = append(d, bson.E{Key: "status", Value: s})
		}
		docs[i] = d
	}
	_, err := db.Collection("tasks").InsertMany(context.Background(), docs)
	require.NoError(t, err)
	return ids
}

func TestCountersExactAcrossThreeNodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	logs := &logBuf{}
	reg := plugin.NewRegistry()
	reg.Register("noop", plugin.Func(func(context.Context, plugin.Task) plugin.Result {
		return plugin.Result{Status: schema.StatusSucceeded}
	}))
	a := newQueue(t, db, "a", 8, true)
	b := newQueue(t, db, "b", 8, false) // counters missing: created by a recount
	c := newQueue(t, db, "c", 0, true)  // runs nothing
	var nodes []*node.Node
	for i := range 3 {
		n, err := node.New(node.Config{Name: fmt.Sprintf("n%d", i), Store: s, Plugins: reg, Tick: 200 * time.Millisecond, Logger: logger(logs)})
		require.NoError(t, err)
		require.NoError(t, n.Start(ctx))
		t.Cleanup(n.Stop)
		nodes = append(nodes, n)
	}
	status := func(i int) any {
		switch i % 997 {
		case 1:
			return -4 // held back: todo, never claimed
		case 2:
			return nil // no status: counts as todo, like {$lte: [null, 0]}
		case 3:
			return "weird" // not a number: not todo
		case 4:
			return 2.0 // a double
		}
		return int32(-2)
	}
	// 10,000 tasks in bursts across the three queues.
	var cIDs []any
	for burst := range 20 {
		q := []bson.ObjectID{a, b, c}[burst%3]
		ids := insertBurst(t, db, q, burst*500, 500, status)
		if q == c {
			cIDs = append(cIDs, ids...)
		}
	}
	tasks := db.Collection("tasks")
	// Deletes, one at a time and many at once, in the queue nothing runs.
	for _, id := range cIDs[:20] {
		_, err := tasks.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}})
		require.NoError(t, err)
	}
	_, err := tasks.DeleteMany(ctx, bson.D{{Key: "queue", Value: c}, {Key: "parameters.i", Value: bson.D{{Key: "$lt", Value: 3000}}}})
	require.NoError(t, err)
	// Moves from c to b (where they then run).
	_, err = tasks.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: cIDs[1000:1100]}}}}, bson.D{{Key: "$set", Value: bson.D{{Key: "queue", Value: b}}}})
	require.NoError(t, err)
	// Wait for a and b to finish, then requeue 300 finished tasks and delete some finished ones.
	runnable := bson.D{{Key: "queue", Value: bson.D{{Key: "$in", Value: bson.A{a, b}}}}, {Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{-2, -1, 0}}}}}
	require.Eventually(t, func() bool { n, _ := tasks.CountDocuments(ctx, runnable); return n == 0 }, 120*time.Second, 100*time.Millisecond)
	cur, err := tasks.Find(ctx, bson.D{{Key: "queue", Value: a}, {Key: "status", Value: 1}}, options.Find().SetLimit(300).SetProjection(bson.D{{Key: "_id", Value: 1}}))
	require.NoError(t, err)
	var finished []bson.Raw
	require.NoError(t, cur.All(ctx, &finished))
	var requeue []any
	for _, d := range finished {
		requeue = append(requeue, d.Lookup("_id").ObjectID())
	}
	_, err = tasks.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: requeue}}}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -2}, {Key: "node", Value: -1}}}})
	require.NoError(t, err)
	_, err = tasks.DeleteMany(ctx, bson.D{{Key: "queue", Value: b}, {Key: "status", Value: 1}, {Key: "parameters.i", Value: bson.D{{Key: "$lt", Value: 2000}}}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { n, _ := tasks.CountDocuments(ctx, runnable); return n == 0 }, 60*time.Second, 100*time.Millisecond)

	requireExact(t, s, 30*time.Second)
	leaders := 0
	for _, n := range nodes {
		st := n.ProjectorStats()
		require.Zero(t, st.DriftQueues, "a projector had to repair drift:\n%s", logs)
		if st.Leader {
			leaders++
			require.Positive(t, st.Events)
			t.Logf("leader applied %d events in %d batches; lag p50 %v p99 %v", st.Events, st.Batches, st.LagP50, st.LagP99)
		}
	}
	require.Equal(t, 1, leaders)
	require.NotContains(t, logs.String(), "counter drift")
}

// writer keeps changing tasks until stopped: inserts, completions,
// requeues and deletes.
func writer(t *testing.T, db *mongo.Database, queues []bson.ObjectID) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ops atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		tasks := db.Collection("tasks")
		r := rand.New(rand.NewPCG(1, 2))
		var ids []bson.ObjectID
		for ctx.Err() == nil {
			q := queues[r.IntN(len(queues))]
			switch k := r.IntN(10); {
			case k < 5 || len(ids) < 10:
				var docs []any
				for range 20 {
					id := bson.NewObjectID()
					ids = append(ids, id)
					docs = append(docs, bson.D{{Key: "_id", Value: id}, {Key: "queue", Value: q}, {Key: "status", Value: -2}, {Key: "node", Value: -1}})
				}
				_, _ = tasks.InsertMany(ctx, docs)
			case k < 8:
				id := ids[r.IntN(len(ids))]
				_, _ = tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: []int{1, 2, -2, 0}[r.IntN(4)]}}}})
			case k < 9:
				id := ids[r.IntN(len(ids))]
				_, _ = tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "queue", Value: q}}}})
			default:
				id := ids[r.IntN(len(ids))]
				_, _ = tasks.DeleteOne(ctx, bson.D{{Key: "_id", Value: id}})
			}
			ops.Add(1)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
		require.Positive(t, ops.Load())
	}
}

func TestCrashedProjectorIsReplacedWithoutDoubleApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	logs := &logBuf{}
	queues := []bson.ObjectID{newQueue(t, db, "a", 0, true), newQueue(t, db, "b", 0, true)}
	cfg := func(name string) projections.Config {
		// 4 s: the leader steps back 3 s after its last landed renewal,
		// which the writer's load must not bring about before the crash
		// (at 2 s, a loaded machine's renewals could).
		return projections.Config{Node: name, Store: s, LeaseTTL: 4 * time.Second, Logger: logger(logs)}
	}
	first := projections.New(cfg("first"))
	require.NoError(t, first.Start(ctx))
	require.Eventually(t, func() bool { return first.Stats().Leader }, 5*time.Second, 10*time.Millisecond)
	second := projections.New(cfg("second"))
	require.NoError(t, second.Start(ctx))
	t.Cleanup(second.Stop)

	stop := writer(t, db, queues)
	require.Eventually(t, func() bool { return first.Stats().Events > 200 }, 20*time.Second, 10*time.Millisecond)
	firstEpoch := first.Stats().Epoch
	require.True(t, first.Stats().Leader, "the first stepped back before its crash: the test proves nothing:\n%s", logs)
	first.Crash() // mid-stream, lease not released
	require.False(t, second.Stats().Leader, "the lease is not free until it expires")
	require.Eventually(t, func() bool { return second.Stats().Leader }, 15*time.Second, 20*time.Millisecond)
	require.Greater(t, second.Stats().Epoch, firstEpoch)
	time.Sleep(time.Second) // the successor applies under load
	stop()
	requireExact(t, s, 30*time.Second)
	require.Zero(t, second.Stats().DriftQueues, "the successor found drift:\n%s", logs)
	require.Positive(t, second.Stats().Events)
}

func TestLostResumePointIsRepairedByRecount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A resume token from another deployment, taken before anything here
	// happens (as a checkpoint restored from another cluster's dump would
	// be): this deployment cannot resume from it.
	elsewhere, err := mongod.StartReplicaSet(ctx, mongod.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = elsewhere.Stop() })
	client, err := mongo.Connect(options.Client().ApplyURI(elsewhere.URI()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	cs, err := client.Database("elsewhere").Watch(ctx, mongo.Pipeline{})
	require.NoError(t, err)
	_, err = client.Database("elsewhere").Collection("x").InsertOne(ctx, bson.D{{Key: "a", Value: 1}})
	require.NoError(t, err)
	require.True(t, cs.Next(ctx))
	foreign := cs.ResumeToken()
	require.NoError(t, cs.Close(ctx))

	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	logs := &logBuf{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	q := newQueue(t, db, "q", 0, true)
	p := projections.New(projections.Config{Node: "n1", Store: s, LeaseTTL: 2 * time.Second, Logger: logger(logs)})
	require.NoError(t, p.Start(ctx))
	insertBurst(t, db, q, 0, 50, func(int) any { return -2 })
	requireExact(t, s, 10*time.Second)
	p.Stop()

	// While no projector runs: more tasks, a corrupted counter, and the
	// foreign checkpoint.
	insertBurst(t, db, q, 50, 30, func(int) any { return 1 })
	_, err = db.Collection("queues").UpdateOne(ctx, bson.D{{Key: "_id", Value: q}}, bson.D{{Key: "$set", Value: bson.D{{Key: "count_todo", Value: 999}}}})
	require.NoError(t, err)
	_, err = db.Collection(store.CollLeases).UpdateOne(ctx, bson.D{{Key: "_id", Value: projections.LeaseName}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "checkpoint", Value: foreign}}}})
	require.NoError(t, err)

	p2 := projections.New(projections.Config{Node: "n1", Store: s, LeaseTTL: 2 * time.Second, Logger: logger(logs)})
	require.NoError(t, p2.Start(ctx))
	t.Cleanup(p2.Stop)
	requireExact(t, s, 10*time.Second)
	require.Regexp(t, "no longer in the oplog|cannot be from this deployment", logs.String())
	require.NotContains(t, logs.String(), "counter drift", "a lost position is repaired by a recount, not discovered as drift")
	insertBurst(t, db, q, 80, 5, func(int) any { return -2 })
	requireExact(t, s, 10*time.Second)
}

func TestQueuesFilledWhileEveryNodeWasDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	logs := &logBuf{}
	// As Disbatch 4.103 clients leave them: no counters, plugin/threads, node null.
	perl := bson.NewObjectID()
	_, err := db.Collection("queues").InsertOne(ctx, bson.D{{Key: "_id", Value: perl}, {Key: "name", Value: "perl"}, {Key: "plugin", Value: "P"}, {Key: "threads", Value: 1}})
	require.NoError(t, err)
	empty := newQueue(t, db, "empty", 1, false)
	insertBurst(t, db, perl, 0, 40, func(i int) any { return []any{-2, 1, 2, -1}[i%4] })
	p := projections.New(projections.Config{Node: "n1", Store: s, Logger: logger(logs)})
	require.NoError(t, p.Start(ctx))
	t.Cleanup(p.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	requireExact(t, s, 10*time.Second)
	stored, err := s.QueueCounters(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(20), *stored[perl].Todo)
	require.Equal(t, int64(40), *stored[perl].Total)
	require.Equal(t, int64(10), *stored[perl].Running)
	require.Equal(t, int64(0), *stored[empty].Total)
	require.Equal(t, int64(0), *stored[empty].Running)
	require.Zero(t, p.Stats().DriftQueues)
}

func TestCorruptCheckpointTokenIsRepairedByRecount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	logs := &logBuf{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	q := newQueue(t, db, "q", 0, true)
	insertBurst(t, db, q, 0, 10, func(int) any { return -2 })
	// A checkpoint the server cannot even parse (MongoDB answers
	// FailedToParse): the projector must recount, not fail every term.
	_, err := db.Collection(store.CollLeases).InsertOne(ctx, bson.D{{Key: "_id", Value: projections.LeaseName},
		{Key: "checkpoint", Value: bson.D{{Key: "_data", Value: "not hex"}}}})
	require.NoError(t, err)
	p := projections.New(projections.Config{Node: "n1", Store: s, LeaseTTL: 2 * time.Second, Logger: logger(logs)})
	require.NoError(t, p.Start(ctx))
	t.Cleanup(p.Stop)
	requireExact(t, s, 10*time.Second)
	insertBurst(t, db, q, 10, 5, func(int) any { return -2 })
	requireExact(t, s, 10*time.Second)
}

func TestServiceLifecycle(t *testing.T) {
	// Not parallel: goleak.
	s := store.New(mongotest.Database(t), store.Options{})
	lifecycletest.Check(t, func(t *testing.T) lifecycle.Service {
		return projections.New(projections.Config{Node: "n1", Store: s, LeaseTTL: time.Second})
	}, lifecycletest.Options{IgnoreGoroutines: mongotest.ClientGoroutines()})
}

// TestReasonsAreCountedWhoeverWritesThem: the projector counts the reasons
// written on tasks, by queue, from its stream: a cancel made through the
// store (as the CLI and the web API make it) and reasons written by another
// program alike; a reason written again after a start removed it counts
// again; a change that keeps a reason does not.
func TestReasonsAreCountedWhoeverWritesThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	q := newQueue(t, db, "q", 0, true)
	other := newQueue(t, db, "other", 0, true)
	svc := projections.New(projections.Config{Node: "n1", Store: s, LeaseTTL: 2 * time.Second})
	require.NoError(t, svc.Start(ctx))
	t.Cleanup(svc.Stop)
	require.Eventually(t, func() bool { return svc.Stats().Leader }, 10*time.Second, 10*time.Millisecond)
	// Reasons come from the stream only: writes the projector's first
	// recount covers are not counted, so wait until it follows the stream.
	probe := newQueue(t, db, "probe", 0, true)
	require.Eventually(t, func() bool {
		insertBurst(t, db, probe, 0, 1, func(int) any { return nil })
		return svc.Stats().Events > 0
	}, 10*time.Second, 100*time.Millisecond, "the projector never applied an event")

	ids := insertBurst(t, db, q, 0, 5, func(int) any { return -2 })
	oids := make([]bson.ObjectID, len(ids))
	for i, id := range ids {
		oids[i] = id.(bson.ObjectID)
	}
	res, err := s.TaskCancel(ctx, store.TaskCancelParams{Target: store.TaskTarget{IDs: oids[:3]}, By: "test"})
	require.NoError(t, err)
	require.EqualValues(t, 3, res.Cancelled)

	tasks := db.Collection("tasks")
	update := func(id bson.ObjectID, u bson.D) {
		t.Helper()
		_, err := tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, u)
		require.NoError(t, err)
	}
	setf := func(kv ...any) bson.D {
		d := bson.D{}
		for i := 0; i < len(kv); i += 2 {
			d = append(d, bson.E{Key: kv[i].(string), Value: kv[i+1]})
		}
		return bson.D{{Key: "$set", Value: d}}
	}
	// Task 3 fails twice and is retried each time: a start removes the
	// reason in between, so the second "retrying" is written afresh.
	update(oids[3], setf("status", -4, "reason", schema.ReasonRetrying))
	update(oids[3], setf("status", -2)) // released: the reason stays, not a new one
	update(oids[3], bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 0}}}, {Key: "$unset", Value: bson.D{{Key: "reason", Value: ""}}}})
	update(oids[3], setf("status", -4, "reason", schema.ReasonRetrying))
	// Task 4 times out in another queue (moved there by another program).
	update(oids[4], setf("queue", other, "status", 2, "reason", schema.ReasonTimeout))
	// A replace that keeps the reason is no new reason.
	var doc bson.D
	require.NoError(t, tasks.FindOne(ctx, bson.D{{Key: "_id", Value: oids[0]}}).Decode(&doc))
	_, err = tasks.ReplaceOne(ctx, bson.D{{Key: "_id", Value: oids[0]}}, doc)
	require.NoError(t, err)

	want := map[projections.ReasonKey]int64{
		{Queue: q, Reason: schema.ReasonCancelled}:   3,
		{Queue: q, Reason: schema.ReasonRetrying}:    2,
		{Queue: other, Reason: schema.ReasonTimeout}: 1,
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) { assert.Equal(c, want, svc.Stats().Reasons) }, 10*time.Second, 10*time.Millisecond)
	// Nothing more comes in later.
	update(oids[0], setf("stdout", "x"))
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, want, svc.Stats().Reasons)
}

// settledEvents is the projector's count of events applied once it has
// not moved for 300 ms.
func settledEvents(t *testing.T, svc *projections.Service) int64 {
	t.Helper()
	var n int64
	require.Eventually(t, func() bool {
		n = svc.Stats().Events
		time.Sleep(300 * time.Millisecond)
		return svc.Stats().Events == n
	}, 10*time.Second, time.Millisecond, "the projector's events never stopped moving")
	return n
}

// rider records what a projector hands its Rider.
type rider struct {
	mu      sync.Mutex
	boarded int
	alit    int
	events  []store.ChangeEvent
}

func (r *rider) Board()  { r.mu.Lock(); r.boarded++; r.mu.Unlock() }
func (r *rider) Alight() { r.mu.Lock(); r.alit++; r.mu.Unlock() }
func (r *rider) Ride(b store.StreamBatch) {
	r.mu.Lock()
	r.events = append(r.events, b.Events...)
	r.mu.Unlock()
}

// heard says whether the rider was handed an update of id that set f
// (f empty: any event of id).
func (r *rider) heard(id bson.ObjectID, f string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range r.events {
		if got, _ := ev.ID.ObjectIDOK(); got != id {
			continue
		}
		if f == "" {
			return true
		}
		if _, err := ev.Updated.LookupErr(f); err == nil && ev.Op == "update" {
			return true
		}
	}
	return false
}

// TestRiderIsHandedTheLeadersEventsWhichTheCountersSkip: with a Rider the
// projector's stream carries the leader's events too (a time or
// awaiting_parents set, no status changed); the rider is handed them,
// the projection applies only its own (CountersMatch), and the counters
// stay exact. The rider boards when the stream opens and alights when
// the term ends.
func TestRiderIsHandedTheLeadersEventsWhichTheCountersSkip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	q := newQueue(t, db, "q", 0, true)
	rd := &rider{}
	svc := projections.New(projections.Config{Node: "n1", Store: s, LeaseTTL: 2 * time.Second, Rider: rd})
	require.NoError(t, svc.Start(ctx))
	require.Eventually(t, func() bool { return svc.Stats().Leader }, 10*time.Second, 10*time.Millisecond)
	// Writes the first recount covers are not events: wait until the
	// projector follows the stream.
	require.Eventually(t, func() bool {
		insertBurst(t, db, q, 0, 1, func(int) any { return -2 })
		return svc.Stats().Events > 0
	}, 10*time.Second, 100*time.Millisecond, "the projector never applied an event")
	ids := insertBurst(t, db, q, 0, 2, func(int) any { return -2 })
	require.Eventually(t, func() bool { return rd.heard(ids[1].(bson.ObjectID), "") }, 10*time.Second, 10*time.Millisecond,
		"the rider was not handed the inserts")
	requireExact(t, s, 10*time.Second) // every insert applied: no event of ours left to come
	// The stats count a batch once its commit is back, after its counters
	// show: read them once they stop moving (read at once, a loaded CI run
	// missed the last batch, and its events counted as the leader's).
	before := settledEvents(t, svc)
	tasks := db.Collection("tasks")
	for _, f := range []string{schema.TaskNotBefore, schema.TaskExpiresAt} {
		_, err := tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[0]}}, bson.D{{Key: "$set", Value: bson.D{{Key: f, Value: time.Now().Add(time.Hour)}}}})
		require.NoError(t, err)
	}
	_, err := tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[1]}}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskAwaitingParents, Value: true}}}})
	require.NoError(t, err)
	insertBurst(t, db, q, 2, 1, func(int) any { return -2 }) // the counters' own, after them
	require.Eventually(t, func() bool { return svc.Stats().Events > before }, 10*time.Second, 10*time.Millisecond, "the last insert was not applied")
	require.Equal(t, before+1, svc.Stats().Events, "the projection applied the leader's events")
	require.True(t, rd.heard(ids[0].(bson.ObjectID), schema.TaskNotBefore), "the rider was not handed not_before set")
	require.True(t, rd.heard(ids[0].(bson.ObjectID), schema.TaskExpiresAt), "the rider was not handed expires_at set")
	require.True(t, rd.heard(ids[1].(bson.ObjectID), schema.TaskAwaitingParents), "the rider was not handed awaiting_parents set")
	requireExact(t, s, 10*time.Second)
	svc.Stop()
	rd.mu.Lock()
	defer rd.mu.Unlock()
	require.GreaterOrEqual(t, rd.boarded, 1)
	require.Equal(t, 1, rd.alit, "the term's end")
}

// zombie is the store of a projector that is cut off on cue: its lease
// renewals fail from then, and its next batch waits until released and is
// then written whatever became of its term, as a deposed projector's
// batch that was on the wire when its lease ran out.
type zombie struct {
	*store.Store
	cut     atomic.Bool
	held    chan struct{} // closed once a late batch waits
	release chan struct{}
	once    sync.Once
}

func (z *zombie) LeaseRenew(ctx context.Context, ref store.LeaseRef, ttl time.Duration) error {
	if z.cut.Load() {
		return errors.New("cut off")
	}
	return z.Store.LeaseRenew(ctx, ref, ttl)
}

func (z *zombie) CountersAdvance(ctx context.Context, to store.CounterPosition, adv []store.CounterAdvance) (store.CountersAdvanced, error) {
	if z.cut.Load() {
		z.once.Do(func() { close(z.held) })
		<-z.release
		return z.Store.CountersAdvance(context.WithoutCancel(ctx), to, adv)
	}
	return z.Store.CountersAdvance(ctx, to, adv)
}

// A deposed projector's batch written after its successor applied the same
// events is not counted twice: each queue's counters move only from the
// position the batch was folded from, so the late write finds the queues
// its successor moved and leaves them (and the deposed term ends at its
// next fenced write).
func TestADeposedProjectorsLateBatchIsNotCountedTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	z := &zombie{Store: s, held: make(chan struct{}), release: make(chan struct{})}
	var released sync.Once
	open := func() { released.Do(func() { close(z.release) }) }
	logs := &logBuf{}
	queues := []bson.ObjectID{newQueue(t, db, "a", 0, true), newQueue(t, db, "b", 0, true), newQueue(t, db, "c", 0, true)}
	first := projections.New(projections.Config{Node: "first", Store: z, LeaseTTL: 2 * time.Second, Logger: logger(logs)})
	require.NoError(t, first.Start(ctx))
	t.Cleanup(first.Stop)
	t.Cleanup(open) // before Stop: the held batch must end for the term to
	require.Eventually(t, func() bool { return first.Stats().Leader }, 5*time.Second, 10*time.Millisecond)
	second := projections.New(projections.Config{Node: "second", Store: s, LeaseTTL: 2 * time.Second, Logger: logger(logs)})
	require.NoError(t, second.Start(ctx))
	t.Cleanup(second.Stop)

	stop := writer(t, db, queues)
	require.Eventually(t, func() bool { return first.Stats().Events > 200 }, 20*time.Second, 10*time.Millisecond)
	z.cut.Store(true)
	select {
	case <-z.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the cut-off projector's next batch never came")
	}
	require.Eventually(t, func() bool { return second.Stats().Leader }, 10*time.Second, 20*time.Millisecond, "the successor never took the lease")
	require.Eventually(t, func() bool { return second.Stats().Events > 500 }, 20*time.Second, 10*time.Millisecond, "the successor applied too little")
	open() // the late batch lands now
	time.Sleep(time.Second)
	stop()
	requireExact(t, s, 30*time.Second)
	require.Contains(t, logs.String(), "queue counters moved by another projector term", "the late batch found no queue moved: it did not test the fence")
	require.Zero(t, second.Stats().DriftQueues, "a recount found the counters off (counted twice?):\n%s", logs)
}

// inserter inserts tasks into queues, in turn, one at a time, until
// stopped (also at the test's end): events that need no pre-images, so
// the projector recounts nothing of its own accord.
func inserter(t *testing.T, db *mongo.Database, queues []bson.ObjectID) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			_, _ = db.Collection(schema.CollTasks).InsertOne(ctx, bson.D{{Key: "queue", Value: queues[i%len(queues)]}, {Key: "status", Value: -2}, {Key: "node", Value: -1}})
		}
	})
	stop = func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return stop
}

// movedOnce is a store whose first batch, once armed, finds every queue
// moved by another term, and whose recounts then fail until let go. It
// counts the checkpoints written since the move (by LeaseCheckpoint, or
// with a recount's sets), and keeps when the last one before it was
// written: a batch applied a checkpoint period after that would have
// written one but for the pending recount.
type movedOnce struct {
	*store.Store
	armed, moved, recountsOK atomic.Bool
	movedAt                  atomic.Uint64 // the moved batch's end, T<<32 | I
	lastCheckpoint           atomic.Int64  // UnixNano, the last one written before the move
	afterMove                atomic.Int64
}

func (s *movedOnce) CountersAdvance(ctx context.Context, to store.CounterPosition, adv []store.CounterAdvance) (store.CountersAdvanced, error) {
	res, err := s.Store.CountersAdvance(ctx, to, adv)
	if err != nil || !s.armed.Load() {
		return res, err
	}
	if !s.moved.Load() {
		res.Moved = map[bson.ObjectID]*store.CounterPosition{}
		for _, a := range adv {
			res.Moved[a.Delta.Queue] = &to // as if another term had applied it
		}
		s.movedAt.Store(uint64(to.Time.T)<<32 | uint64(to.Time.I))
		s.moved.Store(true)
	}
	return res, err
}

func (s *movedOnce) QueueRecount(ctx context.Context, p store.QueueRecountParams) (store.Recount, error) {
	if s.moved.Load() && !s.recountsOK.Load() {
		return store.Recount{}, errors.New("recount refused by the test")
	}
	return s.Store.QueueRecount(ctx, p)
}

// checkpointed counts a checkpoint written at at: past the moved batch,
// or before it (one started before the move may land after it).
func (s *movedOnce) checkpointed(at bson.Timestamp) {
	if s.moved.Load() && uint64(at.T)<<32|uint64(at.I) >= s.movedAt.Load() {
		s.afterMove.Add(1)
		return
	}
	s.lastCheckpoint.Store(time.Now().UnixNano())
}

func (s *movedOnce) LeaseCheckpoint(ctx context.Context, ref store.LeaseRef, checkpoint bson.Raw, at bson.Timestamp) error {
	err := s.Store.LeaseCheckpoint(ctx, ref, checkpoint, at)
	if err == nil {
		s.checkpointed(at)
	}
	return err
}

func (s *movedOnce) CountersSet(ctx context.Context, p store.CountersSetParams) error {
	err := s.Store.CountersSet(ctx, p)
	if err == nil {
		s.checkpointed(p.CheckpointTime)
	}
	return err
}

// The checkpoint does not pass a batch whose queues another term moved
// until they are recounted: a successor resuming after it would never
// read their events again.
func TestNoCheckpointPastQueuesStillToRecount(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	s := &movedOnce{Store: store.New(db, store.Options{})}
	s.lastCheckpoint.Store(time.Now().UnixNano())
	queues := []bson.ObjectID{newQueue(t, db, "a", 0, true), newQueue(t, db, "b", 0, true)}
	svc := started(t, s, projections.Config{PreImagesIdle: time.Nanosecond})
	require.Eventually(t, func() bool { return svc.Stats().Steady }, 20*time.Second, 10*time.Millisecond, "never steady")
	// Inserts only: they need no pre-images, so no batch asks for a full
	// recount, which would hold the checkpoint back for its own reason.
	stop := inserter(t, db, queues)

	s.armed.Store(true)
	require.Eventually(t, s.moved.Load, 10*time.Second, 10*time.Millisecond, "no batch came")
	// The moved queues are held out of the batches until recounted, so
	// the batches applied are counted from the stats, not the store.
	var late int64
	require.Eventually(t, func() bool {
		if late == 0 && time.Since(time.Unix(0, s.lastCheckpoint.Load())) > 1200*time.Millisecond {
			late = svc.Stats().Batches
		}
		return late > 0 && svc.Stats().Batches >= late+3
	}, 20*time.Second, 10*time.Millisecond, "no batch came a checkpoint period after the last checkpoint")
	require.Zero(t, s.afterMove.Load(), "a checkpoint passed queues still to recount")
	s.recountsOK.Store(true)
	require.Eventually(t, func() bool { return s.afterMove.Load() > 0 }, 10*time.Second, 10*time.Millisecond, "no checkpoint once recounted")
	stop()
	requireExact(t, s.Store, 30*time.Second)
}

// movedInside is a store that, once armed, moves one queue's counters to
// a position of its own just before the next batch for it is written (as
// a deposed term's late batch would, here one that held no events of the
// queue: the counts stay), and then refuses recounts until let go. It
// counts the batches written after the move.
type movedInside struct {
	*store.Store
	db                       *mongo.Database
	armed, moved, recountsOK atomic.Bool
	queue                    bson.ObjectID
	pos                      store.CounterPosition
	after                    atomic.Int64
}

func (s *movedInside) CountersAdvance(ctx context.Context, to store.CounterPosition, adv []store.CounterAdvance) (store.CountersAdvanced, error) {
	if s.moved.Load() {
		s.after.Add(1)
	} else if s.armed.Load() {
		for _, a := range adv {
			if a.From == nil {
				continue
			}
			// Just past the batch's From and before its first event: the
			// counts hold exactly the events up to it.
			s.queue, s.pos = a.Delta.Queue, store.CounterPosition{Time: a.From.Time, Token: a.From.Token + "0"}
			_, err := s.db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: s.queue}},
				bson.D{{Key: "$set", Value: bson.D{{Key: schema.QueueCountsApplied, Value: bson.D{{Key: "t", Value: s.pos.Time}, {Key: "token", Value: s.pos.Token}}}}}})
			if err != nil {
				return store.CountersAdvanced{}, err
			}
			s.moved.Store(true)
			break
		}
	}
	return s.Store.CountersAdvance(ctx, to, adv)
}

func (s *movedInside) QueueRecount(ctx context.Context, p store.QueueRecountParams) (store.Recount, error) {
	if s.moved.Load() && !s.recountsOK.Load() {
		return store.Recount{}, errors.New("recount refused by the test")
	}
	return s.Store.QueueRecount(ctx, p)
}

// A queue another term moved is held out of the batches until its
// recount: its position may lie inside the batch that found it moved,
// whose events for it were not added, so a later batch advanced from that
// position would claim them without them.
func TestAQueueAnotherTermMovedIsHeldUntilItsRecount(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	s := &movedInside{Store: store.New(db, store.Options{}), db: db}
	queues := []bson.ObjectID{newQueue(t, db, "a", 0, true), newQueue(t, db, "b", 0, true)}
	svc := started(t, s, projections.Config{PreImagesIdle: time.Nanosecond})
	require.Eventually(t, func() bool { return svc.Stats().Steady }, 20*time.Second, 10*time.Millisecond, "never steady")
	stop := inserter(t, db, queues)
	require.Eventually(t, func() bool { return svc.Stats().Events > 50 }, 20*time.Second, 10*time.Millisecond, "no events")

	s.armed.Store(true)
	require.Eventually(t, s.moved.Load, 10*time.Second, 10*time.Millisecond, "no batch came")
	require.Eventually(t, func() bool { return s.after.Load() >= 5 }, 20*time.Second, 10*time.Millisecond, "no batches after the move")
	stop()
	stored, err := s.QueueCounters(context.Background())
	require.NoError(t, err)
	got := stored[s.queue].Applied
	require.NotNil(t, got)
	require.Equal(t, s.pos, *got, "the moved queue's counters were advanced from the other term's position before their recount")

	s.recountsOK.Store(true)
	requireExact(t, s.Store, 30*time.Second)
}

// checkpointHeld is a store whose checkpoints wait at its gate once armed,
// counting those in flight, and whose next checkpoint, once lose is set,
// fails as a lost lease would.
type checkpointHeld struct {
	*store.Store
	g                          *gate
	armed, lose, fail          atomic.Bool
	inFlight, mostNow, written atomic.Int64
}

func (s *checkpointHeld) LeaseCheckpoint(ctx context.Context, ref store.LeaseRef, checkpoint bson.Raw, at bson.Timestamp) error {
	if s.lose.CompareAndSwap(true, false) {
		return fmt.Errorf("test: %w", store.ErrLeaseLost)
	}
	if s.fail.CompareAndSwap(true, false) {
		return errors.New("test: the connection was reset")
	}
	defer s.written.Add(1)
	if s.armed.Load() {
		n := s.inFlight.Add(1)
		defer s.inFlight.Add(-1)
		for m := s.mostNow.Load(); n > m && !s.mostNow.CompareAndSwap(m, n); m = s.mostNow.Load() {
		}
		if err := s.g.pass(ctx); err != nil {
			return err
		}
	}
	return s.Store.LeaseCheckpoint(ctx, ref, checkpoint, at)
}

// The lease's checkpoint is written off the batches' path: while one is
// held, batches go on being applied, and no second is started; a
// checkpoint that finds the lease lost still ends the term.
func TestACheckpointDoesNotHoldBatchesBack(t *testing.T) {
	t.Parallel()
	s, svc, logs, db, queues, stop := checkpointHeldInserting(t)

	s.armed.Store(true)
	select {
	case <-s.g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no checkpoint was written")
	}
	held := svc.Stats().Batches
	require.Eventually(t, func() bool { return svc.Stats().Batches >= held+20 }, 20*time.Second, 10*time.Millisecond,
		"batches stopped while the checkpoint was held")
	time.Sleep(1500 * time.Millisecond) // over a checkpoint period, batches still coming
	require.EqualValues(t, 1, s.mostNow.Load(), "a second checkpoint was started while one was in flight")
	s.g.open()
	stop()
	requireExact(t, s.Store, 30*time.Second)

	require.Equal(t, 1, strings.Count(logs.String(), "projector lease acquired"))
	s.lose.Store(true)
	inserter(t, db, queues)
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "projector lease acquired") == 2 }, 20*time.Second, 10*time.Millisecond,
		"the term went on after its checkpoint found the lease lost:\n%s", logs)
	require.Contains(t, logs.String(), "projector lease lost")
}

// checkpointHeldInserting starts a projector over a checkpointHeld
// store, waits until it is steady, and starts an inserter into two
// queues.
func checkpointHeldInserting(t *testing.T) (*checkpointHeld, *projections.Service, *logBuf, *mongo.Database, []bson.ObjectID, func()) {
	t.Helper()
	db := mongotest.Database(t)
	logs := &logBuf{}
	s := &checkpointHeld{Store: store.New(db, store.Options{}), g: newGate()}
	t.Cleanup(s.g.open)
	queues := []bson.ObjectID{newQueue(t, db, "a", 0, true), newQueue(t, db, "b", 0, true)}
	svc := started(t, s, projections.Config{PreImagesIdle: time.Nanosecond, Logger: logger(logs)})
	require.Eventually(t, func() bool { return svc.Stats().Steady }, 20*time.Second, 10*time.Millisecond, "never steady")
	return s, svc, logs, db, queues, inserter(t, db, queues)
}

// A checkpoint that fails for another reason than the lease's loss does
// not end the term: the next one, a period later, is written.
func TestAFailedCheckpointIsRetriedWithoutEndingTheTerm(t *testing.T) {
	t.Parallel()
	s, _, logs, _, _, stop := checkpointHeldInserting(t)

	s.fail.Store(true)
	require.Eventually(t, func() bool { return !s.fail.Load() }, 10*time.Second, 10*time.Millisecond, "no checkpoint was tried")
	written := s.written.Load()
	require.Eventually(t, func() bool { return s.written.Load() > written }, 10*time.Second, 10*time.Millisecond, "no checkpoint after the failed one")
	stop()
	requireExact(t, s.Store, 30*time.Second)
	require.Equal(t, 1, strings.Count(logs.String(), "projector lease acquired"), "the failed checkpoint ended the term:\n%s", logs)
	require.Contains(t, logs.String(), "projector checkpoint not written: the next one tries again")
	require.Contains(t, logs.String(), "the connection was reset")
}

// A reply cut short by MaxBatch can end inside a transaction (its events
// share one moment). A recount at that moment holds the whole transaction
// while the counters hold part of it, and would log the difference as
// drift: so a recount waits for a batch that held all there was.
func TestNoDriftFromABatchThatCutATransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A recount after every batch it may follow, and replies of 100.
	r := steadyWithAQueue(t, projections.Config{MaxBatch: 100, ReconcileEvery: time.Nanosecond})
	db, s, logs, q, svc := r.db, r.s, r.logs, r.q, r.svc

	batches := svc.Stats().Batches
	sess, err := db.Client().StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		docs := make([]any, 250)
		for i := range docs {
			docs[i] = bson.D{{Key: "queue", Value: q}, {Key: "status", Value: -2}, {Key: "node", Value: -1}}
		}
		return db.Collection(schema.CollTasks).InsertMany(ctx, docs)
	})
	require.NoError(t, err)
	requireExact(t, s, 20*time.Second)
	require.Eventually(t, func() bool { return !svc.Stats().Committing && svc.Stats().Events >= 250 }, 10*time.Second, 10*time.Millisecond)
	require.GreaterOrEqual(t, svc.Stats().Batches-batches, int64(3), "the transaction's 250 events came in fewer than three batches: nothing was cut")
	require.Zero(t, svc.Stats().DriftQueues, "a recount took the cut transaction for drift:\n%s", logs)
	require.NotContains(t, logs.String(), "counter drift repaired")
}

// The periodic recount checks every queue: counters changed by hand
// (drift) are repaired, and counted as drift, without any event of
// their queue to trigger it.
func TestThePeriodicRecountRepairsEveryQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := steadyWithAQueue(t, projections.Config{ReconcileEvery: 300 * time.Millisecond})
	db, s, logs, q, svc := r.db, r.s, r.logs, r.q, r.svc
	insertBurst(t, db, q, 0, 5, func(int) any { return -2 })
	requireExact(t, s, 10*time.Second)
	require.Zero(t, svc.Stats().DriftQueues)

	// Changed by hand: no event of the projector's stream says so.
	_, err := db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: q}}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.QueueCountTodo, Value: int64(999)}}}})
	require.NoError(t, err)
	requireExact(t, s, 10*time.Second)
	// Counted just after the repair's commit.
	require.Eventually(t, func() bool { return svc.Stats().DriftQueues == 1 }, 5*time.Second, 10*time.Millisecond, "the repair was not counted as drift:\n%s", logs)
	require.Contains(t, logs.String(), "counter drift repaired")
}

// steadyRun is a projector, steady, over a fresh database with one queue.
type steadyRun struct {
	db   *mongo.Database
	s    *store.Store
	logs *logBuf
	q    bson.ObjectID
	svc  *projections.Service
}

// steadyWithAQueue starts a projector with cfg (pre-images off as soon as
// it may, its log kept) over a fresh database with one queue whose
// counters are zero, and waits until it is steady.
func steadyWithAQueue(t *testing.T, cfg projections.Config) steadyRun {
	t.Helper()
	r := steadyRun{db: mongotest.Database(t), logs: &logBuf{}}
	r.s = store.New(r.db, store.Options{})
	r.q = newQueue(t, r.db, "a", 0, true)
	cfg.PreImagesIdle, cfg.Logger = time.Nanosecond, logger(r.logs)
	r.svc = started(t, r.s, cfg)
	require.Eventually(t, func() bool { return r.svc.Stats().Steady }, 20*time.Second, 10*time.Millisecond, "never steady")
	return r
}

// recountGated is a store that holds its next recount at a stream
// position, once asked to, at a gate; the others pass. It can fail its
// next read of the counters.
type recountGated struct {
	*store.Store
	next atomic.Pointer[heldRecount]
	// countersErr: the next QueueCounters' answer, once (nil: the store's).
	countersErr atomic.Pointer[error]
}

func (s *recountGated) QueueCounters(ctx context.Context) (map[bson.ObjectID]store.StoredCounters, error) {
	if err := s.countersErr.Swap(nil); err != nil {
		return nil, *err
	}
	return s.Store.QueueCounters(ctx)
}

// heldRecount is a recount to hold: at g, then answering err (nil: the
// store's answer).
type heldRecount struct {
	g   *gate
	err error
}

func (s *recountGated) QueueRecount(ctx context.Context, p store.QueueRecountParams) (store.Recount, error) {
	if p.At != nil {
		if h := s.next.Swap(nil); h != nil {
			if err := h.g.pass(ctx); err != nil {
				return store.Recount{}, err
			}
			if h.err != nil {
				return store.Recount{}, h.err
			}
		}
	}
	return s.Store.QueueRecount(ctx, p)
}

// holdNext holds the next recount at a stream position, answering err
// once let go (nil: the store's answer), and returns its gate, which the
// test's end opens.
func (s *recountGated) holdNext(t *testing.T, err error) *gate {
	t.Helper()
	g := newGate()
	t.Cleanup(g.open) // before Stop (registered earlier, run later)
	s.next.Store(&heldRecount{g: g, err: err})
	return g
}

// entered waits until a recount is held at g.
func entered(t *testing.T, g *gate) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no recount began")
	}
}

// periodicRecountHeld starts a projector (a periodic recount every 300
// ms) over a fresh database with queue "a" (and a queue of each name in
// more, their ids returned in order) whose counters are zero, waits until
// it is steady, and holds its next periodic recount at the returned gate
// (opened at the test's end), which then answers err (nil: the store's
// answer).
func periodicRecountHeld(t *testing.T, err error, more ...string) (*mongo.Database, *recountGated, bson.ObjectID, *projections.Service, *logBuf, *gate, []bson.ObjectID) {
	t.Helper()
	db, logs := mongotest.Database(t), &logBuf{}
	s := &recountGated{Store: store.New(db, store.Options{})}
	q := newQueue(t, db, "a", 0, true)
	var others []bson.ObjectID
	for _, name := range more {
		others = append(others, newQueue(t, db, name, 0, true))
	}
	svc := started(t, s, projections.Config{ReconcileEvery: 300 * time.Millisecond, PreImagesIdle: time.Nanosecond, Logger: logger(logs)})
	require.Eventually(t, func() bool { return svc.Stats().Steady }, 20*time.Second, 10*time.Millisecond, "never steady")
	g := s.holdNext(t, err)
	entered(t, g)
	return db, s, q, svc, logs, g, others
}

// retriedAfterTheBackoff lets the recount held at g go, requires that it
// fails (the warning naming errText) and that the next recount comes only
// after the backoff's wait (1 s, less a fifth at most), not at the next
// period (300 ms), then lets that one go and requires it compared, without
// drift.
func retriedAfterTheBackoff(t *testing.T, s *recountGated, svc *projections.Service, logs *logBuf, g *gate, errText string) {
	t.Helper()
	reconciles := svc.Stats().Reconciles
	next := s.holdNext(t, nil)
	failed := time.Now()
	g.open()
	entered(t, next)
	waited := time.Since(failed)
	require.Contains(t, logs.String(), `msg="periodic recount failed; retrying later" component=projector error="`+errText+`" retry_in=`)
	require.GreaterOrEqual(t, waited, 800*time.Millisecond, "retried before the backoff's wait:\n%s", logs)
	require.EqualValues(t, 1, svc.Stats().RecountFailures)

	next.open()
	require.Eventually(t, func() bool { return svc.Stats().Reconciles > reconciles }, 10*time.Second, 10*time.Millisecond, "the retry was never compared")
	require.Zero(t, svc.Stats().DriftQueues, logs.String())
}

// TestThePeriodicRecountLetsTheBatchesGoOn: the periodic recount of a
// steady term is read in the background: while it is held, the batches
// are still applied. A change by hand meanwhile is found against the
// counters less what those batches added, repaired as drift, and the
// counters come out exact.
func TestThePeriodicRecountLetsTheBatchesGoOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s, q, svc, logs, g, _ := periodicRecountHeld(t, nil)

	insertBurst(t, db, q, 0, 5, func(int) any { return -2 })
	requireExact(t, s.Store, 10*time.Second) // applied while the recount is held
	_, err := db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: q}}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.QueueCountTodo, Value: int64(999)}}}})
	require.NoError(t, err)
	insertBurst(t, db, q, 5, 2, func(int) any { return -2 })
	require.Eventually(t, func() bool {
		stored, err := s.QueueCounters(ctx)
		require.NoError(t, err)
		return *stored[q].Total == 7
	}, 10*time.Second, 10*time.Millisecond, "the last inserts applied")
	require.Zero(t, svc.Stats().DriftQueues)

	g.open()
	requireExact(t, s.Store, 10*time.Second)
	require.Eventually(t, func() bool { return svc.Stats().DriftQueues == 1 }, 5*time.Second, 10*time.Millisecond, "the repair was not counted as drift:\n%s", logs)
	require.Contains(t, logs.String(), `msg="counter drift repaired" component=projector queue=`+q.Hex()+` count_todo=1001 recount_todo=7`)
	require.Never(t, func() bool { return svc.Stats().DriftQueues > 1 }, time.Second, 50*time.Millisecond, "drift found again: "+logs.String())
}

// TestABackgroundRecountLeavesOutQueuesRecountedMeanwhile: a queue that a
// batch finds without a counter while the periodic recount is read in the
// background is recounted between batches, at a later moment; the
// background recount leaves it out, where comparing it would take the
// later events for drift and set it wrong.
func TestABackgroundRecountLeavesOutQueuesRecountedMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s, q, svc, logs, g, _ := periodicRecountHeld(t, nil)
	reconciles := svc.Stats().Reconciles

	insertBurst(t, db, q, 0, 2, func(int) any { return -2 })
	requireExact(t, s.Store, 10*time.Second)
	_, err := db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: q}}, bson.D{{Key: "$unset", Value: bson.D{{Key: schema.QueueCountFailed, Value: ""}}}})
	require.NoError(t, err)
	insertBurst(t, db, q, 2, 1, func(int) any { return -2 })
	requireExact(t, s.Store, 10*time.Second) // recounted between batches
	// Counted just after its commit.
	require.Eventually(t, func() bool { return svc.Stats().Reconciles == reconciles+1 }, 5*time.Second, 10*time.Millisecond, "the queue's own recount")
	insertBurst(t, db, q, 3, 1, func(int) any { return -2 })
	requireExact(t, s.Store, 10*time.Second)

	g.open()
	require.Eventually(t, func() bool { return svc.Stats().Reconciles >= reconciles+2 }, 10*time.Second, 10*time.Millisecond, "the background recount was never compared")
	requireExact(t, s.Store, 10*time.Second)
	require.Zero(t, svc.Stats().DriftQueues, logs.String())
}

// TestABackgroundRecountIsDroppedAfterARecountOfEveryQueue: a change the
// projector cannot place (another program's, without a pre-image) while
// the periodic recount is read in the background makes it recount every
// queue between batches; the background recount, older, is dropped, where
// comparing it would take the events since for drift.
func TestABackgroundRecountIsDroppedAfterARecountOfEveryQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, logs := mongotest.Database(t), &logBuf{}
	s := &recountGated{Store: store.New(db, store.Options{})}
	q := newQueue(t, db, "b", 0, true)
	ids := insertBurst(t, db, q, 0, 3, func(int) any { return -2 })
	svc := started(t, s, projections.Config{ReconcileEvery: 300 * time.Millisecond, PreImagesIdle: time.Hour, Logger: logger(logs)})
	require.Eventually(t, func() bool { return svc.Stats().Reconciles >= 1 }, 20*time.Second, 10*time.Millisecond, "never reconciled")
	require.NoError(t, s.TasksPreImagesSet(ctx, false)) // as after PreImagesIdle
	g := s.holdNext(t, nil)
	entered(t, g)
	reconciles := svc.Stats().Reconciles

	insertBurst(t, db, q, 3, 2, func(int) any { return -2 })
	requireExact(t, s.Store, 10*time.Second)
	// Another program's finish, which no pre-image tells the old status of.
	_, err := db.Collection(schema.CollTasks).UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[0]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: int32(1)}}}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return svc.Stats().Reconciles > reconciles }, 10*time.Second, 10*time.Millisecond, "no recount of every queue")
	requireExact(t, s.Store, 10*time.Second)
	insertBurst(t, db, q, 5, 1, func(int) any { return -2 })
	requireExact(t, s.Store, 10*time.Second)

	g.open()
	require.Never(t, func() bool { return svc.Stats().DriftQueues > 0 }, 2*time.Second, 20*time.Millisecond, logs.String())
	requireExact(t, s.Store, 10*time.Second)
}

// TestAFailedBackgroundRecountBacksOff: a periodic recount read in the
// background that fails is retried after the backoff's wait (1 s, less a
// fifth at most), not at the next period (300 ms here), and the warning
// says when.
func TestAFailedBackgroundRecountBacksOff(t *testing.T) {
	t.Parallel()
	_, s, _, svc, logs, g, _ := periodicRecountHeld(t, errors.New("injected failure"))
	retriedAfterTheBackoff(t, s, svc, logs, g, "injected failure")
}

// TestABackgroundRecountPastTheSnapshotHistoryRecountsBetweenBatches: a
// periodic recount whose moment the server no longer keeps (the projector
// idle for longer than its snapshot history) is not a failure to back off
// from: every queue is recounted between two batches at once instead.
func TestABackgroundRecountPastTheSnapshotHistoryRecountsBetweenBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s, q, svc, logs, g, _ := periodicRecountHeld(t, fmt.Errorf("recount: %w", store.ErrSnapshotTooOld))
	next := s.holdNext(t, nil)
	g.open()
	entered(t, next)

	// Between batches: while it is held, no batch is applied.
	insertBurst(t, db, q, 0, 2, func(int) any { return -2 })
	require.Never(t, func() bool {
		stored, err := s.QueueCounters(ctx)
		require.NoError(t, err)
		return *stored[q].Total != 0
	}, time.Second, 50*time.Millisecond, "a batch was applied while the recount of every queue was held:\n%s", logs)
	next.open()
	requireExact(t, s.Store, 10*time.Second)
	require.NotContains(t, logs.String(), "periodic recount failed")
	require.Zero(t, svc.Stats().RecountFailures)
	require.Zero(t, svc.Stats().DriftQueues, logs.String())
}

// TestABackgroundRecountRecountsAQueueAnotherTermMoved: counters that
// another term moved while the periodic recount was read (their position
// is not the one this term applied) are not the comparison's to judge:
// it neither calls them drift nor sets them from its snapshot. It marks
// them for a recount between batches, fenced by the lease, as a batch that
// found them moved would; here no batch for the queue comes after the move
// (its events could net to nothing), and the recount must come anyway.
func TestABackgroundRecountRecountsAQueueAnotherTermMoved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s, a, svc, logs, g, others := periodicRecountHeld(t, nil, "b")
	b := others[0]
	reconciles := svc.Stats().Reconciles

	// Another term's batch for b, as far as b's counters show (b has no
	// task: its true counts are zero). Its increment is one no write of
	// this term's reaches: at I: 1 it could be the very moment this
	// term's first recount set b at (the first write of that second), and
	// the counters would then look this term's own, and the difference
	// drift.
	moved := bson.Timestamp{T: uint32(time.Now().Add(-time.Second).Unix()), I: 1 << 31}
	_, err := db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: b}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: schema.QueueCountTodo, Value: int64(5)}, {Key: schema.QueueCountTotal, Value: int64(5)},
		{Key: schema.QueueCountsApplied, Value: bson.D{{Key: "t", Value: moved}, {Key: "token", Value: ""}}}}}})
	require.NoError(t, err)
	insertBurst(t, db, a, 0, 1, func(int) any { return -2 })
	require.Eventually(t, func() bool {
		stored, err := s.QueueCounters(ctx)
		require.NoError(t, err)
		return *stored[a].Total == 1
	}, 10*time.Second, 10*time.Millisecond, "a's insert applied")

	g.open()
	require.Eventually(t, func() bool { return svc.Stats().Reconciles > reconciles+1 }, 10*time.Second, 10*time.Millisecond,
		"the background recount, then b's own, were never done:\n%s", logs)
	require.Contains(t, logs.String(), `msg="queue counters moved by another projector term: recounting the queue" component=projector queue=`+b.Hex())
	require.Zero(t, svc.Stats().DriftQueues, "another term's progress taken for drift:\n%s", logs)
	stored, err := s.QueueCounters(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(0), *stored[b].Todo, "b never recounted:\n%s", logs)
	require.NotEqual(t, moved, stored[b].Applied.Time, "b's position is still the other term's")
	requireExact(t, s.Store, 10*time.Second)
}

// TestAFailedBackgroundRepairBacksOffWithoutEndingTheTerm: when the
// comparison of a background recount fails (here its read of the stored
// counters), the recount is retried after the backoff's wait, as a failed
// read is; the term goes on (it ends for the lease's loss alone, where a
// new term would recount every queue between batches).
func TestAFailedBackgroundRepairBacksOffWithoutEndingTheTerm(t *testing.T) {
	t.Parallel()
	_, s, _, svc, logs, g, _ := periodicRecountHeld(t, nil)
	injected := errors.New("injected read failure")
	s.countersErr.Store(&injected)
	retriedAfterTheBackoff(t, s, svc, logs, g, "injected read failure")
	require.Equal(t, 1, strings.Count(logs.String(), "projector lease acquired"), "the term ended:\n%s", logs)
}

// catchUpHeld starts a projector (no periodic recount within the test)
// over a fresh database with one queue whose counters are zero, holding
// its term's catch-up recount at the returned gate once it begins; the
// held recount answers err (nil: the store's answer).
func catchUpHeld(t *testing.T, err error) (*mongo.Database, *recountGated, bson.ObjectID, *projections.Service, *logBuf, *gate) {
	t.Helper()
	db, logs := mongotest.Database(t), &logBuf{}
	s := &recountGated{Store: store.New(db, store.Options{})}
	q := newQueue(t, db, "a", 0, true)
	g := s.holdNext(t, err)
	svc := started(t, s, projections.Config{ReconcileEvery: time.Hour, PreImagesIdle: time.Nanosecond, Logger: logger(logs)})
	entered(t, g)
	return db, s, q, svc, logs, g
}

// TestTheCatchUpRecountLetsTheBatchesGoOn: the recount a term takes once
// it has caught up (0.6 s over 1,000,000 tasks) is read in the
// background too: while it is held the batches are applied, the term is
// not yet steady, and a change by hand meanwhile is repaired as drift
// once it is compared.
func TestTheCatchUpRecountLetsTheBatchesGoOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s, q, svc, logs, g := catchUpHeld(t, nil)

	insertBurst(t, db, q, 0, 3, func(int) any { return -2 })
	requireExact(t, s.Store, 10*time.Second) // applied while the recount is held
	_, err := db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: q}}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.QueueCountTodo, Value: int64(999)}}}})
	require.NoError(t, err)
	require.False(t, svc.Stats().Steady, "steady before its catch-up recount was compared")

	g.open()
	require.Eventually(t, func() bool { return svc.Stats().Steady }, 10*time.Second, 10*time.Millisecond, "never steady:\n%s", logs)
	requireExact(t, s.Store, 10*time.Second)
	require.Eventually(t, func() bool { return svc.Stats().DriftQueues == 1 }, 5*time.Second, 10*time.Millisecond, "the repair was not counted as drift:\n%s", logs)
}

// TestAFailedCatchUpRecountIsTriedAgain: a catch-up recount read in the
// background that fails is tried again, as the catch-up recount, after
// the backoff's wait (not at the next period, an hour here); the term is
// steady once that one is compared.
func TestAFailedCatchUpRecountIsTriedAgain(t *testing.T) {
	t.Parallel()
	_, s, _, svc, logs, g := catchUpHeld(t, errors.New("injected failure"))
	next := s.holdNext(t, nil)
	g.open()
	entered(t, next)
	require.Contains(t, logs.String(), `msg="catch-up recount failed; retrying later" component=projector error="injected failure" retry_in=`)
	require.False(t, svc.Stats().Steady, "steady without a catch-up recount compared")

	next.open()
	require.Eventually(t, func() bool { return svc.Stats().Steady }, 10*time.Second, 10*time.Millisecond, "never steady:\n%s", logs)
	require.EqualValues(t, 1, svc.Stats().RecountFailures)
}
