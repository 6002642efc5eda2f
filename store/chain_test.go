package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// TestThenCreateKeepsItsMarkOnAFailedRead: a read of the then queue that
// fails (a step-down's HostUnreachable, the driver's one retry failing
// too) is an error, not a problem: the mark stays and the next try makes
// the task (it removed the mark, the output never became a task). A
// private replica set with test commands fails the reads on cue.
func TestThenCreateKeepsItsMarkOnAFailedRead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := failpoints(t, ctx, "thenfp")
	admin, db := client.Database("admin"), client.Database("thenfp")
	s := store.New(db, store.Options{})
	var err error
	var src, dst schema.Queue
	for _, q := range []*schema.Queue{&src, &dst} {
		name := map[*schema.Queue]string{&src: "src", &dst: "dst"}[q]
		*q, err = s.QueueCreate(ctx, store.QueueCreateParams{Name: name, Constructor: "Disbatch::Plugin::Demo"})
		require.NoError(t, err)
	}
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: src.ID, Then: ptrTo("dst")}))
	ids, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: src.ID, Parameters: []bson.Raw{{5, 0, 0, 0, 0}}})
	require.NoError(t, err)
	_, err = s.TaskClaim(ctx, store.TaskClaimParams{Queue: src.ID, Node: "n1"})
	require.NoError(t, err)
	require.NoError(t, s.TaskStart(ctx, store.TaskTransitionParams{ID: ids[0], Node: "n1"}))
	out, err := bson.Marshal(bson.D{{Key: "v", Value: bson.D{{Key: "n", Value: 1}}}})
	require.NoError(t, err)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: ids[0], Node: "n1", Status: schema.StatusSucceeded,
		Output: bson.Raw(out).Lookup("v"), Then: "dst"}))

	// The task's read passes; the queue's, and its retry, fail.
	require.NoError(t, admin.RunCommand(ctx, bson.D{
		{Key: "configureFailPoint", Value: "failCommand"},
		{Key: "mode", Value: bson.D{{Key: "skip", Value: 1}}},
		{Key: "data", Value: bson.D{{Key: "failCommands", Value: bson.A{"find"}}, {Key: "errorCode", Value: 6}}},
	}).Err())
	_, err = s.ThenCreate(context.Background(), ids[0])
	require.NoError(t, admin.RunCommand(ctx, bson.D{{Key: "configureFailPoint", Value: "failCommand"}, {Key: "mode", Value: "off"}}).Err())
	require.ErrorContains(t, err, "HostUnreachable")
	raw, err := db.Collection(schema.CollTasks).FindOne(ctx, bson.D{{Key: "_id", Value: ids[0]}}).Raw()
	require.NoError(t, err)
	require.Equal(t, "dst", raw.Lookup(schema.TaskThenPending).StringValue(), "the mark stays")
	require.Equal(t, bson.Type(0), raw.Lookup("then_error").Type)

	r, err := s.ThenCreate(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, store.ThenResult{Created: 1}, r)
}

func ptrTo[T any](v T) *T { return &v }
