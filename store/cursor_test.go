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

// A read whose context ends while it spans several replies (a node
// stopping, a projector's term ending, an HTTP client gone) closes its
// cursors all the same: left open, each would stay on the server for ten
// minutes, and the driver, believing a cut-off cursor gone, does not kill
// it.
func TestAReadCancelledBetweenRepliesLeavesNoCursor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		queues, statuses int
		read             func(ctx context.Context, s *store.Store, queue bson.ObjectID) error
	}{
		// 150 queues: the recount's listing of them takes two replies.
		{"the recount's queues", 150, 1, recount},
		// 60 queues, 120 (queue, status) groups: the recount's counts take two.
		{"the recount's counts", 60, 2, recount},
		{"the queue list", 150, 1, func(ctx context.Context, s *store.Store, _ bson.ObjectID) error {
			_, err := s.QueueList(ctx)
			return err
		}},
		// 2 queues of 150 tasks: one queue's list takes two replies.
		{"a task list", 2, 150, func(ctx context.Context, s *store.Store, q bson.ObjectID) error {
			_, err := s.TaskList(ctx, store.TaskListParams{Queue: q})
			return err
		}},
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
						cancel() // the read's context ends as it asks for its second reply
					}
				},
			}))
			require.NoError(t, err)
			t.Cleanup(func() { _ = cli.Disconnect(context.Background()) })
			s := store.New(cli.Database(db.Name()), store.Options{})
			require.NoError(t, s.IndexesEnsure(context.Background()))
			var queues, tasks []any
			var first bson.ObjectID
			for i := range tc.queues {
				id := bson.NewObjectID()
				if i == 0 {
					first = id
				}
				queues = append(queues, bson.D{{Key: "_id", Value: id}, {Key: "name", Value: id.Hex()}, {Key: "plugin", Value: "Disbatch::Plugin::Demo"}})
				for st := range tc.statuses {
					tasks = append(tasks, bson.D{{Key: schema.TaskQueue, Value: id}, {Key: schema.TaskStatus, Value: int32(st%2 - 2)}, {Key: "i", Value: i}})
				}
			}
			_, err = db.Collection(schema.CollQueues).InsertMany(context.Background(), queues)
			require.NoError(t, err)
			_, err = db.Collection(schema.CollTasks).InsertMany(context.Background(), tasks)
			require.NoError(t, err)

			armed.Store(true)
			err = tc.read(ctx, s, first)
			require.True(t, errors.Is(err, context.Canceled), "the read did not end with its context: %v", err)
			require.Eventually(t, func() bool { return len(openCursors(t, db)) == 0 }, 5*time.Second, 50*time.Millisecond,
				"a cursor of the read is left open: %v", openCursors(t, db))
		})
	}
}

func recount(ctx context.Context, s *store.Store, _ bson.ObjectID) error {
	_, err := s.QueueRecount(ctx, store.QueueRecountParams{})
	return err
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
