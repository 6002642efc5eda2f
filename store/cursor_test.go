package store_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// A recount whose context ends while its reads span several replies (a
// node stopping, a projector's term ending) closes their cursors all the
// same: left open, each would stay on the server for ten minutes.
func TestARecountCancelledBetweenRepliesLeavesNoCursor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		queues, statuses int
	}{
		{"the queues' listing", 150, 1}, // 150 queues: the listing takes two replies
		{"the tasks' counts", 60, 2},    // 60 queues, 120 groups: the counts take two
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := mongotest.Database(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var armed atomic.Bool
			cli, err := mongo.Connect(options.Client().ApplyURI(mongotest.URI(t)).SetMonitor(&event.CommandMonitor{
				Started: func(_ context.Context, e *event.CommandStartedEvent) {
					if e.CommandName == "getMore" && armed.Load() {
						cancel() // the recount's context ends as it asks for its second reply
					}
				},
			}))
			require.NoError(t, err)
			t.Cleanup(func() { _ = cli.Disconnect(context.Background()) })
			s := store.New(cli.Database(db.Name()), store.Options{})
			require.NoError(t, s.IndexesEnsure(context.Background()))
			var queues, tasks []any
			for i := range tc.queues {
				id := bson.NewObjectID()
				queues = append(queues, bson.D{{Key: "_id", Value: id}, {Key: "name", Value: id.Hex()}})
				for st := range tc.statuses {
					tasks = append(tasks, bson.D{{Key: schema.TaskQueue, Value: id}, {Key: schema.TaskStatus, Value: int32(st - 2)}, {Key: "i", Value: i}})
				}
			}
			_, err = db.Collection(schema.CollQueues).InsertMany(context.Background(), queues)
			require.NoError(t, err)
			_, err = db.Collection(schema.CollTasks).InsertMany(context.Background(), tasks)
			require.NoError(t, err)

			armed.Store(true)
			_, err = s.QueueRecount(ctx, store.QueueRecountParams{})
			require.True(t, errors.Is(err, context.Canceled), "the recount did not end with its context: %v", err)
			require.Eventually(t, func() bool { return len(openCursors(t, db)) == 0 }, 5*time.Second, 50*time.Millisecond,
				"a cursor of the recount is left open: %v", openCursors(t, db))
		})
	}
}

// openCursors lists the idle cursors the server keeps on db's collections.
func openCursors(t *testing.T, db *mongo.Database) []bson.Raw {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cur, err := db.Client().Database("admin").Aggregate(ctx, mongo.Pipeline{
		{{Key: "$currentOp", Value: bson.D{{Key: "idleCursors", Value: true}, {Key: "allUsers", Value: true}}}},
		{{Key: "$match", Value: bson.D{{Key: "type", Value: "idleCursor"}, {Key: "ns", Value: bson.D{{Key: "$regex", Value: "^" + db.Name() + `\.`}}}}}},
	})
	require.NoError(t, err)
	var out []bson.Raw
	require.NoError(t, cur.All(ctx, &out))
	return out
}
