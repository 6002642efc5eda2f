package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/store"
)

func testLeaseAcquireRenewRelease(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	a, err := s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "l", Owner: "a", TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, store.Lease{Name: "l", Owner: "a", Epoch: 1, Expires: a.Expires}, a)
	again, err := s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "l", Owner: "a", TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, int64(1), again.Epoch, "the owner's own lease keeps its epoch")
	_, err = s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "l", Owner: "b", TTL: time.Minute})
	require.ErrorIs(t, err, store.ErrLeaseHeld)

	refA := store.LeaseRef{Name: "l", Owner: "a", Epoch: 1}
	require.NoError(t, s.LeaseRenew(ctx, refA, time.Minute))
	require.ErrorIs(t, s.LeaseRenew(ctx, store.LeaseRef{Name: "l", Owner: "a", Epoch: 2}, time.Minute), store.ErrLeaseLost, "another epoch")
	require.ErrorIs(t, s.LeaseRenew(ctx, store.LeaseRef{Name: "l", Owner: "b", Epoch: 1}, time.Minute), store.ErrLeaseLost, "another owner")

	// Release lets another owner take it at once, at the next epoch.
	require.NoError(t, s.LeaseRelease(ctx, refA))
	b, err := s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "l", Owner: "b", TTL: time.Minute})
	require.NoError(t, err)
	require.Equal(t, int64(2), b.Epoch)
	require.ErrorIs(t, s.LeaseRenew(ctx, refA, time.Minute), store.ErrLeaseLost, "the old owner's renewal fails")

	// Expiry is by the server's clock.
	_, err = s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "short", Owner: "a", TTL: 300 * time.Millisecond})
	require.NoError(t, err)
	_, err = s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "short", Owner: "b", TTL: time.Minute})
	require.ErrorIs(t, err, store.ErrLeaseHeld)
	require.Eventually(t, func() bool {
		l, err := s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "short", Owner: "b", TTL: time.Minute})
		return err == nil && l.Epoch == 2
	}, 10*time.Second, 50*time.Millisecond)
}

func testLeaseSession(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	l, err := s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "l", Owner: "a", TTL: time.Minute})
	require.NoError(t, err)
	ref := store.LeaseRef{Name: "l", Owner: "a", Epoch: l.Epoch}
	sess, err := s.LeaseSessionStart(ctx, ref)
	require.NoError(t, err)
	defer sess.End(context.Background())
	got, err := s.LeaseGet(ctx, "l")
	require.NoError(t, err)
	require.NotEmpty(t, got.Session, "the session's id is in the lease")

	_, err = s.LeaseSessionStart(ctx, store.LeaseRef{Name: "l", Owner: "a", Epoch: l.Epoch + 1})
	require.ErrorIs(t, err, store.ErrLeaseLost, "only the holder records its session")

	// Transactions run in it, one after another.
	q := newQueue(t, s, "q", "")
	for i := range int64(3) {
		require.NoError(t, s.CountersSet(ctx, store.CountersSetParams{Lease: ref, Session: sess, Sets: map[bson.ObjectID]store.QueueCounts{q.ID: {Todo: i + 1, Total: 2 * (i + 1), Running: i + 1, Failed: i + 1}}}))
	}
	counters, err := s.QueueCounters(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), *counters[q.ID].Todo)
	require.Equal(t, int64(6), *counters[q.ID].Total)
	require.Equal(t, int64(3), *counters[q.ID].Running)
	require.Equal(t, int64(3), *counters[q.ID].Failed)

	// At the end of the term its id leaves the lease, and never goes back
	// to the driver, which would hand it to other operations that a
	// successor, having read the lease before, could kill.
	id := got.Session.Lookup("id").String()
	sess.End(ctx)
	got, err = s.LeaseGet(ctx, "l")
	require.NoError(t, err)
	require.Empty(t, got.Session)
	requireIDsNotReused(t, db, id)
}

// abandon opens a transaction that writes the lease document in a session
// of another client, records that session in the lease as its holder
// would, and leaves the transaction open: a holder that died mid-commit.
func abandon(t *testing.T, db *mongo.Database, lease string) (commit func() error) {
	t.Helper()
	ctx := ctxT(t)
	sess, err := db.Client().StartSession()
	require.NoError(t, err)
	t.Cleanup(func() { sess.EndSession(context.Background()) })
	leases := db.Collection(store.CollLeases)
	_, err = leases.UpdateOne(ctx, bson.D{{Key: "_id", Value: lease}}, bson.D{{Key: "$set", Value: bson.D{{Key: "session", Value: sess.ID()}}}})
	require.NoError(t, err)
	require.NoError(t, sess.StartTransaction())
	sctx := mongo.NewSessionContext(ctx, sess)
	_, err = leases.UpdateOne(sctx, bson.D{{Key: "_id", Value: lease}}, bson.D{{Key: "$set", Value: bson.D{{Key: "checkpoint_time", Value: bson.Timestamp{T: 1}}}}})
	require.NoError(t, err)
	return func() error { return sess.CommitTransaction(sctx) }
}

func testLeaseAcquireEndsAnAbandonedTransaction(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)

	// A live holder's transaction is left alone: the lease is not free.
	_, err := s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "live", Owner: "a", TTL: time.Minute})
	require.NoError(t, err)
	commit := abandon(t, db, "live")
	_, err = s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "live", Owner: "b", TTL: time.Minute})
	require.ErrorIs(t, err, store.ErrLeaseHeld)
	require.NoError(t, commit(), "the holder's transaction was not killed")

	// An expired holder's open transaction is ended: the successor gets
	// the lease at once instead of after the server's 60 s.
	_, err = s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "dead", Owner: "a", TTL: 500 * time.Millisecond})
	require.NoError(t, err)
	commit = abandon(t, db, "dead")
	time.Sleep(time.Second) // past the expiry
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	l, err := s.LeaseAcquire(actx, store.LeaseAcquireParams{Name: "dead", Owner: "b", TTL: time.Minute})
	require.NoError(t, err)
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, "b", l.Owner)
	require.Error(t, commit(), "the abandoned transaction was aborted")
	require.Empty(t, l.Session, "a session is killed once, then forgotten")

	// So is the owner's own from an earlier term (it restarted).
	_, err = s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "mine", Owner: "a", TTL: time.Minute})
	require.NoError(t, err)
	commit = abandon(t, db, "mine")
	actx2, cancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel2()
	_, err = s.LeaseAcquire(actx2, store.LeaseAcquireParams{Name: "mine", Owner: "a", TTL: time.Minute})
	require.NoError(t, err)
	require.Error(t, commit())
}

func testLeaseAcquireConcurrentOneOwner(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	owners := map[string]int64{}
	for i := range 8 {
		wg.Go(func() {
			name := string(rune('a' + i))
			l, err := s.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "l", Owner: name, TTL: time.Minute})
			if errors.Is(err, store.ErrLeaseHeld) {
				return
			}
			if err != nil {
				t.Errorf("acquire: %v", err)
				return
			}
			mu.Lock()
			owners[name] = l.Epoch
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Len(t, owners, 1, "exactly one of 8 concurrent acquirers holds the lease: %v", owners)
	for _, epoch := range owners {
		require.Equal(t, int64(1), epoch)
	}
}
