package node

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// TestPausedQueueRunsNothingAndResumesAtOnce: a paused queue's tasks wait;
// resuming it is a queue change the node hears at once (the tick is a
// minute away).
func TestPausedQueueRunsNothingAndResumesAtOnce(t *testing.T) {
	b := setup(t)
	q := b.queue("paused", "test", 2, schema.SortFIFO)
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: q, Paused: ptr(true)}))
	cfg := b.config("n1")
	cfg.Tick = time.Minute
	b.start(cfg)
	require.Eventually(t, func() bool { return strings.Contains(b.logs.String(), "reason=paused") }, 10*time.Second, 10*time.Millisecond,
		"the node says why it does not serve the queue:\n%s", b.logs)
	id := b.tasks(q, 1, nil)[0]
	time.Sleep(300 * time.Millisecond) // a wake-up would have claimed it by now
	require.Equal(t, int64(schema.StatusQueued), b.task(id).Lookup("status").AsInt64(), "a paused queue's task waits")

	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: q, Paused: ptr(false)}))
	b.waitStatus(id, schema.StatusSucceeded, 10*time.Second)
}

// TestPriorityAcrossQueuesOnANode: with the node's slots scarce, a queue of
// higher priority runs all its tasks before a lower one gets any.
func TestPriorityAcrossQueuesOnANode(t *testing.T) {
	b := setup(t)
	lo := b.queue("a-lo", "test", 5, schema.SortFIFO)
	hi := b.queue("b-hi", "test", 5, schema.SortFIFO)
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: hi, Priority: ptr(10.0)}))
	b.rec.sleep = 30 * time.Millisecond
	loIDs := b.tasks(lo, 5, nil)
	hiIDs := b.tasks(hi, 10, nil)
	cfg := b.config("n1")
	cfg.MaxThreads = ptr(2)
	b.start(cfg)
	b.waitDone(bson.D{{Key: "queue", Value: lo}}, 5, 30*time.Second)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	pos := map[bson.ObjectID]int{}
	for i, id := range b.rec.order {
		pos[id] = i
	}
	firstLo := len(b.rec.order)
	for _, l := range loIDs {
		firstLo = min(firstLo, pos[l])
	}
	// The lower priority gets a slot only once the higher one has no task
	// left to claim; its last tasks may still be starting on the other slot
	// (the plugin runs record their start in any order).
	late := 0
	for _, h := range hiIDs {
		if pos[h] > firstLo {
			late++
		}
	}
	require.LessOrEqual(t, late, 1, "tasks of the higher priority started after the lower priority's first (2 slots): %v\nlo %v\nhi %v\n%s", b.rec.order, loIDs, hiIDs, b.logs)
}

// TestMaxRunningCapsTheQueueAcrossNodes: three nodes with 10 slots each on
// a queue capped at 3 never run more than 3 of its tasks at once, and do
// reach 3; every task runs once, and no admission is left behind.
func TestMaxRunningCapsTheQueueAcrossNodes(t *testing.T) {
	b := setup(t)
	q := b.queue("capped", "test", 10, schema.SortFIFO)
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: q, MaxRunning: ptr(3)}))
	// Long enough that three run at once whatever the machine's load
	// (with 20 ms a loaded CI run never had three, and with 200 ms once
	// only two: each admission is a transaction).
	b.rec.sleep = 500 * time.Millisecond
	ids := b.tasks(q, 30, nil)
	for _, name := range []string{"n1", "n2", "n3"} {
		cfg := b.config(name)
		cfg.safetyNets = time.Hour // the nodes' own releases, not the leader's sweep
		b.start(cfg)
	}
	b.waitDone(bson.D{{Key: "queue", Value: q}}, int64(len(ids)), time.Minute)
	require.Equal(t, 3, b.rec.max("queue:capped"), "at most max_running at once, and the cap reached")
	for _, id := range ids {
		require.Len(t, b.rec.runs[id], 1, "task %s", id.Hex())
	}
	require.Eventually(t, func() bool {
		got, err := b.store.QueueGet(context.Background(), store.QueueGetParams{Ref: q.Hex()})
		return err == nil && got.Sched.Admitted == 0 && b.count(bson.D{{Key: schema.TaskAdmitted, Value: true}}) == 0
	}, 10*time.Second, 20*time.Millisecond, "every admission released")
}

