package jaegertest

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// TestSpansRoundTrip sends a parent and a child span with the OTel SDK over
// OTLP/HTTP and reads them back from the query API.
func TestSpansRoundTrip(t *testing.T) {
	j := Start(t)
	ctx := context.Background()

	for _, addr := range []string{j.OTLPGRPCEndpoint(), strings.TrimPrefix(j.OTLPHTTPEndpoint(), "http://"), strings.TrimPrefix(j.QueryURL(), "http://")} {
		host, _, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1", host, addr)
	}

	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(j.OTLPHTTPEndpoint()+"/v1/traces"))
	require.NoError(t, err)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "jaegertest"))),
	)
	tracer := tp.Tracer("jaegertest")

	pctx, parent := tracer.Start(ctx, "parent")
	_, child := tracer.Start(pctx, "child")
	child.SetAttributes(
		attribute.String("disbatch.test", "hello"),
		attribute.Int64("disbatch.count", 42),
		attribute.Bool("disbatch.flag", true),
	)
	child.AddEvent("something happened", trace.WithAttributes(attribute.String("what", "it")))
	child.End()
	parent.End()
	traceID := parent.SpanContext().TraceID().String()
	parentID := parent.SpanContext().SpanID().String()
	childID := child.SpanContext().SpanID().String()

	shutdownCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, tp.Shutdown(shutdownCtx)) // flushes

	traces := j.WaitForTraces(t, "jaegertest", 10*time.Second, func(ts []Trace) bool {
		return len(ts) == 1 && len(ts[0].Spans) == 2
	})
	tr := traces[0]
	require.Equal(t, traceID, tr.TraceID)

	p, ok := tr.Span("parent")
	require.True(t, ok, tr.String())
	c, ok := tr.Span("child")
	require.True(t, ok, tr.String())
	require.Equal(t, parentID, p.SpanID)
	require.Equal(t, childID, c.SpanID)
	require.Empty(t, p.References, tr.String())
	require.Equal(t, []Reference{{Type: ChildOf, TraceID: traceID, SpanID: parentID}}, c.References)
	require.Equal(t, parentID, c.ParentID())
	require.Equal(t, "jaegertest", p.ServiceName)
	require.Equal(t, "jaegertest", c.ServiceName)
	require.Equal(t, "hello", c.Tags["disbatch.test"], tr.String())
	require.Equal(t, int64(42), c.Tags["disbatch.count"], tr.String())
	require.Equal(t, true, c.Tags["disbatch.flag"], tr.String())
	require.NotContains(t, p.Tags, "disbatch.test")
	require.Len(t, c.Logs, 1)
	require.Equal(t, "it", c.Logs[0].Fields["what"])
	require.False(t, c.StartTime.Before(p.StartTime))
	require.LessOrEqual(t, c.Duration, p.Duration)
	require.WithinDuration(t, time.Now(), p.StartTime, time.Minute)

	// The same trace by id, and the service list.
	byID, err := j.Trace(ctx, traceID)
	require.NoError(t, err)
	require.Equal(t, traceID, byID.TraceID)
	require.Len(t, byID.Spans, 2)

	_, err = j.Trace(ctx, "0123456789abcdef0123456789abcdef")
	require.ErrorIs(t, err, ErrNotFound)

	services, err := j.Services(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"jaegertest"}, services)

	none, err := j.Traces(ctx, "no-such-service")
	require.NoError(t, err)
	require.Empty(t, none)
}

// TestEnv runs the OTel SDK's own environment handling against Env: a child
// process (this test binary, running TestEnvChild) exports a span with the
// autoexport exporter, configured only by the environment.
func TestEnv(t *testing.T) {
	j := Start(t)
	env := j.Env()
	require.Contains(t, env, "OTEL_EXPORTER_OTLP_ENDPOINT="+j.OTLPHTTPEndpoint())

	cmd := exec.Command(os.Args[0], "-test.run=^TestEnvChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "JAEGERTEST_CHILD=1", "OTEL_SERVICE_NAME=jaegertest-env")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child: %s", out)
	require.Contains(t, string(out), "PASS")

	traces := j.WaitForTraces(t, "jaegertest-env", 10*time.Second, func(ts []Trace) bool { return len(ts) == 1 })
	require.Len(t, traces[0].Spans, 1)
	require.Equal(t, "from-env", traces[0].Spans[0].OperationName)
}

// TestEnvChild is the child process of TestEnv: the exporter (autoexport:
// OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*), the batcher
// (OTEL_BSP_SCHEDULE_DELAY) and the resource (OTEL_SERVICE_NAME) take all
// their settings from the environment.
func TestEnvChild(t *testing.T) {
	if os.Getenv("JAEGERTEST_CHILD") != "1" {
		return // run by TestEnv only
	}
	ctx := context.Background()
	exp, err := autoexport.NewSpanExporter(ctx)
	require.NoError(t, err)
	require.False(t, autoexport.IsNoneSpanExporter(exp))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	_, span := tp.Tracer("jaegertest").Start(ctx, "from-env")
	span.End()
	require.NoError(t, tp.Shutdown(ctx))
}

func TestTailBuffer(t *testing.T) {
	b := &tailBuffer{keep: 10}
	require.Equal(t, "(no output)", b.Tail(3))
	_, _ = b.Write([]byte("a\nb\n"))
	require.Equal(t, "a\nb", b.Tail(3))
	_, _ = b.Write([]byte("c\nd\n"))
	require.Equal(t, "...\nc\nd", b.Tail(2))
	_, _ = b.Write([]byte("0123456789xyz"))
	require.Equal(t, "3456789xyz", b.String())
	require.Equal(t, "...\n3456789xyz", b.Tail(5))
}

func TestDecodeTags(t *testing.T) {
	m, err := tagMap([]apiKeyValue{
		{Key: "s", Type: "string", Value: []byte(`"x"`)},
		{Key: "b", Type: "bool", Value: []byte(`true`)},
		{Key: "i", Type: "int64", Value: []byte(`-7`)},
		{Key: "big", Type: "int64", Value: []byte(`"9007199254740993"`)},
		{Key: "f", Type: "float64", Value: []byte(`1.5`)},
		{Key: "bin", Type: "binary", Value: []byte(`"aGk="`)},
	})
	require.NoError(t, err)
	require.Equal(t, map[string]any{
		"s": "x", "b": true, "i": int64(-7), "big": int64(9007199254740993), "f": 1.5, "bin": []byte("hi"),
	}, m)
}
