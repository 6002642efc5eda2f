package events_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.uber.org/goleak"

	"github.com/disbatch-go/disbatch/events"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/internal/lifecycle/lifecycletest"
	"github.com/disbatch-go/disbatch/internal/mongod"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// wait is how long an event that should come may take: change streams see
// majority-committed writes within milliseconds, this is for slow CI.
const wait = 10 * time.Second

// majority is the write concern of direct writes, as the store uses.
var majority = options.Collection().SetWriteConcern(writeconcern.Majority())

func TestEventsOfEachChange(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	db := mongotest.Database(t)
	st := store.New(db, store.Options{})
	bus := newBus(t)
	c := collect(t, bus)
	s := startStream(t, events.Config{Store: st, Publisher: bus, Name: "n1"})
	tasks, queues := db.Collection(schema.CollTasks, majority), db.Collection(schema.CollQueues, majority)

	// Queue insert, update.
	q, err := st.QueueCreate(ctx, store.QueueCreateParams{Name: "q1", Constructor: "C"})
	require.NoError(t, err)
	require.Equal(t, got{events.TopicQueues, events.QueueChanged{Op: events.OpInsert, ID: q.ID}}, c.next(t, wait))
	name := "q1-renamed"
	require.NoError(t, st.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, Name: &name}))
	require.Equal(t, got{events.TopicQueues, events.QueueChanged{Op: events.OpUpdate, ID: q.ID}}, c.next(t, wait))
	q2, err := st.QueueCreate(ctx, store.QueueCreateParams{Name: "q2", Constructor: "C"})
	require.NoError(t, err)
	require.Equal(t, got{events.TopicQueues, events.QueueChanged{Op: events.OpInsert, ID: q2.ID}}, c.next(t, wait))

	// Task insert: queue, status -2, node -1 and the time.
	ids := insertTasks(t, st, q.ID, 2)
	for _, id := range ids {
		tc := requireTask(t, c.next(t, wait), events.OpInsert, id, q.ID, statusPtr(schema.StatusQueued))
		require.True(t, tc.NodeMinusOne)
	}

	// A claim, a start, a finish: no work for anybody, so no event.
	claimed, err := st.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.Equal(t, ids[0], claimed.ID)

	// Updates that leave status and queue alone send nothing either: the
	// next event is the marker written after them.
	_, err = tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[0]}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: schema.TaskParameters, Value: bson.D{{Key: "x", Value: 1}}},
		{Key: schema.TaskMTime, Value: time.Now()},
	}}})
	require.NoError(t, err)
	_, err = tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[0]}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: schema.TaskStdout, Value: strings.Repeat("out ", 1000)},
	}}})
	require.NoError(t, err)
	_, err = tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[1]}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: schema.TaskNode, Value: "elsewhere"},
	}}})
	require.NoError(t, err)
	name = "marker"
	require.NoError(t, st.QueueUpdate(ctx, store.QueueUpdateParams{ID: q2.ID, Name: &name}))
	require.Equal(t, got{events.TopicQueues, events.QueueChanged{Op: events.OpUpdate, ID: q2.ID}}, c.next(t, wait),
		"an update of neither status nor queue made an event")

	// A move to another queue: the queue, no status.
	_, err = tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[1]}}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskQueue, Value: q2.ID}}}})
	require.NoError(t, err)
	requireTask(t, c.next(t, wait), events.OpUpdate, ids[1], q2.ID, nil)

	// Back to the queue ($set of status and node): the status.
	_, err = tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[0]}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
		{Key: schema.TaskNode, Value: schema.Unclaimed},
	}}})
	require.NoError(t, err)
	tc := requireTask(t, c.next(t, wait), events.OpUpdate, ids[0], bson.ObjectID{}, statusPtr(schema.StatusQueued))
	require.True(t, tc.NodeMinusOne, "the update shows node -1")

	// A task as Disbatch 4.103 queues it: node null.
	perl, err := tasks.InsertOne(ctx, bson.D{{Key: schema.TaskQueue, Value: q.ID}, {Key: schema.TaskStatus, Value: int32(schema.StatusQueued)}, {Key: schema.TaskNode, Value: nil}})
	require.NoError(t, err)
	tc = requireTask(t, c.next(t, wait), events.OpInsert, perl.InsertedID.(bson.ObjectID), q.ID, statusPtr(schema.StatusQueued))
	require.False(t, tc.NodeMinusOne, "node null")

	// A task delete: neither queue nor status.
	_, err = tasks.DeleteOne(ctx, bson.D{{Key: "_id", Value: ids[1]}})
	require.NoError(t, err)
	requireTask(t, c.next(t, wait), events.OpDelete, ids[1], bson.ObjectID{}, nil)

	// A queue delete.
	_, err = queues.DeleteOne(ctx, bson.D{{Key: "_id", Value: q2.ID}})
	require.NoError(t, err)
	require.Equal(t, got{events.TopicQueues, events.QueueChanged{Op: events.OpDelete, ID: q2.ID}}, c.next(t, wait))

	// Writes to other collections of the database send nothing either.
	_, err = db.Collection("other", majority).InsertOne(ctx, bson.D{{Key: "status", Value: -2}, {Key: "queue", Value: q.ID}})
	require.NoError(t, err)
	_, err = queues.DeleteOne(ctx, bson.D{{Key: "_id", Value: q.ID}})
	require.NoError(t, err)
	require.Equal(t, got{events.TopicQueues, events.QueueChanged{Op: events.OpDelete, ID: q.ID}}, c.next(t, wait))

	// The counter goes up once the bus took the event.
	eventually(t, func() bool { return s.Stats().Events == 12 }, wait, time.Millisecond)
	require.Equal(t, events.Stats{Events: 12}, s.Stats())
	select {
	case g := <-c.ch:
		t.Fatalf("unexpected event %v", g)
	default:
	}
}

