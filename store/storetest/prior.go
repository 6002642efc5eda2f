package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// testStreamEveryOwnTransitionSaysWhereTheTaskStood: every write of ours
// that moves a task (a node's hand-backs, failures and finishes, large
// output included; an operator's kills, cancels and retries; the timers'
// expiries; recovery of a restarted, a dead and a silent 4.103 node; the
// settling of task graphs) says where the task stood (schema.TaskPrior),
// and says it right: the counter projector then needs no pre-image while
// only our nodes write. Each step's events are followed, up to a marker,
// against the state the stream itself showed before; the setup's raw
// writes (another program's) are followed without the requirement.
func testStreamEveryOwnTransitionSaysWhereTheTaskStood(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{OutputThreshold: 1024})
	ctx := ctxT(t)
	f := openStream(t, s, store.StreamParams{Profile: store.StreamCounters, NoPreImages: true})
	q := newQueue(t, s, "q", schema.SortFIFO)
	type stood struct {
		queue  bson.ObjectID
		status int64
	}
	shadow := map[any]stood{}
	step := func(what string, ours bool, do func()) {
		t.Helper()
		do()
		_, evs := f.until(isOp("insert", schema.CollQueues, marker(t, db)))
		moved := 0
		for _, ev := range evs {
			if ev.Coll != schema.CollTasks {
				continue
			}
			id := ev.ID.String()
			switch ev.Op {
			case "insert":
				q, _ := ev.Doc.Lookup(schema.TaskQueue).ObjectIDOK()
				shadow[id] = stood{q, ev.Doc.Lookup(schema.TaskStatus).AsInt64()}
			case "update":
				was, known := shadow[id]
				require.True(t, known, "%s: task %s seen before", what, id)
				if ours {
					require.True(t, ev.Prior, "%s: the update of task %s says where it stood", what, id)
					require.Equal(t, was.queue, ev.Before.Lookup(schema.TaskQueue).ObjectID(), "%s: task %s's queue", what, id)
					require.Equal(t, was.status, ev.Before.Lookup(schema.TaskStatus).AsInt64(), "%s: task %s's status before", what, id)
				}
				if v, err := ev.Updated.LookupErr(schema.TaskStatus); err == nil {
					was.status = v.AsInt64()
					shadow[id] = was
					moved++
				}
			default:
				require.False(t, ours, "%s: a %s of task %s", what, ev.Op, id)
			}
		}
		if ours {
			require.Positive(t, moved, "%s: moved no task", what)
		}
	}
	var ids []bson.ObjectID
	step("insert", false, func() { ids = insertTasks(t, s, q.ID, 20) })
	next := 0
	claim := func(node string, start bool) bson.ObjectID {
		t.Helper()
		task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: node, Sort: schema.SortFIFO, Start: start})
		require.NoError(t, err)
		require.Equal(t, ids[next], task.ID)
		next++
		return task.ID
	}
	var id bson.ObjectID
	step("claim", true, func() { id = claim("n1", false) })
	step("release", true, func() { require.NoError(t, s.TaskRelease(ctx, store.TaskTransitionParams{ID: id, Node: "n1"})) })
	// The released task is the oldest queued one again.
	step("claim into running", true, func() {
		task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Start: true})
		require.NoError(t, err)
		require.Equal(t, id, task.ID)
	})
	step("hand back unstarted", true, func() { require.NoError(t, s.TaskUnstart(ctx, store.TaskTransitionParams{ID: id, Node: "n1"})) })
	next = 0
	var failed []bson.ObjectID
	step("claim, end unstarted", true, func() {
		id := claim("n1", false)
		failed = append(failed, id)
		require.NoError(t, s.TaskEndClaimed(ctx, store.TaskEndClaimedParams{ID: id, Node: "n1", Reason: schema.ReasonKilled, Stderr: "$killed"}))
	})
	step("claim, fail", true, func() {
		id := claim("n1", false)
		failed = append(failed, id)
		require.NoError(t, s.TaskFail(ctx, store.TaskFailParams{ID: id, Node: "n1", From: schema.StatusClaimed, Reason: "cannot read it"}))
	})
	step("finish with output for GridFS, and with output too large for a piped finish", true, func() {
		a, b := claim("n1", true), claim("n1", true)
		errs := s.TaskFinishMany(ctx, []store.TaskFinishParams{
			{ID: a, Node: "n1", Status: schema.StatusSucceeded, Stdout: strings.Repeat("$out ", 400)},
			{ID: b, Node: "n1", Status: schema.StatusFailed, Stdout: strings.Repeat("$out ", 40)},
		})
		require.Equal(t, []error{nil, nil}, errs)
	})
	step("finish of two nodes' tasks", true, func() {
		a, b := claim("n1", true), claim("n2", true)
		errs := s.TaskFinishMany(ctx, []store.TaskFinishParams{
			{ID: a, Node: "n1", Status: schema.StatusSucceeded},
			{ID: b, Node: "n2", Status: schema.StatusFailed},
		})
		require.Equal(t, []error{nil, nil}, errs)
		failed = append(failed, b)
	})
	var bad, good bson.ObjectID
	step("claims", true, func() { bad, good = claim("n1", true), claim("n1", true) })
	step("a task whose attempts another program broke", false, func() {
		set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: bad}}, bson.D{{Key: schema.TaskAttempts, Value: "not a list"}})
	})
	step("a batched finish that one task fails, written again one by one", true, func() {
		errs := s.TaskFinishMany(ctx, []store.TaskFinishParams{
			{ID: bad, Node: "n1", Status: schema.StatusSucceeded},
			{ID: good, Node: "n1", Status: schema.StatusSucceeded},
		})
		require.Error(t, errs[0])
		require.NoError(t, errs[1])
	})
	queued := ids[next:]
	step("cancel", true, func() {
		r, err := s.TaskCancel(ctx, store.TaskCancelParams{Target: store.TaskTarget{IDs: queued[len(queued)-1:]}, By: "op"})
		require.NoError(t, err)
		require.EqualValues(t, 1, r.Cancelled)
	})
	step("kill of a queued task", true, func() {
		r, err := s.TaskKill(ctx, store.TaskKillParams{Target: store.TaskTarget{IDs: queued[len(queued)-2 : len(queued)-1]}, By: "op"})
		require.NoError(t, err)
		require.EqualValues(t, 1, r.Cancelled)
	})
	step("retry", true, func() {
		r, err := s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{IDs: failed}, By: "op"})
		require.NoError(t, err)
		require.EqualValues(t, len(failed), r.Requeued)
	})
	step("an expiry set by another program", false, func() {
		set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: queued[len(queued)-3]}}, bson.D{{Key: schema.TaskExpiresAt, Value: time.Now().Add(-time.Second)}})
	})
	step("expire", true, func() {
		n, err := s.TaskExpireDue(ctx, store.TaskTimersParams{Now: time.Now()})
		require.NoError(t, err)
		require.Len(t, n, 1)
	})

	// Recovery: a restarted node's claimed and running tasks; a kill of
	// the orphan; a stale claim; a dead node; a silent 4.103 node.
	claimAny := func(node string, start bool) bson.ObjectID {
		t.Helper()
		task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: node, Sort: schema.SortFIFO, Start: start})
		require.NoError(t, err)
		return task.ID
	}
	var orphan bson.ObjectID
	step("claims of a node that restarts", true, func() { claimAny("n3", false); orphan = claimAny("n3", true) })
	step("orphan a restarted node's tasks", true, func() {
		n, err := s.TaskOrphanNode(ctx, store.TaskOrphanNodeParams{Node: "n3"})
		require.NoError(t, err)
		require.EqualValues(t, 2, n)
	})
	step("kill of an orphan", true, func() {
		r, err := s.TaskKill(ctx, store.TaskKillParams{Target: store.TaskTarget{IDs: []bson.ObjectID{orphan}}, By: "op"})
		require.NoError(t, err)
		require.EqualValues(t, 1, r.Settled)
	})
	var stale bson.ObjectID
	step("a claim", true, func() { stale = claimAny("n4", false) })
	step("the claim grows old", false, func() {
		set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: stale}}, bson.D{{Key: schema.TaskMTime, Value: time.Now().Add(-time.Hour)}})
	})
	step("orphan a stale claim", true, func() {
		n, err := s.TaskOrphanStale(ctx, store.TaskOrphanStaleParams{OlderThan: time.Minute})
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
	})
	_, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "dead", State: schema.NodeStateRunning})
	require.NoError(t, err)
	step("a node's claims", true, func() { claimAny("dead", false); claimAny("dead", true) })
	step("its tasks in 4.103's shape", false, func() {
		_, err := db.Collection(schema.CollNodes).InsertOne(ctx, bson.D{{Key: "node", Value: "perl-host"}, {Key: "timestamp", Value: time.Now().Add(-time.Hour)}})
		require.NoError(t, err)
		set(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: claimAny("perl-claims", false)}}, bson.D{{Key: schema.TaskNode, Value: "perl-host"}})
	})
	setNodeAge(t, db, "dead", time.Hour)
	step("recover a dead node and a silent 4.103 node", true, func() {
		dead, err := s.NodesDeadRecover(ctx, store.NodesDeadRecoverParams{DeadAfter: time.Minute, By: "n1"})
		require.NoError(t, err)
		require.Len(t, dead, 2)
	})

	// Task graphs: a child queued when its parent succeeded; one ended
	// when its parent failed, blocked again when the parent is retried.
	qg := newQueue(t, s, "graph", schema.SortFIFO)
	p1, c1, p2, c2 := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	step("a graph", false, func() {
		graphInsert(t, s,
			store.GraphTask{ID: p1, Queue: qg.ID}, store.GraphTask{ID: c1, Queue: qg.ID, Parents: []bson.ObjectID{p1}},
			store.GraphTask{ID: p2, Queue: qg.ID}, store.GraphTask{ID: c2, Queue: qg.ID, Parents: []bson.ObjectID{p2}})
	})
	step("run the parents", true, func() {
		won, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: qg.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 2, Start: true})
		require.NoError(t, err)
		require.Len(t, won.Tasks, 2)
		errs := s.TaskFinishMany(ctx, []store.TaskFinishParams{{ID: p1, Node: "n1", Status: schema.StatusSucceeded}, {ID: p2, Node: "n1", Status: schema.StatusFailed}})
		require.Equal(t, []error{nil, nil}, errs)
	})
	step("settle the children", true, func() {
		res, err := s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{p1, p2}})
		require.NoError(t, err)
		require.EqualValues(t, 1, res.Queued)
		require.EqualValues(t, 1, res.Failed)
	})
	step("retry the failed parent", true, func() {
		r, err := s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{IDs: []bson.ObjectID{p2}}, By: "op"})
		require.NoError(t, err)
		require.EqualValues(t, 1, r.Reblocked)
	})
	require.Equal(t, int64(schema.StatusBlocked), shadow[bson.RawValue{Type: bson.TypeObjectID, Value: c2[:]}.String()].status, "the child waits again")
}

