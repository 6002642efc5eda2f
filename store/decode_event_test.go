package store

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// decodeEventByLookups is decodeEvent as it was, a lookup per field: the
// oracle for the one pass.
func decodeEventByLookups(current, token bson.Raw) ChangeEvent {
	raw := slices.Clone(current)
	ev := ChangeEvent{Token: slices.Clone(token)}
	ev.Self = raw.Lookup("_id")
	ev.Op, _ = raw.Lookup("operationType").StringValueOK()
	ev.Coll, _ = raw.Lookup("ns", "coll").StringValueOK()
	ev.ID = raw.Lookup("documentKey", "_id")
	if t, i, ok := raw.Lookup("clusterTime").TimestampOK(); ok {
		ev.ClusterTime = bson.Timestamp{T: t, I: i}
	}
	ev.WallTime, _ = raw.Lookup("wallTime").TimeOK()
	ev.Doc, _ = raw.Lookup("fullDocument").DocumentOK()
	ev.Before, _ = raw.Lookup("fullDocumentBeforeChange").DocumentOK()
	ev.Updated, _ = raw.Lookup("updateDescription", "updatedFields").DocumentOK()
	if ev.Op == "update" {
		if before := beforeFromPrior(ev.Updated); before != nil {
			ev.Prior = true
			if ev.Before == nil {
				ev.Before = before
			}
		}
	}
	ev.AdmissionsOnly, _ = raw.Lookup(admissionsOnly).BooleanOK()
	if removed, ok := raw.Lookup("updateDescription", "removedFields").ArrayOK(); ok {
		vals, _ := removed.Values()
		for _, v := range vals {
			if s, ok := v.StringValueOK(); ok {
				ev.Removed = append(ev.Removed, s)
			}
		}
	}
	return ev
}

func eventDoc(t testing.TB, d bson.D) bson.Raw {
	t.Helper()
	raw, err := bson.Marshal(d)
	require.NoError(t, err)
	return raw
}

// changeEvents are events of every shape the streams see.
func changeEvents(t testing.TB) []bson.Raw {
	id, queue := bson.NewObjectID(), bson.NewObjectID()
	common := func(op, coll string) bson.D {
		return bson.D{
			{Key: "_id", Value: bson.D{{Key: "_data", Value: "8267A1B2C3000000012B"}}},
			{Key: "operationType", Value: op},
			{Key: "clusterTime", Value: bson.Timestamp{T: 1764331200, I: 7}},
			{Key: "wallTime", Value: bson.NewDateTimeFromTime(time.UnixMilli(1764331200123))},
			{Key: "ns", Value: bson.D{{Key: "db", Value: "disbatch"}, {Key: "coll", Value: coll}}},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: id}}},
		}
	}
	prior := queue.Hex() + " -1 " + bson.NewObjectID().Hex() + " n1"
	return []bson.Raw{
		eventDoc(t, append(common("insert", "tasks"), bson.E{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: id}, {Key: "queue", Value: queue}, {Key: "status", Value: -2}}})),
		eventDoc(t, append(common("update", "tasks"), bson.E{Key: "updateDescription", Value: bson.D{
			{Key: "updatedFields", Value: bson.D{{Key: "status", Value: 1}, {Key: "mtime", Value: 1.5}, {Key: schema.TaskPrior, Value: prior}}},
			{Key: "removedFields", Value: bson.A{"reason", "kill"}},
			{Key: "truncatedArrays", Value: bson.A{}},
		}})),
		eventDoc(t, append(common("update", "tasks"),
			bson.E{Key: "fullDocumentBeforeChange", Value: bson.D{{Key: "queue", Value: queue}, {Key: "status", Value: 0}}},
			bson.E{Key: "updateDescription", Value: bson.D{{Key: "updatedFields", Value: bson.D{{Key: "status", Value: 2}}}, {Key: "removedFields", Value: bson.A{}}}})),
		eventDoc(t, append(common("update", "queues"), bson.E{Key: "updateDescription", Value: bson.D{{Key: "updatedFields", Value: bson.D{{Key: "admitted", Value: 3}}}}}, bson.E{Key: admissionsOnly, Value: true})),
		eventDoc(t, append(common("delete", "tasks"), bson.E{Key: "fullDocument", Value: nil})),
		eventDoc(t, bson.D{{Key: "_id", Value: bson.D{{Key: "_data", Value: "82"}}}, {Key: "operationType", Value: "invalidate"}, {Key: "clusterTime", Value: bson.Timestamp{T: 1, I: 1}}}),
		eventDoc(t, bson.D{}),
		// Not what a server sends: fields of the wrong type read as absent.
		eventDoc(t, bson.D{{Key: "operationType", Value: 7}, {Key: "ns", Value: "tasks"}, {Key: "documentKey", Value: bson.A{1}}, {Key: "updateDescription", Value: 1}}),
	}
}

// TestDecodeEventReadsWhatLookupsRead: decoding an event in one pass gives
// what a lookup per field gave, for every shape of event.
func TestDecodeEventReadsWhatLookupsRead(t *testing.T) {
	token := eventDoc(t, bson.D{{Key: "_data", Value: "8267A1B2C3000000012B"}})
	for i, raw := range changeEvents(t) {
		want, got := decodeEventByLookups(raw, token), decodeEvent(raw, token)
		require.Equal(t, want, got, "event %d: %v", i, raw)
	}
	ev := decodeEvent(changeEvents(t)[1], token)
	require.True(t, ev.Prior)
	require.Equal(t, []string{"reason", "kill"}, ev.Removed)
	require.Equal(t, "tasks", ev.Coll)
}

// BenchmarkDecodeEvent decodes a task's update as the projector reads it.
func BenchmarkDecodeEvent(b *testing.B) {
	evs := changeEvents(b)
	token := eventDoc(b, bson.D{{Key: "_data", Value: "8267A1B2C3000000012B"}})
	for _, c := range []struct {
		name   string
		decode func(current, token bson.Raw) ChangeEvent
	}{{"OnePass", decodeEvent}, {"Lookups", decodeEventByLookups}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = c.decode(evs[1], token)
			}
		})
	}
}
