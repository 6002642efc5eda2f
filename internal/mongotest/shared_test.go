package mongotest

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

func TestSharedDeploymentIsReplicaSet(t *testing.T) {
	begin := time.Now()
	uri := URI(t)
	t.Logf("shared deployment %s ready after %v", uri, time.Since(begin))
	ctx := testContext(t, time.Minute)

	var h struct {
		SetName           string `bson:"setName"`
		IsWritablePrimary bool   `bson:"isWritablePrimary"`
	}
	require.NoError(t, Client(t).Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&h))
	require.Equal(t, "rs0", h.SetName)
	require.True(t, h.IsWritablePrimary)

	// Change streams only exist on replica sets (and sharded clusters).
	coll := Database(t).Collection("events")
	cs, err := coll.Watch(ctx, mongo.Pipeline{})
	require.NoError(t, err)
	defer cs.Close(context.Background())
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "a"}, {Key: "n", Value: 1}})
	require.NoError(t, err)
	require.True(t, cs.Next(ctx), "no change event: %v", cs.Err())
	var ev struct {
		OperationType string `bson:"operationType"`
		FullDocument  struct {
			ID string `bson:"_id"`
			N  int    `bson:"n"`
		} `bson:"fullDocument"`
	}
	require.NoError(t, cs.Decode(&ev))
	require.Equal(t, "insert", ev.OperationType)
	require.Equal(t, "a", ev.FullDocument.ID)
	require.Equal(t, 1, ev.FullDocument.N)
}

func databaseNames(t *testing.T) []string {
	t.Helper()
	// Not t.Context(): this also runs in a Cleanup, when that is canceled.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names, err := Client(t).ListDatabaseNames(ctx, bson.D{})
	require.NoError(t, err)
	return names
}

func TestDatabaseIsolationAndDrop(t *testing.T) {
	ctx := testContext(t, time.Minute)
	var nameA, nameB string

	t.Run("a", func(t *testing.T) {
		dbA := Database(t)
		nameA = dbA.Name()
		_, err := dbA.Collection("c").InsertOne(ctx, bson.D{{Key: "owner", Value: "a"}})
		require.NoError(t, err)

		t.Run("b", func(t *testing.T) {
			// Registered before Database, so it runs after Database's drop.
			t.Cleanup(func() {
				assert.NotContains(t, databaseNames(t), nameB, "database of b not dropped after b")
			})
			dbB := Database(t)
			nameB = dbB.Name()
			require.NotEqual(t, nameA, nameB)

			n, err := dbB.Collection("c").CountDocuments(ctx, bson.D{})
			require.NoError(t, err)
			require.Zero(t, n, "b sees a's data")
			_, err = dbB.Collection("c").InsertOne(ctx, bson.D{{Key: "owner", Value: "b"}})
			require.NoError(t, err)
			require.Contains(t, databaseNames(t), nameB)
		})

		var docs []struct {
			Owner string `bson:"owner"`
		}
		cur, err := dbA.Collection("c").Find(ctx, bson.D{})
		require.NoError(t, err)
		require.NoError(t, cur.All(ctx, &docs))
		require.Len(t, docs, 1, "a sees b's data")
		require.Equal(t, "a", docs[0].Owner)
		require.NotContains(t, databaseNames(t), nameB)
		require.Contains(t, databaseNames(t), nameA)
	})

	require.NotEmpty(t, nameA)
	require.NotEmpty(t, nameB)
	names := databaseNames(t)
	require.False(t, slices.Contains(names, nameA), "database of a not dropped: %v", names)
}

// helperEnv tells a re-executed test binary which helper test should act.
const helperEnv = "DISBATCH_MONGOTEST_HELPER"

func TestURIFailsWithHowToWhenNoMongoDB(t *testing.T) {
	empty := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcessNoMongoDB$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(),
		helperEnv+"=nomongo",
		"MONGODB_URI=",
		"DISBATCH_MONGOD=",
		"XDG_CACHE_HOME="+empty,
		"PATH="+empty,
	)
	out, err := cmd.CombinedOutput()
	t.Logf("helper output:\n%s", out)
	require.Error(t, err, "helper passed without a MongoDB")
	require.Contains(t, string(out), "--- FAIL: TestHelperProcessNoMongoDB")
	require.Contains(t, string(out), "run `make mongod` (or set DISBATCH_MONGOD to a mongod binary, or MONGODB_URI to a replica set)")
	require.NotContains(t, string(out), "SKIP")
}

// TestHelperProcessNoMongoDB is run by TestURIFailsWithHowToWhenNoMongoDB in
// a child process that has no MongoDB; it does nothing otherwise.
func TestHelperProcessNoMongoDB(t *testing.T) {
	if os.Getenv(helperEnv) != "nomongo" {
		return
	}
	tryContainer = false // a Docker engine on this machine must not change the outcome
	URI(t)
	t.Log("URI returned without a MongoDB")
}
