package jaegertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const (
	// readyTimeout bounds how long Start waits for Jaeger to serve.
	readyTimeout = 30 * time.Second
	// stopTimeout is how long the cleanup waits after SIGTERM before SIGKILL.
	stopTimeout = 10 * time.Second
	// startAttempts is how often Start tries again when a port it picked was
	// taken by someone else before Jaeger bound it.
	startAttempts = 3
	// logKeep is how much of Jaeger's output is kept (the end of it).
	logKeep = 1 << 20
	// logTailLines is how many lines of the log a failure shows.
	logTailLines = 60
)

// Jaeger is a running Jaeger v2 all-in-one process started by Start. Its
// methods may be called from any goroutine.
type Jaeger struct {
	otlpGRPC  string // host:port
	otlpHTTP  string // host:port
	queryHTTP string // host:port
	queryGRPC string // host:port

	cmd    *exec.Cmd
	log    *tailBuffer
	exited chan struct{} // closed when the process has exited and been reaped
	err    error         // cmd.Wait's result, set before exited is closed
	gaveUp atomic.Bool   // Start killed it (so its cleanup stays quiet)

	transport *http.Transport
	client    *http.Client
}

// Start runs a Jaeger v2 all-in-one with in-memory storage on free
// 127.0.0.1 ports and waits (up to 30 s) until its query API answers and its
// OTLP receivers accept connections. Its configuration file is written into
// t.TempDir(). If there is no binary (see Binary) or Jaeger does not come
// up, the test fails (t.Fatal) with the tail of Jaeger's log. The process is
// stopped by t.Cleanup; one that exits on its own before that fails the test.
//
// Start must be called from the test's goroutine.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	began := time.Now()
	for attempt := 1; ; attempt++ {
		j, err := start(t, bin, dir, attempt)
		if err != nil {
			t.Fatalf("jaegertest: %v", err)
		}
		err = j.waitReady(began.Add(readyTimeout))
		if err == nil {
			t.Logf("jaegertest: jaeger %s (pid %d) ready in %v: OTLP gRPC %s, OTLP HTTP %s, query %s",
				bin, j.PID(), time.Since(began).Round(time.Millisecond), j.otlpGRPC, j.otlpHTTP, j.QueryURL())
			return j
		}
		// Stop it now (its cleanup then finds it gone and stays quiet).
		selfExit := exitedEarly(j)
		j.kill()
		if selfExit && strings.Contains(j.log.String(), "address already in use") && attempt < startAttempts {
			t.Logf("jaegertest: attempt %d: a port was taken before jaeger bound it; trying other ports", attempt)
			continue
		}
		t.Fatalf("jaegertest: jaeger (%s) did not come up: %v\njaeger log (tail):\n%s", bin, err, j.log.Tail(logTailLines))
	}
}

