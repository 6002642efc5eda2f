package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// graphTask reads what a graph test looks at.
type graphTaskState struct {
	status   schema.Status
	reason   string
	awaiting bool
	stderr   string
}

func graphStateOf(t *testing.T, db *mongo.Database, id bson.ObjectID) graphTaskState {
	t.Helper()
	raw := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: id}})
	var st graphTaskState
	st.status = schema.Status(raw.Lookup("status").AsInt64())
	st.reason, _ = raw.Lookup("reason").StringValueOK()
	st.awaiting, _ = raw.Lookup("awaiting_parents").BooleanOK()
	st.stderr, _ = raw.Lookup("stderr").StringValueOK()
	return st
}

// requireGraph checks each task's status, and that it is marked
// awaiting_parents exactly when it is held (-4): callers list held tasks
// only while they wait for their parents.
func requireGraph(t *testing.T, db *mongo.Database, want map[bson.ObjectID]schema.Status, names map[bson.ObjectID]string) {
	t.Helper()
	for id, st := range want {
		got := graphStateOf(t, db, id)
		require.Equal(t, st, got.status, "task %s (%s): %+v", names[id], id.Hex(), got)
		require.Equal(t, st == schema.StatusBlocked, got.awaiting, "task %s: awaiting_parents exactly while held for its parents", names[id])
	}
}

// counted is what settling did, without the queues it queued in.
func counted(res store.TaskGraphResult) store.TaskGraphResult {
	res.QueuedIn = nil
	return res
}

func graphInsert(t *testing.T, s *store.Store, tasks ...store.GraphTask) []bson.ObjectID {
	t.Helper()
	ids, err := s.TaskInsertGraph(ctxT(t), store.TaskInsertGraphParams{Tasks: tasks})
	require.NoError(t, err)
	require.Len(t, ids, len(tasks))
	return ids
}

// testTaskGraphInsert: a child of a new or unfinished parent is held at
// -4 awaiting its parents, with its parents stored; a child whose parents
// all succeeded already is queued (or held for its not_before, by the
// timers only); a child of an already failed parent fails at once.
func testTaskGraphInsert(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx))
	qa := newQueue(t, s, "a", schema.SortFIFO)
	qb := newQueue(t, s, "b", schema.SortFIFO)
	old := insertTasks(t, s, qa.ID, 3)
	done, failed, running := old[0], old[1], old[2]
	setStatus(t, db, done, schema.StatusSucceeded, "n1")
	setStatus(t, db, failed, schema.StatusFailed, "n1")
	setStatus(t, db, running, schema.StatusRunning, "n1")

	p, c := bson.NewObjectID(), bson.NewObjectID()
	later := time.Now().Add(time.Hour)
	ids := graphInsert(t, s,
		store.GraphTask{ID: p, Queue: qa.ID},
		store.GraphTask{ID: c, Queue: qb.ID, Parents: []bson.ObjectID{p, running, p}, OnParentFailure: schema.OnParentFailureRun},
		store.GraphTask{Queue: qb.ID, Parents: []bson.ObjectID{done}},
		store.GraphTask{Queue: qb.ID, Parents: []bson.ObjectID{done}, Control: &store.TaskInsertControl{NotBefore: later}},
		store.GraphTask{Queue: qb.ID, Parents: []bson.ObjectID{failed}},
	)
	require.Equal(t, []bson.ObjectID{p, c}, ids[:2], "the ids chosen by the caller")
	requireGraph(t, db, map[bson.ObjectID]schema.Status{p: schema.StatusQueued, c: schema.StatusBlocked, ids[2]: schema.StatusQueued},
		map[bson.ObjectID]string{p: "p", c: "c", ids[2]: "child of a succeeded parent"})
	delayed := graphStateOf(t, db, ids[3])
	require.Equal(t, schema.StatusBlocked, delayed.status, "a child of a succeeded parent with a not_before ahead")
	require.False(t, delayed.awaiting, "held for its not_before only: the timers' to release")

	task, err := s.TaskGet(ctx, c)
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{p, running}, task.Graph.Parents, "parents stored once each")
	require.Equal(t, schema.OnParentFailureRun, task.Graph.OnParentFailure)
	require.True(t, task.Graph.AwaitingParents)
	require.Equal(t, qb.ID, task.Queue)

	orphan := graphStateOf(t, db, ids[4])
	require.Equal(t, schema.StatusFailed, orphan.status, "its parent had failed before the insert")
	require.Equal(t, schema.ReasonParentFailed, orphan.reason)
	require.Contains(t, orphan.stderr, failed.Hex())

	// The timers never release a child awaiting its parents, whatever its
	// not_before, and do not wake up for it.
	d := graphInsert(t, s, store.GraphTask{Queue: qb.ID, Parents: []bson.ObjectID{running}, Control: &store.TaskInsertControl{NotBefore: time.Now().Add(-time.Minute)}})
	n, err := s.TaskReleaseDue(ctx, store.TaskTimersParams{Now: time.Now().Add(48 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the delayed child of a succeeded parent only")
	require.Equal(t, schema.StatusBlocked, graphStateOf(t, db, d[0]).status)
	_, ok, err := s.TaskTimerNext(ctx)
	require.NoError(t, err)
	require.False(t, ok, "nothing the timers may release")
}

// testTaskGraphUnblock: a diamond across two queues; each child is
// queued once all its parents succeeded, not before; a child with a
// future not_before is handed to the timers, which release it at its time.
func testTaskGraphUnblock(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	qa := newQueue(t, s, "a", schema.SortFIFO)
	qb := newQueue(t, s, "b", schema.SortFIFO)
	a, b, c, d, e := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	names := map[bson.ObjectID]string{a: "a", b: "b", c: "c", d: "d", e: "e"}
	now := time.Now().UTC().Truncate(time.Millisecond)
	graphInsert(t, s,
		store.GraphTask{ID: a, Queue: qa.ID},
		store.GraphTask{ID: b, Queue: qb.ID, Parents: []bson.ObjectID{a}},
		store.GraphTask{ID: c, Queue: qa.ID, Parents: []bson.ObjectID{a}},
		store.GraphTask{ID: d, Queue: qb.ID, Parents: []bson.ObjectID{b, c}},
		store.GraphTask{ID: e, Queue: qa.ID, Parents: []bson.ObjectID{a}, Control: &store.TaskInsertControl{NotBefore: now.Add(time.Hour)}},
	)
	requireGraph(t, db, map[bson.ObjectID]schema.Status{a: -2, b: -4, c: -4, d: -4, e: -4}, names)

	// Settling a parent that has not ended changes nothing.
	res, err := s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{a}})
	require.NoError(t, err)
	require.Zero(t, res)

	setStatus(t, db, a, schema.StatusSucceeded, "n1")
	res, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{a}})
	require.NoError(t, err)
	require.Equal(t, store.TaskGraphResult{Queued: 2, Held: 1}, counted(res))
	require.ElementsMatch(t, []bson.ObjectID{qa.ID, qb.ID}, res.QueuedIn, "the queues children were queued in")
	requireGraph(t, db, map[bson.ObjectID]schema.Status{b: -2, c: -2, d: -4}, names)
	eState := graphStateOf(t, db, e)
	require.Equal(t, schema.StatusBlocked, eState.status, "its not_before is an hour away")
	require.False(t, eState.awaiting, "handed to the timers")
	n, err := s.TaskReleaseDue(ctx, store.TaskTimersParams{Now: now.Add(2 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, schema.StatusQueued, graphStateOf(t, db, e).status)

	// Again: nothing more to do (every write is guarded).
	res, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{a}})
	require.NoError(t, err)
	require.Zero(t, res)

	setStatus(t, db, b, schema.StatusSucceeded, "n1")
	res, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{b}})
	require.NoError(t, err)
	require.Zero(t, res, "d still waits for c")
	requireGraph(t, db, map[bson.ObjectID]schema.Status{d: -4}, names)

	setStatus(t, db, c, schema.StatusSucceeded, "n2")
	res, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{c}})
	require.NoError(t, err)
	require.Equal(t, store.TaskGraphResult{Queued: 1}, counted(res))
	require.Equal(t, []bson.ObjectID{qb.ID}, res.QueuedIn)
	requireGraph(t, db, map[bson.ObjectID]schema.Status{d: -2}, names)
	claimed, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: qb.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.Equal(t, d, claimed.ID, "a queued child is claimable")
}

