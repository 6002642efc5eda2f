package integration

// Issue 16's process-level tests of scheduling: three disbatchd processes on
// the fault suite's three-member replica set run a continuous queue, `then`
// chaining through lost answers and a killed node, and a task graph of
// 10,000 tasks. A change stream on the database records every status a task
// is given, with its cluster time (the oplog's total order), so that "after"
// and "once" are checked against MongoDB's own order rather than against
// clocks. Run them alone with
//
//	go test -race -count=1 -run TestDag -v ./integration/

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// TestDag runs the scenarios one after the other on one replica set (each
// has its own database and three nodes): Continuous, Then (a node's
// answers lost as it finishes, the node killed between a finish and its
// chaining) and Graph.
func TestDag(t *testing.T) {
	runScenarios(t, []suiteScenario{
		{"Continuous", dagContinuous},
		{"Then", dagThen},
		{"Graph", dagGraph},
	})
}

// suiteScenario is one scenario of a test that runs several in turn on
// the fault suite's replica set.
type suiteScenario struct {
	name string
	run  func(*testing.T, *faultSuite)
}

// runScenarios sets the fault suite up and runs the scenarios one after
// the other as subtests, each once the replica set is healthy, saying how
// long each took.
func runScenarios(t *testing.T, scenarios []suiteScenario) {
	begin := time.Now()
	s := setupFaultSuite(t)
	for _, sc := range scenarios {
		s.waitHealthy(t, 2*time.Minute)
		t.Run(sc.name, func(t *testing.T) {
			begin := time.Now()
			sc.run(t, s)
			t.Logf("%s took %v", sc.name, time.Since(begin).Round(time.Millisecond))
		})
	}
	t.Logf("%s took %v", t.Name(), time.Since(begin).Round(time.Second))
}

// dagCluster is one scenario's database and its disbatchd nodes.
type dagCluster struct {
	t      *testing.T
	s      *faultSuite
	dbName string
	db     *mongo.Database
	flags  []string // more disbatchd flags, for every node
	// fault: the nodes get the fault suite's timings (a silent node is
	// fenced after 1.5 s and found dead after 4 s); otherwise the defaults,
	// which a loaded machine does not trip.
	fault bool
	env   []string // more environment, for every node (and so its plugins)
	nodes []*faultNode
}

func dagNewCluster(t *testing.T, s *faultSuite) *dagCluster {
	t.Helper()
	name := fmt.Sprintf("dag_%s_%d", strings.ReplaceAll(filepath.Base(t.Name()), "/", "_"), time.Now().UnixNano()%1_000_000)
	return &dagCluster{t: t, s: s, dbName: name, db: s.client.Database(name)}
}

// start starts a node named name on uri ("" for the replica set's) with
// more flags.
func (c *dagCluster) start(name, uri string, more ...string) *faultNode {
	c.t.Helper()
	if uri == "" {
		uri = c.s.uri
	}
	args := nodeArgs(uri, c.dbName, name, "--grace", faultGrace.String())
	if c.fault {
		args = append(args, "--heartbeat", faultHeartbeat.String(), "--fence-after", faultFenceAfter.String(), "--dead-after", faultDeadAfter.String())
	}
	args = append(append(args, c.flags...), more...)
	n := &faultNode{name: name, uri: uri, p: startNode(c.t, args, c.env...)}
	c.nodes = append(c.nodes, n)
	return n
}

// startThree starts n1, n2 and n3 on the replica set and waits for them.
func (c *dagCluster) startThree() {
	c.t.Helper()
	for _, name := range []string{"n1", "n2", "n3"} {
		c.start(name, "")
	}
	c.waitStarted()
}

func (c *dagCluster) waitStarted() {
	c.t.Helper()
	for _, n := range c.nodes {
		n.p.waitLog("node started", nodeStartWait)
	}
}

// stop stops the live nodes with SIGTERM; each must exit 0.
func (c *dagCluster) stop() {
	c.t.Helper()
	(&scenario{t: c.t, nodes: c.nodes}).stopNodes()
}

func (c *dagCluster) queueID(name string) bson.ObjectID {
	c.t.Helper()
	return (&scenario{t: c.t, db: c.db}).queueID(name)
}

// logs is every node's log so far.
func (c *dagCluster) logs() string {
	var b strings.Builder
	for _, n := range c.nodes {
		b.WriteString(n.p.log.String())
	}
	return b.String()
}

// dagScript writes an executable /bin/sh script (a plugin) and returns its
// path.
func dagScript(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755))
	return path
}

// dagEvent is a change of a document, as the change stream told it.
type dagEvent struct {
	ts     bson.Timestamp // the oplog's order
	wall   time.Time      // the primary's clock at the change
	id     bson.ObjectID
	status int64 // the status the change set (or inserted); only if hasStatus
	// hasStatus: the change set a status (inserts and replaces too).
	hasStatus bool
	next      time.Time // a queue's next_continuous the change set, or zero
}

func dagBefore(a, b bson.Timestamp) bool { return a.T < b.T || (a.T == b.T && a.I < b.I) }

// dagStream follows a change stream over a database's tasks and queues
// from its start, keeping every event in order.
type dagStream struct {
	db     *mongo.Database
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	events  []dagEvent
	markers map[bson.ObjectID]bool
	err     error
}

const dagMarkers = "dag_markers"

