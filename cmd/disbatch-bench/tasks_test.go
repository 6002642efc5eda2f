package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// TestPaddedTasksCarryBytesOfTheirOwn: --scale-task-bytes gives each task
// parameters of that many random bytes, different from task to task (a
// repeated pad would compress to nothing on disk).
func TestPaddedTasksCarryBytesOfTheirOwn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	q, err := newQueue(ctx, s, "padded", 1)
	require.NoError(t, err)
	require.NoError(t, insertPadded(ctx, slog.New(slog.DiscardHandler), s, q.ID, 3, 2000))

	cur, err := db.Collection(schema.CollTasks).Find(ctx, bson.D{{Key: schema.TaskQueue, Value: q.ID}})
	require.NoError(t, err)
	var docs []bson.Raw
	require.NoError(t, cur.All(ctx, &docs))
	require.Len(t, docs, 3)
	seen := map[string]bool{}
	for _, d := range docs {
		_, pad, ok := d.Lookup(schema.TaskParameters, "pad").BinaryOK()
		require.True(t, ok, "parameters.pad is binary: %s", d)
		require.Len(t, pad, 2000)
		seen[string(pad)] = true
		require.Equal(t, int32(schema.StatusQueued), d.Lookup(schema.TaskStatus).Int32())
	}
	require.Len(t, seen, 3, "each task's pad its own")
}
