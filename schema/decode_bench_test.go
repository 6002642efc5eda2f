package schema_test

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// BenchmarkDecodeTask decodes a task as a claim reads it back: running,
// with parameters, a trace context and the fields a node writes, and
// none of the optional control and graph fields (each looked up anyway).
func BenchmarkDecodeTask(b *testing.B) {
	now := time.Now()
	raw, err := bson.Marshal(bson.D{
		{Key: "_id", Value: bson.NewObjectID()},
		{Key: "queue", Value: bson.NewObjectID()},
		{Key: "status", Value: int32(0)},
		{Key: "node", Value: "bench-proc-1"},
		{Key: "parameters", Value: bson.D{{Key: "n", Value: int32(7)}, {Key: "cmd", Value: "true"}}},
		{Key: "ctime", Value: bson.NewDateTimeFromTime(now)},
		{Key: "mtime", Value: bson.NewDateTimeFromTime(now)},
		{Key: "stdout", Value: nil},
		{Key: "stderr", Value: nil},
		{Key: "traceparent", Value: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{Key: "claimed_at", Value: bson.NewDateTimeFromTime(now)},
		{Key: "prior", Value: "5f0c 0 6650 bench-proc-1"},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := schema.DecodeTask(raw); err != nil {
			b.Fatal(err)
		}
	}
}