func dagWatch(t *testing.T, db *mongo.Database) *dagStream {
	t.Helper()
	pipeline := mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "ns.coll", Value: bson.D{{Key: "$in", Value: bson.A{"tasks", "queues", dagMarkers}}}}}}},
		{{Key: "$project", Value: bson.D{
			{Key: "operationType", Value: 1}, {Key: "ns", Value: 1}, {Key: "documentKey", Value: 1}, {Key: "clusterTime", Value: 1}, {Key: "wallTime", Value: 1},
			{Key: "updateDescription.updatedFields.status", Value: 1},
			{Key: "updateDescription.updatedFields.next_continuous", Value: 1},
			{Key: "fullDocument.status", Value: 1},
		}}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &dagStream{db: db, cancel: cancel, done: make(chan struct{}), markers: map[bson.ObjectID]bool{}}
	octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
	cs, err := db.Watch(octx, pipeline, options.ChangeStream().SetBatchSize(10000))
	ocancel()
	require.NoError(t, err, "open the change stream")
	go func() {
		defer close(w.done)
		defer cs.Close(context.Background())
		for cs.Next(ctx) {
			w.handle(cs.Current)
		}
		if ctx.Err() == nil {
			w.mu.Lock()
			w.err = cs.Err()
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-w.done
	})
	return w
}

func (w *dagStream) handle(raw bson.Raw) {
	var ev struct {
		Op   string         `bson:"operationType"`
		TS   bson.Timestamp `bson:"clusterTime"`
		Wall time.Time      `bson:"wallTime"`
		NS   struct {
			Coll string `bson:"coll"`
		} `bson:"ns"`
		Key struct {
			ID bson.RawValue `bson:"_id"`
		} `bson:"documentKey"`
		Upd struct {
			Fields bson.Raw `bson:"updatedFields"`
		} `bson:"updateDescription"`
		Full bson.Raw `bson:"fullDocument"`
	}
	err := bson.Unmarshal(raw, &ev)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.err = fmt.Errorf("decode a change event: %w: %v", err, raw)
		return
	}
	id, ok := ev.Key.ID.ObjectIDOK()
	if !ok {
		return
	}
	if ev.NS.Coll == dagMarkers {
		w.markers[id] = true
		return
	}
	e := dagEvent{ts: ev.TS, wall: ev.Wall, id: id}
	var st bson.RawValue
	switch ev.Op {
	case "insert", "replace":
		if ev.Full != nil {
			st = ev.Full.Lookup("status")
		}
	case "update":
		if ev.Upd.Fields != nil {
			st = ev.Upd.Fields.Lookup("status")
			if nc, ok := ev.Upd.Fields.Lookup("next_continuous").DateTimeOK(); ok {
				e.next = time.UnixMilli(nc)
			}
		}
	}
	e.status, e.hasStatus = st.AsInt64OK()
	w.events = append(w.events, e)
}

