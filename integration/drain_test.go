package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
)

// TestDrainLetsRunningTasksFinishThenExits drives `disbatch node drain`
// against a real disbatchd: the node stops claiming, its running tasks
// finish (not killed, not handed back), it exits 0, and its document says
// draining, then stopped.
func TestDrainLetsRunningTasksFinishThenExits(t *testing.T) {
	t.Parallel()
	uri, db := mongotest.URI(t), mongotest.Database(t)
	dir := t.TempDir()
	cli(t, uri, db.Name(), "", "queue", "create", "q", "--constructor", "shell", "--maxthreads", "2", "--sort", "fifo")
	// Each task waits for its own go-file, so the test decides when it ends.
	var items []any
	for range 4 {
		items = append(items, map[string]string{"command": fmt.Sprintf(`while [ ! -e %s/$DISBATCH_TASK_ID.go ]; do sleep 0.02; done; echo done`, dir)})
	}
	cli(t, uri, db.Name(), jsonLines(t, items...), "task", "submit", "q")
	n := startNode(t, nodeArgs(uri, db.Name(), "drainee", "--enable-plugin", "shell", "--heartbeat", "100ms", "--fence-after", "5s", "--dead-after", "10s")) // a fence would end its tasks: not under test
	running := waitTasks(t, db, startWait, "two tasks running", func(ts []task) bool { return countStatus(ts, func(x task) bool { return x.Status == 0 }) == 2 })

	out := cli(t, uri, db.Name(), "", "node", "drain", "drainee")
	require.Contains(t, out, "asked node drainee to drain")
	n.waitLog("drain requested", 5*time.Second)
	// Each read has its own deadline: one for them all ran out on a
	// loaded machine before the last, after the waits between them.
	state := func() string {
		var doc struct {
			State string `bson:"state"`
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, db.Collection("nodes").FindOne(ctx, bson.D{{Key: "node", Value: "drainee"}}).Decode(&doc))
		return doc.State
	}
	require.Eventually(t, func() bool { return state() == "draining" }, 5*time.Second, 50*time.Millisecond)
	require.Contains(t, cli(t, uri, db.Name(), "", "node", "list"), "draining")
	time.Sleep(300 * time.Millisecond)
	require.False(t, n.exited(), "still running its tasks")

	for _, x := range running {
		if x.Status == 0 {
			require.NoError(t, os.WriteFile(filepath.Join(dir, x.ID.Hex()+".go"), nil, 0o644))
		}
	}
	require.Zero(t, n.wait(15*time.Second), "a drained node exits 0")
	require.Contains(t, n.log.String(), "drained on request: exiting")
	ts := tasks(t, db)
	require.Equal(t, 2, countStatus(ts, func(x task) bool { return x.Status == 1 && x.stdout() == "done\n" }), "the running tasks finished normally")
	require.Equal(t, 2, countStatus(ts, func(x task) bool { return x.Status == -2 }), "nothing else was claimed")
	require.Equal(t, "stopped", state())
}
