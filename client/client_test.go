package client

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

func TestSubmitWritesSeedTasksWithTheCallersTraceContext(t *testing.T) {
	ctx := context.Background()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	one := 1
	_, err := s.QueueCreate(ctx, store.QueueCreateParams{Name: "demo", Constructor: "C", MaxThreads: &one})
	require.NoError(t, err)
	c := New(db)

	// Without a span: no trace context.
	ids, err := c.Submit(ctx, "demo", bson.D{{Key: "commands", Value: "a"}})
	require.NoError(t, err)
	task, err := s.TaskGet(ctx, ids[0])
	require.NoError(t, err)
	require.Empty(t, task.TraceParent)
	require.Equal(t, schema.StatusQueued, task.Status)

	// With a recording span: its context travels in the task.
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(ctx)
	sctx, span := tp.Tracer("test").Start(ctx, "submitter")
	ids, err = c.Submit(sctx, "demo", bson.M{"commands": "b"}, struct {
		Commands string `bson:"commands"`
	}{"c"})
	span.End()
	require.NoError(t, err)
	require.Len(t, ids, 2)
	for _, id := range ids {
		task, err := s.TaskGet(ctx, id)
		require.NoError(t, err)
		require.Equal(t, "00-"+span.SpanContext().TraceID().String()+"-"+span.SpanContext().SpanID().String()+"-01", task.TraceParent)
	}
	_, err = c.Submit(ctx, "nope", bson.D{})
	require.ErrorIs(t, err, store.ErrNotFound)
}
