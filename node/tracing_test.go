package node

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/tracing"
)

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// recorded installs, once for the package's parallel tests, a tracer
// provider that records every span: tests filter them by task id.
var recorded = sync.OnceValues(func() (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	// The sampler set, not left to OTEL_TRACES_SAMPLER: every root span
	// records, and a child as its parent does.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	otel.SetTracerProvider(tp)
	return rec, tp
})

// taskSpan waits for the ended disbatch.task span of a task.
func taskSpan(t *testing.T, rec *tracetest.SpanRecorder, id bson.ObjectID) sdktrace.ReadOnlySpan {
	t.Helper()
	var task sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == "disbatch.task" && attrs(s)["disbatch.task.id"].AsString() == id.Hex() {
				task = s
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond)
	return task
}

func TestTaskLifecycleIsOneTraceJoinedToTheSubmitter(t *testing.T) {
	b := setup(t)
	rec, tp := recorded()

	q := b.queue("traced", plugin.DemoConstructor, 2, schema.SortFIFO)
	ctx, submit := tp.Tracer("test").Start(context.Background(), "submitter")
	traceparent, tracestate := tracing.Inject(ctx)
	submit.End()
	ps := []bson.Raw{}
	for _, c := range []string{"a", "c"} {
		raw, _ := bson.Marshal(bson.D{{Key: "commands", Value: c}})
		ps = append(ps, raw)
	}
	ids, err := b.store.TaskInsertMany(context.Background(), store.TaskInsertManyParams{Queue: q, Parameters: ps, TraceParent: traceparent, TraceState: tracestate})
	require.NoError(t, err)
	b.start(b.config("n1"))
	b.waitDone(nil, 2, 10*time.Second)

	byTask := func(id bson.ObjectID) (task sdktrace.ReadOnlySpan, children map[string]sdktrace.ReadOnlySpan) {
		task = taskSpan(t, rec, id)
		children = map[string]sdktrace.ReadOnlySpan{}
		for _, s := range rec.Ended() {
			if s.Parent().SpanID() == task.SpanContext().SpanID() {
				children[s.Name()] = s
			}
		}
		return task, children
	}
	ok, okChildren := byTask(ids[0])
	require.Equal(t, submit.SpanContext().TraceID(), ok.SpanContext().TraceID(), "one trace with the submitter")
	require.Equal(t, submit.SpanContext().SpanID(), ok.Parent().SpanID(), "the task span is the submitter's child")
	a := attrs(ok)
	require.Equal(t, "traced", a["disbatch.queue"].AsString())
	require.Equal(t, plugin.DemoConstructor, a["disbatch.constructor"].AsString())
	require.Equal(t, "n1", a["disbatch.node"].AsString())
	require.Equal(t, int64(1), a["disbatch.status"].AsInt64())
	require.Equal(t, "succeeded", a["disbatch.outcome"].AsString())
	require.Contains(t, a, attribute.Key("disbatch.queue.wait_ms"))
	require.Len(t, okChildren, 4, "queued, claim, run, complete")
	for _, name := range []string{"disbatch.queued", "disbatch.claim", "disbatch.run", "disbatch.complete"} {
		require.Contains(t, okChildren, name)
	}
	task, err := b.store.TaskGet(context.Background(), ids[0])
	require.NoError(t, err)
	require.Equal(t, task.CTime, okChildren["disbatch.queued"].StartTime().UTC().Truncate(time.Millisecond), "the wait in the queue starts at ctime")
	require.Equal(t, ok.StartTime(), okChildren["disbatch.queued"].StartTime())
	require.False(t, okChildren["disbatch.run"].StartTime().Before(okChildren["disbatch.claim"].EndTime()), "run follows the claim")

	failed, failedChildren := byTask(ids[1])
	require.Equal(t, codes.Error, failed.Status().Code)
	require.Equal(t, codes.Error, failedChildren["disbatch.run"].Status().Code)
	require.Contains(t, failedChildren["disbatch.run"].Status().Description, "cry")
	require.Equal(t, "failed", attrs(failed)["disbatch.outcome"].AsString())
}

