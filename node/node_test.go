package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/internal/lifecycle/lifecycletest"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/internal/syncbuf"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

// execution is one run of the recording plugin.
type execution struct {
	node       string
	start, end time.Time
}

// recorder is a test plugin that records every execution and the highest
// concurrency it saw per node and per (node, queue).
type recorder struct {
	mu      sync.Mutex
	runs    map[bson.ObjectID][]execution
	order   []bson.ObjectID
	cur     map[string]int
	maxSeen map[string]int
	sleep   time.Duration
}

func newRecorder() *recorder {
	return &recorder{runs: map[bson.ObjectID][]execution{}, cur: map[string]int{}, maxSeen: map[string]int{}}
}

func (r *recorder) Run(ctx context.Context, t plugin.Task) plugin.Result {
	keys := []string{t.Node, t.Node + "/" + t.Queue, "queue:" + t.Queue}
	r.mu.Lock()
	for _, k := range keys {
		r.cur[k]++
		r.maxSeen[k] = max(r.maxSeen[k], r.cur[k])
	}
	r.order = append(r.order, t.ID)
	r.mu.Unlock()
	start := time.Now()
	if r.sleep > 0 {
		time.Sleep(r.sleep)
	}
	r.mu.Lock()
	for _, k := range keys {
		r.cur[k]--
	}
	r.runs[t.ID] = append(r.runs[t.ID], execution{t.Node, start, time.Now()})
	r.mu.Unlock()
	return plugin.Result{Status: schema.StatusSucceeded, Stdout: "ran on " + t.Node}
}

func (r *recorder) max(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxSeen[key]
}

// logBuf collects a node's logs for assertions.
type logBuf = syncbuf.Buffer

type bundle struct {
	t     *testing.T
	db    *mongo.Database
	store *store.Store
	rec   *recorder
	reg   *plugin.Registry
	logs  *logBuf
}

func setup(t *testing.T) *bundle {
	t.Parallel()
	db := mongotest.Database(t)
	b := &bundle{t: t, db: db, store: store.New(db, store.Options{}), rec: newRecorder(), reg: plugin.NewRegistry(), logs: &logBuf{}}
	b.reg.Register("test", b.rec)
	b.reg.Register(plugin.DemoConstructor, plugin.Demo())
	// Registered first, so it runs last: after the nodes stopped.
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(failureLog(b.logs.String(), 100))
		}
	})
	return b
}

// failureLog is what a failed test shows of its nodes' log: every warning
// and error, and the last n lines (a CI run shows nothing else of it).
func failureLog(log string, n int) string {
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	var bad []string
	for _, l := range lines {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			bad = append(bad, l)
		}
	}
	all := len(bad)
	if all > 2*n {
		bad = append(bad[:n:n], bad[all-n:]...) // the first and the last
	}
	return fmt.Sprintf("the nodes' warnings and errors (%d; at most the first and last %d shown):\n%s\nthe log's last %d lines:\n%s",
		all, n, strings.Join(bad, "\n"), n, strings.Join(lines[max(0, len(lines)-n):], "\n"))
}