func TestResumeAfterRestart(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	db := mongotest.Database(t)
	st := store.New(db, store.Options{})
	q := bson.NewObjectID()

	_, err := st.StreamTokenGet(ctx, "n1")
	require.ErrorIs(t, err, store.ErrNotFound)

	bus1 := newBus(t)
	c1 := collect(t, bus1)
	s1 := startStream(t, events.Config{Store: st, Publisher: bus1, Name: "n1", SaveEvery: time.Hour})
	before := insertTasks(t, st, q, 1)[0]
	requireTask(t, c1.next(t, wait), events.OpInsert, before, q, statusPtr(schema.StatusQueued))
	s1.Stop()
	tok, err := st.StreamTokenGet(ctx, "n1")
	require.NoError(t, err, "no token saved on Stop")
	require.NotEmpty(t, tok.Lookup("_data").StringValue())

	// Written while no stream runs.
	missed := insertTasks(t, st, q, 3)
	// Another stream's token is not this one's.
	_, err = st.StreamTokenGet(ctx, "n2")
	require.ErrorIs(t, err, store.ErrNotFound)

	bus2 := newBus(t)
	c2 := collect(t, bus2)
	s2 := startStream(t, events.Config{Store: st, Publisher: bus2, Name: "n1"})
	for _, id := range missed {
		requireTask(t, c2.next(t, wait), events.OpInsert, id, q, statusPtr(schema.StatusQueued))
	}
	after := insertTasks(t, st, q, 1)[0]
	requireTask(t, c2.next(t, wait), events.OpInsert, after, q, statusPtr(schema.StatusQueued))
	// The counter goes up once the bus took the event.
	eventually(t, func() bool { return s2.Stats().Events == 4 }, wait, time.Millisecond)
	require.Equal(t, events.Stats{Events: 4}, s2.Stats())
}

