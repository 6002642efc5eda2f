package plugin

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// slack is how late, past its deadline, Run may return in these tests: the
// AbandonGrace (a second) plus scheduling noise under -race on a loaded machine (a CI
// dry run on a slow 2-core machine, every package's tests at once, took
// 1.94 s for a 150 ms timeout). A Run that waited for a plugin ignoring
// its context would not return at all.
const slack = 5 * time.Second

func TestRunPassesResultsThrough(t *testing.T) {
	t.Parallel()
	for _, want := range []Result{
		{Status: 1, Stdout: "out", Stderr: "err"},
		{Status: 2, Stderr: "failed on purpose"},
		{Status: 3, Stdout: "custom"},
		{Status: 1, Stdout: "x", Extra: bson.D{{Key: "result", Value: int32(0)}}},
	} {
		p := Func(func(context.Context, Task) Result { return want })
		require.Equal(t, want, Run(t.Context(), p, Task{}, time.Minute))
		require.Equal(t, want, Run(t.Context(), p, Task{}, 0))
	}
}

func TestRunGivesThePluginTheTask(t *testing.T) {
	t.Parallel()
	in := Task{Queue: "q", Constructor: "c", Node: "n"}
	var got Task
	res := Run(t.Context(), Func(func(_ context.Context, tk Task) Result {
		got = tk
		return Result{Status: 1}
	}), in, 0)
	require.Equal(t, schema.StatusSucceeded, res.Status)
	require.Equal(t, in, got)
}

func TestRunPanic(t *testing.T) {
	t.Parallel()
	res := Run(t.Context(), Func(func(context.Context, Task) Result {
		panic("boom-42")
	}), Task{}, time.Minute)
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "panic")
	require.Contains(t, res.Stderr, "boom-42")
	require.Contains(t, res.Stderr, "run_test.go", "the stack is included")

	res = Run(t.Context(), Func(func(context.Context, Task) Result {
		panic(errors.New("an error value"))
	}), Task{}, 0)
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "panicked: an error value")

	res = Run(t.Context(), Func(func(context.Context, Task) Result {
		var m map[string]int
		m["x"] = 1 // a runtime error
		return Result{Status: 1}
	}), Task{}, 0)
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "assignment to entry in nil map")
}

func TestRunGoexit(t *testing.T) {
	t.Parallel()
	res := Run(t.Context(), Func(func(context.Context, Task) Result {
		runtime.Goexit()
		return Result{Status: 1}
	}), Task{}, 0)
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "Goexit")
}

func TestRunUnfinishedStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status schema.Status
		named  string
	}{
		{0, "status 0 (running)"},
		{-1, "status -1 (claimed)"},
		{-2, "status -2 (queued)"},
		{-7, "status -7,"},
	} {
		res := Run(t.Context(), answer(tc.status, "partial", "plugin said"), Task{}, 0)
		require.Equal(t, schema.StatusFailed, res.Status)
		require.Equal(t, "partial", res.Stdout)
		require.True(t, strings.HasPrefix(res.Stderr, "plugin said\n"), res.Stderr)
		require.Contains(t, res.Stderr, tc.named)
		require.Contains(t, res.Stderr, "not a finished status")
		require.True(t, strings.HasSuffix(res.Stderr, "\n"))
	}
	res := Run(t.Context(), answer(0, "", ""), Task{}, 0)
	require.Equal(t, "plugin returned status 0 (running), which is not a finished status: want > 0\n", res.Stderr)
}

// hanging is a Go plugin that ignores its context; it returns when the test
// ends, so the goroutine Run abandons does not outlive the test.
func hanging(t *testing.T) (Plugin, *atomic.Bool) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var returned atomic.Bool
	return Func(func(context.Context, Task) Result {
		<-release
		returned.Store(true)
		return Result{Status: 1, Stdout: "too late"}
	}), &returned
}

