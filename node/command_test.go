package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// TestShellTaskRecordsResultAndMixedout: a shell task's document ends with
// the exit code (-9 when killed) and its output interleaved, beside stdout
// and stderr.
func TestShellTaskRecordsResultAndMixedout(t *testing.T) {
	b := setup(t)
	q := b.shellQueue("commands", 3, nil)
	b.start(b.config("n1"))
	ids := b.insert(q, nil,
		bson.D{{Key: "command", Value: "echo a; sleep 0.3; echo b >&2; sleep 0.3; echo c; exit 3"}},
		bson.D{{Key: "command", Value: "echo ok"}},
	)
	killed := b.insert(q, &store.TaskInsertControl{Timeout: time.Second}, bson.D{{Key: "command", Value: "echo started; exec sleep 30"}})[0]

	b.waitStatus(ids[0], schema.StatusFailed, 20*time.Second)
	d := b.task(ids[0])
	require.Equal(t, int32(3), d.Lookup(schema.TaskResult).Int32(), "%s", d)
	require.Equal(t, "a\nb\nc\n", d.Lookup(schema.TaskMixedout).StringValue())
	require.Equal(t, "a\nc\n", d.Lookup(schema.TaskStdout).StringValue())
	require.Equal(t, "b\nexit status 3\n", d.Lookup(schema.TaskStderr).StringValue())

	b.waitStatus(ids[1], schema.StatusSucceeded, 20*time.Second)
	d = b.task(ids[1])
	require.Equal(t, int32(0), d.Lookup(schema.TaskResult).Int32(), "%s", d)
	require.Equal(t, "ok\n", d.Lookup(schema.TaskMixedout).StringValue())
	require.Equal(t, "ok\n", d.Lookup(schema.TaskStdout).StringValue())

	b.waitStatus(killed, schema.StatusFailed, 20*time.Second)
	d = b.task(killed)
	require.Equal(t, int32(-9), d.Lookup(schema.TaskResult).Int32(), "killed by SIGKILL: %s", d)
	require.Equal(t, "started\n", d.Lookup(schema.TaskMixedout).StringValue())
	require.Equal(t, schema.ReasonTimeout, b.control(killed).Reason)
}
