package jaegertest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeTB is a testing.TB whose Fatal and Error are recorded (Fatal ends the
// goroutine, as the real one does) and whose cleanups run when runFake says.
// Everything else goes to the real test.
type fakeTB struct {
	testing.TB
	mu       sync.Mutex
	fatal    []string
	errors   []string
	cleanups []func()
}

func (f *fakeTB) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.fatal = append(f.fatal, fmt.Sprintf(format, args...))
	f.mu.Unlock()
	runtime.Goexit()
}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.fatal)+len(f.errors) > 0
}

func (f *fakeTB) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}

// runFake runs fn with a fakeTB on its own goroutine, then the cleanups
// fn registered, and returns the fakeTB.
func runFake(t *testing.T, fn func(tb testing.TB)) *fakeTB {
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	return f
}

// TestStartFailureReported: a "jaeger" that exits at once fails the test
// with its exit status and output.
func TestStartFailureReported(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "jaeger")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\necho 'boom: no config for you' >&2\nexit 3\n"), 0o755))
	t.Setenv("DISBATCH_JAEGER", fake)
	f := runFake(t, func(tb testing.TB) {
		Start(tb)
		tb.Errorf("Start returned")
	})
	require.Len(t, f.fatal, 1, "errors: %v", f.errors)
	require.Contains(t, f.fatal[0], "did not come up")
	require.Contains(t, f.fatal[0], "exit status 3")
	require.Contains(t, f.fatal[0], "boom: no config for you")
	require.Empty(t, f.errors)

	// No binary at all.
	t.Setenv("DISBATCH_JAEGER", filepath.Join(t.TempDir(), "missing"))
	f = runFake(t, func(tb testing.TB) { Start(tb) })
	require.Len(t, f.fatal, 1)
	require.Contains(t, f.fatal[0], "make jaeger")
}

// TestWaitForTracesFailure: WaitForTraces fails the test after the timeout,
// showing what it saw.
func TestWaitForTracesFailure(t *testing.T) {
	j := Start(t)
	began := time.Now()
	f := runFake(t, func(tb testing.TB) {
		j.WaitForTraces(tb, "nobody", 300*time.Millisecond, func(ts []Trace) bool { return len(ts) > 0 })
		tb.Errorf("WaitForTraces returned")
	})
	require.GreaterOrEqual(t, time.Since(began), 300*time.Millisecond)
	require.Len(t, f.fatal, 1, "errors: %v", f.errors)
	require.True(t, strings.HasPrefix(f.fatal[0], `jaegertest: traces of service "nobody" not as expected after 300ms`), f.fatal[0])
	require.Contains(t, f.fatal[0], "last seen 0 traces")
}

// TestEarlyExitReported: a Jaeger that exits before the cleanup fails the
// test, saying how it exited and showing its log.
func TestEarlyExitReported(t *testing.T) {
	f := runFake(t, func(tb testing.TB) {
		j := Start(tb)
		if err := j.cmd.Process.Signal(os.Interrupt); err != nil {
			tb.Fatalf("interrupting jaeger: %v", err)
		}
		<-j.exited
	})
	require.Empty(t, f.fatal)
	require.Len(t, f.errors, 1)
	// Jaeger is ready (it answers) a moment before its own signal
	// handler is installed: an interrupt in between ends it by the
	// signal (a CI run saw it), later it exits cleanly, saying so.
	require.Regexp(t, `exited before the test's cleanup: (exit status 0\n(?s:.*)Received signal from OS|signal: interrupt\n)`, f.errors[0])
	require.Contains(t, f.errors[0], "jaeger log (tail):")
}
