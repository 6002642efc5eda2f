package storetest

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// testContinuousCreate: many concurrent tries create one task per
// interval; none while the queue has a task to do, none before the
// interval has passed, none when the queue is paused or not continuous.
// The moments given are years ahead of the server's clock, so that they
// are the creations' (ContinuousCreate takes the later of the two).
func testContinuousCreate(t *testing.T, newStore Factory) {
	var now atomic.Int64
	now.Store(time.Date(2036, 11, 23, 12, 0, 0, 0, time.UTC).UnixMilli())
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "cont", schema.SortFIFO)
	tryAll := func() int {
		var created atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, ok, err := s.ContinuousCreate(ctx, q.ID, time.Minute, time.UnixMilli(now.Load()))
				require.NoError(t, err)
				if ok {
					created.Add(1)
				}
			}()
		}
		wg.Wait()
		return int(created.Load())
	}
	require.Zero(t, tryAll(), "not continuous")
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, Continuous: ptr(true), Interval: ptr(time.Minute)}))
	require.Equal(t, 1, tryAll(), "one of eight concurrent tries")
	task := rawDoc(t, db, schema.CollTasks, bson.D{{Key: schema.TaskQueue, Value: q.ID}})
	require.Equal(t, "2111054400", task.Lookup("name").StringValue(), "named by the Unix time")
	require.Equal(t, int32(-2), task.Lookup("status").Int32())
	require.Equal(t, bson.Raw{5, 0, 0, 0, 0}, task.Lookup("parameters").Document())

	now.Add((2 * time.Minute).Milliseconds())
	require.Zero(t, tryAll(), "the last task is still queued")
	_, err := db.Collection(schema.CollTasks).UpdateMany(ctx, bson.D{}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 1}}}})
	require.NoError(t, err)
	require.Equal(t, 1, tryAll(), "done, and the interval passed")
	_, err = db.Collection(schema.CollTasks).UpdateMany(ctx, bson.D{}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 1}}}})
	require.NoError(t, err)
	now.Add((30 * time.Second).Milliseconds())
	require.Zero(t, tryAll(), "within the interval")
	now.Add((30 * time.Second).Milliseconds())
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, Paused: ptr(true)}))
	require.Zero(t, tryAll(), "paused")
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, Paused: ptr(false)}))
	require.Equal(t, 1, tryAll())
	n, err := db.Collection(schema.CollTasks).CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	got, err := s.QueueGet(ctx, store.QueueGetParams{Ref: q.ID.Hex()})
	require.NoError(t, err)
	require.True(t, got.Sched.Continuous)
	require.Equal(t, time.Minute, got.Sched.Interval)
	require.Equal(t, time.UnixMilli(now.Load()).Add(time.Minute).UTC(), got.Sched.NextContinuous.UTC())
}

// testContinuousAtTheGivenMoment: a continuous queue's task is created at
// the moment the caller gives (the server's clock, which the leader
// reads) when the server's clock has not passed it since (here it is
// years ahead), not at the store's own clock (here a day off): its name
// is that second, its ctime and mtime that moment, and the queue's
// next_continuous that moment plus the interval.
func testContinuousAtTheGivenMoment(t *testing.T, newStore Factory) {
	at := time.Date(2036, 11, 23, 12, 0, 0, 999_000_000, time.UTC)
	s, db := newStore(t, store.Options{Now: func() time.Time { return time.Now().Add(24 * time.Hour) }})
	ctx := ctxT(t)
	q := newQueue(t, s, "cont", schema.SortFIFO)
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, Continuous: ptr(true), Interval: ptr(time.Minute)}))
	_, ok, err := s.ContinuousCreate(ctx, q.ID, time.Minute, at)
	require.NoError(t, err)
	require.True(t, ok)
	task := rawDoc(t, db, schema.CollTasks, bson.D{{Key: schema.TaskQueue, Value: q.ID}})
	require.Equal(t, strconv.FormatInt(at.Unix(), 10), task.Lookup("name").StringValue())
	require.Equal(t, at, task.Lookup(schema.TaskCTime).Time().UTC())
	require.Equal(t, at, task.Lookup(schema.TaskMTime).Time().UTC())
	got, err := s.QueueGet(ctx, store.QueueGetParams{Ref: q.ID.Hex()})
	require.NoError(t, err)
	require.Equal(t, at.Add(time.Minute), got.Sched.NextContinuous.UTC())
}

// testContinuousCreatedAfterTheCount: a moment given that the server's
// clock has passed since (the leader read it before a task's finish landed
// and the transaction found none unfinished) is not the creation's: the
// task is created at the server's clock, read after the transaction's
// count, so it is not before a finish the count saw, and the queue's
// next_continuous is that moment plus the interval.
func testContinuousCreatedAfterTheCount(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "cont", schema.SortFIFO)
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, Continuous: ptr(true), Interval: ptr(time.Minute)}))
	judged, err := s.ServerNow(ctx)
	require.NoError(t, err)
	// A finish lands between the leader's read and its transaction.
	time.Sleep(50 * time.Millisecond)
	finished, err := s.ServerNow(ctx)
	require.NoError(t, err)
	_, ok, err := s.ContinuousCreate(ctx, q.ID, time.Minute, judged)
	require.NoError(t, err)
	require.True(t, ok)
	after, err := s.ServerNow(ctx)
	require.NoError(t, err)
	task := rawDoc(t, db, schema.CollTasks, bson.D{{Key: schema.TaskQueue, Value: q.ID}})
	ctime := task.Lookup(schema.TaskCTime).Time().UTC()
	require.False(t, ctime.Before(finished.Truncate(time.Millisecond)), "created at %v, before a finish at %v that its count saw", ctime, finished)
	require.False(t, ctime.After(after), "created at %v, after the call returned at %v", ctime, after)
	require.Equal(t, strconv.FormatInt(ctime.Unix(), 10), task.Lookup("name").StringValue())
	got, err := s.QueueGet(ctx, store.QueueGetParams{Ref: q.ID.Hex()})
	require.NoError(t, err)
	require.Equal(t, ctime.Add(time.Minute), got.Sched.NextContinuous.UTC())
}

// testContinuousIntervalShortened: a shortened interval brings the next
// task forward to one new interval from now; a longer one leaves it.
func testContinuousIntervalShortened(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "cont", schema.SortFIFO)
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, Continuous: ptr(true), Interval: ptr(24 * time.Hour)}))
	now, err := s.ServerNow(ctx)
	require.NoError(t, err)
	_, ok, err := s.ContinuousCreate(ctx, q.ID, 24*time.Hour, now)
	require.NoError(t, err)
	require.True(t, ok)
	next := func() time.Time {
		t.Helper()
		got, err := s.QueueGet(ctx, store.QueueGetParams{Ref: q.ID.Hex()})
		require.NoError(t, err)
		return got.Sched.NextContinuous
	}
	require.WithinDuration(t, now.Add(24*time.Hour), next(), time.Second)
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, Interval: ptr(time.Minute)}))
	require.WithinDuration(t, now.Add(time.Minute), next(), 30*time.Second, "a day away no more")
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, Interval: ptr(time.Hour)}))
	require.WithinDuration(t, now.Add(time.Minute), next(), 30*time.Second, "a longer interval counts from the next creation")
}