func TestPostBatchTokenSaved(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	db := mongotest.Database(t)
	st := store.New(db, store.Options{})
	bus := newBus(t)
	c := collect(t, bus)
	const saveEvery, maxAwait = 100 * time.Millisecond, 200 * time.Millisecond
	s := startStream(t, events.Config{Store: st, Publisher: bus, Name: "n1", SaveEvery: saveEvery, MaxAwait: maxAwait})
	other := db.Collection("other", majority)

	// token waits for a saved token other than prev, writing to an
	// unrelated collection meanwhile (which moves the post-batch token on).
	token := func(prev bson.Raw) bson.Raw {
		var tok bson.Raw
		eventually(t, func() bool {
			_, err := other.InsertOne(ctx, bson.D{{Key: "at", Value: time.Now()}})
			require.NoError(t, err)
			tok, err = st.StreamTokenGet(ctx, "n1")
			return err == nil && !slices.Equal(tok, prev)
		}, 20*(saveEvery+maxAwait), 50*time.Millisecond, "saved token never changed from %v", prev)
		return tok
	}
	t1 := token(nil)
	t2 := token(t1)
	t3 := token(t2)
	require.Greater(t, t3.Lookup("_data").StringValue(), t1.Lookup("_data").StringValue(), "tokens move forward")
	require.Zero(t, s.Stats().Events)
	select {
	case g := <-c.ch:
		t.Fatalf("unexpected event %v", g)
	default:
	}

	// A stream restarted from such a token sees what came after it.
	s.Stop()
	last, err := st.StreamTokenGet(ctx, "n1")
	require.NoError(t, err)
	id := insertTasks(t, st, bson.NewObjectID(), 1)[0]
	s2 := startStream(t, events.Config{Store: st, Publisher: bus, Name: "n1"})
	_, skipped := c.until(t, wait, taskEvent(events.OpInsert, id))
	require.Empty(t, skipped)
	require.Zero(t, s2.Stats().Rescans)
	require.GreaterOrEqual(t, last.Lookup("_data").StringValue(), t3.Lookup("_data").StringValue())
}

// eventToken returns the resume token of an insert on another deployment
// (a single-member replica set started for this test and stopped again).
func eventToken(t *testing.T) bson.Raw {
	t.Helper()
	ctx := testContext(t, 2*time.Minute)
	rs, err := mongod.StartReplicaSet(ctx, mongod.Options{ReplSet: "other"})
	require.NoError(t, err)
	defer func() { require.NoError(t, rs.Stop()) }()
	client, err := mongo.Connect(options.Client().ApplyURI(rs.URI()))
	require.NoError(t, err)
	defer func() { require.NoError(t, client.Disconnect(ctx)) }()
	coll := client.Database("elsewhere").Collection(schema.CollTasks, majority)
	cs, err := client.Database("elsewhere").Watch(ctx, mongo.Pipeline{})
	require.NoError(t, err)
	defer cs.Close(ctx)
	_, err = coll.InsertOne(ctx, bson.D{{Key: "status", Value: -2}})
	require.NoError(t, err)
	require.True(t, cs.Next(ctx), "%v", cs.Err())
	return append(bson.Raw(nil), cs.Current.Lookup("_id").Document()...)
}

