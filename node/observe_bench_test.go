package node

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
)

// BenchmarkNewTaskTrace is a task's trace as the runner makes it, begun
// to ended, with
// tracing off (no tracer provider installed, as disbatchd without an
// OTLP endpoint). Run it alone (-run '^$'): this package's tracing tests
// install a recording provider, which it would then measure.
func BenchmarkNewTaskTrace(b *testing.B) {
	q := claimer.Queue{ID: bson.NewObjectID(), Name: "q", Constructor: "Demo"}
	t := schema.Task{ID: bson.NewObjectID(), CTime: time.Now().Add(-time.Second)}
	claim := claimer.Timing{Start: time.Now()}
	b.ReportAllocs()
	for b.Loop() {
		tt := newTaskTrace("n1", q, t, claim, queuedSince(t))
		tt.started()
		tt.ran(plugin.Result{Status: schema.StatusSucceeded})
		tt.finished(plugin.Result{Status: schema.StatusSucceeded}, nil)
		tt.end("succeeded")
	}
}