// testTaskGraphParentFailed: a parent that fails, is orphaned or deleted
// finishes its waiting descendants unrun, transitively, with reason
// parent_failed; a child with on_parent_failure "run" is queued once all
// its parents have ended.
func testTaskGraphParentFailed(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	a, b, c, r, other, r2 := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	names := map[bson.ObjectID]string{a: "a", b: "b", c: "c", r: "r", other: "other", r2: "r2"}
	graphInsert(t, s,
		store.GraphTask{ID: a, Queue: q.ID},
		store.GraphTask{ID: other, Queue: q.ID},
		store.GraphTask{ID: b, Queue: q.ID, Parents: []bson.ObjectID{a}},
		store.GraphTask{ID: c, Queue: q.ID, Parents: []bson.ObjectID{b}},
		store.GraphTask{ID: r, Queue: q.ID, Parents: []bson.ObjectID{a}, OnParentFailure: schema.OnParentFailureRun},
		store.GraphTask{ID: r2, Queue: q.ID, Parents: []bson.ObjectID{a, other}, OnParentFailure: schema.OnParentFailureRun},
	)
	setStatus(t, db, a, schema.StatusFailed, "n1")
	res, err := s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{a}})
	require.NoError(t, err)
	require.Equal(t, store.TaskGraphResult{Queued: 1, Failed: 2}, counted(res))
	requireGraph(t, db, map[bson.ObjectID]schema.Status{b: 2, c: 2, r: -2, r2: -4}, names)
	for _, id := range []bson.ObjectID{b, c} {
		st := graphStateOf(t, db, id)
		require.Equal(t, schema.ReasonParentFailed, st.reason, names[id])
	}
	require.Contains(t, graphStateOf(t, db, b).stderr, "parent_failed: not run: its parent "+a.Hex()+" ended with status failed")
	require.Contains(t, graphStateOf(t, db, c).stderr, b.Hex(), "c names its own parent, b")

	setStatus(t, db, other, schema.StatusSucceeded, "n1")
	res, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{other}})
	require.NoError(t, err)
	require.Equal(t, store.TaskGraphResult{Queued: 1}, counted(res), "r2 runs once both parents ended")

	// An orphaned parent (it will not be rerun) and a deleted one fail their children.
	o, oc, del, dc := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	graphInsert(t, s,
		store.GraphTask{ID: o, Queue: q.ID}, store.GraphTask{ID: oc, Queue: q.ID, Parents: []bson.ObjectID{o}},
		store.GraphTask{ID: del, Queue: q.ID}, store.GraphTask{ID: dc, Queue: q.ID, Parents: []bson.ObjectID{del}},
	)
	setStatus(t, db, o, schema.StatusOrphaned, "gone")
	_, err = db.Collection("tasks").DeleteOne(ctx, bson.D{{Key: "_id", Value: del}})
	require.NoError(t, err)
	res, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{o, del}})
	require.NoError(t, err)
	require.Equal(t, store.TaskGraphResult{Failed: 2}, counted(res))
	require.Contains(t, graphStateOf(t, db, oc).stderr, "ended with status orphaned")
	require.Contains(t, graphStateOf(t, db, dc).stderr, "no longer exists")

	// A cancelled parent (an operator's cancel is status 2, reason cancelled) too.
	k, kc := bson.NewObjectID(), bson.NewObjectID()
	graphInsert(t, s, store.GraphTask{ID: k, Queue: q.ID}, store.GraphTask{ID: kc, Queue: q.ID, Parents: []bson.ObjectID{k}})
	_, err = s.TaskCancel(ctx, store.TaskCancelParams{Target: store.TaskTarget{IDs: []bson.ObjectID{k}}, By: "op"})
	require.NoError(t, err)
	_, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{k}})
	require.NoError(t, err)
	require.Contains(t, graphStateOf(t, db, kc).stderr, "(reason cancelled)")
}