// TestLostHistoryRescans saves a token the deployment cannot resume from:
// Start publishes a Rescan, and the stream then follows the database from
// now on, saving this deployment's tokens.
func TestLostHistoryRescans(t *testing.T) {
	t.Parallel()
	foreign := eventToken(t)
	raw := func(d bson.D) bson.Raw {
		b, err := bson.Marshal(d)
		require.NoError(t, err)
		return b
	}
	for _, tc := range []struct {
		name  string
		token bson.Raw
		code  int // what MongoDB 6.0 answers
	}{
		// ChangeStreamFatalError: "cannot resume stream; the resume token
		// was not found", when the stream reaches the next event.
		{"token of another deployment", foreign, 280},
		// Tokens the server cannot read: a saved token that is corrupt.
		{"_data not hex", raw(bson.D{{Key: "_data", Value: "zz"}}), 9},                           // FailedToParse
		{"_data not a KeyString", raw(bson.D{{Key: "_data", Value: "00"}}), 50811},               // KeyString format error
		{"no _data", raw(bson.D{{Key: "data", Value: "826B025C45000000192B0229296E04"}}), 40647}, // Bad resume token
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t, time.Minute)
			db := mongotest.Database(t)
			st := store.New(db, store.Options{})
			require.NoError(t, st.StreamTokenSave(ctx, "n1", tc.token))
			bus := newBus(t)
			// A subscriber that re-reads the database on a Rescan must not
			// miss what is written then: insert a task while the Stream
			// waits for the Rescan's ack.
			q := bson.NewObjectID()
			var onRescan atomic.Value // bson.ObjectID
			c := collectHook(t, bus, func(g got) {
				if !isRescan(g) || onRescan.Load() != nil {
					return
				}
				ids, err := st.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q, Parameters: []bson.Raw{nil}})
				if err != nil {
					t.Errorf("insert on rescan: %v", err)
					return
				}
				onRescan.Store(ids[0])
			})
			log := &logs{}
			s := startStream(t, events.Config{Store: st, Publisher: bus, Name: "n1", Logger: slog.New(log), MaxAwait: 200 * time.Millisecond})

			// The server may refuse the token when the stream opens, or only
			// when it reaches a later event: write until the Rescan comes.
			var rescan got
			eventually(t, func() bool {
				insertTasks(t, st, q, 1)
				select {
				case g := <-c.ch:
					if isRescan(g) {
						rescan = g
						return true
					}
					t.Errorf("event before the rescan: %v", g)
				case <-time.After(200 * time.Millisecond):
				}
				return false
			}, wait, time.Millisecond, "no rescan; log:\n%s", log)
			t.Logf("rescan: %+v", rescan.Ev)
			require.Contains(t, rescan.Ev.(events.Rescan).Reason, "history lost")
			answered := false
			for _, se := range log.serverErrors() {
				t.Logf("MongoDB answered: %v", se)
				answered = answered || se.HasErrorCode(tc.code)
			}
			require.True(t, answered, "no error %d in the log:\n%s", tc.code, log)

			// Events flow again: the insert made on the rescan arrives, and
			// the next one (the ones written before the rescan may or may
			// not, depending on when it came).
			id := onRescan.Load().(bson.ObjectID)
			_, skipped := c.until(t, wait, taskEvent(events.OpInsert, id))
			require.Empty(t, skipped)
			id = insertTasks(t, st, q, 1)[0]
			_, skipped = c.until(t, wait, taskEvent(events.OpInsert, id))
			for _, g := range skipped {
				require.Equal(t, events.TopicTasks, g.Topic, "%v", g)
			}
			require.Equal(t, int64(1), s.Stats().Rescans)

			// The new token is this deployment's: it is saved and a restart
			// resumes from it without another rescan.
			s.Stop()
			saved, err := st.StreamTokenGet(ctx, "n1")
			require.NoError(t, err)
			require.NotEqual(t, tc.token, saved)
			id = insertTasks(t, st, q, 1)[0]
			s2 := startStream(t, events.Config{Store: st, Publisher: bus, Name: "n1"})
			_, skipped = c.until(t, wait, taskEvent(events.OpInsert, id))
			require.Empty(t, skipped)
			require.Zero(t, s2.Stats().Rescans)
		})
	}
}

func TestDropRescans(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		drop   func(t *testing.T, db *mongo.Database)
		reason string
	}{
		{"drop of tasks", func(t *testing.T, db *mongo.Database) {
			require.NoError(t, db.Collection(schema.CollTasks).Drop(testContext(t, wait)))
		}, "drop of tasks"},
		{"dropDatabase", func(t *testing.T, db *mongo.Database) {
			require.NoError(t, db.Drop(testContext(t, wait)))
		}, "dropDatabase"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := mongotest.Database(t)
			st := store.New(db, store.Options{})
			bus := newBus(t)
			c := collect(t, bus)
			s := startStream(t, events.Config{Store: st, Publisher: bus, Name: "n1", SaveEvery: 50 * time.Millisecond})
			q := bson.NewObjectID()
			id := insertTasks(t, st, q, 1)[0]
			requireTask(t, c.next(t, wait), events.OpInsert, id, q, statusPtr(schema.StatusQueued))

			tc.drop(t, db)
			_, skipped := c.until(t, wait, func(g got) bool {
				return isRescan(g) && strings.Contains(g.Ev.(events.Rescan).Reason, tc.reason)
			})
			for _, g := range skipped {
				require.True(t, isRescan(g), "%v", g)
			}

			// The collection is created again by the next insert, and the
			// stream still follows it.
			for range 2 {
				id = insertTasks(t, st, q, 1)[0]
				_, skipped = c.until(t, wait, taskEvent(events.OpInsert, id))
				for _, g := range skipped {
					require.True(t, isRescan(g), "%v", g)
				}
			}
			t.Logf("stats %+v", s.Stats())
			require.GreaterOrEqual(t, s.Stats().Rescans, int64(1))
		})
	}
}

