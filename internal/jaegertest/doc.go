// Package jaegertest runs a real Jaeger v2 (the all-in-one binary built by
// `make jaeger`, scripts/fetch-jaeger.sh) for tests: [Start] launches one on
// free loopback ports with in-memory storage, gives the OTLP endpoints (and,
// through [Jaeger.Env], the OTEL_* environment a process needs to export its
// spans there), and reads the stored traces back through Jaeger's query HTTP
// API ([Jaeger.Traces], [Jaeger.Trace], [Jaeger.Services],
// [Jaeger.WaitForTraces]).
//
// Only tests use this package.
//
// # Processes
//
// Every Jaeger listens on 127.0.0.1 only (OTLP gRPC and HTTP receivers, the
// query HTTP API/UI and the query gRPC API); its own telemetry (metrics and
// self-tracing) is off. It is stopped by the test's cleanup (SIGTERM, then
// SIGKILL after 10 s) and, on Linux, gets Pdeathsig=SIGKILL, so it does not
// outlive the test binary even if that is killed. Its log is kept in memory
// and its tail printed when the test fails.
package jaegertest