func (b *bundle) config(name string) Config {
	return Config{
		Name: name, Store: b.store, Plugins: b.reg, Tick: 200 * time.Millisecond, Grace: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// start starts a node and stops it at the end of the test.
func (b *bundle) start(cfg Config) *Node {
	b.t.Helper()
	n, err := New(cfg)
	require.NoError(b.t, err)
	require.NoError(b.t, n.Start(context.Background()))
	b.t.Cleanup(n.Stop)
	return n
}

func (b *bundle) queue(name, constructor string, maxThreads int, sort schema.Sort) bson.ObjectID {
	b.t.Helper()
	q, err := b.store.QueueCreate(context.Background(), store.QueueCreateParams{Name: name, Constructor: constructor, MaxThreads: &maxThreads, Sort: sort})
	require.NoError(b.t, err)
	return q.ID
}

func (b *bundle) tasks(q bson.ObjectID, n int, params func(i int) bson.D) []bson.ObjectID {
	b.t.Helper()
	ps := make([]bson.Raw, n)
	for i := range ps {
		d := bson.D{{Key: "i", Value: i}}
		if params != nil {
			d = params(i)
		}
		raw, err := bson.Marshal(d)
		require.NoError(b.t, err)
		ps[i] = raw
	}
	var ids []bson.ObjectID
	for start := 0; start < n; start += 1000 {
		got, err := b.store.TaskInsertMany(context.Background(), store.TaskInsertManyParams{Queue: q, Parameters: ps[start:min(start+1000, n)]})
		require.NoError(b.t, err)
		ids = append(ids, got...)
	}
	return ids
}

func (b *bundle) count(filter bson.D) int64 {
	n, err := b.db.Collection("tasks").CountDocuments(context.Background(), filter)
	require.NoError(b.t, err)
	return n
}

func (b *bundle) task(id bson.ObjectID) bson.Raw {
	raw, err := b.db.Collection("tasks").FindOne(context.Background(), bson.D{{Key: "_id", Value: id}}).Raw()
	require.NoError(b.t, err)
	return raw
}

func (b *bundle) waitStatus(id bson.ObjectID, status schema.Status, within time.Duration) {
	b.t.Helper()
	require.Eventually(b.t, func() bool {
		return b.task(id).Lookup("status").AsInt64() == int64(status)
	}, within, 5*time.Millisecond, "task %s never reached status %d: %s", id.Hex(), status, b.task(id))
}

func (b *bundle) waitDone(filter bson.D, want int64, within time.Duration) {
	b.t.Helper()
	f := append(bson.D{{Key: "status", Value: bson.D{{Key: "$gt", Value: 0}}}}, filter...)
	deadline := time.Now().Add(within)
	for {
		n := b.count(f)
		if n == want {
			return
		}
		// The count when it gave up (a message built before the wait would
		// say how many had finished when it began).
		require.False(b.t, time.Now().After(deadline), "finished %d of %d within %v", n, want, within)
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNodesRunEveryTaskExactlyOnce(t *testing.T) {
	for _, nodes := range []int{2, 5} {
		t.Run(fmt.Sprintf("%d nodes", nodes), func(t *testing.T) {
			b := setup(t)
			b.rec.sleep = 5 * time.Millisecond
			q := b.queue("work", "test", 4, schema.SortFIFO)
			ids := b.tasks(q, 2000, nil)
			for i := range nodes {
				cfg := b.config(fmt.Sprintf("n%d", i))
				if i == 0 {
					cfg.MaxThreads = ptr(2) // a node-wide cap below the queue's
					cfg.FenceAfter = 12345 * time.Millisecond
				}
				b.start(cfg)
			}
			// Generous: this asserts exactly once, not a rate. A loaded CI
			// run (-race, beside the integration suite, load average 17 on
			// two cores) ran about 8 tasks a second here.
			b.waitDone(bson.D{{Key: "queue", Value: q}}, 2000, 5*time.Minute)
			require.Equal(t, int64(2000), b.count(bson.D{{Key: "status", Value: 1}}))
			b.rec.mu.Lock()
			defer b.rec.mu.Unlock()
			require.Len(t, b.rec.runs, 2000)
			perNode := map[string]int{}
			for _, id := range ids {
				runs := b.rec.runs[id]
				require.Len(t, runs, 1, "task %s ran %d times", id.Hex(), len(runs))
				perNode[runs[0].node]++
			}
			n0, err := b.store.NodeGet(context.Background(), "n0")
			require.NoError(t, err)
			require.Equal(t, ptr(2), n0.OwnMaxThreads, "its heartbeat says its own cap")
			require.Equal(t, 12345*time.Millisecond, n0.FenceAfter, "its heartbeat says its --fence-after")
			for i := range nodes {
				node := fmt.Sprintf("n%d", i)
				require.Positive(t, perNode[node], "node %s ran nothing", node)
				limit := 4
				if i == 0 {
					limit = 2
				}
				require.LessOrEqual(t, b.rec.maxSeen[node+"/work"], limit, "node %s exceeded its limit", node)
				require.GreaterOrEqual(t, b.rec.maxSeen[node+"/work"], 2, "node %s never ran tasks concurrently: the sampling proves nothing", node)
			}
		})
	}
}

// TestTasksQueuedByDisbatch4103Run: tasks with node null (as Disbatch
// 4.103's programs queue them) in a queue of ours, in a backlog and
// queued while it drains and once it is empty, all run once. The claimer
// leaves node null out of most claims of a backlog (it costs MongoDB a
// walk over the queue's claimed index entries), so this is what says it
// still finds them.
func TestTasksQueuedByDisbatch4103Run(t *testing.T) {
	b := setup(t)
	b.rec.sleep = time.Millisecond
	q := b.queue("work", "test", 8, schema.SortFIFO)
	tasks := b.db.Collection("tasks")
	perl := func(n int) []bson.ObjectID {
		var docs []any
		var ids []bson.ObjectID
		for i := range n {
			id := bson.NewObjectID()
			ids = append(ids, id)
			docs = append(docs, bson.D{{Key: "_id", Value: id}, {Key: "queue", Value: q}, {Key: "status", Value: -2}, {Key: "node", Value: nil},
				{Key: "params", Value: bson.D{{Key: "perl", Value: i}}}, {Key: "ctime", Value: time.Now()}, {Key: "mtime", Value: time.Now()}})
		}
		_, err := tasks.InsertMany(context.Background(), docs)
		require.NoError(t, err)
		return ids
	}
	var want []bson.ObjectID
	want = append(want, b.tasks(q, 300, nil)...)
	want = append(want, perl(10)...)
	want = append(want, b.tasks(q, 300, nil)...)
	b.start(b.config("n1"))
	require.Eventually(t, func() bool { return b.count(bson.D{{Key: "status", Value: bson.D{{Key: "$gt", Value: 0}}}}) >= 50 }, time.Minute, 5*time.Millisecond)
	want = append(want, perl(10)...) // while the backlog drains
	b.waitDone(nil, int64(len(want)), 2*time.Minute)
	want = append(want, perl(5)...) // into the empty queue
	b.waitDone(nil, int64(len(want)), time.Minute)

	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Len(t, b.rec.runs, len(want))
	for _, id := range want {
		require.Len(t, b.rec.runs[id], 1, "task %s", id.Hex())
	}
}

// TestTasksQueuedBelowTheClaimBoundRun: tasks whose ids sort before the
// ones a node is draining (another submitter's, or an hour old) are
// claimed though the node's fifo claims start where the last ones read.
func TestTasksQueuedBelowTheClaimBoundRun(t *testing.T) {
	b := setup(t)
	b.rec.sleep = time.Millisecond
	q := b.queue("work", "test", 8, schema.SortFIFO)
	want := b.tasks(q, 600, nil)
	b.start(b.config("n1"))
	require.Eventually(t, func() bool { return b.count(bson.D{{Key: "status", Value: bson.D{{Key: "$gt", Value: 0}}}}) >= 50 }, time.Minute, 5*time.Millisecond)
	var docs []any
	for i := range 10 {
		id := bson.NewObjectIDFromTimestamp(time.Now().Add(-time.Hour))
		want = append(want, id)
		docs = append(docs, bson.D{{Key: "_id", Value: id}, {Key: "queue", Value: q}, {Key: "status", Value: -2}, {Key: "node", Value: -1},
			{Key: "parameters", Value: bson.D{{Key: "early", Value: i}}}, {Key: "ctime", Value: time.Now()}, {Key: "mtime", Value: time.Now()}})
	}
	_, err := b.db.Collection("tasks").InsertMany(context.Background(), docs)
	require.NoError(t, err)
	b.waitDone(nil, int64(len(want)), 2*time.Minute)

	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Len(t, b.rec.runs, len(want))
	for _, id := range want {
		require.Len(t, b.rec.runs[id], 1, "task %s", id.Hex())
	}
}

func ptr[T any](v T) *T { return &v }

// recv receives from ch or fails the test after 10 s.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting on a channel")
	}
	var zero T
	return zero
}

func TestFIFOAndLIFOOrder(t *testing.T) {
	for _, sort := range []schema.Sort{schema.SortFIFO, schema.SortLIFO} {
		t.Run(string(sort), func(t *testing.T) {
			b := setup(t)
			q := b.queue("q", "test", 1, sort)
			ids := b.tasks(q, 30, nil)
			b.start(b.config("n1"))
			b.waitDone(nil, 30, 30*time.Second)
			b.rec.mu.Lock()
			defer b.rec.mu.Unlock()
			want := append([]bson.ObjectID(nil), ids...)
			if sort == schema.SortLIFO {
				for i, j := 0, len(want)-1; i < j; i, j = i+1, j-1 {
					want[i], want[j] = want[j], want[i]
				}
			}
			require.Equal(t, want, b.rec.order)
		})
	}
}

// TestPriorityOrder: on a queue sorted by priority the node runs the
// highest task priority first, then the oldest; tasks without one last.
func TestPriorityOrder(t *testing.T) {
	b := setup(t)
	q := b.queue("q", "test", 1, schema.SortPriority)
	var want []bson.ObjectID
	byPriority := map[int64][]bson.ObjectID{}
	for i, p := range []int64{0, 3, 1, 3, 0, 7, 1, 0, 7, 3} {
		byPriority[p] = append(byPriority[p], b.insert(q, &store.TaskInsertControl{Priority: p}, bson.D{{Key: "i", Value: i}})[0])
	}
	for _, p := range []int64{7, 3, 1, 0} {
		want = append(want, byPriority[p]...)
	}
	b.start(b.config("n1"))
	b.waitDone(nil, int64(len(want)), 30*time.Second)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Equal(t, want, b.rec.order)
}

func TestChangeStreamWakeUpBeatsTheTick(t *testing.T) {
	for _, pollOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("poll-only=%v", pollOnly), func(t *testing.T) {
			b := setup(t)
			q := b.queue("q", "test", 2, schema.SortFIFO)
			cfg := b.config("n1")
			cfg.Tick = 10 * time.Second
			cfg.PollOnly = pollOnly
			var passes atomic.Int64
			cfg.passed = func() { passes.Add(1) }
			n := b.start(cfg)
			// Past the first pass (the start's own), which a loaded machine
			// may delay: a task it claimed would not count as woken.
			require.Eventually(t, func() bool { return passes.Load() > 0 }, 10*time.Second, time.Millisecond)
			id := b.tasks(q, 1, nil)[0]
			if pollOnly {
				// The control: without change streams nothing happens until the tick.
				time.Sleep(1500 * time.Millisecond)
				require.Equal(t, int64(schema.StatusQueued), b.task(id).Lookup("status").AsInt64())
				return
			}
			start := time.Now()
			// Well under the 10 s tick (a loaded machine takes its time
			// over the writes), and WakePasses below says what woke it.
			b.waitStatus(id, schema.StatusSucceeded, 5*time.Second)
			t.Logf("insert to finished: %v", time.Since(start))
			// A pass's stats are counted when it ends, and it goes on
			// claiming after it dispatched the task (a loaded CI run saw
			// the task finished first).
			require.Eventually(t, func() bool { return n.ClaimerStats().WakePasses > 0 }, 5*time.Second, time.Millisecond,
				"the pass that claimed the task was a wake-up's")
			require.Positive(t, n.StreamStats().Events)
		})
	}
}

func TestRestartedNodeMissesNoTask(t *testing.T) {
	b := setup(t)
	q := b.queue("q", "test", 4, schema.SortFIFO)
	cfg := b.config("n1")
	cfg.Tick = time.Minute // only the resumed stream can find the tasks within the waits below
	n, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, n.Start(context.Background()))
	b.tasks(q, 50, nil)
	b.waitDone(nil, 50, 15*time.Second)
	n.Stop()
	b.tasks(q, 50, nil) // while the node is down
	saved, err := b.store.StreamTokenGet(context.Background(), "node:n1")
	require.NoError(t, err, "the stream saved its resume token at Stop")
	require.NotEmpty(t, saved)
	b.start(cfg)
	b.tasks(q, 50, nil) // after the restart
	b.waitDone(nil, 150, 15*time.Second)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Len(t, b.rec.runs, 150)
}

func TestQueuesTheNodeDoesNotServe(t *testing.T) {
	b := setup(t)
	unknown := b.queue("unknown", "No::Such::Plugin", 2, "")
	zero := b.queue("zero", "test", 0, "")
	good := b.queue("good", "test", 2, "")
	b.tasks(unknown, 3, nil)
	b.tasks(zero, 3, nil)
	b.tasks(good, 3, nil)
	b.start(b.config("n1"))
	b.waitDone(bson.D{{Key: "queue", Value: good}}, 3, 5*time.Second)
	time.Sleep(600 * time.Millisecond) // several ticks
	require.Equal(t, int64(6), b.count(bson.D{{Key: "status", Value: -2}}))
	require.Equal(t, 1, b.logs.Count("no plugin for constructor No::Such::Plugin"), "logged once, not every tick:\n%s", b.logs)
	require.Equal(t, 1, b.logs.Count("start it with --plugin No::Such::Plugin=PATH"), "saying how to give it one:\n%s", b.logs)
	require.Equal(t, 1, b.logs.Count("maxthreads is 0 or null"))

	// Re-checked each tick: once the queue names a plugin this node has, it runs.
	c := "test"
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: unknown, Constructor: &c}))
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: zero, SetMaxThreads: true, MaxThreads: ptr(1)}))
	b.waitDone(nil, 9, 5*time.Second)
}