// testTasksPreImagesSwitch: pre-images of tasks are turned on and off,
// and read back, under a context with a deadline (which the driver sends
// as maxTimeMS), whether the collection exists yet or not.
func testTasksPreImagesSwitch(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	_, hasDeadline := ctx.Deadline()
	require.True(t, hasDeadline)
	on, err := s.TasksPreImages(ctx)
	require.NoError(t, err)
	require.False(t, on, "a new collection keeps none")
	for _, want := range []bool{true, false, false, true} {
		require.NoError(t, s.TasksPreImagesSet(ctx, want))
		on, err := s.TasksPreImages(ctx)
		require.NoError(t, err)
		require.Equal(t, want, on)
	}
}

// testRecoveryWritesSurviveAMalformedTask: a task whose queue is no
// scalar (another program's mistake) does not fail the writes over many
// tasks that say where each stood: a restarted node's tasks are
// orphaned, that one with them (its change says nothing of where it
// stood).
func testRecoveryWritesSurviveAMalformedTask(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 1)
	_, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n5", Sort: schema.SortFIFO, Start: true})
	require.NoError(t, err)
	odd := bson.NewObjectID()
	_, err = db.Collection(schema.CollTasks).InsertOne(ctx, bson.D{{Key: "_id", Value: odd}, {Key: schema.TaskQueue, Value: bson.D{{Key: "not", Value: "an id"}}},
		{Key: schema.TaskStatus, Value: int32(schema.StatusRunning)}, {Key: schema.TaskNode, Value: "n5"}})
	require.NoError(t, err)
	n, err := s.TaskOrphanNode(ctx, store.TaskOrphanNodeParams{Node: "n5"})
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	for _, id := range []bson.ObjectID{ids[0], odd} {
		st, _ := statusOf(t, db, id)
		require.Equal(t, schema.StatusOrphaned, st)
	}
}