// cursorHost follows where a client's change stream commands go.
type cursorHost struct {
	mu   sync.Mutex
	addr string // of the last aggregate or getMore
	log  []string
}

func (h *cursorHost) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName != "aggregate" && e.CommandName != "getMore" {
			return
		}
		addr, _, _ := strings.Cut(e.ConnectionID, "[")
		h.mu.Lock()
		defer h.mu.Unlock()
		if e.CommandName == "aggregate" || addr != h.addr {
			h.log = append(h.log, time.Now().Format("15:04:05.000")+" "+e.CommandName+" "+addr)
		}
		h.addr = addr
	}}
}

func (h *cursorHost) get() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.addr
}

func TestStepDown(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	begin := time.Now()
	rs, err := mongod.StartReplicaSet(ctx, mongod.Options{Members: 3})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rs.Stop()) })
	t.Logf("three-member replica set up in %v", time.Since(begin))
	client, err := mongo.Connect(options.Client().ApplyURI(rs.URI()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(testContext(t, 10*time.Second)) })
	// The stream's client gives up server selection after a second, less
	// than an election takes: then the driver's own resume fails and the
	// Stream's has to do it.
	cursor := &cursorHost{}
	streamClient, err := mongo.Connect(options.Client().ApplyURI(rs.URI()).
		SetServerSelectionTimeout(time.Second).SetMonitor(cursor.monitor()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = streamClient.Disconnect(testContext(t, 10*time.Second)) })
	st := store.New(client.Database("stepdown"), store.Options{})
	bus := newBus(t)
	c := collect(t, bus)
	log := &logs{}
	s := startStream(t, events.Config{Store: store.New(streamClient.Database("stepdown"), store.Options{}), Publisher: bus, Name: "n1", Logger: slog.New(log), MaxAwait: 200 * time.Millisecond})
	q := bson.NewObjectID()
	id := insertTasks(t, st, q, 1)[0]
	requireTask(t, c.next(t, wait), events.OpInsert, id, q, statusPtr(schema.StatusQueued))

	old, err := rs.WaitPrimary(ctx)
	require.NoError(t, err)
	require.Equal(t, old.Addr(), cursor.get())
	begin = time.Now()
	// Since 4.2 a step-down no longer closes connections: MongoDB 6.0
	// answers ok, and the stream's cursor may live on, on a secondary.
	err = client.Database("admin").RunCommand(ctx, bson.D{{Key: "replSetStepDown", Value: 10}}).Err()
	t.Logf("replSetStepDown on %s: %v", old.Addr(), err)
	var primary *mongod.Member
	eventually(t, func() bool {
		primary, err = rs.WaitPrimary(ctx)
		require.NoError(t, err)
		return primary != old
	}, 20*time.Second, 100*time.Millisecond)
	t.Logf("new primary %s after %v", primary.Addr(), time.Since(begin))

	id = insertTasks(t, st, q, 1)[0]
	g, skipped := c.until(t, 20*time.Second, taskEvent(events.OpInsert, id))
	requireTask(t, g, events.OpInsert, id, q, statusPtr(schema.StatusQueued))
	require.Empty(t, skipped)
	t.Logf("event after the step-down delivered %v after it; stats %+v", time.Since(begin), s.Stats())

	// The cursor may have stayed on the old primary, now a secondary: kill
	// the member it reads from, so the stream moves (to the primary).
	require.Contains(t, []string{old.Addr(), primary.Addr()}, cursor.get())
	victim := old
	if cursor.get() == primary.Addr() {
		victim = primary
	}
	killAndInsert := func(victim *mongod.Member) {
		t.Helper()
		begin := time.Now()
		require.NoError(t, victim.Kill())
		now, err := rs.WaitPrimary(ctx)
		require.NoError(t, err)
		t.Logf("%s killed; %s primary after %v", victim.Addr(), now.Addr(), time.Since(begin))
		id := insertTasks(t, st, q, 1)[0]
		g, skipped := c.until(t, 20*time.Second, taskEvent(events.OpInsert, id))
		requireTask(t, g, events.OpInsert, id, q, statusPtr(schema.StatusQueued))
		require.Empty(t, skipped)
		t.Logf("event after the kill delivered %v after it; stats %+v", time.Since(begin), s.Stats())
	}
	killAndInsert(victim)

	// Once the killed member is back, kill the primary, which the stream
	// now reads from: the election takes longer than the stream client's
	// server selection, so the Stream's own resume does the job.
	require.NoError(t, victim.Restart(ctx))
	direct, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + victim.Addr() + "/?directConnection=true"))
	require.NoError(t, err)
	defer func() { _ = direct.Disconnect(ctx) }()
	eventually(t, func() bool {
		var h struct {
			Secondary bool `bson:"secondary"`
		}
		err := direct.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&h)
		return err == nil && h.Secondary
	}, 20*time.Second, 100*time.Millisecond, "%s is not a secondary again", victim.Addr())
	primary, err = rs.WaitPrimary(ctx)
	require.NoError(t, err)
	require.Equal(t, primary.Addr(), cursor.get())
	killAndInsert(primary)

	cursor.mu.Lock()
	t.Logf("stream commands:\n%s\nlog:\n%s", strings.Join(cursor.log, "\n"), log)
	cursor.mu.Unlock()
	require.Zero(t, s.Stats().Rescans)
}