// testTaskGraphRetryReblocks: retrying a failed parent, by id or by
// filter, holds its parent_failed descendants again, transitively; they
// run once it succeeds.
func testTaskGraphRetryReblocks(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	q2 := newQueue(t, s, "q2", schema.SortFIFO)
	a, b, c, keep := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	names := map[bson.ObjectID]string{a: "a", b: "b", c: "c", keep: "keep"}
	graphInsert(t, s,
		store.GraphTask{ID: a, Queue: q.ID},
		store.GraphTask{ID: b, Queue: q.ID, Parents: []bson.ObjectID{a}},
		store.GraphTask{ID: c, Queue: q2.ID, Parents: []bson.ObjectID{b}},
		store.GraphTask{ID: keep, Queue: q.ID, Parents: []bson.ObjectID{a}},
	)
	setStatus(t, db, a, schema.StatusFailed, "n1")
	_, err := s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{a}})
	require.NoError(t, err)
	requireGraph(t, db, map[bson.ObjectID]schema.Status{b: 2, c: 2, keep: 2}, names)
	// keep was cancelled by an operator afterwards: not a parent_failed
	// end, so a retry of a leaves it alone.
	_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: keep}}, bson.D{{Key: "$set", Value: bson.D{{Key: "reason", Value: "cancelled"}}}})
	require.NoError(t, err)

	res, err := s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{IDs: []bson.ObjectID{a}}, By: "op"})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Requeued)
	require.Equal(t, int64(2), res.Reblocked)
	requireGraph(t, db, map[bson.ObjectID]schema.Status{a: -2, b: -4, c: -4, keep: 2}, names)
	require.Empty(t, graphStateOf(t, db, b).reason, "held for its parents: no reason")

	setStatus(t, db, a, schema.StatusSucceeded, "n1")
	gres, err := s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{a}})
	require.NoError(t, err)
	require.Equal(t, store.TaskGraphResult{Queued: 1}, counted(gres))
	requireGraph(t, db, map[bson.ObjectID]schema.Status{b: -2, c: -4}, names)

	// By filter too: c, in the other queue, is not matched by the filter;
	// it is held again as b's descendant.
	setStatus(t, db, b, schema.StatusFailed, "n1")
	_, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{b}})
	require.NoError(t, err)
	requireGraph(t, db, map[bson.ObjectID]schema.Status{c: 2}, names)
	res, err = s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{Filter: &store.TaskFilter{Queue: q.ID, Statuses: []schema.Status{schema.StatusFailed}, Reason: ""}}, By: "op"})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Requeued, "b and keep")
	require.Equal(t, int64(1), res.Reblocked, "c")
	requireGraph(t, db, map[bson.ObjectID]schema.Status{b: -2, keep: -2, c: -4}, names)
	require.Empty(t, graphStateOf(t, db, c).reason, "held for its parents: no reason")

	// A failed task matched by the filter itself is requeued, not held: an
	// operator's retry of a task runs it whatever its parents.
	setStatus(t, db, b, schema.StatusFailed, "n1")
	_, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{b}})
	require.NoError(t, err)
	requireGraph(t, db, map[bson.ObjectID]schema.Status{c: 2}, names)
	res, err = s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{Filter: &store.TaskFilter{Queue: q2.ID, Statuses: []schema.Status{schema.StatusFailed}}}, By: "op"})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Requeued, "c")
	require.Zero(t, res.Reblocked)
	require.Equal(t, schema.StatusQueued, graphStateOf(t, db, c).status)
	require.False(t, graphStateOf(t, db, c).awaiting)
}

// testTaskGraphEndUnrun: a child held for its parents that an operator
// cancels or kills, or that expires, finishes unrun like any held task,
// and is no longer marked awaiting its parents.
func testTaskGraphEndUnrun(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	now := time.Now().UTC().Truncate(time.Millisecond)
	p, cancelled, killed, expired := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	names := map[bson.ObjectID]string{p: "p", cancelled: "cancelled", killed: "killed", expired: "expired"}
	graphInsert(t, s,
		store.GraphTask{ID: p, Queue: q.ID},
		store.GraphTask{ID: cancelled, Queue: q.ID, Parents: []bson.ObjectID{p}},
		store.GraphTask{ID: killed, Queue: q.ID, Parents: []bson.ObjectID{p}},
		store.GraphTask{ID: expired, Queue: q.ID, Parents: []bson.ObjectID{p}, Control: &store.TaskInsertControl{ExpiresAt: now.Add(time.Minute)}},
	)
	requireGraph(t, db, map[bson.ObjectID]schema.Status{cancelled: -4, killed: -4, expired: -4}, names)

	cres, err := s.TaskCancel(ctx, store.TaskCancelParams{Target: store.TaskTarget{IDs: []bson.ObjectID{cancelled}}, By: "op"})
	require.NoError(t, err)
	require.Equal(t, int64(1), cres.Cancelled)
	kres, err := s.TaskKill(ctx, store.TaskKillParams{Target: store.TaskTarget{IDs: []bson.ObjectID{killed}}, By: "op"})
	require.NoError(t, err)
	require.Equal(t, int64(1), kres.Cancelled)
	exp, err := s.TaskExpireDue(ctx, store.TaskTimersParams{Now: now.Add(2 * time.Minute)})
	require.NoError(t, err)
	require.Equal(t, map[bson.ObjectID]int64{q.ID: 1}, exp)

	requireGraph(t, db, map[bson.ObjectID]schema.Status{cancelled: 2, killed: 2, expired: 2}, names)
	for id, reason := range map[bson.ObjectID]string{cancelled: schema.ReasonCancelled, killed: schema.ReasonCancelled, expired: schema.ReasonExpired} {
		st := graphStateOf(t, db, id)
		require.Equal(t, reason, st.reason, names[id])
		require.False(t, st.awaiting, "%s: finished, no longer awaiting its parents", names[id])
	}
	res, err := s.TaskGraphSweep(ctx)
	require.NoError(t, err)
	require.Zero(t, res, "nothing waits any more")
}

