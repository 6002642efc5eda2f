package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func setStatus(t *testing.T, db *mongo.Database, id bson.ObjectID, status schema.Status, node any) {
	t.Helper()
	_, err := db.Collection("tasks").UpdateOne(context.Background(), bson.D{{Key: "_id", Value: id}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: int32(status)}, {Key: "node", Value: node}}}})
	require.NoError(t, err)
}

func statusOf(t *testing.T, db *mongo.Database, id bson.ObjectID) (schema.Status, string) {
	t.Helper()
	raw := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: id}})
	reason, _ := raw.Lookup("reason").StringValueOK()
	return schema.Status(raw.Lookup("status").AsInt64()), reason
}

// testTaskKill: each state gets what the kill table in the README says,
// and a finished task is never touched.
func testTaskKill(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 5)
	queued, claimed, running, orphan, done := ids[0], ids[1], ids[2], ids[3], ids[4]
	setStatus(t, db, claimed, schema.StatusClaimed, "n1")
	setStatus(t, db, running, schema.StatusRunning, "n2")
	setStatus(t, db, orphan, schema.StatusOrphaned, "n3")
	setStatus(t, db, done, schema.StatusSucceeded, "n1")
	missing := bson.NewObjectID()
	res, err := s.TaskKill(ctx, store.TaskKillParams{Target: store.TaskTarget{IDs: append(ids, missing)}, By: "op", Reason: "why"})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Requested)
	require.Equal(t, int64(1), res.Cancelled)
	require.Equal(t, int64(1), res.Settled)
	require.Len(t, res.Skipped, 2)
	require.Equal(t, done, res.Skipped[0].ID)
	require.Equal(t, missing, res.Skipped[1].ID)
	require.Equal(t, "no such task", res.Skipped[1].Why)
	require.Equal(t, store.SkipMissing, res.Skipped[1].Code)
	require.Equal(t, store.SkipState, res.Skipped[0].Code)

	st, reason := statusOf(t, db, queued)
	require.Equal(t, schema.StatusFailed, st)
	require.Equal(t, schema.ReasonCancelled, reason)
	st, reason = statusOf(t, db, orphan)
	require.Equal(t, schema.StatusFailed, st)
	require.Equal(t, schema.ReasonKilled, reason)
	for id, node := range map[bson.ObjectID]string{claimed: "n1", running: "n2"} {
		raw := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: id}})
		k, ok := store.KillRequestOf(raw)
		require.True(t, ok)
		require.Equal(t, node, k.Request.Node)
		require.Equal(t, "op", k.Request.By)
		require.Equal(t, "why", k.Request.Reason)
		require.False(t, k.Request.At.IsZero())
	}
	st, _ = statusOf(t, db, done)
	require.Equal(t, schema.StatusSucceeded, st)

	// The claimed task's start is refused: the node ends it unrun.
	errs := s.TaskStartMany(ctx, []store.TaskTransitionParams{{ID: claimed, Node: "n1"}})
	require.ErrorIs(t, errs[0], store.ErrKillRequested)
	require.NoError(t, s.TaskEndClaimed(ctx, store.TaskEndClaimedParams{ID: claimed, Node: "n1", Reason: schema.ReasonKilled, Stderr: "not started"}))
	st, reason = statusOf(t, db, claimed)
	require.Equal(t, schema.StatusFailed, st)
	require.Equal(t, schema.ReasonKilled, reason)

	pending, err := s.TaskKillsPending(ctx, "n2")
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.Equal(t, running, pending[0].ID)

	// A second request changes nothing and says so.
	res, err = s.TaskKill(ctx, store.TaskKillParams{Target: store.TaskTarget{IDs: []bson.ObjectID{running}}, By: "op2"})
	require.NoError(t, err)
	require.Zero(t, res.Requested)
	require.Contains(t, res.Skipped[0].Why, "already requested")
	require.Equal(t, store.SkipUnderway, res.Skipped[0].Code)

	_, err = s.TaskKill(ctx, store.TaskKillParams{Target: store.TaskTarget{IDs: make([]bson.ObjectID, store.MaxControlIDs+1)}})
	require.ErrorContains(t, err, "at most 1000")
	_, err = s.TaskKill(ctx, store.TaskKillParams{Target: store.TaskTarget{IDs: ids, Filter: &store.TaskFilter{Queue: q.ID}}})
	require.ErrorContains(t, err, "not both")
}

