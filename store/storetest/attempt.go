package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// testTaskFinishGuardedByAttempt: a node found dead while it ran tasks
// (their reruns queued as the next attempt) comes back and claims them
// again; the finishes of its lost runs, guarded by their attempt, must not
// land on the new claims, which node and status alone cannot tell apart,
// on every path of a finish (one, piped, bulk), and the new runs'
// finishes land, alone or beside first attempts.
func testTaskFinishGuardedByAttempt(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, RerunOrphans: ptr(true), Retries: ptr(3)}))
	insertTasks(t, s, q.ID, 3)
	lost := []bson.ObjectID{running(t, s, q.ID), running(t, s, q.ID), running(t, s, q.ID)}

	_, err := db.Collection("nodes").InsertOne(ctx, bson.D{{Key: "node", Value: "n1"},
		{Key: "timestamp", Value: time.Now().Add(-time.Hour)}, {Key: "state", Value: "running"}})
	require.NoError(t, err)
	dead, err := s.NodesDeadRecover(ctx, store.NodesDeadRecoverParams{DeadAfter: time.Minute, By: "n2"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, int64(3), dead[0].Requeued, "its running tasks rerun as their next attempt")

	// n1 is back and claims them again, as their second attempt.
	for range lost {
		id := running(t, s, q.ID)
		require.Contains(t, lost, id)
	}
	// A task on n2, so that a batch led by it takes the bulk path for n1's.
	insertTasks(t, s, q.ID, 1)
	other, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n2", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.NoError(t, s.TaskStart(ctx, store.TaskTransitionParams{ID: other.ID, Node: "n2"}))

	old := func(id bson.ObjectID) store.TaskFinishParams {
		return store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusSucceeded, Stdout: "run of attempt 1", Attempt: 1}
	}
	require.ErrorIs(t, s.TaskFinish(ctx, old(lost[0])), store.ErrLostTask, "one finish")
	fresh := insertTasks(t, s, q.ID, 1)[0]
	require.Equal(t, fresh, running(t, s, q.ID))
	errs := s.TaskFinishMany(ctx, []store.TaskFinishParams{old(lost[1]),
		{ID: fresh, Node: "n1", Status: schema.StatusSucceeded, Stdout: "first", Attempt: 1}})
	require.ErrorIs(t, errs[0], store.ErrLostTask, "piped")
	require.NoError(t, errs[1], "a first attempt beside it lands")
	errs = s.TaskFinishMany(ctx, []store.TaskFinishParams{
		{ID: other.ID, Node: "n2", Status: schema.StatusSucceeded, Attempt: 1}, old(lost[2])})
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], store.ErrLostTask, "bulk")
	for _, id := range lost {
		task, err := s.TaskGet(ctx, id)
		require.NoError(t, err)
		require.Equal(t, schema.StatusRunning, task.Status, "the new claim runs on")
		require.Equal(t, 1, task.Control.Attempt)
		require.False(t, task.Stdout.Set, "no result of the lost run")
	}

	// The new runs' finishes land, on each path: alone, piped beside a
	// first attempt (attempts differ in one batch), in bulk.
	again := func(id bson.ObjectID) store.TaskFinishParams {
		return store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusSucceeded, Stdout: "run of attempt 2", Attempt: 2}
	}
	require.NoError(t, s.TaskFinish(ctx, again(lost[0])))
	first := insertTasks(t, s, q.ID, 1)[0]
	require.Equal(t, first, running(t, s, q.ID))
	errs = s.TaskFinishMany(ctx, []store.TaskFinishParams{again(lost[1]),
		{ID: first, Node: "n1", Status: schema.StatusSucceeded, Attempt: 1}})
	require.Equal(t, []error{nil, nil}, errs)
	insertTasks(t, s, q.ID, 1)
	other, err = s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n2", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.NoError(t, s.TaskStart(ctx, store.TaskTransitionParams{ID: other.ID, Node: "n2"}))
	errs = s.TaskFinishMany(ctx, []store.TaskFinishParams{{ID: other.ID, Node: "n2", Status: schema.StatusSucceeded, Attempt: 1}, again(lost[2])})
	require.Equal(t, []error{nil, nil}, errs)
	for _, id := range append(lost, first, fresh) {
		task, err := s.TaskGet(ctx, id)
		require.NoError(t, err)
		require.Equal(t, schema.StatusSucceeded, task.Status)
		if id == first || id == fresh {
			require.Equal(t, 1, task.Control.Attempt)
			continue
		}
		require.Equal(t, 2, task.Control.Attempt)
		require.Equal(t, "run of attempt 2", task.Stdout.Text)
	}

	// A retried finish whose first try landed is done; the lost run's,
	// arriving after it, is still lost.
	require.NoError(t, s.TaskFinish(ctx, again(lost[0])), "retried, landed already")
	require.ErrorIs(t, s.TaskFinish(ctx, old(lost[0])), store.ErrLostTask, "the lost run's after the new one's")
	errs = s.TaskFinishMany(ctx, []store.TaskFinishParams{again(lost[1]), old(lost[2])})
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], store.ErrLostTask)
}