// testTaskGraphInsertRefuses: bad graphs are refused whole, with errors
// that say which task and why, and nothing is inserted.
func testTaskGraphInsertRefuses(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	existing := insertTasks(t, s, q.ID, 1)[0]
	// A stored task of a queue that no longer exists.
	lost := bson.NewObjectID()
	_, err := db.Collection("tasks").InsertOne(ctx, bson.D{{Key: "_id", Value: lost}, {Key: "queue", Value: bson.NewObjectID()}, {Key: "status", Value: -2}, {Key: "node", Value: -1}})
	require.NoError(t, err)
	a, b, c := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	many := make([]bson.ObjectID, 100000)
	for i := range many {
		many[i] = bson.NewObjectID()
	}
	for _, tc := range []struct {
		name  string
		tasks []store.GraphTask
		kind  store.GraphErrorKind
		task  int
		want  string
	}{
		{"cycle", []store.GraphTask{
			{ID: a, Queue: q.ID, Parents: []bson.ObjectID{c}, Ref: "a"},
			{ID: b, Queue: q.ID, Parents: []bson.ObjectID{a}, Ref: "b"},
			{ID: c, Queue: q.ID, Parents: []bson.ObjectID{b, existing}, Ref: "c"},
		}, store.GraphConflict, 0, `a cycle of parents: "a" -> "c" -> "b" -> "a" (each waits for the next)`},
		{"self-parent", []store.GraphTask{{ID: a, Queue: q.ID, Parents: []bson.ObjectID{a}}}, store.GraphConflict, 0, "task 0: a task cannot be its own parent"},
		{"unknown parent", []store.GraphTask{{Queue: q.ID}, {Queue: q.ID, Parents: []bson.ObjectID{b}, Ref: "x"}}, store.GraphUnknown, 1, `task 1 (ref "x"): parent ` + b.Hex() + `: no such task`},
		{"too many parents", []store.GraphTask{{Queue: q.ID, Parents: many}}, store.GraphInvalidTask, 0, "100000 parents; a task may have at most 1000"},
		{"unknown queue", []store.GraphTask{{Queue: q.ID}, {Queue: bson.NewObjectID()}}, store.GraphUnknown, 1, "task 1: queue"},
		{"parent in an unknown queue", []store.GraphTask{{Queue: q.ID}, {Queue: q.ID, Parents: []bson.ObjectID{lost}}}, store.GraphUnknown, 1, "which does not exist (it can never run)"},
		{"duplicate id", []store.GraphTask{{ID: a, Queue: q.ID}, {ID: a, Queue: q.ID}}, store.GraphConflict, 1, "is also task 0's"},
		{"stored id", []store.GraphTask{{Queue: q.ID}, {ID: existing, Queue: q.ID}}, store.GraphConflict, 1, "already a stored task's"},
		{"on_parent_failure", []store.GraphTask{{Queue: q.ID, OnParentFailure: "maybe"}}, store.GraphInvalidTask, 0, `on_parent_failure must be "fail" or "run"`},
		{"too many tasks", slices.Repeat([]store.GraphTask{{Queue: q.ID}}, store.MaxGraphInsert+1), store.GraphInvalidTask, store.MaxGraphInsert, "a graph of 50001 tasks; one insert takes at most 50000"},
	} {
		_, err := s.TaskInsertGraph(ctx, store.TaskInsertGraphParams{Tasks: tc.tasks})
		require.ErrorIs(t, err, store.ErrInvalidGraph, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
		var ge *store.GraphInputError
		require.True(t, errors.As(err, &ge), tc.name)
		require.Equal(t, tc.kind, ge.Kind, "%s: kind", tc.name)
		require.Equal(t, tc.task, ge.Task, "%s: the task it is about", tc.name)
		n, err := db.Collection("tasks").CountDocuments(ctx, bson.D{})
		require.NoError(t, err)
		require.Equal(t, int64(2), n, "%s: nothing inserted", tc.name)
	}
}

// testTaskGraphInsertAllOrNothing: a server error partway through the
// insert (here a validator that refuses the last task) leaves none of the
// graph.
func testTaskGraphInsertAllOrNothing(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	require.NoError(t, db.CreateCollection(ctx, "tasks", options.CreateCollection().
		SetValidator(bson.D{{Key: "parameters.poison", Value: bson.D{{Key: "$exists", Value: false}}}})))
	poison, err := bson.Marshal(bson.D{{Key: "poison", Value: true}})
	require.NoError(t, err)
	tasks := make([]store.GraphTask, 2000)
	for i := range tasks {
		tasks[i] = store.GraphTask{ID: bson.NewObjectID(), Queue: q.ID}
		if i > 0 {
			tasks[i].Parents = []bson.ObjectID{tasks[i-1].ID}
		}
	}
	tasks[len(tasks)-1].Parameters = poison
	_, err = s.TaskInsertGraph(ctx, store.TaskInsertGraphParams{Tasks: tasks})
	require.ErrorContains(t, err, "Document failed validation")
	require.Zero(t, countWith(t, db, bson.D{}), "no part of the graph")
}

// testTaskGraphSweep: the sweep settles children whose parents' finish
// nobody acted on, transitively.
func testTaskGraphSweep(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ok, okc, bad, badc, badcc, wait, waitc := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	graphInsert(t, s,
		store.GraphTask{ID: ok, Queue: q.ID}, store.GraphTask{ID: okc, Queue: q.ID, Parents: []bson.ObjectID{ok}},
		store.GraphTask{ID: bad, Queue: q.ID}, store.GraphTask{ID: badc, Queue: q.ID, Parents: []bson.ObjectID{bad}},
		store.GraphTask{ID: badcc, Queue: q.ID, Parents: []bson.ObjectID{badc}},
		store.GraphTask{ID: wait, Queue: q.ID}, store.GraphTask{ID: waitc, Queue: q.ID, Parents: []bson.ObjectID{wait}},
	)
	setStatus(t, db, ok, schema.StatusSucceeded, "n1")
	setStatus(t, db, bad, schema.StatusFailed, "n1")
	setStatus(t, db, wait, schema.StatusRunning, "n1")
	res, err := s.TaskGraphSweep(ctx)
	require.NoError(t, err)
	require.Equal(t, store.TaskGraphResult{Queued: 1, Failed: 2}, counted(res))
	requireGraph(t, db, map[bson.ObjectID]schema.Status{okc: -2, badc: 2, badcc: 2, waitc: -4}, nil)
	res, err = s.TaskGraphSweep(ctx)
	require.NoError(t, err)
	require.Zero(t, res)
}

// testStreamLeader: the leader's profile with GraphEnds carries tasks that
// end (finished, orphaned) and deletes, which EndsTask tells apart, and
// tasks given a not_before or an expires_at, with the times; not other
// transitions.
func testStreamLeader(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 5)
	r, err := s.StreamOpen(ctx, store.StreamParams{Profile: store.StreamLeader, GraphEnds: true, MaxAwait: 100 * time.Millisecond})
	require.NoError(t, err)
	defer r.Close()
	tasks := db.Collection("tasks")
	setStatus(t, db, ids[0], schema.StatusRunning, "n1") // not an end
	setStatus(t, db, ids[0], schema.StatusSucceeded, "n1")
	setStatus(t, db, ids[1], schema.StatusOrphaned, "n1")
	_, err = tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[2]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "mtime", Value: time.Now()}}}})
	require.NoError(t, err)
	_, err = tasks.DeleteOne(ctx, bson.D{{Key: "_id", Value: ids[3]}})
	require.NoError(t, err)
	_, err = s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil}}) // not an end, no timer
	require.NoError(t, err)
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	_, err = tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[4]}}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskNotBefore, Value: at}}}})
	require.NoError(t, err)
	timed := bson.NewObjectID()
	_, err = tasks.InsertOne(ctx, bson.D{{Key: "_id", Value: timed}, {Key: schema.TaskQueue, Value: q.ID}, {Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
		{Key: schema.TaskExpiresAt, Value: at.Add(time.Minute)}})
	require.NoError(t, err)
	require.Equal(t, []string{
		"update " + ids[0].Hex() + " ends", "update " + ids[1].Hex() + " ends", "delete " + ids[3].Hex() + " ends",
		"update " + ids[4].Hex() + " not_before=0s", "insert " + timed.Hex() + " expires_at=1m0s",
	}, leaderEvents(t, r, 5, at))
	requireNoMoreEvents(t, r, "nothing else follows")
}