func testTaskCancel(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 3)
	setStatus(t, db, ids[1], schema.StatusBlocked, nil)
	setStatus(t, db, ids[2], schema.StatusRunning, "n1")
	res, err := s.TaskCancel(ctx, store.TaskCancelParams{Target: store.TaskTarget{IDs: ids}, By: "op"})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Cancelled)
	require.Len(t, res.Skipped, 1)
	require.Contains(t, res.Skipped[0].Why, "kill it instead")
	for _, id := range ids[:2] {
		st, reason := statusOf(t, db, id)
		require.Equal(t, schema.StatusFailed, st)
		require.Equal(t, schema.ReasonCancelled, reason)
	}
	st, _ := statusOf(t, db, ids[2])
	require.Equal(t, schema.StatusRunning, st)
}

// testTaskRetryManyOrphans requeues 100,000 orphans by filter, in chunks,
// with progress, and a dry run first that changes nothing.
func testTaskRetryManyOrphans(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	// 100,000 tasks written twice: minutes on a loaded machine, not the
	// suite's usual one.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	q := newQueue(t, s, "q", schema.SortFIFO)
	const n = 100_000
	docs := make([]any, n)
	for i := range docs {
		docs[i] = bson.D{{Key: "queue", Value: q.ID}, {Key: "status", Value: int32(schema.StatusOrphaned)}, {Key: "node", Value: "gone"},
			{Key: "ctime", Value: time.Now()}, {Key: "mtime", Value: time.Now()}, {Key: "parameters", Value: bson.D{}}}
	}
	for part := range slices.Chunk(docs, 10_000) { // each write well within a socket timeout
		_, err := db.Collection("tasks").InsertMany(ctx, part)
		require.NoError(t, err)
	}
	filter := &store.TaskFilter{Queue: q.ID, Statuses: []schema.Status{schema.StatusOrphaned}}
	dry, err := s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{Filter: filter}, By: "op", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, int64(n), dry.Requeued)
	c, err := db.Collection("tasks").CountDocuments(ctx, bson.D{{Key: "status", Value: int32(schema.StatusOrphaned)}})
	require.NoError(t, err)
	require.Equal(t, int64(n), c, "a dry run changed tasks")
	var calls int
	var last int64
	res, err := s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{Filter: filter}, By: "op", Progress: func(done, total int64) {
		calls++
		require.Equal(t, int64(n), total)
		require.Greater(t, done, last)
		last = done
	}})
	require.NoError(t, err)
	require.Equal(t, int64(n), res.Requeued)
	require.Equal(t, n/1000, calls)
	c, err = db.Collection("tasks").CountDocuments(ctx, bson.D{{Key: "status", Value: int32(schema.StatusQueued)}, {Key: "node", Value: int32(-1)}, {Key: "reason", Value: schema.ReasonRequeued}})
	require.NoError(t, err)
	require.Equal(t, int64(n), c)
}

func testTaskRetryByIDs(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 3)
	setStatus(t, db, ids[0], schema.StatusFailed, "n1")
	setStatus(t, db, ids[1], schema.StatusRunning, "n1")
	res, err := s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{IDs: ids}, By: "op"})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Requeued)
	require.Len(t, res.Skipped, 2)
	require.Contains(t, res.Skipped[0].Why, "only finished or orphaned")
	require.Contains(t, res.Skipped[1].Why, "not finished")
	st, reason := statusOf(t, db, ids[0])
	require.Equal(t, schema.StatusQueued, st)
	require.Equal(t, schema.ReasonRequeued, reason)
}

