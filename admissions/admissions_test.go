package admissions_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/admissions"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// TestLeadReleasesWhatNoNodeReleased: a capped queue whose claimed tasks
// were finished by someone else (an operator's cancel here) and a queue
// whose cap was lifted get their admissions put right by the leader's
// sweep, at the start of its term and on each tick; a queue never capped
// is not touched.
func TestLeadReleasesWhatNoNodeReleased(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	mk := func(name string) bson.ObjectID {
		q, err := s.QueueCreate(ctx, store.QueueCreateParams{Name: name, Constructor: "C", MaxThreads: ptr(10)})
		require.NoError(t, err)
		_, err = s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{mustRaw(t), mustRaw(t), mustRaw(t)}})
		require.NoError(t, err)
		return q.ID
	}
	capped, lifted, plain := mk("capped"), mk("lifted"), mk("plain")
	for _, q := range []bson.ObjectID{capped, lifted} {
		require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q, MaxRunning: ptr(2)}))
		res, err := s.TaskClaimCapped(ctx, store.TaskClaimCappedParams{Queue: q, Node: "gone", Limit: 3, Max: 2})
		require.NoError(t, err)
		require.Len(t, res.Tasks, 2)
	}
	// The dead node's claims are requeued by recovery, which takes no
	// admissions back; the cap of "lifted" is removed.
	_, err := db.Collection(schema.CollTasks).UpdateMany(ctx, bson.D{{Key: schema.TaskQueue, Value: capped}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -2}, {Key: "node", Value: -1}}}})
	require.NoError(t, err)
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: lifted, MaxRunning: ptr(0)}))

	swept := make(chan bson.ObjectID, 10)
	a := admissions.New(admissions.Config{Store: s, Tick: time.Hour, Swept: func(q bson.ObjectID, _ store.AdmissionsSweepResult) { swept <- q }})
	lead, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Lead(lead, leadership.Term{}) }()
	got := map[bson.ObjectID]bool{<-swept: true, <-swept: true}
	require.Equal(t, map[bson.ObjectID]bool{capped: true, lifted: true}, got, "the capped queue and the one with admissions; not %s", plain.Hex())
	stop()
	require.NoError(t, <-done)
	for _, q := range []bson.ObjectID{capped, lifted} {
		got, err := s.QueueGet(ctx, store.QueueGetParams{Ref: q.Hex()})
		require.NoError(t, err)
		require.Zero(t, got.Sched.Admitted)
	}
	n, err := db.Collection(schema.CollTasks).CountDocuments(ctx, bson.D{{Key: schema.TaskAdmitted, Value: true}})
	require.NoError(t, err)
	require.Zero(t, n)
	lifted2, err := s.QueueGet(ctx, store.QueueGetParams{Ref: lifted.Hex()})
	require.NoError(t, err)
	require.False(t, lifted2.Sched.Capped(), "max_running 0 is no cap")
}

func ptr[T any](v T) *T { return &v }

func mustRaw(t *testing.T) bson.Raw {
	raw, err := bson.Marshal(bson.D{{Key: "x", Value: 1}})
	require.NoError(t, err)
	return raw
}