func TestPinIgnoreAndConfigQueues(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	pinB := b.queue("pinB", "test", 2, "")
	ignoreB := b.queue("ignoreB", "test", 2, "")
	both := b.queue("both", "test", 2, "") // pin wins over ignore
	notActive := b.queue("notActive", "test", 2, "")
	require.NoError(t, b.store.QueueUpdate(ctx, store.QueueUpdateParams{ID: pinB, NodesPin: &[]string{"b"}}))
	require.NoError(t, b.store.QueueUpdate(ctx, store.QueueUpdateParams{ID: ignoreB, NodesIgnore: &[]string{"b"}}))
	require.NoError(t, b.store.QueueUpdate(ctx, store.QueueUpdateParams{ID: both, NodesPin: &[]string{"a"}, NodesIgnore: &[]string{"a"}}))
	// Node c reads a config with activequeues; nodes a and b read none.
	_, err := b.db.Collection("config").InsertOne(ctx, bson.D{{Key: "label", Value: "c-only"}, {Key: "activequeues", Value: bson.A{notActive.Hex()}}})
	require.NoError(t, err)
	for _, q := range []bson.ObjectID{pinB, ignoreB, both, notActive} {
		b.tasks(q, 6, nil)
	}
	cfgC := b.config("c")
	cfgC.Label = "c-only"
	b.start(b.config("a"))
	b.start(b.config("b"))
	b.start(cfgC)
	b.waitDone(nil, 24, 10*time.Second)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	ranOn := map[string]map[string]bool{}
	for id, runs := range b.rec.runs {
		raw := b.task(id)
		var qname string
		for name, qid := range map[string]bson.ObjectID{"pinB": pinB, "ignoreB": ignoreB, "both": both, "notActive": notActive} {
			if raw.Lookup("queue").ObjectID() == qid {
				qname = name
			}
		}
		if ranOn[qname] == nil {
			ranOn[qname] = map[string]bool{}
		}
		ranOn[qname][runs[0].node] = true
	}
	require.Equal(t, map[string]bool{"b": true}, ranOn["pinB"])
	require.NotContains(t, ranOn["ignoreB"], "b")
	require.NotContains(t, ranOn["ignoreB"], "c", "c runs only its activequeues")
	require.Equal(t, map[string]bool{"a": true}, ranOn["both"])
	require.True(t, ranOn["notActive"]["c"] || ranOn["notActive"]["a"] || ranOn["notActive"]["b"])
	require.Contains(t, b.logs.String(), "not in the config's activequeues")
}

func TestOrphanRules(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	q := b.queue("q", "test", 0, "") // runs nothing: only the reaper acts
	ids := b.tasks(q, 4, nil)
	set := func(id bson.ObjectID, node string, status int, mtime time.Time) {
		_, err := b.db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "node", Value: node}, {Key: "status", Value: status}, {Key: "mtime", Value: mtime}}}})
		require.NoError(t, err)
	}
	set(ids[0], "n1", -1, time.Now())                        // left by this node's previous run
	set(ids[1], "n1", 0, time.Now())                         // likewise, running
	set(ids[2], "other", -1, time.Now().Add(-2*time.Second)) // another node's claim, about to be stale
	set(ids[3], "other", 0, time.Now().Add(-time.Hour))      // another node running: not the reaper's business
	cfg := b.config("n1")
	cfg.OrphanAfter = 3 * time.Second
	b.start(cfg)
	require.Equal(t, int64(-6), b.task(ids[0]).Lookup("status").AsInt64(), "own leftovers are orphaned before the node claims")
	require.Equal(t, int64(-6), b.task(ids[1]).Lookup("status").AsInt64())
	require.Equal(t, int64(-1), b.task(ids[2]).Lookup("status").AsInt64(), "not stale yet")
	b.waitStatus(ids[2], schema.StatusOrphaned, 5*time.Second)
	require.Equal(t, int64(0), b.task(ids[3]).Lookup("status").AsInt64())
}

// blocker is a test plugin that runs until released or killed.
type blocker struct {
	started chan bson.ObjectID
	release chan struct{}
}

func (p *blocker) Run(ctx context.Context, t plugin.Task) plugin.Result {
	p.started <- t.ID
	select {
	case <-p.release:
		return plugin.Result{Status: schema.StatusSucceeded, Stdout: "late result"}
	case <-ctx.Done():
		return plugin.Result{Status: schema.StatusFailed, Stderr: "killed"}
	}
}

func TestGuardedFinishCannotOverwriteANewOwner(t *testing.T) {
	b := setup(t)
	blk := &blocker{started: make(chan bson.ObjectID, 10), release: make(chan struct{})}
	b.reg.Register("block", blk)
	q := b.queue("q", "block", 1, schema.SortFIFO)
	ids := b.tasks(q, 2, nil)
	b.start(b.config("n1"))
	first := recv(t, blk.started)
	require.Equal(t, ids[0], first)
	// While it runs, the task is taken away (another node's recovery, an operator).
	_, err := b.db.Collection("tasks").UpdateOne(context.Background(), bson.D{{Key: "_id", Value: first}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -6}}}})
	require.NoError(t, err)
	blk.release <- struct{}{}
	second := recv(t, blk.started)
	require.Equal(t, ids[1], second)
	close(blk.release)
	b.waitStatus(second, schema.StatusSucceeded, 5*time.Second)
	raw := b.task(first)
	require.Equal(t, int64(-6), raw.Lookup("status").AsInt64(), "the lost task's result did not land")
	require.Equal(t, bson.TypeNull, raw.Lookup("stdout").Type)
	require.Contains(t, b.logs.String(), "task was taken from this node; its finish was not written")
}

func TestOutputGoesToGridFSOverTheThreshold(t *testing.T) {
	b := setup(t)
	b.store = store.New(b.db, store.Options{OutputThreshold: 512 << 10})
	q := b.queue("demo", plugin.DemoConstructor, 2, schema.SortFIFO)
	ids := b.tasks(q, 2, func(i int) bson.D {
		return bson.D{{Key: "commands", Value: []string{"1", "a"}[i]}}
	})
	b.start(b.config("n1"))
	b.waitDone(nil, 2, 10*time.Second)
	big, small := b.task(ids[0]), b.task(ids[1])
	require.Equal(t, bson.TypeObjectID, big.Lookup("stdout").Type, "1 MiB of stdout goes to GridFS")
	require.Equal(t, "This is command 'a' for apple.\n", small.Lookup("stdout").StringValue())
	task, err := schema.DecodeTask(big)
	require.NoError(t, err)
	out, err := b.store.TaskOutputRead(context.Background(), task.Stdout)
	require.NoError(t, err)
	require.Len(t, out, 1<<20)
}