// testTaskTimers: delayed tasks are held until due, expired ones finish
// unrun, the next timer is the earliest of both, and the claim never takes
// an expired task.
func testTaskTimers(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx))
	q := newQueue(t, s, "q", schema.SortFIFO)
	now := time.Now().UTC().Truncate(time.Millisecond)
	ins := func(c store.TaskInsertControl) bson.ObjectID {
		ids, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil}, Control: &c})
		require.NoError(t, err)
		return ids[0]
	}
	delayed := ins(store.TaskInsertControl{NotBefore: now.Add(time.Hour)})
	expiring := ins(store.TaskInsertControl{ExpiresAt: now.Add(30 * time.Minute)})
	st, _ := statusOf(t, db, delayed)
	require.Equal(t, schema.StatusBlocked, st)

	// The delayed tasks are read from the {awaiting_parents, not_before}
	// index, the tasks awaiting their parents out of its bounds, in
	// not_before order (no sort in memory).
	for _, cmd := range []bson.D{
		{{Key: "find", Value: "tasks"},
			{Key: "filter", Value: bson.D{{Key: "status", Value: -4}, {Key: "not_before", Value: bson.D{{Key: "$type", Value: "date"}}}, {Key: "awaiting_parents", Value: nil}}},
			{Key: "sort", Value: bson.D{{Key: "not_before", Value: 1}}}, {Key: "limit", Value: 1}},
		{{Key: "update", Value: "tasks"}, {Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "status", Value: -4}, {Key: "not_before", Value: bson.D{{Key: "$lte", Value: now}}}, {Key: "awaiting_parents", Value: nil}}},
			{Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -2}}}}}, {Key: "multi", Value: true}}}}},
	} {
		var plan bson.Raw
		require.NoError(t, db.RunCommand(ctx, bson.D{{Key: "explain", Value: cmd}}).Decode(&plan))
		win := plan.Lookup("queryPlanner", "winningPlan").String()
		require.Contains(t, win, "awaiting_parents_1_not_before_1", cmd[0].Key)
		require.NotContains(t, win, "COLLSCAN", cmd[0].Key)
		require.NotContains(t, win, `"SORT"`, cmd[0].Key)
		require.NotContains(t, win, "MinKey", "%s: tight bounds on awaiting_parents: %s", cmd[0].Key, win)
	}
	// And the store's own queries are those: they use that index.
	used := timerIndexOps(t, db)
	_, _, err := s.TaskTimerNext(ctx)
	require.NoError(t, err)
	_, err = s.TaskReleaseDue(ctx, store.TaskTimersParams{Now: now})
	require.NoError(t, err)
	require.GreaterOrEqual(t, timerIndexOps(t, db)-used, int64(2), "TaskTimerNext and TaskReleaseDue read the {awaiting_parents, not_before} index")
	next, ok, err := s.TaskTimerNext(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, now.Add(30*time.Minute), next)

	// Not due yet: nothing moves.
	n, err := s.TaskReleaseDue(ctx, store.TaskTimersParams{Now: now})
	require.NoError(t, err)
	require.Zero(t, n)
	exp, err := s.TaskExpireDue(ctx, store.TaskTimersParams{Now: now})
	require.NoError(t, err)
	require.Empty(t, exp)

	exp, err = s.TaskExpireDue(ctx, store.TaskTimersParams{Now: now.Add(31 * time.Minute)})
	require.NoError(t, err)
	require.Equal(t, map[bson.ObjectID]int64{q.ID: 1}, exp)
	st, reason := statusOf(t, db, expiring)
	require.Equal(t, schema.StatusFailed, st)
	require.Equal(t, schema.ReasonExpired, reason)
	n, err = s.TaskReleaseDue(ctx, store.TaskTimersParams{Now: now.Add(2 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	st, _ = statusOf(t, db, delayed)
	require.Equal(t, schema.StatusQueued, st)
	_, ok, err = s.TaskTimerNext(ctx)
	require.NoError(t, err)
	require.False(t, ok)

	// A queued task past its expires_at is never claimed.
	_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: delayed}}, bson.D{{Key: "$set", Value: bson.D{{Key: "expires_at", Value: now.Add(-time.Second)}}}})
	require.NoError(t, err)
	_, err = s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.ErrorIs(t, err, store.ErrNoTask)

	_, err = s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil},
		Control: &store.TaskInsertControl{NotBefore: now.Add(time.Hour), ExpiresAt: now}})
	require.ErrorContains(t, err, "could never run")
	_, err = s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil},
		Control: &store.TaskInsertControl{Timeout: -time.Second}})
	require.ErrorContains(t, err, "timeout must be")
}

