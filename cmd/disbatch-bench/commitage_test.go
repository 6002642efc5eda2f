package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
)

func TestCommitAgeIsTheStatusDateLessTheCommitPointsWallTime(t *testing.T) {
	t.Parallel()
	date := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	reply := func(d, wall time.Time) bson.Raw {
		raw, err := bson.Marshal(bson.D{{Key: "set", Value: "rs0"}, {Key: "date", Value: d},
			{Key: "optimes", Value: bson.D{{Key: "lastCommittedWallTime", Value: wall}, {Key: "appliedOpTime", Value: bson.D{}}}}})
		require.NoError(t, err)
		return raw
	}
	age, err := commitAgeFrom(reply(date, date.Add(-37*time.Millisecond)))
	require.NoError(t, err)
	require.Equal(t, 37*time.Millisecond, age)
	age, err = commitAgeFrom(reply(date, date.Add(5*time.Millisecond))) // the clock stepped back
	require.NoError(t, err)
	require.Zero(t, age)

	_, err = commitAgeFrom(bson.Raw(must(bson.Marshal(bson.D{{Key: "date", Value: date}}))))
	require.ErrorContains(t, err, "no optimes.lastCommittedWallTime")
	_, err = commitAgeFrom(bson.Raw(must(bson.Marshal(bson.D{{Key: "optimes", Value: bson.D{{Key: "lastCommittedWallTime", Value: date}}}}))))
	require.ErrorContains(t, err, "no date")
}

func TestCommitAgeCountsOnlyTheDrainsSamples(t *testing.T) {
	t.Parallel()
	at := []int64{100, 200, 300, 400, 500}
	ages := []time.Duration{900 * time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond, 6 * time.Millisecond, 800 * time.Millisecond}
	l := commitAgeWithin(at, ages, 200, 400)
	require.Equal(t, 3, l.N)
	require.InDelta(t, 4, l.P50, 1e-9)
	require.InDelta(t, 6, l.Max, 1e-9)
	require.Equal(t, 2, commitAgeWithin(at, ages, 0, 250).N, "from the start")
	require.Zero(t, commitAgeWithin(at, ages, 0, 0).N, "no drain (no first claim): no samples")
}

// The sampler against a real replica set: while majority writes go on,
// it samples about every commitAgeEvery, the commit point stays young,
// and stopping ends its goroutine.
func TestCommitAgeSamplesARealReplicaSetWhileItIsWritten(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := mongotest.Database(t)
	s := sampleCommitAge(ctx, mongotest.Client(t))
	from := time.Now().UnixNano()
	for end := time.Now().Add(20 * commitAgeEvery); time.Now().Before(end); {
		_, err := db.Collection("w").InsertOne(ctx, bson.D{{Key: "at", Value: time.Now()}})
		require.NoError(t, err)
	}
	to := time.Now().UnixNano()
	l, failed, err := s.stop(from, to)
	require.NoError(t, err)
	require.Zero(t, failed)
	require.GreaterOrEqual(t, l.N, 10, "a sample every %v for %v", commitAgeEvery, time.Duration(to-from))
	require.LessOrEqual(t, l.P50, l.P99)
	require.Less(t, l.Max, 1000.0, "the commit point of a replica set written all along is well under a second old")
	select {
	case <-s.done:
	default:
		t.Fatal("the sampler's goroutine still runs after stop")
	}
	// Stopping twice is harmless (the drains stop on error paths too).
	again, _, err := s.stop(from, to)
	require.NoError(t, err)
	require.Equal(t, l, again)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
