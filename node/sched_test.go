package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// TestPausedQueueRunsNothingAndResumesAtOnce: a paused queue's tasks wait;
// resuming it is a queue change the node hears at once (the tick is a
// minute away).
func TestPausedQueueRunsNothingAndResumesAtOnce(t *testing.T) {
	b := setup(t)
	q := b.queue("paused", "test", 2, schema.SortFIFO)
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: q, Paused: ptr(true)}))
	cfg := b.config("n1")
	cfg.Tick = time.Minute
	b.start(cfg)
	require.Eventually(t, func() bool { return strings.Contains(b.logs.String(), "reason=paused") }, 10*time.Second, 10*time.Millisecond,
		"the node says why it does not serve the queue:\n%s", b.logs)
	id := b.tasks(q, 1, nil)[0]
	time.Sleep(300 * time.Millisecond) // a wake-up would have claimed it by now
	require.Equal(t, int64(schema.StatusQueued), b.task(id).Lookup("status").AsInt64(), "a paused queue's task waits")

	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: q, Paused: ptr(false)}))
	b.waitStatus(id, schema.StatusSucceeded, 10*time.Second)
}

// TestPriorityAcrossQueuesOnANode: with the node's slots scarce, a queue of
// higher priority runs all its tasks before a lower one gets any.
func TestPriorityAcrossQueuesOnANode(t *testing.T) {
	b := setup(t)
	lo := b.queue("a-lo", "test", 5, schema.SortFIFO)
	hi := b.queue("b-hi", "test", 5, schema.SortFIFO)
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: hi, Priority: ptr(10.0)}))
	b.rec.sleep = 30 * time.Millisecond
	loIDs := b.tasks(lo, 5, nil)
	hiIDs := b.tasks(hi, 10, nil)
	cfg := b.config("n1")
	cfg.MaxThreads = ptr(2)
	b.start(cfg)
	b.waitDone(bson.D{{Key: "queue", Value: lo}}, 5, 30*time.Second)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	pos := map[bson.ObjectID]int{}
	for i, id := range b.rec.order {
		pos[id] = i
	}
	firstLo := len(b.rec.order)
	for _, l := range loIDs {
		firstLo = min(firstLo, pos[l])
	}
	// The lower priority gets a slot only once the higher one has no task
	// left to claim; its last tasks may still be starting on the other slot
	// (the plugin runs record their start in any order).
	late := 0
	for _, h := range hiIDs {
		if pos[h] > firstLo {
			late++
		}
	}
	require.LessOrEqual(t, late, 1, "tasks of the higher priority started after the lower priority's first (2 slots): %v", b.rec.order)
}