// timerIndexOps is how many operations used the delayed tasks' index.
func timerIndexOps(t *testing.T, db *mongo.Database) int64 {
	t.Helper()
	cur, err := db.Collection("tasks").Aggregate(context.Background(), mongo.Pipeline{
		{{Key: "$indexStats", Value: bson.D{}}},
		{{Key: "$match", Value: bson.D{{Key: "name", Value: "awaiting_parents_1_not_before_1"}}}},
	})
	require.NoError(t, err)
	var stats []bson.Raw
	require.NoError(t, cur.All(context.Background(), &stats))
	require.Len(t, stats, 1)
	return stats[0].Lookup("accesses", "ops").AsInt64()
}

// testDeadNodeSettlesKillsAndRerunsOrphans: a dead node's running task
// asked to be killed finishes killed, one of a rerun_orphans queue goes
// back as a new attempt spending a try (one whose tries reached the
// queue's retries, at least 1, is orphaned instead), the others are
// orphaned with their attempt recorded.
func testDeadNodeSettlesKillsAndRerunsOrphans(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	plain := newQueue(t, s, "plain", schema.SortFIFO)
	rerun := newQueue(t, s, "rerun", schema.SortFIFO)
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: rerun.ID, RerunOrphans: ptr(true)}))
	a := insertTasks(t, s, plain.ID, 2)
	b := insertTasks(t, s, rerun.ID, 2)
	for _, id := range append(a, b...) {
		setStatus(t, db, id, schema.StatusRunning, "ghost")
	}
	// b[1] was rerun once already: the queue's retries (0) allow one rerun.
	_, err := db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: b[1]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "tries", Value: 1}}}})
	require.NoError(t, err)
	_, err = s.TaskKill(ctx, store.TaskKillParams{Target: store.TaskTarget{IDs: a[1:]}, By: "op"})
	require.NoError(t, err)
	_, err = db.Collection("nodes").InsertOne(ctx, bson.D{{Key: "node", Value: "ghost"}, {Key: "timestamp", Value: time.Now().Add(-time.Hour)}, {Key: "state", Value: "running"}}) // ours (state)
	require.NoError(t, err)
	dead, err := s.NodesDeadRecover(ctx, store.NodesDeadRecoverParams{DeadAfter: time.Minute, By: "n1"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, store.DeadNode{Node: "ghost", Since: dead[0].Since, Requeued: 1, Orphaned: 2, Killed: 1}, dead[0])
	st, reason := statusOf(t, db, a[0])
	require.Equal(t, schema.StatusOrphaned, st)
	require.Equal(t, schema.ReasonOrphaned, reason)
	st, reason = statusOf(t, db, a[1])
	require.Equal(t, schema.StatusFailed, st)
	require.Equal(t, schema.ReasonKilled, reason)
	st, reason = statusOf(t, db, b[0])
	require.Equal(t, schema.StatusQueued, st)
	require.Equal(t, schema.ReasonRerun, reason)
	task, err := s.TaskGet(ctx, b[0])
	require.NoError(t, err)
	require.Equal(t, 1, task.Control.Attempt)
	require.Len(t, task.Control.Attempts, 1)
	require.Equal(t, "ghost", task.Control.Attempts[0].Node)
	require.Equal(t, schema.StatusOrphaned, task.Control.Attempts[0].Status)
	require.Equal(t, 1, task.Control.Tries, "a rerun spends a try")
	st, reason = statusOf(t, db, b[1])
	require.Equal(t, schema.StatusOrphaned, st, "its rerun spent: orphaned, not rerun on every death")
	require.Equal(t, schema.ReasonOrphaned, reason)

	// With retries 3, a task that has spent 2 tries is rerun once more.
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: rerun.ID, Retries: ptr(3)}))
	c := insertTasks(t, s, rerun.ID, 1)[0]
	setStatus(t, db, c, schema.StatusRunning, "ghost2")
	_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: c}}, bson.D{{Key: "$set", Value: bson.D{{Key: "tries", Value: 2}}}})
	require.NoError(t, err)
	_, err = db.Collection("nodes").InsertOne(ctx, bson.D{{Key: "node", Value: "ghost2"}, {Key: "timestamp", Value: time.Now().Add(-time.Hour)}, {Key: "state", Value: "running"}})
	require.NoError(t, err)
	_, err = s.NodesDeadRecover(ctx, store.NodesDeadRecoverParams{DeadAfter: time.Minute, By: "n1"})
	require.NoError(t, err)
	st, reason = statusOf(t, db, c)
	require.Equal(t, schema.StatusQueued, st)
	require.Equal(t, schema.ReasonRerun, reason)
}
