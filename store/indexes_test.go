package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/internal/mongod"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// TestIndexesEnsureRetriesInterruptedBuilds: a node must not fail to start
// because MongoDB interrupted an index build (CI saw "(Interrupted)
// operation was interrupted" from createIndexes on a loaded server). A
// private replica set with test commands makes createIndexes fail on cue.
func TestIndexesEnsureRetriesInterruptedBuilds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := failpoints(t, ctx, "failpoints")
	admin := client.Database("admin")
	failCreateIndexes := func(code int32, times any) {
		t.Helper()
		require.NoError(t, admin.RunCommand(ctx, bson.D{
			{Key: "configureFailPoint", Value: "failCommand"},
			{Key: "mode", Value: times},
			{Key: "data", Value: bson.D{{Key: "failCommands", Value: bson.A{"createIndexes"}}, {Key: "errorCode", Value: code}}},
		}).Err())
	}
	off := func() {
		require.NoError(t, admin.RunCommand(ctx, bson.D{{Key: "configureFailPoint", Value: "failCommand"}, {Key: "mode", Value: "off"}}).Err())
	}

	t.Run("interrupted twice, then built", func(t *testing.T) {
		db := client.Database("twice")
		failCreateIndexes(11601, bson.D{{Key: "times", Value: 2}})
		defer off()
		require.NoError(t, store.New(db, store.Options{}).IndexesEnsure(ctx, schema.CollQueues))
		cur, err := db.Collection(schema.CollQueues).Indexes().List(ctx)
		require.NoError(t, err)
		var ixs []bson.M
		require.NoError(t, cur.All(ctx, &ixs))
		require.Len(t, ixs, 2, "_id and name: %v", ixs)
	})
	t.Run("interrupted every time: the error, after a bounded number of tries", func(t *testing.T) {
		failCreateIndexes(11602, "alwaysOn")
		defer off()
		err := store.New(client.Database("always"), store.Options{}).IndexesEnsure(ctx, schema.CollQueues)
		require.ErrorContains(t, err, "create indexes on queues")
		require.ErrorContains(t, err, "InterruptedDueToReplStateChange")
	})
	t.Run("another error is not retried", func(t *testing.T) {
		failCreateIndexes(13, bson.D{{Key: "times", Value: 1}}) // Unauthorized
		defer off()
		err := store.New(client.Database("other"), store.Options{}).IndexesEnsure(ctx, schema.CollQueues)
		require.ErrorContains(t, err, "Unauthorized")
	})
}

// failpoints starts a private replica set with test commands (so that
// MongoDB's failCommand fail point fails commands on cue) and connects to
// it; both end with the test.
func failpoints(t *testing.T, ctx context.Context, replSet string) *mongo.Client {
	t.Helper()
	rs, err := mongod.StartReplicaSet(ctx, mongod.Options{ReplSet: replSet, ExtraArgs: []string{"--setParameter", "enableTestCommands=1"}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rs.Stop()) })
	client, err := mongo.Connect(options.Client().ApplyURI(rs.URI()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	return client
}