// TestQueueConfigReachesThePlugin: a queue's config is handed to the plugin
// with each task (DISBATCH_CONFIG for shell), and a change reaches the next
// task.
func TestQueueConfigReachesThePlugin(t *testing.T) {
	b := setup(t)
	conf, err := bson.Marshal(bson.D{{Key: "bucket", Value: "b1"}})
	require.NoError(t, err)
	q := b.shellQueue("configured", 1, func(p *store.QueueUpdateParams) { p.Config = conf })
	b.start(b.config("n1"))
	id := b.insert(q, nil, bson.D{{Key: "command", Value: `echo "$DISBATCH_CONFIG"`}})[0]
	b.waitStatus(id, schema.StatusSucceeded, 10*time.Second)
	require.Equal(t, "{\"bucket\":\"b1\"}\n", b.task(id).Lookup("stdout").StringValue())

	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: q, Config: bson.Raw{5, 0, 0, 0, 0}}))
	require.True(t, queueHasNo(b, q, schema.QueueConfig), "{} removes the config")
	id = b.insert(q, nil, bson.D{{Key: "command", Value: `echo "$DISBATCH_CONFIG"`}})[0]
	b.waitStatus(id, schema.StatusSucceeded, 10*time.Second)
	require.Equal(t, "{}\n", b.task(id).Lookup("stdout").StringValue(), "config removed: {}")
}

func queueHasNo(b *bundle, q bson.ObjectID, field string) bool {
	raw, err := b.db.Collection("queues").FindOne(context.Background(), bson.D{{Key: "_id", Value: q}}).Raw()
	require.NoError(b.t, err)
	_, err = raw.LookupErr(field)
	return err != nil
}

// TestContinuousQueueOneTaskPerIntervalWithThreeNodes: three nodes (any of
// which may lead) create one task at a time on a continuous queue: each
// after the previous one finished and the interval passed since it was
// created.
func TestContinuousQueueOneTaskPerIntervalWithThreeNodes(t *testing.T) {
	b := setup(t)
	q := b.queue("cont", "test", 5, schema.SortFIFO)
	interval := 400 * time.Millisecond
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: q, Continuous: ptr(true), Interval: &interval}))
	for _, name := range []string{"n1", "n2", "n3"} {
		b.start(b.config(name))
	}
	b.waitDone(bson.D{{Key: "queue", Value: q}}, 4, 30*time.Second)
	cur, err := b.db.Collection("tasks").Find(context.Background(), bson.D{{Key: "queue", Value: q}}, options.Find().SetSort(bson.D{{Key: "ctime", Value: 1}}))
	require.NoError(t, err)
	var tasks []struct {
		Name   string    `bson:"name"`
		CTime  time.Time `bson:"ctime"`
		MTime  time.Time `bson:"mtime"`
		Status int       `bson:"status"`
	}
	require.NoError(t, cur.All(context.Background(), &tasks))
	require.GreaterOrEqual(t, len(tasks), 4)
	for i := 1; i < len(tasks); i++ {
		prev, cur := tasks[i-1], tasks[i]
		require.Equal(t, 1, prev.Status, "task %d finished before the next", i-1)
		require.False(t, cur.CTime.Before(prev.MTime), "task %d created after task %d finished", i, i-1)
		// ctime is the inserting node's clock at millisecond precision,
		// taken when the insert is built; the interval is kept from the
		// leader's decision by the server's clock. A loaded machine put
		// 8 ms between the two (a CI run: 392 ms apart), so a margin of
		// 50 ms; tasks created back to back would still be far below it.
		require.GreaterOrEqual(t, cur.CTime.Sub(prev.CTime), interval-50*time.Millisecond, "tasks %d and %d an interval apart", i-1, i)
		require.Equal(t, strconv.FormatInt(cur.CTime.Unix(), 10), cur.Name)
	}
}

// fanOut answers success with an output of two objects.
type fanOut struct{}

func (fanOut) Run(_ context.Context, t plugin.Task) plugin.Result {
	raw, _ := bson.Marshal(bson.D{{Key: "v", Value: bson.A{bson.D{{Key: "part", Value: 1}}, bson.D{{Key: "part", Value: 2}}}}})
	return plugin.Result{Status: schema.StatusSucceeded, Output: bson.Raw(raw).Lookup("v")}
}