// leaderEvents reads n events of a StreamLeader reader (20 s at most),
// each as "op id", then " waits" (WaitsOnParents), " ends" (EndsTask) and
// the times it carries, as offsets from at.
func leaderEvents(t *testing.T, r *store.StreamReader, n int, at time.Time) []string {
	t.Helper()
	var got []string
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		b, err := r.Next(ctxT(t))
		require.NoError(t, err)
		for _, ev := range b.Events {
			id, _ := ev.ID.ObjectIDOK()
			got = append(got, ev.Op+" "+id.Hex()+leaderMarks(ev, at))
		}
	}
	return got
}

// leaderMarks is what the leader's duties read of an event: " waits"
// (WaitsOnParents), " ends" (EndsTask) and the times it carries, as
// offsets from at.
func leaderMarks(ev store.ChangeEvent, at time.Time) string {
	e := ""
	if store.WaitsOnParents(ev) {
		e += " waits"
	}
	if store.EndsTask(ev) {
		e += " ends"
	}
	for _, doc := range []bson.Raw{ev.Doc, ev.Updated} {
		for _, f := range []string{schema.TaskNotBefore, schema.TaskExpiresAt} {
			if v, ok := doc.Lookup(f).TimeOK(); ok {
				e += " " + f + "=" + v.Sub(at).String()
			}
		}
	}
	return e
}

// requireNoMoreEvents: r delivers no event for 500 ms.
func requireNoMoreEvents(t *testing.T, r *store.StreamReader, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctxT(t), 500*time.Millisecond)
	defer cancel()
	for {
		b, err := r.Next(ctx)
		if err != nil {
			return
		}
		require.Empty(t, b.Events, msg)
	}
}

// testStreamLeaderWithoutEnds: without GraphEnds the leader's profile
// leaves the ends out and carries the tasks that start waiting on their
// parents (WaitsOnParents); TaskGraphAnyWaiting says whether one waits.
func testStreamLeaderWithoutEnds(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx))
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 2)
	waiting, err := s.TaskGraphAnyWaiting(ctx)
	require.NoError(t, err)
	require.False(t, waiting)
	r, err := s.StreamOpen(ctx, store.StreamParams{Profile: store.StreamLeader, MaxAwait: 100 * time.Millisecond})
	require.NoError(t, err)
	defer r.Close()
	setStatus(t, db, ids[0], schema.StatusSucceeded, "n1") // an end: left out
	_, err = db.Collection("tasks").DeleteOne(ctx, bson.D{{Key: "_id", Value: ids[1]}})
	require.NoError(t, err)
	parent, child := bson.NewObjectID(), bson.NewObjectID()
	graphInsert(t, s, store.GraphTask{ID: parent, Queue: q.ID}, store.GraphTask{ID: child, Queue: q.ID, Parents: []bson.ObjectID{parent}})
	waiting, err = s.TaskGraphAnyWaiting(ctx)
	require.NoError(t, err)
	require.True(t, waiting)
	require.Equal(t, []string{"insert " + child.Hex() + " waits"}, leaderEvents(t, r, 1, time.Time{}))
	setStatus(t, db, parent, schema.StatusSucceeded, "n1")
	_, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{parent}})
	require.NoError(t, err)
	waiting, err = s.TaskGraphAnyWaiting(ctx)
	require.NoError(t, err)
	require.False(t, waiting, "the child was queued")
	requireNoMoreEvents(t, r, "neither the parent's end nor the child's release is carried")
}

