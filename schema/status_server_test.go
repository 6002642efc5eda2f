package schema

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/mongotest"
)

// These hold the classifiers the projector folds events with, and the
// store's recount counts with, to the server's own answer.

func TestTodoValueFollowsMongoDBComparison(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	nan, err := bson.ParseDecimal128("NaN")
	require.NoError(t, err)
	values := bson.A{nil, int32(-2), int32(0), int32(1), int64(-6), int64(7), -0.5, 0.5, "weird", true, bson.D{}, bson.A{1},
		math.NaN(), math.Inf(-1), math.Inf(1), nan, bson.MinKey{}, bson.MaxKey{}, bson.Undefined{}, time.Unix(0, 0), bson.NewObjectID()}
	var docs []any
	for i, v := range values {
		docs = append(docs, bson.D{{Key: "i", Value: i}, {Key: "status", Value: v}})
	}
	docs = append(docs, bson.D{{Key: "i", Value: len(values)}}) // missing
	_, err = db.Collection("t").InsertMany(ctx, docs)
	require.NoError(t, err)
	cur, err := db.Collection("t").Aggregate(ctx, mongo.Pipeline{{{Key: "$project", Value: bson.D{
		{Key: "status", Value: 1}, {Key: "todo", Value: bson.D{{Key: "$lte", Value: bson.A{"$status", 0}}}}}}}})
	require.NoError(t, err)
	var rows []bson.Raw
	require.NoError(t, cur.All(ctx, &rows))
	require.Len(t, rows, len(docs))
	for _, r := range rows {
		require.Equal(t, r.Lookup("todo").Boolean(), TodoValue(r.Lookup("status")), "status %v", r.Lookup("status"))
	}
}

func TestRunningValueFollowsMongoDBComparison(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	dec := func(s string) bson.Decimal128 {
		d, err := bson.ParseDecimal128(s)
		require.NoError(t, err)
		return d
	}
	values := bson.A{nil, int32(-2), int32(-1), int32(0), int32(1), int64(-1), int64(0), -1.0, 0.0, -0.5, -0.0,
		dec("-1"), dec("0"), dec("-1.00"), dec("-0.5"), "0", "-1", false, true, bson.D{}, bson.A{0}, bson.A{-1}}
	var docs []any
	for i, v := range values {
		docs = append(docs, bson.D{{Key: "i", Value: i}, {Key: "status", Value: v}})
	}
	docs = append(docs, bson.D{{Key: "i", Value: len(values)}}) // missing
	_, err := db.Collection("t").InsertMany(ctx, docs)
	require.NoError(t, err)
	// The expression the store's recount uses.
	cur, err := db.Collection("t").Aggregate(ctx, mongo.Pipeline{{{Key: "$project", Value: bson.D{
		{Key: "status", Value: 1}, {Key: "running", Value: bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: "$eq", Value: bson.A{"$status", int32(-1)}}},
			bson.D{{Key: "$eq", Value: bson.A{"$status", int32(0)}}},
		}}}}}}}})
	require.NoError(t, err)
	var rows []bson.Raw
	require.NoError(t, cur.All(ctx, &rows))
	require.Len(t, rows, len(docs))
	running := 0
	for _, r := range rows {
		require.Equal(t, r.Lookup("running").Boolean(), RunningValue(r.Lookup("status")), "status %v", r.Lookup("status"))
		if RunningValue(r.Lookup("status")) {
			running++
		}
	}
	require.Equal(t, 10, running, "-1 and 0 of every numeric type")
}

func TestFailedValueFollowsMongoDBComparison(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	dec := func(s string) bson.Decimal128 {
		d, err := bson.ParseDecimal128(s)
		require.NoError(t, err)
		return d
	}
	values := bson.A{nil, int32(-2), int32(0), int32(1), int32(2), int32(3), int64(2), 2.0, 1.5, 2.5, -2.0,
		dec("2"), dec("2.00"), dec("2.5"), dec("-2"), "2", true, bson.D{}, bson.A{2}}
	var docs []any
	for i, v := range values {
		docs = append(docs, bson.D{{Key: "i", Value: i}, {Key: "status", Value: v}})
	}
	docs = append(docs, bson.D{{Key: "i", Value: len(values)}}) // missing
	_, err := db.Collection("t").InsertMany(ctx, docs)
	require.NoError(t, err)
	// The expression the store's recount uses.
	cur, err := db.Collection("t").Aggregate(ctx, mongo.Pipeline{{{Key: "$project", Value: bson.D{
		{Key: "status", Value: 1}, {Key: "failed", Value: bson.D{{Key: "$eq", Value: bson.A{"$status", int32(2)}}}}}}}})
	require.NoError(t, err)
	var rows []bson.Raw
	require.NoError(t, cur.All(ctx, &rows))
	require.Len(t, rows, len(docs))
	failed := 0
	for _, r := range rows {
		require.Equal(t, r.Lookup("failed").Boolean(), FailedValue(r.Lookup("status")), "status %v", r.Lookup("status"))
		if FailedValue(r.Lookup("status")) {
			failed++
		}
	}
	require.Equal(t, 5, failed, "2 of every numeric type")
}