func TestStopLeavesNoGoroutines(t *testing.T) {
	// Not parallel: goleak must see only this stream's goroutines. The
	// shared client's server monitors may start a heartbeat read (after an
	// earlier test's failover, say) at any time: goleak ignores those, and
	// the server is asked instead whether the stream's cursor is gone.
	ctx := testContext(t, time.Minute)
	db := mongotest.Database(t)
	st := store.New(db, store.Options{})
	bus := newBus(t)
	c := collect(t, bus)
	require.NoError(t, db.Client().Ping(ctx, nil))
	opts := append(mongotest.ClientGoroutines(), goleak.IgnoreCurrent())

	s := events.New(events.Config{Store: st, Publisher: bus, Name: "n1", SaveEvery: 10 * time.Millisecond, MaxAwait: 100 * time.Millisecond})
	require.NoError(t, s.Start(ctx))
	q := bson.NewObjectID()
	id := insertTasks(t, st, q, 1)[0]
	requireTask(t, c.next(t, wait), events.OpInsert, id, q, statusPtr(schema.StatusQueued))
	time.Sleep(300 * time.Millisecond) // a few empty getMores and saves
	require.NotEmpty(t, mongotest.ChangeStreamCursors(t, db), "the running stream's cursor is open")
	s.Stop()
	s.Stop() // idempotent
	goleak.VerifyNone(t, opts...)
	// Not the ten minutes a cursor left behind stays; a loaded server
	// takes its time to notice a getMore's kill (node's test saw over
	// 10 s once on CI).
	require.Eventually(t, func() bool { return len(mongotest.ChangeStreamCursors(t, db)) == 0 }, 30*time.Second, 10*time.Millisecond,
		"the stream's cursor is still open on the server")
	_, err := st.StreamTokenGet(ctx, "n1")
	require.NoError(t, err)
}

func TestStreamLifecycle(t *testing.T) {
	// Not parallel: goleak.
	db := mongotest.Database(t)
	st := store.New(db, store.Options{})
	lifecycletest.Check(t, func(t *testing.T) lifecycle.Service {
		return events.New(events.Config{Store: st, Publisher: newBus(t), Name: "life", MaxAwait: 100 * time.Millisecond})
	}, lifecycletest.Options{IgnoreGoroutines: mongotest.ClientGoroutines()})
}

// commandCounter counts the commands a client starts, by name.
type commandCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *commandCounter) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.n[e.CommandName]++
	}}
}

func (c *commandCounter) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