// testStreamCountersWithLeader: StreamCounters with StreamParams.Leader
// carries what StreamCounters and StreamLeader (without the ends) carry,
// with their fields; CountersMatch picks out the counters' events
// and LeaderMatch the leader's, with or without the ends, as the server's
// filters do: the four streams read the same writes.
func testStreamCountersWithLeader(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx))
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 8)
	open := func(p store.StreamParams) *store.StreamReader {
		p.MaxAwait = 100 * time.Millisecond
		r, err := s.StreamOpen(ctx, p)
		require.NoError(t, err)
		t.Cleanup(r.Close)
		return r
	}
	both := open(store.StreamParams{Profile: store.StreamCounters, Leader: true})
	counters := open(store.StreamParams{Profile: store.StreamCounters})
	leader := open(store.StreamParams{Profile: store.StreamLeader})
	leaderEnds := open(store.StreamParams{Profile: store.StreamLeader, GraphEnds: true})

	tasks := db.Collection("tasks")
	set := func(id bson.ObjectID, d bson.D) {
		t.Helper()
		_, err := tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, d)
		require.NoError(t, err)
	}
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	setStatus(t, db, ids[0], schema.StatusRunning, "n1")                                               // counters
	setStatus(t, db, ids[0], schema.StatusSucceeded, "n1")                                             // counters, an end
	setStatus(t, db, ids[1], schema.StatusOrphaned, "n1")                                              // counters, an end
	set(ids[2], bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskMTime, Value: time.Now()}}}})      // neither
	set(ids[3], bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskReason, Value: "because"}}}})      // counters
	set(ids[4], bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskNotBefore, Value: at}}}})          // the leader's only
	set(ids[5], bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskExpiresAt, Value: at}}}})          // the leader's only
	set(ids[6], bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskAwaitingParents, Value: true}}}})  // the leader's only
	set(ids[6], bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskAwaitingParents, Value: false}}}}) // neither
	set(ids[7], bson.D{{Key: "$unset", Value: bson.D{{Key: schema.TaskStatus, Value: ""}}}})           // counters
	_, err := tasks.DeleteOne(ctx, bson.D{{Key: "_id", Value: ids[1]}})                                // counters, an end
	require.NoError(t, err)
	parent, child := bson.NewObjectID(), bson.NewObjectID()
	graphInsert(t, s, store.GraphTask{ID: parent, Queue: q.ID}, store.GraphTask{ID: child, Queue: q.ID, Parents: []bson.ObjectID{parent}})
	other := newQueue(t, s, "other", schema.SortFIFO)                                                                                                        // counters
	set(ids[3], bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskQueue, Value: other.ID}}}})                                                              // counters
	_, err = db.Collection("queues").UpdateOne(ctx, bson.D{{Key: "_id", Value: other.ID}}, bson.D{{Key: "$set", Value: bson.D{{Key: "threads", Value: 3}}}}) // neither
	require.NoError(t, err)
	last := bson.NewObjectID() // every stream's: an insert with a not_before
	_, err = tasks.InsertOne(ctx, bson.D{{Key: "_id", Value: last}, {Key: schema.TaskQueue, Value: q.ID}, {Key: schema.TaskStatus, Value: int32(schema.StatusBlocked)},
		{Key: schema.TaskNotBefore, Value: at}})
	require.NoError(t, err)

	// Each event as its kind, task and time, and what the leader's
	// duties read of it.
	// An event as the projector reads it: what changed, when, and the
	// task's queue, status and reason before and after.
	key := func(ev store.ChangeEvent) string {
		id, _ := ev.ID.ObjectIDOK()
		e := ev.Op + " " + ev.Coll + " " + id.Hex() + " " + fmt.Sprint(ev.ClusterTime)
		for _, doc := range []bson.Raw{ev.Before, ev.Doc, ev.Updated} {
			for _, f := range []string{schema.TaskQueue, schema.TaskStatus, schema.TaskReason} {
				if v, err := doc.LookupErr(f); err == nil {
					e += " " + f + "=" + v.String()
				}
			}
		}
		return e + fmt.Sprint(" removed=", ev.Removed)
	}
	// An event as the leader's duties read it.
	show := func(ev store.ChangeEvent) string {
		id, _ := ev.ID.ObjectIDOK()
		return ev.Op + " " + ev.Coll + " " + id.Hex() + " " + fmt.Sprint(ev.ClusterTime) + leaderMarks(ev, at)
	}
	read := func(r *store.StreamReader) []store.ChangeEvent {
		t.Helper()
		var got []store.ChangeEvent
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			b, err := r.Next(ctx)
			require.NoError(t, err)
			for _, ev := range b.Events {
				got = append(got, ev)
				if id, _ := ev.ID.ObjectIDOK(); id == last {
					return got
				}
			}
		}
		t.Fatalf("the last write was not heard in 20 s; heard %d events", len(got))
		return nil
	}
	shown := func(evs []store.ChangeEvent, keep func(store.ChangeEvent) bool, as func(store.ChangeEvent) string) []string {
		var out []string
		for _, ev := range evs {
			if keep(ev) {
				out = append(out, as(ev))
			}
		}
		return out
	}
	all := func(store.ChangeEvent) bool { return true }
	gotBoth := read(both)
	wantCounters, wantLeader, wantEnds := shown(read(counters), all, key), shown(read(leader), all, show), shown(read(leaderEnds), all, show)
	require.Len(t, wantLeader, 5, "not_before, expires_at, awaiting_parents set by updates; the child inserted waiting; the last insert")
	require.Len(t, wantEnds, 8, "and three ends")
	require.Len(t, wantCounters, 11, "two claims, orphaned, reason, status removed, delete, three task inserts, a queue insert, queue set")
	// It may carry more (awaiting_parents set false: the server's filter
	// asks only that the field be set), which neither filter keeps.
	require.Equal(t, wantCounters, shown(gotBoth, store.CountersMatch, key), "CountersMatch")
	require.Equal(t, wantLeader, shown(gotBoth, func(ev store.ChangeEvent) bool { return store.LeaderMatch(ev, false) }, show), "LeaderMatch without the ends")
	require.Equal(t, wantEnds, shown(gotBoth, func(ev store.ChangeEvent) bool { return store.LeaderMatch(ev, true) }, show), "LeaderMatch with the ends")
}