// sync waits until the stream has seen everything written so far.
func (w *dagStream) sync(t *testing.T) []dagEvent {
	t.Helper()
	id := bson.NewObjectID()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := w.db.Collection(dagMarkers, options.Collection().SetWriteConcern(writeconcern.Majority())).InsertOne(ctx, bson.D{{Key: "_id", Value: id}})
	require.NoError(t, err, "insert the stream's marker")
	for {
		w.mu.Lock()
		seen, err := w.markers[id], w.err
		w.mu.Unlock()
		require.NoError(t, err, "the change stream")
		if seen {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the change stream did not see its marker within 60s")
		case <-w.done:
			t.Fatalf("the change stream stopped: %v", w.err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.events)
}

// dagWaitDone waits until no task the filter selects is unfinished (held,
// queued, claimed or running), failing after timeout with a count of the
// unfinished by status.
func dagWaitDone(t *testing.T, db *mongo.Database, filter bson.D, timeout time.Duration) time.Duration {
	t.Helper()
	begin := time.Now()
	unfinished := append(bson.D{{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{-4, -2, -1, 0}}}}}, filter...)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := db.Collection("tasks").CountDocuments(ctx, unfinished)
		cancel()
		if err == nil && n == 0 {
			return time.Since(begin)
		}
		if time.Since(begin) > timeout {
			t.Fatalf("%d tasks still unfinished after %v (err %v): by status %v", n, timeout, err, dagByStatus(t, db, unfinished))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// dagByStatus counts the tasks filter selects by status.
func dagByStatus(t *testing.T, db *mongo.Database, filter bson.D) map[int]int {
	t.Helper()
	out := map[int]int{}
	for _, x := range dagTasks(t, db, filter) {
		out[x.Status]++
	}
	return out
}

// dagAttempt is an attempt's record in a task document.
type dagAttempt struct {
	Node     string    `bson:"node"`
	Started  time.Time `bson:"started"`
	Finished time.Time `bson:"finished"`
}

// dagTask is the part of a task document these tests read.
type dagTask struct {
	ID          bson.ObjectID   `bson:"_id"`
	Status      int             `bson:"status"`
	Reason      string          `bson:"reason"`
	Name        string          `bson:"name"`
	CTime       time.Time       `bson:"ctime"`
	Stderr      bson.RawValue   `bson:"stderr"`
	Parameters  bson.Raw        `bson:"parameters"`
	Attempt     int             `bson:"attempt"`
	Attempts    []dagAttempt    `bson:"attempts"`
	Parents     []bson.ObjectID `bson:"parents"`
	Awaiting    bson.RawValue   `bson:"awaiting_parents"`
	Output      bson.RawValue   `bson:"output"`
	ThenPending bson.RawValue   `bson:"then_pending"`
	ChainedFrom bson.RawValue   `bson:"chained_from"`
}

func dagTasks(t *testing.T, db *mongo.Database, filter bson.D) []dagTask {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cur, err := db.Collection("tasks").Find(ctx, filter)
	require.NoError(t, err)
	var out []dagTask
	require.NoError(t, cur.All(ctx, &out))
	return out
}

// ---------------------------------------------------------------------------
// Continuous queues.

const (
	dagInterval   = time.Second             // the continuous queue's interval
	dagContWindow = 7 * time.Second         // observed from its first task
	dagContTick   = 50 * time.Millisecond   // the nodes' tick: the leader looks for due queues this often
	dagLongRun    = 1600 * time.Millisecond // every third task runs longer than the interval
)

// dagContinuous: a continuous queue with an interval of 1 s on three
// nodes. Every third task runs 1.6 s, longer than the interval, so that the
// rule's two conditions both bind: a task is created only when the queue
// has no unfinished task, and only once the interval has passed since the
// previous creation (store.ContinuousCreate: next_continuous = creation +
// interval). Checked: never two unfinished tasks (sampled live, and from
// the documents: each task is created after the previous one finished),
// creations at least the interval apart (from the queue's next_continuous
// as the change stream saw each value), each task's name the Unix time of
// its creation with empty parameters, and the count over the window equal
// to the rule's ideal (one the instant it allows) or one fewer: never more,
// and the leader's tick may not lose a whole cycle.
func dagContinuous(t *testing.T, s *faultSuite) {
	c := dagNewCluster(t, s)
	runs := filepath.Join(t.TempDir(), "runs")
	// Tasks never overlap (that is what is checked), so the counter needs
	// no lock; should they overlap, a count may repeat, which changes only
	// which tasks run long.
	script := dagScript(t, "sleeper", fmt.Sprintf(`cat >/dev/null
n=$(( $(cat "$DAG_RUNS" 2>/dev/null || echo 0) + 1 ))
echo "$n" >"$DAG_RUNS"
if [ $((n %% 3)) -eq 0 ]; then sleep %.3f; else sleep 0.05; fi
echo '{"status": 1, "stdout": "run '"$n"'"}'
`, dagLongRun.Seconds()))
	c.flags = []string{"--tick", dagContTick.String(), "--plugin", "Dag::Sleeper=" + script}
	c.env = []string{"DAG_RUNS=" + runs}
	const queue = "dag_cont"
	cli(t, s.uri, c.dbName, "", "queue", "create", queue, "--constructor", "Dag::Sleeper", "--maxthreads", "4")
	qid := c.queueID(queue)
	c.startThree()
	stream := dagWatch(t, c.db)
	ofQueue := bson.D{{Key: "queue", Value: qid}}

	// Live: never two tasks unfinished at once.
	var maxUnfinished atomic.Int64
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		f := append(bson.D{{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{-4, -2, -1, 0}}}}}, ofQueue...)
		for watchCtx.Err() == nil {
			ctx, cancel := context.WithTimeout(watchCtx, 5*time.Second)
			n, err := c.db.Collection("tasks").CountDocuments(ctx, f)
			cancel()
			if err == nil && n > maxUnfinished.Load() {
				maxUnfinished.Store(n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	defer func() { stopWatch(); <-watched }()

	cli(t, s.uri, c.dbName, "", "queue", "set", queue, "continuous=true", "interval="+strconv.Itoa(int(dagInterval/time.Second)))
	// The window starts with the first task.
	waitTasks(t, c.db, 30*time.Second, "the continuous queue's first task", func(ts []task) bool { return len(ts) > 0 })
	first := dagTasks(t, c.db, ofQueue)[0].CTime
	time.Sleep(time.Until(first.Add(dagContWindow)))
	end := time.Now()
	cli(t, s.uri, c.dbName, "", "queue", "set", queue, "continuous=false")
	dagWaitDone(t, c.db, ofQueue, 30*time.Second)
	stopWatch()
	<-watched
	events := stream.sync(t)
	c.stop()

	ts := dagTasks(t, c.db, ofQueue)
	sort.Slice(ts, func(i, j int) bool { return ts[i].CTime.Before(ts[j].CTime) })
	// The creations' instants: each moved next_continuous to creation +
	// interval in the transaction that inserted the task.
	var created []time.Time
	for _, e := range events {
		if e.id == qid && !e.next.IsZero() {
			created = append(created, e.next.Add(-dagInterval))
		}
	}
	require.LessOrEqual(t, maxUnfinished.Load(), int64(1), "two tasks of the continuous queue were unfinished at once")
	require.Len(t, created, len(ts), "one next_continuous move per task created")

	var long int
	for k, x := range ts {
		require.Equal(t, 1, x.Status, "task %d (%s) did not succeed", k, x.ID.Hex())
		require.Len(t, x.Attempts, 1, "task %d (%s) ran more than once", k, x.ID.Hex())
		require.Equal(t, strconv.FormatInt(created[k].Unix(), 10), x.Name, "task %d's name is not the Unix time of its creation", k)
		require.Empty(t, dagElements(t, x.Parameters), "task %d's parameters", k)
		require.False(t, x.CTime.Before(created[k]), "task %d inserted (%v) before its creation instant (%v)", k, x.CTime, created[k])
		require.Less(t, x.CTime.Sub(created[k]), dagInterval, "task %d's ctime is far from its creation: the events and tasks are not paired", k)
		if x.Attempts[0].Finished.Sub(x.CTime) > dagInterval {
			long++
		}
		if k == 0 {
			continue
		}
		prev := ts[k-1]
		require.False(t, x.CTime.Before(prev.Attempts[0].Finished), "task %d created at %v before task %d finished at %v: two at once", k, x.CTime, k-1, prev.Attempts[0].Finished)
		require.GreaterOrEqual(t, created[k].Sub(created[k-1]), dagInterval, "tasks %d and %d created less than the interval apart", k-1, k)
	}

	// The ideal: each task created the instant the rule allows, from the
	// first one: the interval after the previous creation, or its finish
	// when that is later. The real creations can only be later (the
	// leader looks once a tick), so never more tasks than this.
	ideal := 0
	for at, k := created[0], 0; !at.After(end); k++ {
		ideal++
		if k >= len(ts) {
			at = at.Add(dagInterval) // not run yet at the end: no finish to wait for
			continue
		}
		at = at.Add(max(dagInterval, ts[k].Attempts[0].Finished.Sub(created[k])))
	}
	n := 0
	for _, at := range created {
		if !at.After(end) {
			n++
		}
	}
	var gaps []string
	for k := 1; k < len(created); k++ {
		gaps = append(gaps, created[k].Sub(created[k-1]).Round(time.Millisecond).String())
	}
	t.Logf("continuous: %d tasks in %v (ideal %d), %d ran longer than the interval; gaps %v; at most %d unfinished at once",
		n, end.Sub(first).Round(time.Millisecond), ideal, long, gaps, maxUnfinished.Load())
	require.GreaterOrEqual(t, long, 1, "no task ran longer than the interval: the finish never gated a creation")
	require.LessOrEqual(t, n, ideal, "more tasks than one per interval")
	require.GreaterOrEqual(t, n, ideal-1, "fewer tasks than one per interval (within one)")
}

func dagElements(t *testing.T, d bson.Raw) []bson.RawElement {
	t.Helper()
	if d == nil {
		return nil
	}
	es, err := d.Elements()
	require.NoError(t, err)
	return es
}

// ---------------------------------------------------------------------------
// then chaining.

const (
	dagThenTasks = 300 // tasks of the source queue
	dagThenItems = 4   // output items per task: tasks of the then queue each
	dagSrc       = "dag_src"
	dagPin       = "dag_pin" // pinned to n3; its plugin waits for the test's go-ahead
	dagDst       = "dag_dst"
)

var dagSweepLine = regexp.MustCompile(`msg="then: the sweep turned an output into tasks[^"]*".*? task_id=([0-9a-f]{24}) created=(\d+) existed=(\d+)`)

// dagThen: queues whose plugin answers an output of four objects, with
// then naming a third queue (which runs nothing, so that its tasks can be
// counted). Nodes n1 and n2 run 300 tasks of one of them; node n3 talks to
// MongoDB through a proxy and serves a queue pinned to it, whose plugin
// waits for the test's go-ahead. Two of its tasks make a finish and its
// chaining happen twice, deterministically; the go-ahead is given once
// the proxy holds n3's answers (its requests still reach MongoDB):
//   - retried: the finish lands and its answer never comes; the proxy then
//     closes n3's connections and keeps closing new ones, so the finish
//     fails and so does the driver's own retry: n3 retries the write (it
//     logs so). Once everything passes again, the retry finds the task
//     where the write puts it, counts the finish done ("task finished" in
//     n3's debug log) and chains, while the leader's sweep, which saw the
//     then_pending mark meanwhile, chained it too: the second finds it
//     done.
//   - killed between finish and chain: n3 is killed with SIGKILL once the
//     finish has landed, its answer held (n3 never logged "task finished"
//     for it, so it never chained it): the leader's sweep must chain it
//     (its log names the task).
//
// Besides, the leader's sweep (each tick) races n1's and n2's own
// chaining: it logs how many follow-up tasks it found already inserted
// (existed: two chainings of one output overlapped). Checked: every
// succeeded task of the two source queues has exactly one task per output
// item in the then queue (chained_from it, each item's index once), no
// other task has any, no then_pending mark is left, and the two pinned
// tasks went as described.
func dagThen(t *testing.T, s *faultSuite) {
	c := dagNewCluster(t, s)
	c.fault = true
	signals := t.TempDir()
	var items []string
	for i := range dagThenItems {
		items = append(items, fmt.Sprintf(`{"from": "%%s", "i": %d, "commands": "a"}`, i))
	}
	script := dagScript(t, "emitter", fmt.Sprintf(`cat >/dev/null
if [ "$DISBATCH_QUEUE" = %s ]; then
	: >"$DAG_SIGNALS/$DISBATCH_TASK_ID.started"
	while [ ! -e "$DAG_SIGNALS/$DISBATCH_TASK_ID.go" ]; do sleep 0.01; done
fi
sleep 0.02
printf '{"status": 1, "stdout": "emitted\\n", "output": [%s]}\n' %s
`, dagPin, strings.Join(items, ", "), strings.Repeat(`"$DISBATCH_TASK_ID" `, dagThenItems)))
	c.flags = []string{"--plugin", "Dag::Emitter=" + script}
	c.env = []string{"DAG_SIGNALS=" + signals}
	// The then queue runs nothing (maxthreads 0): its tasks stay queued,
	// to be counted.
	cli(t, s.uri, c.dbName, "", "queue", "create", dagDst, "--constructor", "Disbatch::Plugin::Demo", "--maxthreads", "0")
	cli(t, s.uri, c.dbName, "", "queue", "create", dagSrc, "--constructor", "Dag::Emitter", "--maxthreads", "16")
	cli(t, s.uri, c.dbName, "", "queue", "create", dagPin, "--constructor", "Dag::Emitter", "--maxthreads", "1")
	// n3 serves the pinned queue alone, so that its connections are idle
	// when its answers are held.
	cli(t, s.uri, c.dbName, "", "queue", "set", dagSrc, "then="+dagDst, "nodes_ignore=n3")
	cli(t, s.uri, c.dbName, "", "queue", "set", dagPin, "then="+dagDst, "nodes_pin=n3")
	srcID, pinID, dstID := c.queueID(dagSrc), c.queueID(dagPin), c.queueID(dagDst)

	// Through a replica-set URI the driver would find the members' real
	// addresses and go around the proxy: n3 talks to the primary alone.
	primary := s.waitHealthy(t, time.Minute)
	px := startProxy(t, primary.Addr())
	// n3 last, so that it likely holds no lease. minPoolSize: connections
	// open and idle, for the finish to go out on while answers are held
	// (a new connection's handshake would wait for its answer);
	// serverSelectionTimeoutMS: see the retried finish below.
	c.start("n1", "")
	c.start("n2", "")
	c.waitStarted()
	n3 := c.start("n3", "mongodb://"+px.addr()+"/?directConnection=true&minPoolSize=20&serverSelectionTimeoutMS=500", "--log-level", "debug")
	c.waitStarted()

	sub := &submitter{coll: c.db.Collection("tasks", options.Collection().SetWriteConcern(writeconcern.Majority()))}
	submitted := make(chan error, 1)
	go func() {
		const per = 20 // every 100 ms
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var err error
		for sent := 0; sent < dagThenTasks && err == nil; sent += per {
			ids, docs := batch(srcID, min(per, dagThenTasks-sent), 0)
			err = sub.insert(ids, docs, time.Now().Add(time.Minute))
			<-tick.C
		}
		submitted <- err
	}()
	dagWaitRunning(t, c.db, "n1", 30*time.Second)

	// pinned runs one task of the pinned queue on n3: once its plugin has
	// started, the proxy holds n3's answers (they never arrive; requests
	// on n3's open connections still reach MongoDB), the plugin answers,
	// and pinned returns once the task's finish has landed.
	pinned := func() bson.ObjectID {
		t.Helper()
		ids, docs := batch(pinID, 1, 0)
		require.NoError(t, sub.insert(ids, docs, time.Now().Add(30*time.Second)))
		id := ids[0]
		started := filepath.Join(signals, id.Hex()+".started")
		deadline := time.Now().Add(30 * time.Second)
		for _, err := os.Stat(started); err != nil; _, err = os.Stat(started) {
			require.False(t, time.Now().After(deadline), "the pinned task %s did not start on n3 within 30s", id.Hex())
			time.Sleep(5 * time.Millisecond)
		}
		_, err := px.p.Toxics.AddToxicJson(strings.NewReader(`{"name": "dag_hold", "type": "timeout", "stream": "downstream", "attributes": {"timeout": 0}}`))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(signals, id.Hex()+".go"), nil, 0o644))
		deadline = time.Now().Add(30 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			n, err := c.db.Collection("tasks").CountDocuments(ctx, bson.D{{Key: "_id", Value: id}, {Key: "status", Value: 1}})
			cancel()
			if err == nil && n == 1 {
				return id
			}
			require.False(t, time.Now().After(deadline), "the pinned task %s's finish did not land within 30s (err %v)", id.Hex(), err)
			time.Sleep(5 * time.Millisecond)
		}
	}
	finishedLine := func(id bson.ObjectID) bool {
		for _, line := range strings.Split(n3.p.log.String(), "\n") {
			if strings.Contains(line, `msg="task finished"`) && strings.Contains(line, "task_id="+id.Hex()) {
				return true
			}
		}
		return false
	}

	// Retried: the finish landed, its answer held; the proxy closes n3's
	// connections (a second timeout toxic, of 1 ms) and keeps closing new
	// ones, so the finish fails with a network error, and so does the
	// driver's own retry (no server within n3's serverSelectionTimeoutMS):
	// n3 retries the write itself. Then everything passes again, and n3's
	// retry finds the finish written (its guard no longer matches, the task
	// is where the write puts it), counts it done and chains.
	retried := pinned()
	_, err := px.p.Toxics.AddToxicJson(strings.NewReader(`{"name": "dag_close", "type": "timeout", "stream": "downstream", "attributes": {"timeout": 1}}`))
	require.NoError(t, err)
	retriedLines := func() []string {
		var out []string
		for _, line := range strings.Split(n3.p.log.String(), "\n") {
			if strings.Contains(line, `msg="task write failed; retrying"`) && strings.Contains(line, "task_id="+retried.Hex()) {
				out = append(out, line)
			}
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(retriedLines()) == 0 {
		require.False(t, time.Now().After(deadline), "n3 did not retry the finish of %s (its answer lost) within 30s", retried.Hex())
		time.Sleep(20 * time.Millisecond)
	}
	px.restore()
	deadline = time.Now().Add(45 * time.Second)
	for !finishedLine(retried) {
		require.False(t, time.Now().After(deadline), "n3 did not count the finish of %s (its answer lost) as done within 45s", retried.Hex())
		time.Sleep(20 * time.Millisecond)
	}

	// Killed between finish and chain: n3 killed once the finish landed,
	// its answer held.
	killed := pinned()
	require.NoError(t, n3.p.cmd.Process.Kill())
	<-n3.p.done
	n3.killed = true
	px.restore()
	require.False(t, finishedLine(killed), "n3 heard that the finish of %s landed: it was not killed before chaining", killed.Hex())

	require.NoError(t, <-submitted, "submit the source tasks")
	ofSources := bson.D{{Key: "queue", Value: bson.D{{Key: "$in", Value: bson.A{srcID, pinID}}}}}
	drained := dagWaitDone(t, c.db, ofSources, 60*time.Second)
	// The marks left are the leader's sweep's (once a tick).
	deadline = time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := c.db.Collection("tasks").CountDocuments(ctx, bson.D{{Key: "then_pending", Value: bson.D{{Key: "$exists", Value: true}}}})
		cancel()
		if err == nil && n == 0 {
			break
		}
		require.False(t, time.Now().After(deadline), "%d tasks still marked then_pending 30s after the sources drained (err %v)", n, err)
		time.Sleep(100 * time.Millisecond)
	}
	c.stop()

	sources := dagTasks(t, c.db, ofSources)
	require.Len(t, sources, dagThenTasks+2, "source tasks")
	chained := map[bson.ObjectID][]dagTask{}
	for _, x := range dagTasks(t, c.db, bson.D{{Key: "queue", Value: dstID}}) {
		from, ok := x.ChainedFrom.ObjectIDOK()
		require.True(t, ok, "then task %s has no chained_from", x.ID.Hex())
		chained[from] = append(chained[from], x)
	}
	var succeeded, notSucceeded int
	for _, a := range sources {
		kids := chained[a.ID]
		delete(chained, a.ID)
		require.Equal(t, bson.Type(0), a.ThenPending.Type, "task %s still marked then_pending", a.ID.Hex())
		if a.Status != 1 {
			notSucceeded++
			require.Empty(t, kids, "task %s ended with status %d and has then tasks", a.ID.Hex(), a.Status)
			continue
		}
		succeeded++
		require.Equal(t, bson.TypeArray, a.Output.Type, "task %s succeeded without its output", a.ID.Hex())
		seen := map[int32]bool{}
		for _, k := range kids {
			var p struct {
				From string `bson:"from"`
				I    int32  `bson:"i"`
			}
			require.NoError(t, bson.Unmarshal(k.Parameters, &p))
			require.Equal(t, a.ID.Hex(), p.From, "then task %s of %s carries another task's output", k.ID.Hex(), a.ID.Hex())
			require.False(t, seen[p.I], "task %s's output item %d became two tasks (%s among them)", a.ID.Hex(), p.I, k.ID.Hex())
			seen[p.I] = true
		}
		require.Len(t, kids, dagThenItems, "task %s (attempt %d) has %d then tasks, want one per output item", a.ID.Hex(), a.Attempt, len(kids))
	}
	require.Empty(t, chained, "then tasks chained from tasks that are not the sources'")
	for _, id := range []bson.ObjectID{retried, killed} {
		x := dagTasks(t, c.db, bson.D{{Key: "_id", Value: id}})
		require.Len(t, x, 1)
		require.Equal(t, 1, x[0].Status, "pinned task %s", id.Hex())
		require.Len(t, x[0].Attempts, 1, "pinned task %s", id.Hex())
		require.Equal(t, "n3", x[0].Attempts[0].Node, "pinned task %s", id.Hex())
	}

	// What the sweep did.
	var swept, sweptExisting, existed int
	var sweptKilled, sweptRetried bool
	for _, m := range dagSweepLine.FindAllStringSubmatch(c.logs(), -1) {
		swept++
		sweptKilled = sweptKilled || m[1] == killed.Hex()
		sweptRetried = sweptRetried || m[1] == retried.Hex()
		if e, _ := strconv.Atoi(m[3]); e > 0 {
			sweptExisting++
			existed += e
		}
	}
	t.Logf("then: the finish of %s (answer lost) was retried by n3: %s; the sweep chained it too: %v",
		retried.Hex(), strings.Join(retriedLines(), "\n"), sweptRetried)
	t.Logf("then: %d source tasks: %d succeeded (%d then tasks each), %d did not; drained %v after the kill; "+
		"the leader's sweep chained %d outputs, %d of them already partly chained by their node (%d tasks existed)",
		len(sources), succeeded, dagThenItems, notSucceeded, drained.Round(time.Millisecond), swept, sweptExisting, existed)
	if !sweptKilled {
		// It flaked once with its then tasks there: what the logs say of it.
		var about []string
		for _, line := range strings.Split(c.logs(), "\n") {
			if strings.Contains(line, killed.Hex()) {
				about = append(about, line)
			}
		}
		t.Fatalf("the leader's sweep did not chain %s, whose node was killed before chaining it; its then tasks: %d; the logs about it:\n%s",
			killed.Hex(), len(dagTasks(t, c.db, bson.D{{Key: "chained_from", Value: killed}})), strings.Join(about, "\n"))
	}
}

// dagWaitRunning waits until node runs at least one task.
func dagWaitRunning(t *testing.T, db *mongo.Database, node string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := db.Collection("tasks").CountDocuments(ctx, bson.D{{Key: "node", Value: node}, {Key: "status", Value: 0}})
		cancel()
		if err == nil && n > 0 {
			return
		}
		require.False(t, time.Now().After(deadline), "node %s ran no task within %v", node, timeout)
		time.Sleep(10 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Task graphs.

const (
	dagGraphTasks = 10_000
	dagQueueA     = "dag_a"
	dagQueueB     = "dag_b"
)

// dagSpec is a task of the generated graph.
type dagSpec struct {
	queue   string
	parents []int // indexes of earlier tasks
	run     bool  // on_parent_failure: "run"
	fails   bool  // its plugin fails it
}

// dagBuild generates the graph (deterministic): a fan-out of 300 and their
// fan-in into one task, a chain of diamonds, a failing task with
// descendants in several shapes, children that run anyway
// (on_parent_failure: run) and their children, and layers with hubs (see
// below) in which a hub fails late. Queues alternate or are drawn at
// random, so edges cross queues.
func dagBuild(n int) []dagSpec {
	rng := rand.New(rand.NewPCG(16, 2))
	var specs []dagSpec
	add := func(s dagSpec) int {
		if s.queue == "" {
			s.queue = dagQueueA
			if len(specs)%2 == 1 {
				s.queue = dagQueueB
			}
		}
		specs = append(specs, s)
		return len(specs) - 1
	}
	// A fan-out of 300 from one root, and their fan-in.
	root := add(dagSpec{})
	var fan []int
	for range 300 {
		fan = append(fan, add(dagSpec{parents: []int{root}}))
	}
	add(dagSpec{parents: fan})
	// A chain of diamonds.
	top := add(dagSpec{})
	for range 4 {
		l := add(dagSpec{parents: []int{top}})
		r := add(dagSpec{parents: []int{top}})
		top = add(dagSpec{parents: []int{l, r}})
	}
	// A failing task and its descendants.
	ok := add(dagSpec{}) // a task that succeeds, a parent beside failed ones
	f := add(dagSpec{fails: true, parents: []int{root}})
	var children []int
	for range 25 {
		children = append(children, add(dagSpec{parents: []int{f}}))
	}
	var grand []int
	for j, ch := range children {
		for k := range 3 {
			ps := []int{ch}
			if k == 2 {
				ps = append(ps, ok) // a parent that succeeds does not save it
			}
			grand = append(grand, add(dagSpec{parents: ps}))
		}
		if j < 10 { // a diamond below the failed task
			add(dagSpec{parents: []int{grand[3*j], grand[3*j+1]}})
		}
	}
	runs := add(dagSpec{run: true, parents: []int{f, ok}})
	add(dagSpec{parents: []int{runs}})                         // its parent ran anyway and succeeded
	runs2 := add(dagSpec{run: true, parents: []int{grand[0]}}) // its parent never ran (parent_failed)
	add(dagSpec{parents: []int{runs2, children[1]}})           // one parent ran, the other failed
	// Layers fill the rest. In each, a few tasks at random places are the
	// hubs: every task of the next layer names one to three of them
	// (fan-in), so each hub has hundreds of children (fan-out), two hubs
	// with a shared parent and a shared child make a diamond, and one task
	// in five also names a hub two layers up. Children become ready in
	// cohorts as hubs end, as in real pipelines, so claims take batches.
	const width, hubs = 900, 6
	var hubsOf [][]int
	for l := 0; len(specs) < n; l++ {
		var layer []int
		for range min(width, n-len(specs)) {
			s := dagSpec{queue: []string{dagQueueA, dagQueueB}[rng.IntN(2)]}
			if l > 0 {
				from := hubsOf[l-1]
				for _, k := range rng.Perm(len(from))[:1+rng.IntN(3)] {
					s.parents = append(s.parents, from[k])
				}
				if l > 1 && rng.IntN(5) == 0 {
					s.parents = append(s.parents, hubsOf[l-2][rng.IntN(hubs)])
				}
			}
			layer = append(layer, add(s))
		}
		var hs []int
		for _, k := range rng.Perm(len(layer))[:min(hubs, len(layer))] {
			hs = append(hs, layer[k])
		}
		hubsOf = append(hubsOf, hs)
	}
	// A hub of the last-but-one layer fails: its children end unrun.
	specs[hubsOf[len(hubsOf)-2][0]].fails = true
	return specs
}

// dagExpect is what the graph rules make of specs: whether each task runs,
// and its final status.
func dagExpect(specs []dagSpec) (ran []bool, status []int) {
	ran, status = make([]bool, len(specs)), make([]int, len(specs))
	for i, s := range specs { // parents come first
		ran[i] = true
		for _, p := range s.parents {
			if status[p] != 1 && !s.run {
				ran[i] = false
			}
		}
		switch {
		case !ran[i] || s.fails:
			status[i] = 2
		default:
			status[i] = 1
		}
	}
	return ran, status
}

// dagGraph: a task graph of 10,000 tasks in two queues, submitted whole
// with `disbatch task submit --graph` while three nodes run. Checked, from
// the change stream (cluster times) and the task documents: every task
// ran at most once (one start, one attempt), each task that ran started
// after every one of its parents had ended (a later cluster time than the
// parent's final status, and a later start than the parent's finish in the
// documents), the failing tasks' descendants ended unrun with status 2 and
// reason parent_failed (a line in stderr naming a parent), and the
// children with on_parent_failure: run ran anyway, as did their own
// children when they succeeded; every status is what the rules say.
func dagGraph(t *testing.T, s *faultSuite) {
	c := dagNewCluster(t, s)
	for _, q := range []string{dagQueueA, dagQueueB} {
		cli(t, s.uri, c.dbName, "", "queue", "create", q, "--constructor", "Disbatch::Plugin::Demo", "--maxthreads", "32")
	}
	specs := dagBuild(dagGraphTasks)
	require.Len(t, specs, dagGraphTasks)
	ran, status := dagExpect(specs)
	var lines strings.Builder
	for i, sp := range specs {
		line := map[string]any{"ref": fmt.Sprintf("t%d", i), "queue": sp.queue, "parameters": map[string]string{"commands": "a"}}
		if sp.fails {
			line["parameters"] = map[string]string{"commands": "c"}
		}
		if len(sp.parents) > 0 {
			refs := make([]string, len(sp.parents))
			for k, p := range sp.parents {
				refs[k] = fmt.Sprintf("t%d", p)
			}
			line["parents"] = refs
		}
		if sp.run {
			line["on_parent_failure"] = "run"
		}
		b, err := json.Marshal(line)
		require.NoError(t, err)
		lines.Write(b)
		lines.WriteByte('\n')
	}
	file := filepath.Join(t.TempDir(), "graph.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(lines.String()), 0o644))

	c.startThree()
	stream := dagWatch(t, c.db)
	begin := time.Now()
	out := cli(t, s.uri, c.dbName, "", "task", "submit", dagQueueA, file, "--graph", "--json")
	inserted := time.Since(begin)
	var ans struct {
		Submitted int               `json:"submitted"`
		Refs      map[string]string `json:"refs"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &ans), "the submit's answer: %.300s", out)
	require.Equal(t, dagGraphTasks, ans.Submitted)
	ids := make([]bson.ObjectID, len(specs))
	index := make(map[bson.ObjectID]int, len(specs))
	for i := range specs {
		id, err := bson.ObjectIDFromHex(ans.Refs[fmt.Sprintf("t%d", i)])
		require.NoError(t, err, "ref t%d", i)
		ids[i], index[id] = id, i
	}
	ranIn := dagWaitDone(t, c.db, nil, 3*time.Minute)
	events := stream.sync(t)
	c.stop()

	// From the change stream: each task's starts, and when it ended.
	starts := make([][]bson.Timestamp, len(specs))
	ends := make([]bson.Timestamp, len(specs))
	ended := make([]bool, len(specs))
	for _, e := range events {
		i, ok := index[e.id]
		if !ok || !e.hasStatus {
			continue
		}
		switch {
		case e.status == 0:
			starts[i] = append(starts[i], e.ts)
		case e.status > 0:
			require.False(t, ended[i], "task t%d (%s) ended twice", i, e.id.Hex())
			ends[i], ended[i] = e.ts, true
		}
	}
	t.Log(dagLatencies(specs, index, events))
	docs := map[bson.ObjectID]dagTask{}
	for _, x := range dagTasks(t, c.db, bson.D{}) {
		docs[x.ID] = x
	}
	require.Len(t, docs, dagGraphTasks)
	var nRan, nUnrun, nFailed, nRunAnyway, edges int
	for i, sp := range specs {
		x := docs[ids[i]]
		name := fmt.Sprintf("task t%d (%s, parents %v)", i, x.ID.Hex(), sp.parents)
		if len(sp.parents) > 10 {
			name = fmt.Sprintf("task t%d (%s, %d parents)", i, x.ID.Hex(), len(sp.parents))
		}
		require.True(t, ended[i], "%s: no end in the change stream", name)
		require.Equal(t, status[i], x.Status, "%s: status", name)
		require.Equal(t, bson.Type(0), x.Awaiting.Type, "%s: still awaiting_parents", name)
		require.Len(t, x.Parents, len(sp.parents), "%s: parents stored", name)
		for _, p := range sp.parents {
			require.Contains(t, x.Parents, ids[p], "%s: parents stored", name)
		}
		if !ran[i] {
			nUnrun++
			require.Empty(t, starts[i], "%s: ran though a parent failed", name)
			require.Equal(t, "parent_failed", x.Reason, "%s: reason", name)
			require.Empty(t, x.Attempts, "%s: has attempts", name)
			named := false
			for _, p := range sp.parents {
				named = named || strings.Contains(rawString(x.Stderr), ids[p].Hex())
			}
			require.True(t, named, "%s: its stderr names no parent: %q", name, rawString(x.Stderr))
			continue
		}
		nRan++
		if sp.fails {
			nFailed++
		}
		require.Len(t, starts[i], 1, "%s: started %d times", name, len(starts[i]))
		require.NotEqual(t, "parent_failed", x.Reason, "%s: ran, yet its reason is parent_failed", name)
		require.Len(t, x.Attempts, 1, "%s: attempts", name)
		require.Equal(t, 1, x.Attempt, "%s: attempt", name)
		anyFailed := false
		for _, p := range sp.parents {
			edges++
			pd := docs[ids[p]]
			anyFailed = anyFailed || status[p] != 1
			require.True(t, dagBefore(ends[p], starts[i][0]), "%s started (cluster time %v) before its parent t%d (%s) ended (%v)",
				name, starts[i][0], p, ids[p].Hex(), ends[p])
			if len(pd.Attempts) > 0 {
				require.False(t, x.Attempts[0].Started.Before(pd.Attempts[0].Finished), "%s started at %v, before its parent t%d finished at %v",
					name, x.Attempts[0].Started, p, pd.Attempts[0].Finished)
			}
		}
		if anyFailed {
			nRunAnyway++
			require.True(t, sp.run, "%s ran though a parent failed", name)
		}
	}
	t.Logf("graph: %d tasks (%d edges to tasks that ran) inserted in %v, all ended %v later: %d ran (%d failed by their plugin, %d despite a failed parent), %d ended unrun with parent_failed; %d change events",
		len(specs), edges, inserted.Round(time.Millisecond), ranIn.Round(time.Millisecond), nRan, nFailed, nRunAnyway, nUnrun, len(events))
	require.Equal(t, 2, nFailed, "failing tasks")
	require.Equal(t, 2, nRunAnyway, "tasks run despite a failed parent")
	require.Greater(t, nUnrun, 100, "descendants of the failing tasks")
}

// dagLatencies describes where the graph's time went: from the last
// parent's end to the child's queueing (the graph's settle), from queued
// to claimed, claimed to started, started to ended (medians and 90th
// percentiles, by the primary's clock).
func dagLatencies(specs []dagSpec, index map[bson.ObjectID]int, events []dagEvent) string {
	type times struct{ queued, claimed, started, ended time.Time }
	at := make([]times, len(specs))
	var first, last time.Time
	for _, e := range events {
		i, ok := index[e.id]
		if !ok || !e.hasStatus {
			continue
		}
		if first.IsZero() || e.wall.Before(first) {
			first = e.wall
		}
		last = e.wall
		switch {
		case e.status == -2:
			at[i].queued = e.wall
		case e.status == -1:
			at[i].claimed = e.wall
		case e.status == 0:
			if at[i].claimed.IsZero() { // claimed straight into running
				at[i].claimed = e.wall
			}
			at[i].started = e.wall
		case e.status > 0:
			at[i].ended = e.wall
		}
	}
	var settle, claim, start, run []time.Duration
	var held time.Duration // summed over tasks: claimed until ended
	for i, s := range specs {
		x := at[i]
		if len(s.parents) > 0 && !x.queued.IsZero() {
			var lastParent time.Time
			for _, p := range s.parents {
				if at[p].ended.After(lastParent) {
					lastParent = at[p].ended
				}
			}
			settle = append(settle, x.queued.Sub(lastParent))
		}
		if !x.queued.IsZero() && !x.claimed.IsZero() {
			claim = append(claim, x.claimed.Sub(x.queued))
		}
		if !x.claimed.IsZero() && !x.started.IsZero() {
			start = append(start, x.started.Sub(x.claimed))
		}
		if !x.started.IsZero() && !x.ended.IsZero() {
			run = append(run, x.ended.Sub(x.started))
		}
		if !x.claimed.IsZero() && !x.ended.IsZero() {
			held += x.ended.Sub(x.claimed)
		}
	}
	q := func(ds []time.Duration) string {
		if len(ds) == 0 {
			return "-"
		}
		slices.Sort(ds)
		return fmt.Sprintf("%v/%v", ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)*9/10].Round(time.Millisecond))
	}
	return fmt.Sprintf("graph latencies (median/p90): last parent ended -> queued %s, queued -> claimed %s, claimed -> started %s, started -> ended %s; first to last change %v, %.1f tasks claimed or running on average",
		q(settle), q(claim), q(start), q(run), last.Sub(first).Round(time.Millisecond), float64(held)/float64(max(last.Sub(first), 1)))
}