func TestShutdownHandsBackClaimedAndKillsRunning(t *testing.T) {
	b := setup(t)
	blk := &blocker{started: make(chan bson.ObjectID, 10), release: make(chan struct{})}
	b.reg.Register("block", blk)
	slow := b.queue("slow", "block", 2, schema.SortFIFO)
	held := b.queue("held", "test", 1, schema.SortFIFO)
	slowIDs := b.tasks(slow, 2, nil)
	heldID := b.tasks(held, 1, nil)[0]
	cfg := b.config("n1")
	cfg.Grace = 300 * time.Millisecond
	var n *Node
	claimedHeld := make(chan bson.ObjectID, 1)
	cfg.beforeStart = func(task schema.Task) {
		// Hold the task of queue "held" between claim and start until the node stops.
		if task.ID == heldID {
			claimedHeld <- task.ID
			for n.runner.handBack() == "" {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}
	var err error
	n, err = New(cfg)
	require.NoError(t, err)
	require.NoError(t, n.Start(context.Background()))
	recv(t, blk.started)
	recv(t, blk.started)
	recv(t, claimedHeld)
	start := time.Now()
	n.Stop()
	took := time.Since(start)
	require.Less(t, took, 5*time.Second)
	require.GreaterOrEqual(t, took, 300*time.Millisecond, "running tasks got their grace")
	for _, id := range slowIDs {
		raw := b.task(id)
		require.Equal(t, int64(2), raw.Lookup("status").AsInt64())
		require.Contains(t, raw.Lookup("stderr").StringValue(), "grace period expired")
	}
	raw := b.task(heldID)
	require.Equal(t, int64(-2), raw.Lookup("status").AsInt64(), "claimed but not started: handed back")
	require.Equal(t, int64(-1), raw.Lookup("node").AsInt64())
	close(blk.release)
}

func TestPluginPanicFailsTheTaskAndTheNodeLives(t *testing.T) {
	b := setup(t)
	b.reg.Register("panics", plugin.Func(func(context.Context, plugin.Task) plugin.Result { panic("boom") }))
	bad := b.queue("bad", "panics", 1, "")
	good := b.queue("good", "test", 1, "")
	badID := b.tasks(bad, 1, nil)[0]
	b.tasks(good, 3, nil)
	b.start(b.config("n1"))
	b.waitStatus(badID, schema.StatusFailed, 5*time.Second)
	require.Contains(t, b.task(badID).Lookup("stderr").StringValue(), "boom")
	b.waitDone(bson.D{{Key: "queue", Value: good}}, 3, 5*time.Second)
}

func TestMalformedDocumentsAreLoggedOnceAndSkipped(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	good := b.queue("good", "test", 2, schema.SortFIFO)
	queues := b.db.Collection("queues")
	_, err := queues.InsertMany(ctx, []any{
		bson.D{{Key: "name", Value: "noconstructor"}, {Key: "maxthreads", Value: 1}},
		bson.D{{Key: "name", Value: "stringthreads"}, {Key: "constructor", Value: "test"}, {Key: "maxthreads", Value: "ten"}},
	})
	require.NoError(t, err)
	cfg := b.config("n1")
	b.start(cfg)
	tasks := b.db.Collection("tasks")
	badParams := bson.NewObjectID()
	_, err = tasks.InsertMany(ctx, []any{
		bson.D{{Key: "queue", Value: "good"}, {Key: "status", Value: -2}, {Key: "node", Value: -1}, {Key: "parameters", Value: bson.D{}}},
		bson.D{{Key: "_id", Value: badParams}, {Key: "queue", Value: good}, {Key: "status", Value: -2}, {Key: "node", Value: -1}, {Key: "parameters", Value: "not an object"}},
		bson.D{{Key: "queue", Value: good}, {Key: "status", Value: "weird"}, {Key: "node", Value: -1}},
	}, options.InsertMany())
	require.NoError(t, err)
	goodIDs := b.tasks(good, 3, nil)
	b.waitStatus(badParams, schema.StatusFailed, 5*time.Second)
	require.Contains(t, b.task(badParams).Lookup("stderr").StringValue(), `field "parameters": want an object`)
	for _, id := range goodIDs {
		b.waitStatus(id, schema.StatusSucceeded, 5*time.Second)
	}
	time.Sleep(600 * time.Millisecond) // several ticks: still one line each
	logs := b.logs.String()
	require.Equal(t, 1, strings.Count(logs, `field \"constructor\": missing`), logs)
	require.Equal(t, 1, strings.Count(logs, `field \"maxthreads\": want an integer, got string \"ten\"`), logs)
	require.Equal(t, 1, strings.Count(logs, "field=queue"), logs)
	require.Equal(t, 1, strings.Count(logs, "field=status"), logs)
}

func TestNodeDocumentAndOperatorMaxThreads(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	blk := &blocker{started: make(chan bson.ObjectID, 100), release: make(chan struct{})}
	b.reg.Register("block", blk)
	q := b.queue("q", "block", 10, schema.SortFIFO)
	b.tasks(q, 10, nil)
	// The operator caps the node at 2 before it starts, and adds a note.
	_, err := b.db.Collection("nodes").InsertOne(ctx, bson.D{{Key: "node", Value: "n1"}, {Key: "maxthreads", Value: 2}, {Key: "note", Value: "keep"}})
	require.NoError(t, err)
	n := b.start(b.config("n1"))
	recv(t, blk.started)
	recv(t, blk.started)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, 2, n.Running(bson.ObjectID{}))
	// Raised to 3: honoured within a heartbeat.
	_, err = b.db.Collection("nodes").UpdateOne(ctx, bson.D{{Key: "node", Value: "n1"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "maxthreads", Value: 3}}}})
	require.NoError(t, err)
	select {
	case <-blk.started:
	case <-time.After(10 * time.Second): // a heartbeat, which a loaded machine may take seconds over
		t.Fatal("the raised maxthreads was not honoured within 10 s")
	}
	raw, err := b.db.Collection("nodes").FindOne(ctx, bson.D{{Key: "node", Value: "n1"}}).Raw()
	require.NoError(t, err)
	require.Equal(t, int64(3), raw.Lookup("maxthreads").AsInt64(), "never overwritten")
	require.Equal(t, "keep", raw.Lookup("note").StringValue())
	require.WithinDuration(t, time.Now(), raw.Lookup("timestamp").Time(), 10*time.Second)
	require.Eventually(t, func() bool {
		raw, err = b.db.Collection("nodes").FindOne(ctx, bson.D{{Key: "node", Value: "n1"}}).Raw()
		return err == nil && raw.Lookup("queues", "0", "tasks_doing").AsInt64() == 3
	}, 10*time.Second, 50*time.Millisecond, "tasks_doing follows the running tasks")
	entry := raw.Lookup("queues", "0").Document()
	require.Equal(t, "q", entry.Lookup("name").StringValue())
	require.Equal(t, q.Hex(), entry.Lookup("id").StringValue())
	require.Equal(t, "block", entry.Lookup("constructor").StringValue())
	require.Equal(t, int64(3), entry.Lookup("tasks_doing").AsInt64())
	require.Equal(t, int64(1), entry.Lookup("preemptive").AsInt64())
	require.Equal(t, int64(0), entry.Lookup("tasks_backfill").AsInt64())
	require.True(t, raw.Lookup("wakeup_stream").Boolean(), "follows a stream")
	require.Eventually(t, func() bool {
		raw, err = b.db.Collection("nodes").FindOne(ctx, bson.D{{Key: "node", Value: "n1"}}).Raw()
		var full []string
		return err == nil && raw.Lookup("full").Unmarshal(&full) == nil && slices.Equal(full, []string{q.Hex()})
	}, 10*time.Second, 50*time.Millisecond, "q full: three tasks at the operator's cap of 3 (its maxthreads is 10)")
	require.Equal(t, raw.Lookup("timestamp").Time(), raw.Lookup("serves_at").Time(), "written together")

	// A queue it has no plugin for: listed in queues (seed 000: every
	// queue), not in serves, which other nodes read to pick listeners. A
	// queue that runs nothing for now (maxthreads 0) is in serves: every
	// node would serve it but for that.
	other := b.queue("other", "nope", 10, schema.SortFIFO)
	idle := b.queue("idle", "block", 0, schema.SortFIFO)
	require.Eventually(t, func() bool {
		raw, err = b.db.Collection("nodes").FindOne(ctx, bson.D{{Key: "node", Value: "n1"}}).Raw()
		arr, ok := raw.Lookup("queues").ArrayOK()
		vals, _ := arr.Values()
		return err == nil && ok && len(vals) == 3
	}, 10*time.Second, 50*time.Millisecond, "the three queues listed")
	var serves []string
	require.NoError(t, raw.Lookup("serves").Unmarshal(&serves))
	require.ElementsMatch(t, []string{q.Hex(), idle.Hex()}, serves, "not %s", other.Hex())
	close(blk.release)

	// A node without a stream says so.
	cfg := b.config("n2")
	cfg.PollOnly = true
	b.start(cfg)
	require.Eventually(t, func() bool {
		raw, err = b.db.Collection("nodes").FindOne(ctx, bson.D{{Key: "node", Value: "n2"}}).Raw()
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "n2's heartbeat")
	stream, ok := raw.Lookup("wakeup_stream").BooleanOK()
	require.True(t, ok, "written")
	require.False(t, stream, "--poll-only")
}

func TestStopLeavesNoGoroutines(t *testing.T) {
	// Not parallel: goleak must see only this node's goroutines.
	db := mongotest.Database(t)
	opts := []goleak.Option{
		goleak.IgnoreCurrent(),
		// The shared test client's monitors, which may start after the
		// baseline and outlive the node by design.
		goleak.IgnoreAnyFunction("go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology.(*rttMonitor).runHellos"),
		goleak.IgnoreAnyFunction("go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology.checkServerWithSignal.func1"),
		goleak.IgnoreTopFunction("go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology.(*contextDoneListener).Listen"),
	}
	reg := plugin.NewRegistry()
	rec := newRecorder()
	reg.Register("test", rec)
	s := store.New(db, store.Options{})
	max1 := 1
	q, err := s.QueueCreate(context.Background(), store.QueueCreateParams{Name: "q", Constructor: "test", MaxThreads: &max1})
	require.NoError(t, err)
	n, err := New(Config{Name: "n1", Store: s, Plugins: reg, Tick: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, n.Start(context.Background()))
	_, err = s.TaskInsertMany(context.Background(), store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil, nil}})
	require.NoError(t, err)
	var done atomic.Bool
	require.Eventually(t, func() bool {
		c, _ := db.Collection("tasks").CountDocuments(context.Background(), bson.D{{Key: "status", Value: 1}})
		done.Store(c == 2)
		return done.Load()
	}, 5*time.Second, 10*time.Millisecond)
	n.Stop()
	goleak.VerifyNone(t, opts...)
}