// testTaskGraphGet: a task's ancestors and descendants with their states.
func testTaskGraphGet(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx))
	q := newQueue(t, s, "q", schema.SortFIFO)
	root, a, b, c, d := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	graphInsert(t, s,
		store.GraphTask{ID: root, Queue: q.ID},
		store.GraphTask{ID: a, Queue: q.ID, Parents: []bson.ObjectID{root}},
		store.GraphTask{ID: b, Queue: q.ID, Parents: []bson.ObjectID{root}},
		store.GraphTask{ID: c, Queue: q.ID, Parents: []bson.ObjectID{a, b}},
		store.GraphTask{ID: d, Queue: q.ID, Parents: []bson.ObjectID{c, root}},
	)
	setStatus(t, db, root, schema.StatusSucceeded, "n1")
	view, err := s.TaskGraphGet(ctx, store.TaskGraphGetParams{ID: a})
	require.NoError(t, err)
	var got []string
	for _, n := range view.Nodes {
		got = append(got, n.ID.Hex()+" "+n.Status.String()+" "+strings.Repeat("+", max(n.Depth, 0))+strings.Repeat("-", max(-n.Depth, 0)))
	}
	require.Equal(t, []string{root.Hex() + " succeeded -", a.Hex() + " blocked ", c.Hex() + " blocked +", d.Hex() + " blocked ++"}, got)
	require.False(t, view.Truncated)
	view, err = s.TaskGraphGet(ctx, store.TaskGraphGetParams{ID: root, Limit: 3})
	require.NoError(t, err)
	require.Len(t, view.Nodes, 3)
	require.True(t, view.Truncated)
	require.Equal(t, 1, view.Nodes[1].Depth)
	view, err = s.TaskGraphGet(ctx, store.TaskGraphGetParams{ID: d})
	require.NoError(t, err)
	require.Len(t, view.Nodes, 5, "d's ancestors are every other task")
	require.Equal(t, -1, view.Nodes[len(view.Nodes)-2].Depth)
	_, err = s.TaskGraphGet(ctx, store.TaskGraphGetParams{ID: bson.NewObjectID()})
	require.ErrorIs(t, err, store.ErrNotFound)

	// Finding children reads the parents index.
	var plan bson.Raw
	require.NoError(t, db.RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{
		{Key: "find", Value: "tasks"},
		{Key: "filter", Value: bson.D{{Key: "parents", Value: bson.D{{Key: "$in", Value: bson.A{root}}}}, {Key: "status", Value: -4}, {Key: "awaiting_parents", Value: true}}},
	}}}).Decode(&plan))
	require.Contains(t, plan.String(), "parents_1")
	require.NotContains(t, plan.String(), "COLLSCAN")
}

// testTaskGraphSettleWaitingReadAhead: the children read while the parent's
// finish was written are settled without reading them again; a child
// inserted after that read is left for the leader's duty; a read of
// another parent's children is refused.
func testTaskGraphSettleWaitingReadAhead(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	p, early, late, other := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	names := map[bson.ObjectID]string{p: "p", early: "early", late: "late", other: "other"}
	graphInsert(t, s, store.GraphTask{ID: p, Queue: q.ID}, store.GraphTask{ID: early, Queue: q.ID, Parents: []bson.ObjectID{p}},
		store.GraphTask{ID: other, Queue: q.ID})
	w, err := s.TaskGraphWaiting(ctx, p)
	require.NoError(t, err)
	graphInsert(t, s, store.GraphTask{ID: late, Queue: q.ID, Parents: []bson.ObjectID{p}})
	setStatus(t, db, p, schema.StatusSucceeded, "n1")

	_, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{other}, Waiting: w})
	require.ErrorContains(t, err, "not those of")
	res, err := s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{p}, Waiting: w,
		Ended: &store.TaskState{Status: schema.StatusSucceeded}})
	require.NoError(t, err)
	require.Equal(t, store.TaskGraphResult{Queued: 1}, counted(res))
	requireGraph(t, db, map[bson.ObjectID]schema.Status{early: -2, late: -4}, names)
	res, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{p}})
	require.NoError(t, err)
	require.Equal(t, store.TaskGraphResult{Queued: 1}, counted(res), "a settle that reads finds the late child")
	requireGraph(t, db, map[bson.ObjectID]schema.Status{late: -2}, names)
}

// testTaskGraphSettleAfterARetry: a settle that read a parent as failed,
// and writes its child's parent_failed end only after an operator's retry
// requeued that parent (whose search for parent_failed children found
// none yet), blocks the child again: once the parent succeeds, the child
// runs. (The interleaving a retry racing a settle can make, taken step by
// step.)
func testTaskGraphSettleAfterARetry(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "g", schema.SortFIFO)
	p, c := bson.NewObjectID(), bson.NewObjectID()
	graphInsert(t, s, store.GraphTask{ID: p, Queue: q.ID}, store.GraphTask{ID: c, Queue: q.ID, Parents: []bson.ObjectID{p}})
	setStatus(t, db, p, schema.StatusFailed, "n1") // the settle reads it so
	r, err := s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{IDs: []bson.ObjectID{p}}, By: "op"})
	require.NoError(t, err)
	require.Zero(t, r.Reblocked, "the child was still waiting")
	// The settle's write, with the state it read before the retry.
	_, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{p}, Ended: &store.TaskState{Status: schema.StatusFailed}})
	require.NoError(t, err)
	st := graphStateOf(t, db, c)
	require.Equal(t, schema.StatusBlocked, st.status, "the child of a retried parent was left %s (%s)", st.status, st.reason)
	require.True(t, st.awaiting)

	setStatus(t, db, p, schema.StatusSucceeded, "n1")
	_, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{p}})
	require.NoError(t, err)
	require.Equal(t, schema.StatusQueued, graphStateOf(t, db, c).status, "its parent succeeded")
}

// testNotBeforeByTheServersClock: a not_before is judged by the server's
// clock, not the host's, when a task is inserted and when its parents let
// it go: a host whose clock runs ten minutes ahead neither inserts nor
// releases a task due in five, by the server's clock, as if it were due.
func testNotBeforeByTheServersClock(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{Now: func() time.Time { return time.Now().Add(10 * time.Minute) }})
	ctx := ctxT(t)
	q := newQueue(t, s, "g", schema.SortFIFO)
	server, err := s.ServerNow(ctx)
	require.NoError(t, err)
	soon := &store.TaskInsertControl{NotBefore: server.Add(5 * time.Minute)}

	ids, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil}, Control: soon})
	require.NoError(t, err)
	require.Equal(t, schema.StatusBlocked, graphStateOf(t, db, ids[0]).status, "inserted as due")

	p, c, d := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	graphInsert(t, s, store.GraphTask{ID: p, Queue: q.ID}, store.GraphTask{ID: c, Queue: q.ID, Parents: []bson.ObjectID{p}, Control: soon},
		store.GraphTask{ID: d, Queue: q.ID, Control: soon})
	require.Equal(t, schema.StatusBlocked, graphStateOf(t, db, d).status, "a graph's task inserted as due")
	setStatus(t, db, p, schema.StatusSucceeded, "n1")
	_, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{p}})
	require.NoError(t, err)
	st := graphStateOf(t, db, c)
	require.Equal(t, schema.StatusBlocked, st.status, "released by its parent as due")
	require.False(t, st.awaiting, "handed over to the timers")
}

