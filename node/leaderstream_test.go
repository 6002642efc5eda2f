package node

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// fakeSource delivers n batches (their Lost naming them), then blocks
// until ctx ends; it counts the Next calls in progress.
type fakeSource struct {
	n, sent int
	inNext  atomic.Int32
}

func (s *fakeSource) Next(ctx context.Context) (store.StreamBatch, error) {
	s.inNext.Add(1)
	defer s.inNext.Add(-1)
	if s.sent < s.n {
		s.sent++
		return store.StreamBatch{Lost: strconv.Itoa(s.sent)}, nil
	}
	<-ctx.Done()
	return store.StreamBatch{}, ctx.Err()
}

// TestSharedStreamGivesEveryDutyEveryBatchInOrder: two duties on one
// source each hear every batch, in order; when one ends with an error the
// other is ended, the error is returned, and the source is no longer read.
func TestSharedStreamGivesEveryDutyEveryBatchInOrder(t *testing.T) {
	src := &fakeSource{n: 20}
	heard := make([][]string, 2)
	boom := errors.New("boom")
	otherEnded := make(chan error, 1)
	otherRead := make(chan struct{})
	read := func(i int, ctx context.Context, src batchSource) error {
		for len(heard[i]) < 20 {
			b, err := src.Next(ctx)
			if err != nil {
				return err
			}
			heard[i] = append(heard[i], b.Lost)
		}
		return nil
	}
	duties := []streamDuty{
		func(ctx context.Context, _ leadership.Term, src batchSource) error {
			if err := read(0, ctx, src); err != nil {
				return err
			}
			<-otherRead
			return boom
		},
		func(ctx context.Context, _ leadership.Term, src batchSource) error {
			if err := read(1, ctx, src); err != nil {
				return err
			}
			close(otherRead)
			_, err := src.Next(ctx) // nothing more comes: waits to be ended
			otherEnded <- err
			return nil
		},
	}
	done := make(chan error, 1)
	go func() { done <- teeRun(context.Background(), leadership.Term{}, src, duties) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, boom)
	case <-time.After(10 * time.Second):
		t.Fatal("teeRun did not return after a duty failed")
	}
	require.Error(t, <-otherEnded, "the other duty's Next ends when one duty ended")
	var want []string
	for i := 1; i <= 20; i++ {
		want = append(want, strconv.Itoa(i))
	}
	require.Equal(t, want, heard[0])
	require.Equal(t, want, heard[1])
	require.Zero(t, src.inNext.Load(), "the source is not read once teeRun returned")
}

// TestSharedStreamEndsWithItsContext: the term's end ends every duty and
// the reading of the source; no error.
func TestSharedStreamEndsWithItsContext(t *testing.T) {
	src := &fakeSource{}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{}, 2)
	duty := func(ctx context.Context, _ leadership.Term, src batchSource) error {
		started <- struct{}{}
		for {
			if _, err := src.Next(ctx); err != nil {
				return nil // ended
			}
		}
	}
	done := make(chan error, 1)
	go func() { done <- teeRun(ctx, leadership.Term{}, src, []streamDuty{duty, duty}) }()
	<-started
	<-started
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("teeRun did not end with its context")
	}
	require.Zero(t, src.inNext.Load())
}

