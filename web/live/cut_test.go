package live

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// These tests drive the hub's fan-out with made-up batches, for the
// hand-overs a real replica set rarely produces on demand: a replay ahead
// of the hub, a cut inside a transaction, a ring that forgot.

func token(t, i uint32, n int) bson.Raw {
	kind := "2929" // a high-water mark
	if n >= 0 {
		kind = fmt.Sprintf("2C0100%04X", n) // an event (made up, but unique)
	}
	raw, _ := bson.Marshal(bson.D{{Key: "_data", Value: fmt.Sprintf("82%08X%08X2B02%s6E04", t, i, kind)}})
	return raw
}

// fakeEvent is task n's insert at cluster time (t, i).
func fakeEvent(t, i uint32, n int) store.ChangeEvent {
	id := bson.NewObjectID()
	doc, _ := bson.Marshal(bson.D{{Key: "_id", Value: id}, {Key: schema.TaskQueue, Value: bson.NewObjectID()}, {Key: schema.TaskStatus, Value: int32(-2)}})
	return store.ChangeEvent{Op: "insert", Coll: schema.CollTasks, ID: bson.RawValue{Type: bson.TypeObjectID, Value: id[:]},
		ClusterTime: bson.Timestamp{T: t, I: i}, Doc: doc, Token: token(t, i, n)}
}

func batch(evs ...store.ChangeEvent) store.StreamBatch {
	return store.StreamBatch{Events: evs, Token: evs[len(evs)-1].Token}
}

func testHub(t *testing.T, history int) *Hub {
	h := New(Options{Store: nilStore{}})
	h.running, h.runCtx = true, t.Context()
	h.all, h.attached = map[*sub]struct{}{}, map[*sub]struct{}{}
	h.ring = newRing(history)
	return h
}

type nilStore struct{ Store }

// replaying is a subscriber on a (pretend) replay.
func replaying(h *Hub) *sub {
	s := newSub(request{filter: filter{kinds: kindsAll}}, 100, "test")
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.private = true
	h.all[s] = struct{}{}
	return s
}

func taken(s *sub) []string {
	var ids []string
	for _, it := range s.take() {
		ids = append(ids, it.id)
	}
	return ids
}

func TestHandOverAheadOfTheHubInsideATransaction(t *testing.T) {
	h := testHub(t, 100)
	a, b := fakeEvent(10, 1, 0), fakeEvent(10, 2, 1)
	tx := []store.ChangeEvent{fakeEvent(11, 1, 2), fakeEvent(11, 1, 3), fakeEvent(11, 1, 4)}
	d := fakeEvent(12, 1, 5)
	h.publish(batch(a, b))

	// The replay has the transaction's first two events; the hub is
	// still before it.
	s := replaying(h)
	require.True(t, h.handover(s, &cut{t: bson.Timestamp{T: 11, I: 1}, k: 2}))
	require.Empty(t, taken(s), "nothing the hub published is after the cut")
	require.NotNil(t, s.cut)
	require.Empty(t, s.pos, "the hub's position is behind the client's")

	// The hub publishes the transaction in two batches, then d.
	h.publish(batch(tx[0], tx[1]))
	require.Empty(t, taken(s))
	h.publish(store.StreamBatch{Events: []store.ChangeEvent{tx[2], d}, Token: token(12, 5, -1)})
	require.Equal(t, []string{encodeID(tx[2].Token), encodeID(d.Token)}, taken(s))
	require.Nil(t, s.cut, "the hub passed the cut")
	require.Equal(t, encodeID(token(12, 5, -1)), s.pos)
	require.Equal(t, int64(1), h.handovers.Load())
}

func TestHandOverBehindTheHubFromItsRing(t *testing.T) {
	h := testHub(t, 100)
	tx := []store.ChangeEvent{fakeEvent(11, 1, 0), fakeEvent(11, 1, 1), fakeEvent(11, 1, 2)}
	d := fakeEvent(12, 1, 3)
	h.publish(batch(fakeEvent(10, 1, 9)))
	h.publish(batch(tx[0]))
	h.publish(batch(tx[1], tx[2], d))

	s := replaying(h)
	require.True(t, h.handover(s, &cut{t: bson.Timestamp{T: 11, I: 1}, k: 1}))
	require.Equal(t, []string{encodeID(tx[1].Token), encodeID(tx[2].Token), encodeID(d.Token)}, taken(s))
	require.Nil(t, s.cut)
	require.Equal(t, h.pos, s.pos)

	// A high-water mark cut: everything from its time on.
	s2 := replaying(h)
	require.True(t, h.handover(s2, &cut{t: bson.Timestamp{T: 11, I: 5}}))
	require.Equal(t, []string{encodeID(d.Token)}, taken(s2))
}

func TestNoHandOverBeforeWhatTheRingHolds(t *testing.T) {
	h := testHub(t, 4)
	s := replaying(h)
	require.False(t, h.handover(s, &cut{t: bson.Timestamp{T: 1, I: 1}}), "the hub has published nothing yet")
	h.publish(batch(fakeEvent(10, 1, 0), fakeEvent(10, 1, 1)))
	require.True(t, h.ring.floor.Equal(bson.Timestamp{T: 10, I: 1}))
	require.False(t, h.handover(s, &cut{t: bson.Timestamp{T: 9, I: 1}}), "before the hub's start")
	for n := 2; n < 6; n++ {
		h.publish(batch(fakeEvent(10, uint32(n), n)))
	}
	require.True(t, h.ring.floor.After(bson.Timestamp{T: 10, I: 1}), "the ring forgot: %v", h.ring.floor)
	require.False(t, h.handover(s, &cut{t: bson.Timestamp{T: 10, I: 1}, k: 2}))
	require.True(t, h.handover(s, &cut{t: bson.Timestamp{T: 10, I: 5}, k: 1}))
	require.Empty(t, taken(s))
}

func TestLostHubPositionResets(t *testing.T) {
	h := testHub(t, 100)
	s := replaying(h)
	h.publish(batch(fakeEvent(10, 1, 0)))
	require.True(t, h.handover(s, &cut{t: bson.Timestamp{T: 10, I: 1}, k: 1}))
	h.publish(store.StreamBatch{Lost: "history lost", Token: token(20, 1, -1)})
	items := s.take()
	require.Len(t, items, 1)
	require.Equal(t, kindControl, items[0].kind)
	require.Contains(t, string(items[0].frame), "event: reset\n")
	require.True(t, h.ring.floor.Equal(bson.Timestamp{T: 20, I: 1}))
}
