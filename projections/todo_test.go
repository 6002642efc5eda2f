package projections

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/mongotest"
)

func TestTokenTimeIsTheEventsClusterTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	cs, err := db.Watch(ctx, mongo.Pipeline{})
	require.NoError(t, err)
	defer cs.Close(ctx)
	_, err = db.Collection("x").InsertOne(ctx, bson.D{{Key: "a", Value: 1}})
	require.NoError(t, err)
	require.True(t, cs.Next(ctx))
	// The event's own token (ResumeToken() may already be the batch's
	// post-batch token, whose time is at or after the event).
	tt, ok := tokenTime(cs.Current.Lookup("_id").Document())
	require.True(t, ok)
	ct, ci, ok := cs.Current.Lookup("clusterTime").TimestampOK()
	require.True(t, ok)
	require.Equal(t, bson.Timestamp{T: ct, I: ci}, tt)

	_, ok = tokenTime(bson.Raw{5, 0, 0, 0, 0})
	require.False(t, ok, "no _data")
}

func TestIsTodoFollowsMongoDBComparison(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	values := bson.A{nil, int32(-2), int32(0), int32(1), int64(-6), int64(7), -0.5, 0.5, "weird", true, bson.D{}, bson.A{1}}
	var docs []any
	for i, v := range values {
		docs = append(docs, bson.D{{Key: "i", Value: i}, {Key: "status", Value: v}})
	}
	docs = append(docs, bson.D{{Key: "i", Value: len(values)}}) // missing
	_, err := db.Collection("t").InsertMany(ctx, docs)
	require.NoError(t, err)
	cur, err := db.Collection("t").Aggregate(ctx, mongo.Pipeline{{{Key: "$project", Value: bson.D{
		{Key: "status", Value: 1}, {Key: "todo", Value: bson.D{{Key: "$lte", Value: bson.A{"$status", 0}}}}}}}})
	require.NoError(t, err)
	var rows []bson.Raw
	require.NoError(t, cur.All(ctx, &rows))
	require.Len(t, rows, len(docs))
	for _, r := range rows {
		require.Equal(t, r.Lookup("todo").Boolean(), isTodo(r.Lookup("status")), "status %v", r.Lookup("status"))
	}
}
