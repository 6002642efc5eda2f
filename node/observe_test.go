package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// TestAnAttemptWaitsFromWhenItCouldRun: the pickup and queue wait of an
// attempt count from when it could run: its ctime, its not_before, the end
// of its last attempt, an operator's requeue, whichever came last (a
// retry's pickup counted from the ctime took in the earlier attempts and
// their backoffs).
func TestAnAttemptWaitsFromWhenItCouldRun(t *testing.T) {
	t.Parallel()
	c := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	task := schema.Task{CTime: c}
	require.Equal(t, c, queuedSince(task), "a first attempt: its ctime")
	task.Control.NotBefore = c.Add(time.Hour)
	require.Equal(t, c.Add(time.Hour), queuedSince(task), "delayed")
	task.Control.Attempts = []schema.Attempt{{Finished: c.Add(2 * time.Hour)}}
	require.Equal(t, c.Add(2*time.Hour), queuedSince(task), "retried at once: from its last attempt's end")
	task.Control.NotBefore = c.Add(3 * time.Hour)
	require.Equal(t, c.Add(3*time.Hour), queuedSince(task), "retried after a backoff")
	raw, err := bson.Marshal(bson.D{{Key: schema.TaskRequeued, Value: bson.D{{Key: schema.KillBy, Value: "op"}, {Key: schema.KillAt, Value: c.Add(24 * time.Hour)}}}})
	require.NoError(t, err)
	task.Raw = raw
	require.True(t, c.Add(24*time.Hour).Equal(queuedSince(task)), "requeued by an operator a day later")
	require.True(t, c.Add(24*time.Hour).Equal(queuedSince(schema.Task{CTime: c, Raw: raw})), "requeued, never run (it was cancelled)")
}
