package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// updateEvent is a task update that set updated.
func updateEvent(t *testing.T, updated bson.D) store.ChangeEvent {
	t.Helper()
	raw, err := bson.Marshal(updated)
	require.NoError(t, err)
	id := bson.NewObjectID()
	return store.ChangeEvent{Op: "update", Coll: schema.CollTasks, ID: bson.RawValue{Type: bson.TypeObjectID, Value: id[:]}, Updated: raw}
}

// TestRideQueuesOnlyTheLeadersEventsAndSaysWhenItDroppedSome: without a
// reader nothing is kept; a reader gets the batches with events the
// leader may keep (ends included), in order, not the others; a reopened
// stream is a Lost in its place; past the ride's limit what was queued is
// replaced by a Lost; after the projector's term ends off is closed.
func TestRideQueuesOnlyTheLeadersEventsAndSaysWhenItDroppedSome(t *testing.T) {
	rd := newRide()
	rd.most = 3
	claim := updateEvent(t, bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusRunning)}})
	end := updateEvent(t, bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusSucceeded)}})
	timer := updateEvent(t, bson.D{{Key: schema.TaskNotBefore, Value: time.Now()}})
	_, ok := rd.join()
	require.False(t, ok, "joined a stream that is not up")
	rd.Board()
	rd.Ride(store.StreamBatch{Events: []store.ChangeEvent{timer}})
	off, ok := rd.join()
	require.True(t, ok)
	require.Empty(t, rd.take(), "kept a batch from before the reader joined")

	rd.Ride(store.StreamBatch{Events: []store.ChangeEvent{claim}})
	rd.Ride(store.StreamBatch{Events: []store.ChangeEvent{claim, end, timer}})
	rd.Board()
	rd.Ride(store.StreamBatch{Events: []store.ChangeEvent{timer}})
	select {
	case <-rd.ready:
	default:
		t.Fatal("a queued batch is not signalled")
	}
	got := rd.take()
	require.Len(t, got, 3, "the claim alone is not the leader's")
	require.Equal(t, []store.ChangeEvent{end, timer}, got[0].Events)
	require.Contains(t, got[1].Lost, "reopened")
	require.Equal(t, []store.ChangeEvent{timer}, got[2].Events)

	rd.Ride(store.StreamBatch{Events: []store.ChangeEvent{end, timer}})
	rd.Ride(store.StreamBatch{Events: []store.ChangeEvent{end, timer}}) // four events: past the limit
	got = rd.take()
	require.Len(t, got, 1)
	require.Contains(t, got[0].Lost, "fell behind")

	rd.Alight()
	select {
	case <-off:
	default:
		t.Fatal("off is not closed when the projector's term ends")
	}
	rd.leave()
	rd.Board()
	rd.Ride(store.StreamBatch{Events: []store.ChangeEvent{timer}})
	require.Empty(t, rd.take(), "kept a batch with no reader")
}
