package node

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// graphInsert inserts a graph of tasks.
func (b *bundle) graphInsert(tasks []store.GraphTask) []bson.ObjectID {
	b.t.Helper()
	ids, err := b.store.TaskInsertGraph(context.Background(), store.TaskInsertGraphParams{Tasks: tasks})
	require.NoError(b.t, err)
	return ids
}

// TestGraphRunsEveryTaskAfterItsParentsOnce: a layered graph across two
// queues, with diamonds, on two nodes: every task runs once, and never
// before every one of its parents has finished.
func TestGraphRunsEveryTaskAfterItsParentsOnce(t *testing.T) {
	b := setup(t)
	b.rec.sleep = 20 * time.Millisecond
	qa := b.queue("qa", "test", 3, schema.SortFIFO)
	qb := b.queue("qb", "test", 3, schema.SortFIFO)
	// Layers of 1, 4, 4, 1 tasks; every task of a layer has two parents
	// in the layer above (the first layer has none), alternating queues.
	layers := []int{1, 4, 4, 1}
	var tasks []store.GraphTask
	var prev []bson.ObjectID
	for l, n := range layers {
		var cur []bson.ObjectID
		for i := range n {
			id := bson.NewObjectID()
			q := qa
			if (l+i)%2 == 1 {
				q = qb
			}
			var parents []bson.ObjectID
			if len(prev) > 0 {
				parents = []bson.ObjectID{prev[i%len(prev)], prev[(i+1)%len(prev)]}
			}
			raw, err := bson.Marshal(bson.D{{Key: "layer", Value: l}, {Key: "i", Value: i}})
			require.NoError(t, err)
			tasks = append(tasks, store.GraphTask{ID: id, Queue: q, Parameters: raw, Parents: parents})
			cur = append(cur, id)
		}
		prev = cur
	}
	ids := b.graphInsert(tasks)
	b.start(b.config("n1"))
	b.start(b.config("n2"))
	b.waitDone(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, int64(len(ids)), 60*time.Second)
	require.Equal(t, int64(len(ids)), b.count(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "status", Value: 1}}))
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	for i, task := range tasks {
		runs := b.rec.runs[task.ID]
		require.Len(t, runs, 1, "task %d ran %d times", i, len(runs))
		for _, p := range task.Parents {
			prun := b.rec.runs[p]
			require.Len(t, prun, 1)
			require.False(t, runs[0].start.Before(prun[0].end), "task %d started %s before its parent %s ended", i, prun[0].end.Sub(runs[0].start), p.Hex())
		}
	}
}

// TestGraphFailingParentPropagates: a failing parent finishes its
// descendants unrun (parent_failed, transitively); a child with
// on_parent_failure "run" runs anyway.
func TestGraphFailingParentPropagates(t *testing.T) {
	b := setup(t)
	b.reg.Register("fail", plugin.Func(func(context.Context, plugin.Task) plugin.Result {
		return plugin.Result{Status: schema.StatusFailed, Stderr: "boom"}
	}))
	qf := b.queue("failing", "fail", 1, schema.SortFIFO)
	q := b.queue("work", "test", 2, schema.SortFIFO)
	a, child, grandchild, runner := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	b.graphInsert([]store.GraphTask{
		{ID: a, Queue: qf},
		{ID: child, Queue: q, Parents: []bson.ObjectID{a}},
		{ID: grandchild, Queue: q, Parents: []bson.ObjectID{child}},
		{ID: runner, Queue: q, Parents: []bson.ObjectID{a}, OnParentFailure: schema.OnParentFailureRun},
	})
	b.start(b.config("n1"))
	b.waitDone(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{a, child, grandchild, runner}}}}}, 4, 30*time.Second)
	for _, id := range []bson.ObjectID{child, grandchild} {
		raw := b.task(id)
		require.Equal(t, int64(2), raw.Lookup("status").AsInt64())
		require.Equal(t, schema.ReasonParentFailed, raw.Lookup("reason").StringValue())
	}
	require.Equal(t, int64(1), b.task(runner).Lookup("status").AsInt64())
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Empty(t, b.rec.runs[child], "a child of a failed parent never runs")
	require.Empty(t, b.rec.runs[grandchild])
	require.Len(t, b.rec.runs[runner], 1)
}