// signals counts a test signal and lets a test wait for the next ones.
type signals struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *signals) add(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]int{}
	}
	s.n[key]++
}

func (s *signals) count(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[key]
}

// await waits up to d for key to signal once more than now; it reports
// whether it did.
func (s *signals) await(d time.Duration, key string) bool {
	before := s.count(key)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if s.count(key) > before {
			return true
		}
		time.Sleep(time.Millisecond)
	}
	return false
}

// advance moves the fake clock by d and waits until each key has signalled
// once more.
func (s *signals) advance(t *testing.T, fake *clock.Fake, d time.Duration, keys ...string) {
	t.Helper()
	before := map[string]int{}
	for _, k := range keys {
		before[k] = s.count(k)
	}
	fake.Advance(d)
	// Generous: on a loaded machine a heartbeat write may take seconds.
	require.Eventually(t, func() bool {
		for _, k := range keys {
			if s.count(k) <= before[k] {
				return false
			}
		}
		return true
	}, 30*time.Second, 2*time.Millisecond, "no signal from every one of %v after advancing %v (counts before: %v)", keys, d, before)
}

func TestDeadNodeTasksAreRecoveredOnce(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	q := b.queue("q", "test", 4, schema.SortFIFO)
	ids := b.tasks(q, 3, nil)
	// "ghost" held two tasks and stopped writing heartbeats a minute ago.
	_, err := b.db.Collection("nodes").InsertOne(ctx, bson.D{{Key: "node", Value: "ghost"}, {Key: "timestamp", Value: time.Now().Add(-time.Minute)},
		{Key: "state", Value: "running"}, {Key: "queues", Value: bson.A{}}}) // one of ours (4.103 nodes write neither)
	require.NoError(t, err)
	for i, status := range []int{-1, 0} {
		_, err := b.db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[i]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "node", Value: "ghost"}, {Key: "status", Value: status}}}})
		require.NoError(t, err)
	}
	// Two nodes on one fake clock, with the default timing: the ghost's
	// heartbeat is older than dead-after by the server's clock, but a node
	// judges only once it has served dead-after itself, by its own clock.
	fake := clock.NewFake(time.Now())
	var sig signals
	var leaders []*Node
	for _, name := range []string{"n1", "n2"} {
		cfg := b.config(name)
		cfg.Clock = fake
		cfg.beaten = func() { sig.add(name + "/beat") }
		cfg.reaped = func(int64) { sig.add("swept") }
		leaders = append(leaders, b.start(cfg))
	}
	require.Eventually(t, func() bool {
		return leaders[0].LeaderStatus().Leader != leaders[1].LeaderStatus().Leader
	}, 10*time.Second, time.Millisecond, "one of the two nodes leads")
	// Every second of (fake) time both nodes beat; the leader sweeps once
	// its duty has started (it first records its session in the lease), so
	// time moves on until the first sweep.
	start := fake.Now()
	for sig.count("swept") == 0 {
		require.Less(t, fake.Since(start), 10*time.Second, "the leader never swept")
		sig.advance(t, fake, time.Second, "n1/beat", "n2/beat")
		sig.await(50*time.Millisecond, "swept")
	}
	for fake.Since(start) < DefaultDeadAfter-time.Second {
		sig.advance(t, fake, time.Second, "n1/beat", "n2/beat", "swept")
	}
	require.Equal(t, int64(-1), b.task(ids[0]).Lookup("status").AsInt64(), "judged before serving dead-after")
	require.Equal(t, int64(0), b.task(ids[1]).Lookup("status").AsInt64())
	require.Equal(t, 0, b.logs.Count("declared a node dead"))

	sig.advance(t, fake, time.Second, "n1/beat", "n2/beat", "swept")
	b.waitStatus(ids[0], schema.StatusSucceeded, 10*time.Second) // claimed, never started: back to the queue and run
	b.waitStatus(ids[1], schema.StatusOrphaned, 5*time.Second)   // was running: orphaned, never re-run
	b.waitStatus(ids[2], schema.StatusSucceeded, 5*time.Second)
	b.rec.mu.Lock()
	require.Len(t, b.rec.runs[ids[0]], 1)
	require.Empty(t, b.rec.runs[ids[1]])
	b.rec.mu.Unlock()
	n, err := b.store.NodeGet(ctx, "ghost")
	require.NoError(t, err)
	require.True(t, n.Dead)
	require.Contains(t, []string{"n1", "n2"}, n.DeadBy)
	require.Equal(t, 1, b.logs.Count("declared a node dead"), "one live node recovers it:\n%s", b.logs)
	require.Equal(t, 1, b.logs.Count("leading: sweeping stale claims and dead nodes"), "only the leader sweeps")
	for _, live := range []string{"n1", "n2"} {
		n, err := b.store.NodeGet(ctx, live)
		require.NoError(t, err)
		require.False(t, n.Dead, "live nodes keep beating")
	}
}

func TestFencedNodeKillsItsTasksStopsClaimingAndRejoins(t *testing.T) {
	b := setup(t)
	blk := &blocker{started: make(chan bson.ObjectID, 10), release: make(chan struct{})}
	b.reg.Register("block", blk)
	q := b.queue("q", "block", 2, schema.SortFIFO)
	first := b.tasks(q, 1, nil)[0]
	var cut atomic.Bool
	var sig signals
	fake := clock.NewFake(time.Now())
	cfg := b.config("n1")
	cfg.Clock = fake
	cfg.Heartbeat, cfg.FenceAfter, cfg.DeadAfter = 100*time.Millisecond, 500*time.Millisecond, 3*time.Second
	cfg.beatFault = func(context.Context) error {
		sig.add("beat")
		if cut.Load() {
			return errors.New("test: heartbeat cut")
		}
		return nil
	}
	cfg.passed = func() { sig.add("pass") }
	n := b.start(cfg)
	require.Equal(t, first, recv(t, blk.started))

	// Silent for less than fence-after: nothing happens.
	cut.Store(true)
	for range 4 {
		sig.advance(t, fake, 100*time.Millisecond, "beat")
	}
	time.Sleep(50 * time.Millisecond) // the watchdog looks every 50 ms of the clock; it saw 400 ms
	require.False(t, n.Fenced(), "fenced after 400 ms of silence, with fence-after 500 ms")
	require.Equal(t, int64(0), b.task(first).Lookup("status").AsInt64(), "the task still runs")

	// Past fence-after: fenced, the task killed at once.
	sig.advance(t, fake, 150*time.Millisecond, "beat")
	b.waitStatus(first, schema.StatusFailed, 5*time.Second)
	require.True(t, n.Fenced())
	require.Contains(t, b.task(first).Lookup("stderr").StringValue(), "node fenced")
	require.Equal(t, schema.ReasonFenced, b.task(first).Lookup("reason").StringValue(), "found by task list --reason fenced")
	require.Contains(t, b.logs.String(), `msg="task killed" node=n1`, "not as an operator's kill")
	require.Contains(t, b.logs.String(), "reason=fenced")
	require.Contains(t, b.logs.String(), "fenced: no heartbeat acknowledged")

	// While fenced, nothing is claimed: the task's wake-up makes a pass
	// that takes nothing.
	passes := sig.count("pass")
	second := b.tasks(q, 1, nil)[0]
	require.Eventually(t, func() bool { return sig.count("pass") > passes }, 5*time.Second, time.Millisecond)
	require.Equal(t, int64(-2), b.task(second).Lookup("status").AsInt64(), "a fenced node claims nothing")

	// MongoDB answers again: at the next heartbeat it rejoins.
	cut.Store(false)
	sig.advance(t, fake, 100*time.Millisecond, "beat")
	require.Equal(t, second, recv(t, blk.started))
	require.False(t, n.Fenced())
	require.Contains(t, b.logs.String(), "rejoining")
	close(blk.release)
	b.waitStatus(second, schema.StatusSucceeded, 5*time.Second)
}