// TestQuietClosesTheStreamUntilWakeUpsAreNeeded: told its node needs no
// wake-ups, the stream kills its server cursor and asks nothing of the
// server however the database is written; told they are needed again, it
// reopens at the present (what was written meanwhile is not delivered)
// and publishes a Rescan saying so, and follows the changes again.
func TestQuietClosesTheStreamUntilWakeUpsAreNeeded(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	st := store.New(db, store.Options{})
	cmds := &commandCounter{n: map[string]int{}}
	client, err := mongo.Connect(options.Client().ApplyURI(mongotest.URI(t)).SetMonitor(cmds.monitor()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(testContext(t, 10*time.Second)) })
	bus := newBus(t)
	c := collect(t, bus)
	s := startStream(t, events.Config{Store: store.New(client.Database(db.Name()), store.Options{}), Publisher: bus, Name: "n1", MaxAwait: 100 * time.Millisecond})
	q := bson.NewObjectID()
	id := insertTasks(t, st, q, 1)[0]
	requireTask(t, c.next(t, wait), events.OpInsert, id, q, statusPtr(schema.StatusQueued))

	s.Quiet(true)
	eventually(t, func() bool { return s.Stats().Quiets == 1 && cmds.get("killCursors") > 0 }, wait, 10*time.Millisecond, "the cursor killed")
	getMores, aggregates := cmds.get("getMore"), cmds.get("aggregate")
	skipped := insertTasks(t, st, q, 1)[0]
	time.Sleep(500 * time.Millisecond) // five of MaxAwait: a held getMore would have gone out
	require.Equal(t, getMores, cmds.get("getMore"), "no getMore while quiet")
	require.Equal(t, aggregates, cmds.get("aggregate"), "not reopened while quiet")
	s.Quiet(true) // said again: nothing changes
	select {
	case g := <-c.ch:
		t.Fatalf("an event while quiet: %v", g)
	case <-time.After(200 * time.Millisecond):
	}

	s.Quiet(false)
	g := c.next(t, wait)
	require.Equal(t, events.TopicRescan, g.Topic)
	require.True(t, g.Ev.(events.Rescan).Quiet, "a routine rescan: %+v", g.Ev)
	id = insertTasks(t, st, q, 1)[0]
	g, others := c.until(t, wait, taskEvent(events.OpInsert, id))
	requireTask(t, g, events.OpInsert, id, q, statusPtr(schema.StatusQueued))
	require.Empty(t, others, "the task inserted while quiet (%s) is not delivered: the rescan stands for it", skipped.Hex())
	require.Equal(t, aggregates+1, cmds.get("aggregate"), "reopened once")
	require.Equal(t, int64(1), s.Stats().Quiets)

	// Stopped while quiet: Stop returns.
	s.Quiet(true)
	eventually(t, func() bool { return s.Stats().Quiets == 2 }, wait, 10*time.Millisecond, "quiet again")
	stopped := make(chan struct{})
	go func() { s.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(wait):
		t.Fatal("Stop did not return during a quiet spell")
	}

	// Started again (the node restarted during the spell): at the present,
	// not at the spell's start: what was written during it (here a kill
	// asked for, then withdrawn by a requeue) is not replayed.
	during := insertTasks(t, st, q, 1)[0]
	tasks := db.Collection(schema.CollTasks, majority)
	for _, u := range []bson.D{
		{{Key: "$set", Value: bson.D{{Key: schema.TaskNode, Value: "n1"}, {Key: schema.TaskStatus, Value: int32(schema.StatusRunning)}}}},
		{{Key: "$set", Value: bson.D{{Key: schema.TaskKill, Value: bson.D{{Key: schema.KillNode, Value: "n1"}, {Key: schema.KillBy, Value: "op"}}}}}},
		{{Key: "$set", Value: bson.D{{Key: schema.TaskNode, Value: -1}, {Key: schema.TaskStatus, Value: int32(schema.StatusQueued)}}},
			{Key: "$unset", Value: bson.D{{Key: schema.TaskKill, Value: ""}}}},
	} {
		_, err := tasks.UpdateOne(testContext(t, wait), bson.D{{Key: "_id", Value: during}}, u)
		require.NoError(t, err)
	}
	bus2 := newBus(t)
	c2 := collect(t, bus2)
	startStream(t, events.Config{Store: st, Publisher: bus2, Name: "n1", MaxAwait: 100 * time.Millisecond})
	id = insertTasks(t, st, q, 1)[0]
	_, replayed := c2.until(t, wait, taskEvent(events.OpInsert, id))
	require.Empty(t, replayed, "a restart during a quiet spell replayed it")
}