// TestGraphNodeSettlesChildrenItself: with the leader's graph duty left
// out, the node that finishes a parent settles its children: a chain
// across queues runs, a child of a parent stored before the graph runs,
// and a child of a failed parent ends parent_failed.
func TestGraphNodeSettlesChildrenItself(t *testing.T) {
	b := setup(t)
	b.reg.Register("fail", plugin.Func(func(context.Context, plugin.Task) plugin.Result {
		return plugin.Result{Status: schema.StatusFailed, Stderr: "boom"}
	}))
	qa := b.queue("qa", "test", 2, schema.SortFIFO)
	qb := b.queue("qb", "test", 2, schema.SortFIFO)
	qf := b.queue("failing", "fail", 1, schema.SortFIFO)
	stored := b.insert(qa, nil, bson.D{{Key: "stored", Value: true}})[0]
	x, y, z, late, f, orphan := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	b.graphInsert([]store.GraphTask{
		{ID: x, Queue: qa},
		{ID: y, Queue: qb, Parents: []bson.ObjectID{x}},
		{ID: z, Queue: qa, Parents: []bson.ObjectID{y}},
		{ID: late, Queue: qb, Parents: []bson.ObjectID{stored}},
		{ID: f, Queue: qf},
		{ID: orphan, Queue: qa, Parents: []bson.ObjectID{f}},
	})
	require.True(t, b.task(stored).Lookup(schema.TaskHasChildren).Boolean(), "a stored parent is marked")
	require.True(t, b.task(x).Lookup(schema.TaskHasChildren).Boolean())
	_, err := b.task(z).LookupErr(schema.TaskHasChildren)
	require.Error(t, err, "a task no one waits for is not marked")
	cfg := b.config("n1")
	cfg.noGraphDuty = true // only the node settles
	b.start(cfg)
	all := bson.A{stored, x, y, z, late, f, orphan}
	b.waitDone(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: all}}}}, int64(len(all)), 30*time.Second)
	for _, id := range []bson.ObjectID{stored, x, y, z, late} {
		require.Equal(t, int64(1), b.task(id).Lookup("status").AsInt64(), id.Hex())
	}
	require.Equal(t, schema.ReasonParentFailed, b.task(orphan).Lookup("reason").StringValue())
}

// TestGraphSweepUnblocksAChildWhoseEventWasMissed: the parent succeeded
// while no leader was there to hear it; the new leader's sweep at the
// start of its term queues the child (its stream starts at the present,
// so only the sweep can).
func TestGraphSweepUnblocksAChildWhoseEventWasMissed(t *testing.T) {
	b := setup(t)
	q := b.queue("q", "test", 1, schema.SortFIFO)
	parent, child := bson.NewObjectID(), bson.NewObjectID()
	b.graphInsert([]store.GraphTask{{ID: parent, Queue: q}, {ID: child, Queue: q, Parents: []bson.ObjectID{parent}}})
	_, err := b.db.Collection("tasks").UpdateOne(context.Background(), bson.D{{Key: "_id", Value: parent}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 1}, {Key: "node", Value: "gone"}}}})
	require.NoError(t, err)
	require.Equal(t, int64(-4), b.task(child).Lookup("status").AsInt64())
	b.start(b.config("n1"))
	b.waitStatus(child, schema.StatusSucceeded, 30*time.Second)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Len(t, b.rec.runs[child], 1)
	require.Empty(t, b.rec.runs[parent], "the parent had finished before")
	require.Contains(t, b.logs.String(), "sweep settled children", "the sweep did it")
}