func TestDrainStopsClaimingAndSignalsWhenIdle(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	blk := &blocker{started: make(chan bson.ObjectID, 10), release: make(chan struct{})}
	b.reg.Register("block", blk)
	q := b.queue("q", "block", 1, schema.SortFIFO)
	ids := b.tasks(q, 2, nil)
	// A drain request left from a previous run is not for this one.
	_, err := b.db.Collection("nodes").InsertOne(ctx, bson.D{{Key: "node", Value: "n1"}, {Key: "drain", Value: true}})
	require.NoError(t, err)
	cfg := b.config("n1")
	cfg.Heartbeat = 50 * time.Millisecond
	n := b.start(cfg)
	require.Equal(t, ids[0], recv(t, blk.started))
	nd, err := b.store.NodeGet(ctx, "n1")
	require.NoError(t, err)
	require.False(t, nd.Drain, "cleared at start")
	require.Equal(t, schema.NodeStateRunning, nd.State)

	_, err = b.store.NodeDrain(ctx, store.NodeDrainParams{Node: "n1"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		nd, err := b.store.NodeGet(ctx, "n1")
		return err == nil && nd.State == schema.NodeStateDraining
	}, 3*time.Second, 20*time.Millisecond, "the node document shows it draining")
	select {
	case <-n.Drained():
		t.Fatal("drained while a task still runs")
	default:
	}
	blk.release <- struct{}{}
	select {
	case <-n.Drained():
	case <-time.After(3 * time.Second):
		t.Fatal("not drained after its last task finished")
	}
	b.waitStatus(ids[0], schema.StatusSucceeded, 3*time.Second)
	require.Equal(t, int64(-2), b.task(ids[1]).Lookup("status").AsInt64(), "nothing claimed after the request")
	n.Stop()
	nd, err = b.store.NodeGet(ctx, "n1")
	require.NoError(t, err)
	require.Equal(t, schema.NodeStateStopped, nd.State)
	close(blk.release)
}

// TestStopWaitsForTheHeartbeatInFlight: a heartbeat that Stop cancelled
// could still be applied on the server after the last one and leave a
// stopped node's document saying it runs (a CI run of the drain test
// found "draining" there after Stop).
func TestStopWaitsForTheHeartbeatInFlight(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	fake := clock.NewFake(time.Now())
	cfg := b.config("n1")
	cfg.Clock = fake
	// A heartbeat's timeout is half of fence-after, at most 5 s: 4 s more
	// than the hold.
	cfg.Heartbeat, cfg.FenceAfter, cfg.DeadAfter = 100*time.Millisecond, 10*time.Second, 12*time.Second
	var hold, cancelled atomic.Bool
	inBeat := make(chan struct{}, 1)
	cfg.beatFault = func(ctx context.Context) error {
		if !hold.CompareAndSwap(true, false) {
			return nil
		}
		inBeat <- struct{}{}
		// Long enough for Stop to reach the heartbeat (nothing runs).
		select {
		case <-ctx.Done():
			cancelled.Store(true)
		case <-time.After(time.Second):
		}
		return nil
	}
	var beats atomic.Int64
	cfg.beaten = func() { beats.Add(1) }
	n := b.start(cfg)
	hold.Store(true)
	fake.Advance(100 * time.Millisecond)
	select {
	case <-inBeat:
	case <-time.After(30 * time.Second):
		t.Fatal("no heartbeat after advancing the clock by one period")
	}
	before := beats.Load()
	n.Stop()
	require.False(t, cancelled.Load(), "Stop cancelled the heartbeat in flight")
	require.Equal(t, before+2, beats.Load(), "the heartbeat in flight and the last one are both acknowledged")
	nd, err := b.store.NodeGet(ctx, "n1")
	require.NoError(t, err)
	require.Equal(t, schema.NodeStateStopped, nd.State)
}

func TestFenceTimingIsValidated(t *testing.T) {
	b := setup(t)
	cfg := b.config("n1")
	cfg.Heartbeat, cfg.FenceAfter, cfg.DeadAfter = time.Second, 1500*time.Millisecond, 30*time.Second
	_, err := New(cfg)
	require.ErrorContains(t, err, "fence-after (1.5s) must be at least two heartbeats")
	cfg.Heartbeat, cfg.FenceAfter, cfg.DeadAfter = time.Second, 10*time.Second, 11*time.Second
	_, err = New(cfg)
	require.ErrorContains(t, err, "dead-after (11s) must exceed fence-after (10s) by at least 2s")
}

func TestStrayClaimIsHandedBackAndRun(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	q := b.queue("q", "test", 2, schema.SortFIFO)
	b.start(b.config("n1"))
	ids := b.tasks(q, 2, nil)
	b.waitStatus(ids[0], schema.StatusSucceeded, 5*time.Second)
	// A claim the server applied whose answer never reached the node (a
	// failover): claimed by n1, long ago, unknown to it.
	res, err := b.db.Collection("tasks").InsertOne(ctx, bson.D{{Key: "queue", Value: q}, {Key: "node", Value: "n1"}, {Key: "status", Value: -1},
		{Key: "parameters", Value: bson.D{}}, {Key: "ctime", Value: time.Now()}, {Key: "mtime", Value: time.Now().Add(-time.Minute)}})
	require.NoError(t, err)
	id := res.InsertedID.(bson.ObjectID)
	b.waitStatus(id, schema.StatusSucceeded, 15*time.Second)
	require.Contains(t, b.logs.String(), "handed back a task this node had claimed without knowing")
}

// TestStopEndsTheStraySweepBeforeDraining: while a stopping node drains,
// its detached supervised tasks are no longer held, so the stray sweep
// must already be over (it would hand them back to run twice).
func TestStopEndsTheStraySweepBeforeDraining(t *testing.T) {
	b := setup(t)
	blk := &blocker{started: make(chan bson.ObjectID, 1), release: make(chan struct{})}
	b.reg.Register("block", blk)
	q := b.queue("q", "block", 1, schema.SortFIFO)
	b.tasks(q, 1, nil)
	n := b.start(b.config("n1"))
	recv(t, blk.started)
	require.True(t, n.strays.Running())
	stopped := make(chan struct{})
	go func() { n.Stop(); close(stopped) }()
	require.Eventually(t, func() bool { return !n.strays.Running() }, 3*time.Second, 5*time.Millisecond, "the sweep still runs while the node drains")
	select {
	case <-stopped:
		t.Fatal("the node stopped without draining its running task")
	default:
	}
	close(blk.release)
	<-stopped
}

func TestStopLeavesNoChangeStreamCursorOnTheServer(t *testing.T) {
	b := setup(t)
	q := b.queue("q", "test", 2, schema.SortFIFO)
	n := b.start(b.config("n1")) // the wake-up stream, and the projector's
	id := b.tasks(q, 1, nil)[0]
	b.waitStatus(id, schema.StatusSucceeded, 5*time.Second)
	require.Eventually(t, func() bool { return n.ProjectorStats().Leader }, 10*time.Second, 10*time.Millisecond)
	require.NotEmpty(t, mongotest.ChangeStreamCursors(t, b.db), "the running node's streams are open")
	stopped := time.Now()
	n.Stop()
	// Seconds, not the ten idle minutes a cursor left open would last:
	// a loaded machine (the CI run, every package at once) took over 2 s,
	// and once more than 10 s.
	var open []bson.Raw
	require.Eventually(t, func() bool { open = mongotest.ChangeStreamCursors(t, b.db); return len(open) == 0 }, 30*time.Second, 10*time.Millisecond,
		"a change stream of the stopped node is still open on the server: %v", &open)
	// Past the longest time the server holds a getMore (1 s): none is
	// left idle either (as one would for ten minutes).
	time.Sleep(time.Until(stopped.Add(1500 * time.Millisecond)))
	require.Empty(t, mongotest.ChangeStreamCursors(t, b.db))
}

func TestKillTaskKillsOneTaskOnly(t *testing.T) {
	b := setup(t)
	blk := &blocker{started: make(chan bson.ObjectID, 10), release: make(chan struct{})}
	b.reg.Register("block", blk)
	q := b.queue("q", "block", 2, schema.SortFIFO)
	ids := b.tasks(q, 2, nil)
	n := b.start(b.config("n1"))
	started := []bson.ObjectID{recv(t, blk.started), recv(t, blk.started)}
	require.ElementsMatch(t, ids, started)
	require.False(t, n.KillTask(bson.NewObjectID(), "no such task"), "a task the node does not run")
	require.True(t, n.KillTask(ids[0], "killed by the test"))
	b.waitStatus(ids[0], schema.StatusFailed, 5*time.Second)
	require.Contains(t, b.task(ids[0]).Lookup("stderr").StringValue(), "killed")
	require.Equal(t, int64(0), b.task(ids[1]).Lookup("status").AsInt64(), "the other task runs on")
	// The finish is written before the runner lets go of the task: a
	// moment later it no longer runs (a loaded machine saw it still held).
	require.Eventually(t, func() bool { return !n.KillTask(ids[0], "again") }, 5*time.Second, 5*time.Millisecond, "it no longer runs")
	close(blk.release)
	b.waitStatus(ids[1], schema.StatusSucceeded, 5*time.Second)
}

