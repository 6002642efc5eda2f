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

// These hold the classifiers that the projector folds events with, and
// the store's recount counts with, to the server's own answer.

// agreesWithServer stores a task status of each of values (and one task
// without a status), asks the server for expr of each, requires classify
// to say the same, and returns how many it said yes to.
func agreesWithServer(t *testing.T, values bson.A, expr bson.D, classify func(bson.RawValue) bool) int {
	t.Helper()
	ctx := context.Background()
	db := mongotest.Database(t)
	var docs []any
	for i, v := range values {
		docs = append(docs, bson.D{{Key: "i", Value: i}, {Key: "status", Value: v}})
	}
	docs = append(docs, bson.D{{Key: "i", Value: len(values)}}) // missing
	_, err := db.Collection("t").InsertMany(ctx, docs)
	require.NoError(t, err)
	cur, err := db.Collection("t").Aggregate(ctx, mongo.Pipeline{{{Key: "$project", Value: bson.D{{Key: "status", Value: 1}, {Key: "server", Value: expr}}}}})
	require.NoError(t, err)
	var rows []bson.Raw
	require.NoError(t, cur.All(ctx, &rows))
	require.Len(t, rows, len(docs))
	yes := 0
	for _, r := range rows {
		require.Equal(t, r.Lookup("server").Boolean(), classify(r.Lookup("status")), "status %v", r.Lookup("status"))
		if classify(r.Lookup("status")) {
			yes++
		}
	}
	return yes
}

func dec(t *testing.T, s string) bson.Decimal128 {
	t.Helper()
	d, err := bson.ParseDecimal128(s)
	require.NoError(t, err)
	return d
}

func TestTodoValueFollowsMongoDBComparison(t *testing.T) {
	t.Parallel()
	values := bson.A{nil, int32(-2), int32(0), int32(1), int64(-6), int64(7), -0.5, 0.5, "weird", true, bson.D{}, bson.A{1},
		math.NaN(), math.Inf(-1), math.Inf(1), dec(t, "NaN"), bson.MinKey{}, bson.MaxKey{}, bson.Undefined{}, time.Unix(0, 0), bson.NewObjectID()}
	todo := agreesWithServer(t, values, bson.D{{Key: "$lte", Value: bson.A{"$status", 0}}}, TodoValue)
	require.Equal(t, 11, todo, "missing, null, undefined, MinKey, NaN (double and decimal), -Inf and the numbers <= 0")
}

func TestRunningValueFollowsMongoDBComparison(t *testing.T) {
	t.Parallel()
	values := bson.A{nil, int32(-2), int32(-1), int32(0), int32(1), int64(-1), int64(0), -1.0, 0.0, -0.5, -0.0,
		dec(t, "-1"), dec(t, "0"), dec(t, "-1.00"), dec(t, "-0.5"), "0", "-1", false, true, bson.D{}, bson.A{0}, bson.A{-1}}
	// The store's recount asked the server this until stop 56.
	running := agreesWithServer(t, values, bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: "$eq", Value: bson.A{"$status", int32(-1)}}},
		bson.D{{Key: "$eq", Value: bson.A{"$status", int32(0)}}},
	}}}, RunningValue)
	require.Equal(t, 10, running, "-1 and 0 of every numeric type")
}

func TestFailedValueFollowsMongoDBComparison(t *testing.T) {
	t.Parallel()
	values := bson.A{nil, int32(-2), int32(0), int32(1), int32(2), int32(3), int64(2), 2.0, 1.5, 2.5, -2.0,
		dec(t, "2"), dec(t, "2.00"), dec(t, "2.5"), dec(t, "-2"), "2", true, bson.D{}, bson.A{2}}
	failed := agreesWithServer(t, values, bson.D{{Key: "$eq", Value: bson.A{"$status", int32(2)}}}, FailedValue)
	require.Equal(t, 5, failed, "2 of every numeric type")
}
