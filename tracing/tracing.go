// Package tracing sets up OpenTelemetry tracing from the standard OTEL_*
// environment variables and carries a task's trace context between the
// process that submits it and the node that runs it.
//
// Tracing is off unless the environment asks for it: OTEL_TRACES_EXPORTER
// (otlp, console, …; "none" turns it off) or an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). The
// protocol (OTEL_EXPORTER_OTLP_PROTOCOL: grpc or http/protobuf), headers,
// batching (OTEL_BSP_*), sampling (OTEL_TRACES_SAMPLER) and the service name
// (OTEL_SERVICE_NAME) follow the OpenTelemetry specification. Off, the
// global tracer is OpenTelemetry's no-op and a span costs a few nanoseconds.
//
// A task carries its submitter's W3C trace context in the string fields
// traceparent and tracestate of its document, beside parameters.
package tracing

import (
	"context"
	"errors"
	"net/http"
	"os"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// Enabled reports whether the environment asks for tracing.
func Enabled() bool {
	if os.Getenv("OTEL_SDK_DISABLED") == "true" {
		return false
	}
	switch os.Getenv("OTEL_TRACES_EXPORTER") {
	case "none":
		return false
	case "":
		return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	}
	return true
}

// Setup installs the global tracer provider when Enabled, with service as
// the service name unless OTEL_SERVICE_NAME says otherwise. The returned
// function flushes and stops it; call it before exiting.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !Enabled() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, err
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
		resource.WithHost(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// Tracer is the project's tracer.
func Tracer() trace.Tracer { return otel.Tracer("github.com/disbatch-go/disbatch") }

// Inject returns the W3C trace context of ctx's span ("" when there is no
// recording span).
func Inject(ctx context.Context) (traceparent, tracestate string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"], c["tracestate"]
}

// FromHeader returns the W3C trace context an HTTP request carries (its
// traceparent and tracestate headers), checked and as written again by the
// propagator; "" when there is none, or none valid. A web server stores it
// on the tasks a request submits, so that their traces join the caller's
// as the CLI's do.
func FromHeader(h http.Header) (traceparent, tracestate string) {
	if h.Get("traceparent") == "" {
		return "", ""
	}
	return Inject(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(h)))
}

// Extract returns ctx with the remote span context of a task's trace
// context as parent; an empty or malformed traceparent leaves ctx alone.
func Extract(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent, "tracestate": tracestate})
}