func TestEveryLogLineNamesTheNodeOnce(t *testing.T) {
	b := setup(t)
	q := b.queue("q", "test", 2, schema.SortFIFO)
	cfg := b.config("n1")
	cfg.Logger = slog.New(slog.NewJSONHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n := b.start(cfg)
	id := b.tasks(q, 1, nil)[0]
	b.waitStatus(id, schema.StatusSucceeded, 5*time.Second)
	require.Eventually(t, func() bool { return n.ProjectorStats().Leader }, 10*time.Second, 10*time.Millisecond)
	n.Stop()
	lines := strings.Split(strings.TrimSpace(b.logs.String()), "\n")
	require.Greater(t, len(lines), 5)
	for _, line := range lines {
		keys := jsonKeys(t, line)
		require.Equal(t, 1, keys["node"], "the node is named once: %s", line)
		for k, c := range keys {
			require.Equal(t, 1, c, "attribute %q given %d times: %s", k, c, line)
		}
	}
}

// jsonKeys counts the top-level keys of a JSON object, duplicates included.
func jsonKeys(t *testing.T, line string) map[string]int {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	tok, err := dec.Token()
	require.NoError(t, err, line)
	require.Equal(t, json.Delim('{'), tok, line)
	keys := map[string]int{}
	for dec.More() {
		k, err := dec.Token()
		require.NoError(t, err, line)
		keys[k.(string)]++
		var v json.RawMessage
		require.NoError(t, dec.Decode(&v), line)
	}
	return keys
}

func TestPartsKeepTheLifecycle(t *testing.T) {
	// Not parallel: goleak.
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	ignore := lifecycletest.Options{IgnoreGoroutines: mongotest.ClientGoroutines()}
	reg := plugin.NewRegistry()
	reg.Register("test", newRecorder())
	i := 0
	lifecycletest.Check(t, func(t *testing.T) lifecycle.Service {
		i++
		n, err := New(Config{Name: fmt.Sprintf("life%d", i), Store: s, Plugins: reg, Tick: 50 * time.Millisecond, Grace: time.Second})
		require.NoError(t, err)
		return n
	}, ignore)
}

// TestStartsBesideDuplicateQueueNames: seed 000 allows two queues of one
// name; the node starts, runs both, and logs that the unique name index
// (which Disbatch 4.103 nodes require) was left out.
func TestStartsBesideDuplicateQueueNames(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	var ids []bson.ObjectID
	for range 2 {
		id := bson.NewObjectID()
		ids = append(ids, id)
		_, err := b.db.Collection(schema.CollQueues).InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "name", Value: "twice"},
			{Key: "constructor", Value: "test"}, {Key: "maxthreads", Value: 1}})
		require.NoError(t, err)
	}
	b.start(b.config("n1"))
	for _, q := range ids {
		b.waitStatus(b.tasks(q, 1, nil)[0], schema.StatusSucceeded, 10*time.Second)
	}
	require.Contains(t, b.logs.String(), "duplicate queue names: the unique index {name: 1} (name_1) was not created")
}

// TestNodeQueueListsReplaceTheConfigDocuments: the node's own activequeues
// and ignorequeues (4.103's config file, --perl-config) replace the config
// document's.
func TestNodeQueueListsReplaceTheConfigDocuments(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	run := b.queue("run", "test", 1, schema.SortFIFO)
	skip := b.queue("skip", "test", 1, schema.SortFIFO)
	// The config document would ignore run; the node's list wins.
	_, err := b.db.Collection("config").InsertOne(ctx, bson.D{{Key: "active", Value: true}, {Key: "ignorequeues", Value: bson.A{"run"}}})
	require.NoError(t, err)
	cfg := b.config("n1")
	cfg.IgnoreQueues = []string{skip.Hex()}
	b.start(cfg)
	skipped := b.tasks(skip, 1, nil)[0]
	b.waitStatus(b.tasks(run, 1, nil)[0], schema.StatusSucceeded, 10*time.Second)
	time.Sleep(500 * time.Millisecond) // a few ticks
	require.EqualValues(t, schema.StatusQueued, b.task(skipped).Lookup("status").AsInt64(), "the ignored queue's task waits")
	require.Contains(t, b.logs.String(), "in the config's ignorequeues (this node's, from its settings)")
}

// TestBalanceHoldIsNotScheduled: a queue QueueBalance holds (its cap for
// now is 0) runs nothing until released.
func TestBalanceHoldIsNotScheduled(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	q := b.queue("held", "test", 1, schema.SortFIFO)
	_, err := b.db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: q}}, bson.D{{Key: "$set", Value: bson.D{{Key: "balance_hold", Value: true}}}})
	require.NoError(t, err)
	b.start(b.config("n1"))
	id := b.tasks(q, 1, nil)[0]
	time.Sleep(600 * time.Millisecond) // three ticks
	require.EqualValues(t, schema.StatusQueued, b.task(id).Lookup("status").AsInt64(), "held: not run")
	require.Contains(t, b.logs.String(), "held by QueueBalance")
	_, err = b.db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: q}}, bson.D{{Key: "$unset", Value: bson.D{{Key: "balance_hold", Value: ""}}}})
	require.NoError(t, err)
	b.waitStatus(id, schema.StatusSucceeded, 10*time.Second)
}

// TestClaimRunningStartsWithoutAStartWrite: a node with ClaimRunning runs
// every task once with two writes (claim into 0, finish), none passing
// through -1 (a change stream sees each status the tasks were given); a
// task whose kill was requested before it was requeued ends killed,
// unrun; and a claim into running whose answer was lost is handed back
// and run.
func TestClaimRunningStartsWithoutAStartWrite(t *testing.T) {
	b := setup(t)
	ctx := t.Context()
	q := b.queue("q", "test", 8, schema.SortFIFO)
	cs, err := b.db.Collection("tasks").Watch(ctx, mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "update"}}}}})
	require.NoError(t, err)
	defer cs.Close(context.Background())
	killed := b.tasks(q, 1, nil)[0]
	_, err = b.db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: killed}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: schema.TaskKill, Value: bson.D{{Key: "node", Value: "gone"}, {Key: "by", Value: "ops"}}}}}})
	require.NoError(t, err)
	ids := b.tasks(q, 200, nil)
	cfg := b.config("n1")
	cfg.ClaimRunning = true
	b.start(cfg)
	b.waitDone(bson.D{{Key: "queue", Value: q}}, 201, 30*time.Second)

	doc := b.task(killed)
	require.Equal(t, int32(2), doc.Lookup("status").Int32())
	require.Equal(t, schema.ReasonKilled, doc.Lookup(schema.TaskReason).StringValue())
	b.rec.mu.Lock()
	require.Empty(t, b.rec.runs[killed], "started killed: the plugin never ran")
	for _, id := range ids {
		require.Len(t, b.rec.runs[id], 1)
	}
	b.rec.mu.Unlock()

	statuses := map[bson.ObjectID][]int32{}
	seen := 0
	for seen < 2*len(ids) && cs.Next(ctx) {
		id := cs.Current.Lookup("documentKey", "_id").ObjectID()
		if st, ok := cs.Current.Lookup("updateDescription", "updatedFields", "status").AsInt64OK(); ok && id != killed {
			statuses[id] = append(statuses[id], int32(st))
			seen++
		}
	}
	require.NoError(t, cs.Err())
	for _, id := range ids {
		require.Equal(t, []int32{0, 1}, statuses[id], "task %s: claimed into running, then finished", id.Hex())
	}

	// A claim into running the server applied but whose answer was lost.
	res, err := b.db.Collection("tasks").InsertOne(ctx, bson.D{{Key: "queue", Value: q}, {Key: "node", Value: "n1"}, {Key: "status", Value: 0},
		{Key: "parameters", Value: bson.D{}}, {Key: "ctime", Value: time.Now()}, {Key: "mtime", Value: time.Now().Add(-time.Minute)}})
	require.NoError(t, err)
	b.waitStatus(res.InsertedID.(bson.ObjectID), schema.StatusSucceeded, 20*time.Second)
	require.Contains(t, b.logs.String(), "claimed_into_running=true")
}

// TestAQuietNodeLetsItsWakeUpsGo: a node draining a backlog (every claim
// full) closes its wake-up stream, and once the backlog is gone has it
// back: with no tick to fall back on, a task queued after the drain is
// still picked up at once, and so is one queued while it was quiet.
func TestAQuietNodeLetsItsWakeUpsGo(t *testing.T) {
	b := setup(t)
	b.rec.sleep = 5 * time.Millisecond
	q := b.queue("work", "test", 8, schema.SortFIFO)
	b.tasks(q, 1500, nil)
	cfg := b.config("n1")
	cfg.Tick = time.Hour // only wake-ups find the tasks queued later
	n := b.start(cfg)
	require.Eventually(t, func() bool { return n.StreamStats().Quiets > 0 }, time.Minute, 5*time.Millisecond, "never quiet while draining a backlog")
	during := b.tasks(q, 1, nil)[0]
	b.waitDone(bson.D{{Key: "queue", Value: q}}, 1501, 2*time.Minute)
	after := b.tasks(q, 1, nil)[0]
	b.waitStatus(after, schema.StatusSucceeded, 10*time.Second)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Len(t, b.rec.runs[during], 1)
	require.Len(t, b.rec.runs[after], 1)
}