// start writes a configuration with fresh ports and starts Jaeger with it;
// the process's cleanup is registered with t.
func start(t testing.TB, bin, dir string, attempt int) (*Jaeger, error) {
	ports, err := pickPorts(4)
	if err != nil {
		return nil, err
	}
	j := &Jaeger{
		otlpGRPC:  loopback(ports[0]),
		otlpHTTP:  loopback(ports[1]),
		queryHTTP: loopback(ports[2]),
		queryGRPC: loopback(ports[3]),
		log:       &tailBuffer{keep: logKeep},
		exited:    make(chan struct{}),
	}
	j.transport = &http.Transport{
		Proxy:               nil, // never via a proxy: Jaeger is on loopback
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	j.client = &http.Client{Transport: j.transport, Timeout: 30 * time.Second}

	cfg := filepath.Join(dir, fmt.Sprintf("jaeger-%d.yaml", attempt))
	if err := os.WriteFile(cfg, []byte(j.config()), 0o600); err != nil {
		return nil, err
	}

	cmd := exec.Command(bin, "--config", "file:"+cfg)
	cmd.Dir = dir
	cmd.Env = childEnv()
	cmd.Stdout = j.log
	cmd.Stderr = j.log
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 5 * time.Second // do not hang on output pipes after exit
	j.cmd = cmd

	// Fork from a goroutine that keeps its OS thread locked until Jaeger
	// has exited: Pdeathsig fires when the forking thread ends, and Go
	// never ends a thread that a goroutine still holds.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		j.err = cmd.Wait()
		close(j.exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	t.Cleanup(func() { j.stop(t) })
	return j, nil
}

// config is Jaeger's YAML configuration: an OTLP (gRPC and HTTP) traces
// pipeline into in-memory storage, the query extension (HTTP API/UI and gRPC
// API) reading it, everything on 127.0.0.1, and no telemetry of its own
// (metrics level none opens no Prometheus endpoint; traces level none gives
// the collector a no-op tracer provider; jaeger_query's enable_tracing is
// off by default).
func (j *Jaeger) config() string {
	return `# Written by internal/jaegertest for one test's Jaeger v2.
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    # No resource attributes: they would only repeat on every log line.
    resource:
      service.name: null
      service.instance.id: null
      service.version: null
    metrics:
      level: none
    traces:
      level: none
    logs:
      level: info

extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000

  jaeger_query:
    storage:
      traces: memstore
    max_clock_skew_adjust: 0s
    enable_tracing: false
    http:
      endpoint: "` + j.queryHTTP + `"
    grpc:
      endpoint: "` + j.queryGRPC + `"

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: "` + j.otlpGRPC + `"
      http:
        endpoint: "` + j.otlpHTTP + `"

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`
}

// waitReady polls until the query API answers /api/services with 200 and
// both OTLP ports accept TCP connections (receivers start last, so then the
// whole pipeline is up), until deadline, or until the process exits.
func (j *Jaeger) waitReady(deadline time.Time) error {
	// Probes end as soon as the process does (something else may hold a
	// port it wanted, and accept connections without answering).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-j.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	var last error
	for {
		if exitedEarly(j) {
			return fmt.Errorf("jaeger exited: %s", j.exitStatus())
		}
		if last = j.probe(ctx); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %v", readyTimeout, last)
		}
		select {
		case <-j.exited:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (j *Jaeger) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL()+"/api/services", nil)
	if err != nil {
		return err
	}
	resp, err := j.client.Do(req)
	if err != nil {
		return fmt.Errorf("query API: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("query API: GET /api/services: %s", resp.Status)
	}
	var d net.Dialer
	for _, addr := range []string{j.otlpGRPC, j.otlpHTTP} {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("OTLP receiver: %w", err)
		}
		c.Close()
	}
	return nil
}

// exitedEarly reports whether the process has already exited.
func exitedEarly(j *Jaeger) bool {
	select {
	case <-j.exited:
		return true
	default:
		return false
	}
}

// kill SIGKILLs the process (if still running) and waits for it; its
// cleanup then has nothing to report.
func (j *Jaeger) kill() {
	j.gaveUp.Store(true)
	if !exitedEarly(j) {
		_ = j.cmd.Process.Kill()
	}
	<-j.exited
	j.transport.CloseIdleConnections()
}

// stop is the cleanup: SIGTERM, SIGKILL after stopTimeout, wait. It fails
// the test if Jaeger had exited on its own, and shows the log tail if the
// test failed.
func (j *Jaeger) stop(t testing.TB) {
	defer j.transport.CloseIdleConnections()
	select {
	case <-j.exited:
		if !j.gaveUp.Load() {
			t.Errorf("jaegertest: jaeger (pid %d) exited before the test's cleanup: %s\njaeger log (tail):\n%s",
				j.PID(), j.exitStatus(), j.log.Tail(logTailLines))
		}
		return
	default:
	}
	if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		_ = j.cmd.Process.Kill()
	}
	select {
	case <-j.exited:
	case <-time.After(stopTimeout):
		t.Logf("jaegertest: jaeger (pid %d) still running %v after SIGTERM; killing it", j.PID(), stopTimeout)
		_ = j.cmd.Process.Kill()
		<-j.exited
	}
	if t.Failed() {
		t.Logf("jaegertest: jaeger (pid %d) log (tail):\n%s", j.PID(), j.log.Tail(logTailLines))
	}
}

// exitStatus describes how the process ended ("exit status 1", "signal:
// killed", ...); only once exited is closed.
func (j *Jaeger) exitStatus() string {
	var exitErr *exec.ExitError
	if j.err != nil && !errors.As(j.err, &exitErr) {
		return fmt.Sprintf("%s (%v)", j.cmd.ProcessState, j.err)
	}
	return j.cmd.ProcessState.String()
}

// PID returns the process id of the Jaeger process.
func (j *Jaeger) PID() int { return j.cmd.Process.Pid }

// OTLPHTTPEndpoint returns the base URL of the OTLP/HTTP receiver, e.g.
// "http://127.0.0.1:4318" (spans go to its /v1/traces).
func (j *Jaeger) OTLPHTTPEndpoint() string { return "http://" + j.otlpHTTP }

// OTLPGRPCEndpoint returns the host:port of the OTLP/gRPC receiver (no TLS),
// e.g. "127.0.0.1:4317".
func (j *Jaeger) OTLPGRPCEndpoint() string { return j.otlpGRPC }

// QueryURL returns the base URL of the query HTTP API and UI, e.g.
// "http://127.0.0.1:16686".
func (j *Jaeger) QueryURL() string { return "http://" + j.queryHTTP }

// Env returns the OTEL_* environment (KEY=value) that makes an OTel SDK
// process (with the autoexport exporters, or the OTLP exporters' own
// environment handling) send its traces here over OTLP/HTTP, flushing
// batches every 100 ms. Metrics and logs exporters are set to "none", since
// Jaeger takes only traces. OTEL_SERVICE_NAME is the caller's to set.
// Append it to a command's environment (later entries win in os/exec).
func (j *Jaeger) Env() []string {
	return []string{
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_METRICS_EXPORTER=none",
		"OTEL_LOGS_EXPORTER=none",
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + j.OTLPHTTPEndpoint(),
		// The signal-specific variables win over the general ones, so set
		// them too in case the environment this is appended to has them.
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + j.OTLPHTTPEndpoint() + "/v1/traces",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// pickPorts is freePorts, or a stand-in in tests.
var pickPorts = freePorts

// freePorts returns n distinct free TCP ports on 127.0.0.1 (held open
// together while they are picked, so they differ).
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("picking a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// childEnv is the test binary's environment without OTEL_* variables, so
// that a test's own OTel settings cannot change how Jaeger runs.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return env
}

// tailBuffer is an io.Writer that keeps the last keep bytes written to it.
type tailBuffer struct {
	mu   sync.Mutex
	keep int
	buf  []byte
	cut  bool // whether anything was dropped from the front
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.keep; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
		b.cut = true
	}
	return len(p), nil
}

// String returns everything kept.
func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// Tail returns the last n lines kept.
func (b *tailBuffer) Tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := bytes.TrimRight(b.buf, "\n")
	cut := b.cut
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			if n--; n == 0 {
				s, cut = s[i+1:], true
				break
			}
		}
	}
	if len(s) == 0 {
		return "(no output)"
	}
	if cut {
		return "...\n" + string(s)
	}
	return string(s)
}