func TestRunTimeoutAbandonsAPluginThatIgnoresCtx(t *testing.T) {
	t.Parallel()
	p, returned := hanging(t)
	const timeout = 150 * time.Millisecond
	start := time.Now()
	res := Run(t.Context(), p, Task{}, timeout)
	elapsed := time.Since(start)
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "timeout")
	require.Equal(t, "task killed after timeout of 150ms (the plugin did not return and was abandoned)\n", res.Stderr)
	require.Empty(t, res.Stdout)
	require.GreaterOrEqual(t, elapsed, timeout)
	require.Less(t, elapsed, timeout+slack)
	require.False(t, returned.Load())
}

func TestRunTimeoutWithAPluginThatHonoursCtx(t *testing.T) {
	t.Parallel()
	var cause error
	p := Func(func(ctx context.Context, _ Task) Result {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return Result{Status: 1, Stdout: "partial", Stderr: "stopping"}
	})
	start := time.Now()
	res := Run(t.Context(), p, Task{}, 100*time.Millisecond)
	require.Less(t, time.Since(start), 100*time.Millisecond+slack)
	require.Equal(t, Result{Status: schema.StatusFailed, Stdout: "partial", Stderr: "stopping\ntask killed after timeout of 100ms\n"}, res)
	require.ErrorIs(t, cause, ErrTimeout)
	require.Equal(t, "timeout of 100ms", cause.Error())
}

func TestRunParentCancel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cause  error
		reason string
	}{
		{errors.New("node shutdown: kill"), "task killed: node shutdown: kill\n"},
		{nil, "task killed: context canceled\n"},
	} {
		ctx, cancel := context.WithCancelCause(t.Context())
		started := make(chan struct{})
		p := Func(func(ctx context.Context, _ Task) Result {
			close(started)
			<-ctx.Done()
			return Result{Status: 1}
		})
		go func() {
			<-started
			cancel(tc.cause)
		}()
		res := Run(ctx, p, Task{}, time.Minute)
		require.Equal(t, Result{Status: schema.StatusFailed, Stderr: tc.reason}, res)
	}
}

func TestRunParentCancelAbandonsAPluginThatIgnoresCtx(t *testing.T) {
	t.Parallel()
	p, _ := hanging(t)
	ctx, cancel := context.WithCancelCause(t.Context())
	time.AfterFunc(100*time.Millisecond, func() { cancel(errors.New("node shutdown")) })
	start := time.Now()
	res := Run(ctx, p, Task{}, 0)
	require.Less(t, time.Since(start), 100*time.Millisecond+slack)
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "killed: node shutdown")
	require.Contains(t, res.Stderr, "abandoned")
}

func TestRunAlreadyCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(errors.New("draining"))
	var called atomic.Bool
	res := Run(ctx, Func(func(context.Context, Task) Result {
		called.Store(true)
		return Result{Status: 1}
	}), Task{}, 0)
	require.Equal(t, Result{Status: schema.StatusFailed, Stderr: "task killed: draining\n"}, res)
	require.False(t, called.Load())
}

func TestRunFailsALateSuccess(t *testing.T) {
	t.Parallel()
	// The plugin notices the timeout and still claims success.
	res := Run(t.Context(), Func(func(ctx context.Context, _ Task) Result {
		<-ctx.Done()
		return Result{Status: 1, Stdout: "done"}
	}), Task{}, 50*time.Millisecond)
	require.Equal(t, Result{Status: schema.StatusFailed, Stdout: "done", Stderr: "task killed after timeout of 50ms\n"}, res)
}

func TestRunCancelsThePluginContextOnReturn(t *testing.T) {
	t.Parallel()
	var pctx context.Context
	res := Run(t.Context(), Func(func(ctx context.Context, _ Task) Result {
		pctx = ctx
		return Result{Status: 1}
	}), Task{}, 0)
	require.Equal(t, schema.StatusSucceeded, res.Status)
	require.Error(t, pctx.Err())
	require.NoError(t, t.Context().Err())
}

func TestRunNilPlugin(t *testing.T) {
	t.Parallel()
	res := Run(t.Context(), nil, Task{}, 0)
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "no plugin")
}