// TestThenChainsTheOutputIntoTasks: a task that succeeds with an output of
// two objects on a queue with then gives two tasks of the then queue, run
// there, each made once.
func TestThenChainsTheOutputIntoTasks(t *testing.T) {
	b := setup(t)
	b.reg.Register("fan", fanOut{})
	src := b.queue("src", "fan", 2, schema.SortFIFO)
	dst := b.queue("dst", "test", 2, schema.SortFIFO)
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: src, Then: ptr("dst")}))
	cfg := b.config("n1")
	cfg.safetyNets = time.Hour // the node's own chaining, not the leader's sweep
	b.start(cfg)
	id := b.tasks(src, 1, nil)[0]
	b.waitStatus(id, schema.StatusSucceeded, 10*time.Second)
	b.waitDone(bson.D{{Key: "queue", Value: dst}}, 2, 10*time.Second)
	require.Equal(t, int64(2), b.count(bson.D{{Key: "queue", Value: dst}, {Key: schema.TaskChainedFrom, Value: id}}))
	require.Equal(t, int64(2), b.count(bson.D{{Key: "queue", Value: dst}}), "each once")
	_, err := b.task(id).LookupErr(schema.TaskThenPending)
	require.Error(t, err, "the mark is removed once the tasks exist")
}

// TestAStartKillsTheTransactionItsPreviousRunLeftOpen: the node's previous
// run was killed inside a capped claim's transaction, which holds the
// queue document until the server's transaction lifetime (60 s): every
// claim of the queue would meet a write conflict until then. The new run
// kills its recorded sessions first, and claims at once.
func TestAStartKillsTheTransactionItsPreviousRunLeftOpen(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	q := b.queue("capped", "test", 5, schema.SortFIFO)
	require.NoError(t, b.store.QueueUpdate(ctx, store.QueueUpdateParams{ID: q, MaxRunning: ptr(3)}))
	ids := b.tasks(q, 5, nil)

	sess, err := b.db.Client().StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	require.NoError(t, sess.StartTransaction())
	_, err = b.db.Collection(schema.CollQueues).UpdateOne(mongo.NewSessionContext(ctx, sess),
		bson.D{{Key: "_id", Value: q}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "admitted", Value: 1}}}})
	require.NoError(t, err)
	_, err = b.db.Collection(store.CollSessions).InsertOne(ctx, bson.D{{Key: "_id", Value: sess.ID().Lookup("id")},
		{Key: "lsid", Value: sess.ID()}, {Key: "node", Value: "n1"}, {Key: "ctime", Value: time.Now()}})
	require.NoError(t, err)

	t0 := time.Now()
	b.start(b.config("n1"))
	b.waitDone(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, int64(len(ids)), 20*time.Second)
	require.Less(t, time.Since(t0), 20*time.Second, "started and done well before the server's transaction lifetime")
	require.Contains(t, b.logs.String(), "killed the previous run's transaction sessions")
	n, err := b.db.Collection(store.CollSessions).CountDocuments(ctx, bson.D{{Key: "_id", Value: sess.ID().Lookup("id")}})
	require.NoError(t, err)
	require.Zero(t, n, "the old record is gone")
}

// TestServingNamesTheNodesAQueueLets: a queue pinned to some nodes, or
// ignoring some, names only the live nodes it lets serve it, and only
// those whose heartbeat says they serve it (the claimer's peers); those
// without a stream are named deaf too, and those with its slots all
// taken full.
func TestServingNamesTheNodesAQueueLets(t *testing.T) {
	q := schema.Queue{ID: bson.NewObjectID()}
	serves := map[string]bool{q.ID.Hex(): true}
	others := map[string]peer{"n3": {serves: serves, stream: true}, "n2": {serves: serves}, "n4": {serves: map[string]bool{}, stream: true},
		"n5": {serves: serves, stream: true, full: serves}}
	names, deaf, full := serving(q, others)
	require.ElementsMatch(t, []string{"n2", "n3", "n5"}, names, "n4 does not serve it")
	require.Equal(t, []string{"n2"}, deaf, "n2 has no stream")
	require.Equal(t, []string{"n5"}, full, "n5 no free slot")
	q.NodesIgnore = []string{"n3", "n5"}
	names, _, _ = serving(q, others)
	require.Equal(t, []string{"n2"}, names)
	q.NodesPin = []string{"n1"}
	names, deaf, full = serving(q, others)
	require.Empty(t, names, "pinned to this node alone")
	require.Empty(t, deaf)
	require.Empty(t, full)
	names, _, _ = serving(q, nil)
	require.Empty(t, names, "no node read")
}