// TestLeaderFollowsTheProjectorsStreamWhileItIsUp: the leader's duties
// read a stream of their own until the projector's is up, then that one
// (their own closed: no change stream left on the server), hearing a Lost
// at each switch and only the leader's events (LeaderMatch: the ends only
// while a task may wait on its parents); when the projector's ends they
// read their own again.
func TestLeaderFollowsTheProjectorsStreamWhileItIsUp(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	st := store.New(db, store.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	rd := newRide()
	heard := make(chan store.StreamBatch, 100)
	duty := func(ctx context.Context, _ leadership.Term, src batchSource) error {
		for {
			b, err := src.Next(ctx)
			if err != nil {
				return nil
			}
			if b.Lost != "" || len(b.Events) > 0 {
				heard <- b
			}
		}
	}
	done := make(chan error, 1)
	go func() { done <- sharedStream(st, slog.New(slog.DiscardHandler), rd, duty)(ctx, leadership.Term{}) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		require.Empty(t, mongotest.ChangeStreamCursors(t, db), "a stream left open")
	})
	next := func(what string) store.StreamBatch {
		t.Helper()
		select {
		case b := <-heard:
			return b
		case <-time.After(20 * time.Second):
			t.Fatalf("nothing heard: %s", what)
			return store.StreamBatch{}
		}
	}
	delayed := func() bson.ObjectID {
		t.Helper()
		id := bson.NewObjectID()
		_, err := db.Collection(schema.CollTasks).InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: schema.TaskQueue, Value: bson.NewObjectID()},
			{Key: schema.TaskStatus, Value: int32(schema.StatusBlocked)}, {Key: schema.TaskNotBefore, Value: time.Now().Add(time.Hour)}})
		require.NoError(t, err)
		return id
	}
	idOf := func(b store.StreamBatch) []bson.ObjectID {
		var ids []bson.ObjectID
		for _, ev := range b.Events {
			id, _ := ev.ID.ObjectIDOK()
			ids = append(ids, id)
		}
		return ids
	}
	require.Eventually(t, func() bool { return len(mongotest.ChangeStreamCursors(t, db)) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the leader's own stream is not open")
	own := delayed()
	require.Equal(t, []bson.ObjectID{own}, idOf(next("a delayed task on the leader's own stream")))

	rd.Board()
	require.Contains(t, next("the switch to the projector's stream").Lost, "the projector's stream")
	require.Eventually(t, func() bool { return len(mongotest.ChangeStreamCursors(t, db)) == 0 }, 20*time.Second, 10*time.Millisecond,
		"the leader's own stream is still open")
	delayed() // only the projector's stream would carry it, and it is fed by hand here
	timer := updateEvent(t, bson.D{{Key: schema.TaskNotBefore, Value: time.Now()}})
	claim := updateEvent(t, bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusRunning)}})
	end := updateEvent(t, bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusSucceeded)}})
	waits := updateEvent(t, bson.D{{Key: schema.TaskAwaitingParents, Value: true}})
	// No task waits on its parents (asked at the switch): the ends are
	// left out, until an event says one starts to.
	rd.Ride(store.StreamBatch{Events: []store.ChangeEvent{claim, end, timer}})
	require.Equal(t, []bson.ObjectID{mustID(timer)}, idOf(next("the leader's events of the projector's batch, without the ends")))
	rd.Ride(store.StreamBatch{Events: []store.ChangeEvent{end, waits, end, claim}})
	require.Equal(t, []bson.ObjectID{mustID(waits), mustID(end)}, idOf(next("the ends from the task that starts waiting on")))
	rd.Board() // reopened: a Lost first
	rd.Ride(store.StreamBatch{Events: []store.ChangeEvent{timer}})
	require.Contains(t, next("a reopened projector's stream").Lost, "reopened")
	require.Equal(t, []bson.ObjectID{mustID(timer)}, idOf(next("the batch after the reopening")))

	rd.Alight()
	require.Contains(t, next("the switch back").Lost, "of their own")
	require.Eventually(t, func() bool { return len(mongotest.ChangeStreamCursors(t, db)) == 1 }, 20*time.Second, 10*time.Millisecond,
		"the leader's own stream is not open again")
	again := delayed()
	require.Equal(t, []bson.ObjectID{again}, idOf(next("a delayed task on the leader's own stream again")))
}

func mustID(ev store.ChangeEvent) bson.ObjectID {
	id, _ := ev.ID.ObjectIDOK()
	return id
}

// TestNodesStartedTogetherHoldBothLeasesOnOne: of nodes started at once,
// the one that takes the leader's lease takes the projector's too (the
// projectors wait for their leader's first try and yield to a leader
// elsewhere), so its leader duties can follow the projector's stream.
func TestNodesStartedTogetherHoldBothLeasesOnOne(t *testing.T) {
	b := setup(t)
	nodes := make([]*Node, 3)
	for i := range nodes {
		n, err := New(b.config("n" + strconv.Itoa(i)))
		require.NoError(t, err)
		nodes[i] = n
	}
	errs := make(chan error, len(nodes))
	for _, n := range nodes {
		go func() { errs <- n.Start(context.Background()) }()
	}
	for range nodes {
		require.NoError(t, <-errs)
	}
	for _, n := range nodes {
		t.Cleanup(n.Stop)
	}
	holder := func(lease func(n *Node) bool) int {
		for i, n := range nodes {
			if lease(n) {
				return i
			}
		}
		return -1
	}
	leader := func(n *Node) bool { return n.LeaderStatus().Leader }
	projector := func(n *Node) bool { return n.ProjectorStats().Leader }
	require.Eventually(t, func() bool { return holder(leader) >= 0 && holder(projector) >= 0 }, 20*time.Second, 10*time.Millisecond,
		"both leases taken")
	require.Equal(t, holder(leader), holder(projector), "the leases went to different nodes")
	require.Eventually(t, func() bool { return strings.Contains(b.logs.String(), "following the projector's stream") }, 20*time.Second, 10*time.Millisecond,
		"the leader's duties do not follow the projector's stream")
}