// A task whose span does not record (its submitter's trace was not
// sampled, or tracing is off) starts no child spans: the task span stands
// in for each of them, as any child of it would record nothing either.
func TestATaskSpanThatDoesNotRecordStartsNoChildren(t *testing.T) {
	rec, _ := recorded()
	q := claimer.Queue{ID: bson.NewObjectID(), Name: "q", Constructor: plugin.DemoConstructor}
	task := schema.Task{ID: bson.NewObjectID(), CTime: time.Now().Add(-time.Second),
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"} // not sampled

	tt := newTaskTrace("n1", q, task, claimer.Timing{Start: time.Now()}, queuedSince(task))
	require.False(t, tt.task.IsRecording())
	tt.started()
	tt.ran(plugin.Result{Status: schema.StatusFailed, Stderr: "cry"})
	tt.finished(plugin.Result{Status: schema.StatusFailed}, nil)
	tt.end("failed")

	id := tt.task.SpanContext().SpanID()
	for name, s := range map[string]interface{ SpanContext() trace.SpanContext }{"claim": tt.claim, "run": tt.run, "complete": tt.complete} {
		require.Equal(t, id, s.SpanContext().SpanID(), "the %s span is the task span", name)
	}
	for _, s := range rec.Ended() {
		require.NotEqual(t, task.TraceParent[3:35], s.SpanContext().TraceID().String(), "%s recorded", s.Name())
	}

	// A task span that records has children of its own.
	tt = newTaskTrace("n1", q, schema.Task{ID: bson.NewObjectID()}, claimer.Timing{Start: time.Now()}, time.Time{})
	require.True(t, tt.task.IsRecording())
	tt.started()
	require.NotEqual(t, tt.task.SpanContext().SpanID(), tt.claim.SpanContext().SpanID())
	require.NotEqual(t, tt.task.SpanContext().SpanID(), tt.run.SpanContext().SpanID())
	tt.ran(plugin.Result{Status: schema.StatusSucceeded})
	tt.finished(plugin.Result{Status: schema.StatusSucceeded}, nil)
	tt.end("succeeded")
}

// TestEveryChildSpanEndsWithItsTask: a path that leaves a child span open
// (a claim found lost; a run left to its supervisor when the node stops)
// has it ended with the task, so that it is exported (they never were).
func TestEveryChildSpanEndsWithItsTask(t *testing.T) {
	rec, _ := recorded()
	q := claimer.Queue{ID: bson.NewObjectID(), Name: "q", Constructor: plugin.DemoConstructor}
	ended := func(tt *taskTrace) map[string]bool {
		names := map[string]bool{}
		trace := tt.task.SpanContext().TraceID()
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID() == trace {
				names[s.Name()] = true
			}
		}
		return names
	}
	lost := newTaskTrace("n1", q, schema.Task{ID: bson.NewObjectID()}, claimer.Timing{Start: time.Now()}, time.Time{})
	lost.end("lost")
	require.Equal(t, map[string]bool{"disbatch.task": true, "disbatch.claim": true}, ended(lost))

	detached := newTaskTrace("n1", q, schema.Task{ID: bson.NewObjectID()}, claimer.Timing{Start: time.Now()}, time.Time{})
	detached.started()
	detached.controlled(ControlDetached, "the node stopped")
	detached.end("detached")
	require.Equal(t, map[string]bool{"disbatch.task": true, "disbatch.claim": true, "disbatch.run": true}, ended(detached))
}

// TestAnAdoptedTaskDidNotWait: the trace of a task taken back from its
// supervisor begins when it is adopted, with no queued span (one from its
// ctime showed an hour's run as an hour's wait).
func TestAnAdoptedTaskDidNotWait(t *testing.T) {
	rec, _ := recorded()
	q := claimer.Queue{ID: bson.NewObjectID(), Name: "q", Constructor: plugin.ExecConstructor}
	now := time.Now()
	task := schema.Task{ID: bson.NewObjectID(), CTime: now.Add(-time.Hour)}
	tt := adoptedTrace("n1", q, task, now)
	tt.started()
	tt.end("detached")
	var names []string
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID() == tt.task.SpanContext().TraceID() {
			names = append(names, s.Name())
			if s.Name() == "disbatch.task" {
				require.False(t, s.StartTime().Before(now), "begins at the adoption")
				require.NotContains(t, attrs(s), attribute.Key("disbatch.queue.wait_ms"))
			}
		}
	}
	require.ElementsMatch(t, []string{"disbatch.task", "disbatch.claim", "disbatch.run"}, names)
}
