package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/store"
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
	tt, ok := store.TokenTime(cs.Current.Lookup("_id").Document())
	require.True(t, ok)
	ct, ci, ok := cs.Current.Lookup("clusterTime").TimestampOK()
	require.True(t, ok)
	require.Equal(t, bson.Timestamp{T: ct, I: ci}, tt)

	_, ok = store.TokenTime(bson.Raw{5, 0, 0, 0, 0})
	require.False(t, ok, "no _data")
}