// TestAQuietNodeStillHearsKillsAndQueueChanges: while its wake-up stream
// is let go, a node reads its queues and sweeps kill requests every
// claimer.QuietAfter, so with no tick to fall back on a paused queue
// stops being claimed, and a kill still reaches a running task, within a
// second or so.
func TestAQuietNodeStillHearsKillsAndQueueChanges(t *testing.T) {
	b := setup(t)
	b.rec.sleep = 5 * time.Millisecond
	b.reg.Register("hold", plugin.Func(func(ctx context.Context, _ plugin.Task) plugin.Result {
		<-ctx.Done()
		return plugin.Result{Status: schema.StatusFailed, Stderr: "stopped"}
	}))
	long := b.queue("long", "hold", 1, schema.SortFIFO)
	higher := 1.0 // queues of one priority keep the wake-ups (claimer.Config.Quiet)
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: long, Priority: &higher}))
	held := b.tasks(long, 1, nil)[0]
	q := b.queue("work", "test", 8, schema.SortFIFO)
	b.tasks(q, 4000, nil)
	cfg := b.config("n1")
	cfg.Tick = time.Hour
	n := b.start(cfg)
	b.waitStatus(held, schema.StatusRunning, 30*time.Second)
	closed := func() bool { return n.stream.IsQuiet() && n.StreamStats().Quiets > 0 }
	require.Eventually(t, closed, time.Minute, time.Millisecond, "the stream never let go while draining a backlog")

	// The running task's queue still has its backlog (its one claim got
	// all it asked for): the node stays quiet with work paused.
	paused := true
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: q, Paused: &paused}))
	claimed := func() int64 {
		return b.count(bson.D{{Key: "queue", Value: q}, {Key: "status", Value: bson.D{{Key: "$ne", Value: -2}}}})
	}
	// The pause is heard within QuietAfter (250 ms), at a queue re-read a
	// loaded machine may take its time over: wait until the claims stand
	// still for a second (not for good: within 10 s), then require that
	// they still do a second later.
	var before int64
	still := time.Time{}
	require.Eventually(t, func() bool {
		if c := claimed(); c != before || still.IsZero() {
			before, still = c, time.Now()
		}
		return time.Since(still) >= time.Second
	}, 10*time.Second, 50*time.Millisecond, "tasks of the paused queue still claimed")
	time.Sleep(time.Second)
	require.Equal(t, before, claimed(), "tasks of the paused queue still claimed")
	require.Less(t, before, int64(4000), "the queue drained before the pause: the test proves nothing")
	require.True(t, closed(), "still quiet")

	_, err := b.store.TaskKill(context.Background(), store.TaskKillParams{Target: store.TaskTarget{IDs: []bson.ObjectID{held}}, By: "test"})
	require.NoError(t, err)
	b.waitStatus(held, schema.StatusFailed, 10*time.Second)
}

// TestOnlyAQueuesListenersKeepTheirStreams: with WakeupListeners 1, of
// two nodes serving a queue one keeps its wake-up stream and the other
// lets it go with no backlog at all; tasks queued meanwhile are run by
// both, the other finding them by its tick and its own tasks' ends. While
// they run, a heartbeat may find the listener full and the other not, and
// the other then listens for a heartbeat or two (a full listener steps
// back: TestAListenerThatFillsUpStepsBack); once both are idle the first
// listens again and the other lets its stream go.
func TestOnlyAQueuesListenersKeepTheirStreams(t *testing.T) {
	b := setup(t)
	b.rec.sleep = 50 * time.Millisecond
	q := b.queue("q", "test", 2, schema.SortFIFO)
	var nodes []*Node
	for _, name := range []string{"n1", "n2"} {
		cfg := b.config(name)
		cfg.WakeupListeners = 1
		nodes = append(nodes, b.start(cfg))
	}
	// Each finds the other among the queue's peers once it has read the
	// other's heartbeat (at most a second old) on a queue read.
	require.Eventually(t, func() bool { return nodes[0].stream.IsQuiet() != nodes[1].stream.IsQuiet() }, 20*time.Second, 10*time.Millisecond,
		"one node's stream let go, the other's kept")
	time.Sleep(time.Second) // a few ticks and queue reads more
	deaf, listener := nodes[0], nodes[1]
	if listener.stream.IsQuiet() {
		deaf, listener = listener, deaf
	}
	require.True(t, deaf.stream.IsQuiet(), "still let go")
	require.False(t, listener.stream.IsQuiet(), "still kept")
	require.Zero(t, listener.StreamStats().Quiets, "never let go: no backlog, and it listens")
	// The spell is counted once the stream's reader has let its cursor
	// go, after the getMore it was waiting on returns (IsQuiet turns at
	// once).
	require.Eventually(t, func() bool { return deaf.StreamStats().Quiets > 0 }, 20*time.Second, 10*time.Millisecond, "its stream let go")

	ids := b.tasks(q, 40, nil)
	b.waitDone(bson.D{{Key: "queue", Value: q}}, 40, 30*time.Second)
	ran := map[string]int{}
	for _, id := range ids {
		ran[b.task(id).Lookup("node").StringValue()]++
	}
	require.Positive(t, ran[deaf.cfg.Name], "the node without a stream ran some: %v", ran)
	require.Positive(t, ran[listener.cfg.Name], "%v", ran)
	require.Eventually(t, func() bool { return deaf.stream.IsQuiet() && !listener.stream.IsQuiet() }, 20*time.Second, 10*time.Millisecond,
		"idle again: the same node listens, the other's stream let go")
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	for _, id := range ids {
		require.Len(t, b.rec.runs[id], 1, "task %s", id.Hex())
	}
}

// deaf is a plugin that ignores its context: it returns only when
// released.
type deaf struct {
	started chan bson.ObjectID
	release chan struct{}
}

func (p *deaf) Run(_ context.Context, t plugin.Task) plugin.Result {
	p.started <- t.ID
	<-p.release
	return plugin.Result{Status: schema.StatusSucceeded}
}

// TestKillWritesAPluginThatIgnoresItsContextAsAbandoned: a second signal's
// Kill waits long enough for a plugin that ignores its context to be
// abandoned (plugin.AbandonGrace) and its task written failed, before the
// process exits; it waited less than the grace, and the task stayed
// running under a node that was gone.
func TestKillWritesAPluginThatIgnoresItsContextAsAbandoned(t *testing.T) {
	b := setup(t)
	p := &deaf{started: make(chan bson.ObjectID, 1), release: make(chan struct{})}
	t.Cleanup(func() { close(p.release) })
	b.reg.Register("deaf", p)
	q := b.queue("q", "deaf", 1, schema.SortFIFO)
	id := b.tasks(q, 1, nil)[0]
	n := b.start(b.config("n1"))
	require.Equal(t, id, recv(t, p.started))
	n.Kill()
	task := b.task(id)
	require.Equal(t, int64(schema.StatusFailed), task.Lookup("status").AsInt64(), "written before Kill returned")
	require.Contains(t, task.Lookup("stderr").StringValue(), "abandoned")
}

// TestKillReleasesTheLeases: a second signal's Kill releases the leader's
// and the projector's leases, so that another node takes them over at
// once; the process exited holding them, and the cluster's duties and
// counters waited a lease's time to live (10 s by default).
func TestKillReleasesTheLeases(t *testing.T) {
	b := setup(t)
	n := b.start(b.config("n1"))
	require.Eventually(t, func() bool { return n.LeaderStatus().Leader && n.ProjectorStats().Leader }, 10*time.Second, 10*time.Millisecond,
		"never led")
	ctx := context.Background()
	for _, name := range []string{LeaderLease, projections.LeaseName} {
		l, err := b.store.LeaseGet(ctx, name)
		require.NoError(t, err)
		require.Equal(t, "n1", l.Owner)
		require.True(t, l.Expires.After(time.Now().Add(time.Second)), "lease %s held: expires %v", name, l.Expires)
	}
	n.Kill()
	for _, name := range []string{LeaderLease, projections.LeaseName} {
		l, err := b.store.LeaseGet(ctx, name)
		require.NoError(t, err)
		require.False(t, l.Expires.After(time.Now()), "lease %s still held after Kill: expires %v", name, l.Expires)
	}
}