// TestChildrenOfAFailureRetriedBeforeTheSettleWait: the node finished the
// parent as failed, and an operator retried it before the node settled
// its children. The children must wait for the new attempt rather than
// fail for the old one: a failure is not handed to the settle as known.
func TestChildrenOfAFailureRetriedBeforeTheSettleWait(t *testing.T) {
	b := setup(t)
	q := b.queue("q", "test", 1, schema.SortFIFO)
	parent, child := bson.NewObjectID(), bson.NewObjectID()
	b.graphInsert([]store.GraphTask{{ID: parent, Queue: q}, {ID: child, Queue: q, Parents: []bson.ObjectID{parent}}})
	// The retry has put the failed parent back in the queue.
	_, err := b.db.Collection("tasks").UpdateOne(context.Background(), bson.D{{Key: "_id", Value: parent}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -2}}}})
	require.NoError(t, err)
	r := &runner{cfg: runnerConfig{Name: "n1", Store: b.store}}
	r.children(slog.New(slog.NewTextHandler(b.logs, nil)), parent, schema.StatusFailed, "", nil)
	require.Equal(t, int64(-4), b.task(child).Lookup("status").AsInt64(), "the child waits for the retried parent")

	// A success is final: its children run even if the parent is rerun.
	r.children(slog.New(slog.NewTextHandler(b.logs, nil)), parent, schema.StatusSucceeded, "", nil)
	require.Equal(t, int64(-2), b.task(child).Lookup("status").AsInt64(), "the child of a success is queued")
}

// TestLeaderReadsTheEndsOnlyWhileATaskWaits: with no task waiting on its
// parents the leader's stream leaves the tasks' ends out; a graph
// inserted later brings them back at once, so a parent that another
// program ends (not a node, whose finish settles its children itself)
// releases its child within seconds, not at the minute's sweep.
func TestLeaderReadsTheEndsOnlyWhileATaskWaits(t *testing.T) {
	t.Run("ProjectorsStream", func(t *testing.T) { leaderReadsTheEnds(t, false) })
	t.Run("OwnStream", func(t *testing.T) { leaderReadsTheEnds(t, true) })
}

// leaderReadsTheEnds: the leader's duties follow the projector's stream
// (the node holds both leases) or, without a projector, one of their own;
// either way they leave the ends out while no task waits.
func leaderReadsTheEnds(t *testing.T, noProjector bool) {
	b := setup(t)
	q := b.queue("q", "test", 1, schema.SortFIFO)
	elsewhere := b.queue("elsewhere", "Nobody::Here", 1, schema.SortFIFO) // no plugin here: not served
	cfg := b.config("n1")
	cfg.NoProjector = noProjector
	b.start(cfg)
	require.Eventually(t, func() bool {
		logs := b.logs.String()
		i := strings.Index(logs, "following the projector's stream")
		if noProjector {
			i = 0
		}
		return i >= 0 && strings.Contains(logs[i:], "the tasks' ends are left out")
	}, 20*time.Second, 20*time.Millisecond, "the leader leaves the ends out while no task waits")
	if noProjector {
		require.NotContains(t, b.logs.String(), "following the projector's stream")
	} else {
		// The switch to the projector's stream is a lost place, which the
		// graph duty hears with the stream's next batch and answers with
		// a sweep. Had that batch been the graph's insert, the sweep could
		// meet the parent's end below and settle the child before the
		// stream did (a CI run did). A task of no graph brings it first.
		b.tasks(elsewhere, 1, nil)
		require.Eventually(t, func() bool {
			return strings.Contains(b.logs.String(), `the stream lost its place: sweeping every waiting child" node=n1 component=graph why="the leader's duties now follow the projector's stream"`)
		}, 10*time.Second, 20*time.Millisecond, "the switch heard as a lost place")
	}
	parent, child := bson.NewObjectID(), bson.NewObjectID()
	b.graphInsert([]store.GraphTask{{ID: parent, Queue: elsewhere}, {ID: child, Queue: q, Parents: []bson.ObjectID{parent}}})
	require.Eventually(t, func() bool { return strings.Contains(b.logs.String(), "the tasks' ends are read again") },
		10*time.Second, 20*time.Millisecond, "the child's insert brings the ends back")
	_, err := b.db.Collection("tasks").UpdateOne(context.Background(), bson.D{{Key: "_id", Value: parent}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 1}, {Key: "node", Value: "gone"}}}})
	require.NoError(t, err)
	b.waitStatus(child, schema.StatusSucceeded, 10*time.Second)
	require.NotContains(t, b.logs.String(), "sweep settled children", "the stream settled it, not a sweep")
}
