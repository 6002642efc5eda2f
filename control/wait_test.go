package control

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

func setup(t *testing.T) (*store.Store, []bson.ObjectID, func(id bson.ObjectID, status schema.Status)) {
	t.Parallel()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	ctx := context.Background()
	q, err := s.QueueCreate(ctx, store.QueueCreateParams{Name: "q", Constructor: "test"})
	require.NoError(t, err)
	ids, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil, nil, nil}})
	require.NoError(t, err)
	set := func(id bson.ObjectID, status schema.Status) {
		_, err := db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: int32(status)}}}})
		require.NoError(t, err)
	}
	return s, ids, set
}

func TestWaitReturnsAtOnceForTasksThatAlreadyEnded(t *testing.T) {
	s, ids, set := setup(t)
	set(ids[0], schema.StatusSucceeded)
	set(ids[1], schema.StatusOrphaned)
	missing := bson.NewObjectID()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	states, err := Wait(ctx, s, []bson.ObjectID{ids[0], ids[1], missing, ids[0]})
	require.NoError(t, err)
	require.Len(t, states, 3, "repeats dropped")
	require.Equal(t, schema.StatusSucceeded, states[0].Status)
	require.Equal(t, schema.StatusOrphaned, states[1].Status)
	require.False(t, states[2].Found)
	require.False(t, Succeeded(states))
}

func TestWaitReturnsWhenTheLastTaskEnds(t *testing.T) {
	s, ids, set := setup(t)
	set(ids[0], schema.StatusSucceeded)
	done := make(chan []store.TaskState, 1)
	go func() {
		states, err := Wait(context.Background(), s, ids[:2])
		require.NoError(t, err)
		done <- states
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("Wait returned while a task was still queued")
	default:
	}
	set(ids[1], schema.StatusSucceeded)
	select {
	case states := <-done:
		require.True(t, Succeeded(states))
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after the last task finished")
	}
}

// readCounter signals each TaskStates read.
type readCounter struct {
	*store.Store
	reads chan []store.TaskState
}

func (r readCounter) TaskStates(ctx context.Context, ids []bson.ObjectID) ([]store.TaskState, error) {
	states, err := r.Store.TaskStates(ctx, ids)
	r.reads <- states
	return states, err
}

// TestWaitIsWokenByTheChangeStream: with the periodic re-read an hour
// away, a wait that has read its task unfinished still returns as soon as
// the task ends: the change stream woke it.
func TestWaitIsWokenByTheChangeStream(t *testing.T) {
	s, ids, set := setup(t)
	rc := readCounter{Store: s, reads: make(chan []store.TaskState, 10)}
	done := make(chan error, 1)
	go func() {
		_, err := wait(context.Background(), rc, ids[:1], time.Hour)
		done <- err
	}()
	first := <-rc.reads
	require.False(t, Ended(first[0]), "the first read sees the task queued")
	// Reads that follow at once (a first empty batch of the stream) are
	// not what this tests: wait until the wait rests in the stream.
	for quiet := false; !quiet; {
		select {
		case st := <-rc.reads:
			require.False(t, Ended(st[0]))
		case <-time.After(300 * time.Millisecond):
			quiet = true
		}
	}
	set(ids[0], schema.StatusFailed)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the wait was not woken by the task's change (its re-read is an hour away)")
	}
}

func TestWaitTimesOutWithTheStatesSoFar(t *testing.T) {
	s, ids, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	states, err := Wait(ctx, s, ids[2:])
	require.True(t, errors.Is(err, ErrWaitTimeout), "%v", err)
	require.Len(t, states, 1)
	require.Equal(t, schema.StatusQueued, states[0].Status)
}

func TestWaitRefusesBadIDLists(t *testing.T) {
	_, err := CheckIDs(nil)
	require.Error(t, err)
	_, err = CheckIDs(make([]bson.ObjectID, store.MaxControlIDs+1))
	require.ErrorContains(t, err, "at most 1000")
}

func TestWaitOutOfTimeBeforeItStartsStillReadsTheStates(t *testing.T) {
	s, ids, _ := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	states, err := Wait(ctx, s, ids[:1])
	require.ErrorIs(t, err, ErrWaitTimeout)
	require.Len(t, states, 1)
	require.True(t, states[0].Found)
	require.Equal(t, schema.StatusQueued, states[0].Status)
}
