package tracing

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func TestEnabledFollowsTheStandardVariables(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, false},
		{map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false},
	} {
		for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"} {
			t.Setenv(k, tc.env[k])
		}
		require.Equal(t, tc.want, Enabled(), "%v", tc.env)
	}
}

func TestSetupOffInstallsNothingAndCostsNothing(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	shutdown, err := Setup(context.Background(), "test")
	require.NoError(t, err)
	require.NoError(t, shutdown(context.Background()))
	_, span := Tracer().Start(context.Background(), "x")
	require.False(t, span.IsRecording(), "off: the no-op tracer")
}

func TestInjectExtractRoundTrip(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("t").Start(context.Background(), "parent")
	defer span.End()
	tpHeader, _ := Inject(ctx)
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, tpHeader)
	got := trace.SpanContextFromContext(Extract(context.Background(), tpHeader, ""))
	require.True(t, got.IsRemote())
	require.Equal(t, span.SpanContext().TraceID(), got.TraceID())
	require.Equal(t, span.SpanContext().SpanID(), got.SpanID())

	empty, _ := Inject(context.Background())
	require.Empty(t, empty, "no span, no context")
	require.False(t, trace.SpanContextFromContext(Extract(context.Background(), "garbage", "")).IsValid())
}

// TestFromHeaderTakesAValidTraceContextOnly: a request's traceparent is
// taken as the propagator reads it; a malformed one, or none, is "".
func TestFromHeaderTakesAValidTraceContextOnly(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	h.Set("tracestate", "vendor=x")
	tp, ts := FromHeader(h)
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", tp)
	require.Equal(t, "vendor=x", ts)
	h.Set("traceparent", "00-not-a-trace-context")
	tp, ts = FromHeader(h)
	require.Empty(t, tp)
	require.Empty(t, ts)
	tp, _ = FromHeader(http.Header{})
	require.Empty(t, tp)
}