// testTaskGraphRetryWaitsWhateverThePaging: a retry that requeues a failed
// parent and its parent_failed child holds the child for the parent,
// whichever of the retry's pages of 1,000 each falls in (the same page,
// or the child's first: both queued it at once, to run before its parent
// ran again), by filter or by ids; a child retried alone runs. Once the
// parent succeeds, the child is queued.
func testTaskGraphRetryWaitsWhateverThePaging(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	failed := func(parent, child bson.ObjectID) {
		t.Helper()
		setStatus(t, db, parent, schema.StatusFailed, "n1")
		_, err := s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{parent}})
		require.NoError(t, err)
		require.Equal(t, schema.ReasonParentFailed, graphStateOf(t, db, child).reason)
	}
	retry := func(target store.TaskTarget) store.TaskRetryResult {
		t.Helper()
		res, err := s.TaskRetry(ctx, store.TaskRetryParams{Target: target, By: "op"})
		require.NoError(t, err)
		return res
	}
	byFilter := store.TaskTarget{Filter: &store.TaskFilter{Queue: q.ID, Statuses: []schema.Status{schema.StatusFailed}}}

	// The child's page first: its id is below 1,000 failed others', its
	// parent's above them.
	child := bson.NewObjectID()
	others := insertTasks(t, s, q.ID, 1000)
	_, err := db.Collection("tasks").UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: others}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 2}, {Key: "node", Value: "n1"}}}})
	require.NoError(t, err)
	parent := bson.NewObjectID()
	names := map[bson.ObjectID]string{parent: "parent", child: "child"}
	graphInsert(t, s, store.GraphTask{ID: parent, Queue: q.ID}, store.GraphTask{ID: child, Queue: q.ID, Parents: []bson.ObjectID{parent}})
	failed(parent, child)
	res := retry(byFilter)
	require.Equal(t, int64(1002), res.Requeued)
	requireGraph(t, db, map[bson.ObjectID]schema.Status{parent: -2, child: -4}, names)

	// One page, by filter and by ids.
	_, err = db.Collection("tasks").DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: others}}}})
	require.NoError(t, err)
	for _, target := range []store.TaskTarget{byFilter, {IDs: []bson.ObjectID{child, parent}}} {
		failed(parent, child)
		res = retry(target)
		require.Equal(t, int64(2), res.Requeued, "%+v", target)
		requireGraph(t, db, map[bson.ObjectID]schema.Status{parent: -2, child: -4}, names)
	}

	// A parent not marked has_children (its child was submitted after it
	// had failed): the same, by ids and by filter, the parent's page
	// first (its id below 1,000 failed others', the child's above them).
	_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: parent}}, bson.D{{Key: "$unset", Value: bson.D{{Key: schema.TaskHasChildren, Value: ""}}}})
	require.NoError(t, err)
	failed(parent, child)
	res = retry(store.TaskTarget{IDs: []bson.ObjectID{child, parent}})
	require.Equal(t, int64(2), res.Requeued)
	requireGraph(t, db, map[bson.ObjectID]schema.Status{parent: -2, child: -4}, names)
	early := bson.NewObjectID()
	others = insertTasks(t, s, q.ID, 1000)
	_, err = db.Collection("tasks").UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: others}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 2}, {Key: "node", Value: "n1"}}}})
	require.NoError(t, err)
	late := bson.NewObjectID()
	graphInsert(t, s, store.GraphTask{ID: early, Queue: q.ID})
	setStatus(t, db, early, schema.StatusFailed, "n1")
	graphInsert(t, s, store.GraphTask{ID: late, Queue: q.ID, Parents: []bson.ObjectID{early}})
	require.Equal(t, schema.ReasonParentFailed, graphStateOf(t, db, late).reason, "failed at its insert: its parent had")
	_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: early}}, bson.D{{Key: "$unset", Value: bson.D{{Key: schema.TaskHasChildren, Value: ""}}}})
	require.NoError(t, err)
	retry(store.TaskTarget{Filter: &store.TaskFilter{Queue: q.ID, Statuses: []schema.Status{schema.StatusFailed}, Reason: schema.ReasonParentFailed}})
	requireGraph(t, db, map[bson.ObjectID]schema.Status{late: -2}, map[bson.ObjectID]string{late: "late"})
	setStatus(t, db, late, schema.StatusFailed, "n1")
	_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: late}}, bson.D{{Key: "$set", Value: bson.D{{Key: "reason", Value: schema.ReasonParentFailed}}}})
	require.NoError(t, err)
	res = retry(byFilter)
	requireGraph(t, db, map[bson.ObjectID]schema.Status{early: -2, late: -4}, map[bson.ObjectID]string{early: "early", late: "late"})
	_, err = db.Collection("tasks").DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: append(others, early, late)}}}})
	require.NoError(t, err)

	// The child alone: the operator asked for it, whatever its parent.
	failed(parent, child)
	retry(store.TaskTarget{IDs: []bson.ObjectID{child}})
	require.Equal(t, schema.StatusQueued, graphStateOf(t, db, child).status)

	// Both again; the parent succeeds: the child is queued.
	_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: child}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -4}, {Key: "awaiting_parents", Value: true}}}})
	require.NoError(t, err)
	failed(parent, child)
	retry(byFilter)
	setStatus(t, db, parent, schema.StatusSucceeded, "n1")
	_, err = s.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: []bson.ObjectID{parent}})
	require.NoError(t, err)
	requireGraph(t, db, map[bson.ObjectID]schema.Status{child: -2}, names)
}
