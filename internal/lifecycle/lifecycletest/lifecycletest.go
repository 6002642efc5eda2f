// Package lifecycletest checks that a service keeps the lifecycle rules of
// package lifecycle: every service's tests run Check on it, so the rules
// hold everywhere, not only in the helper.
package lifecycletest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/disbatch-go/disbatch/internal/lifecycle"
)

// wait bounds each step: a service that starts or stops slower than this
// is broken for our purposes.
const wait = 30 * time.Second

// Options tune Check.
type Options struct {
	// IgnoreGoroutines are functions whose goroutines may outlive Stop
	// (a shared database client's monitors).
	IgnoreGoroutines []goleak.Option
}

// Check runs the lifecycle rules against services made by newService (a
// fresh one per step that needs it). It must not run in parallel with
// other tests: it checks that Stop leaves no goroutine behind.
func Check(t *testing.T, newService func(t *testing.T) lifecycle.Service, opts Options) {
	t.Helper()
	leak := append([]goleak.Option{goleak.IgnoreCurrent()}, opts.IgnoreGoroutines...)

	t.Run("StopBeforeStartReturnsAtOnce", func(t *testing.T) {
		s := newService(t)
		within(t, "Stop before Start", s.Stop)
		within(t, "a second Stop before Start", s.Stop)
	})
	t.Run("StartTwiceStopTwice", func(t *testing.T) {
		s := newService(t)
		started := s.Started()
		require.False(t, closed(started), "Started is closed before Start")
		ctx := context.Background()
		require.NoError(t, s.Start(ctx))
		require.True(t, closed(started), "Started is not closed after Start returned")
		stopped := s.Stopped()
		require.False(t, closed(stopped), "Stopped is closed while running")
		require.NoError(t, s.Start(ctx), "a second Start")
		require.False(t, closed(s.Stopped()), "a second Start stopped the service")
		within(t, "Stop", s.Stop)
		require.True(t, closed(stopped), "Stopped is not closed after Stop returned")
		within(t, "a second Stop", s.Stop)
		goleak.VerifyNone(t, leak...)
	})
	t.Run("ConcurrentStopsAllWait", func(t *testing.T) {
		s := newService(t)
		require.NoError(t, s.Start(context.Background()))
		stopped := s.Stopped()
		done := make(chan bool, 3)
		for range 3 {
			go func() {
				s.Stop()
				done <- closed(stopped)
			}()
		}
		for range 3 {
			select {
			case ok := <-done:
				require.True(t, ok, "a Stop returned before the service stopped")
			case <-time.After(wait):
				t.Fatal("concurrent Stops did not return")
			}
		}
		goleak.VerifyNone(t, leak...)
	})
	t.Run("StartAfterStopRunsAgain", func(t *testing.T) {
		s := newService(t)
		ctx := context.Background()
		require.NoError(t, s.Start(ctx))
		within(t, "Stop", s.Stop)
		require.NoError(t, s.Start(ctx), "Start after Stop")
		require.True(t, closed(s.Started()))
		stopped := s.Stopped()
		require.False(t, closed(stopped), "the new run has the old run's Stopped")
		within(t, "Stop", s.Stop)
		require.True(t, closed(stopped))
		goleak.VerifyNone(t, leak...)
	})
	t.Run("StartCancelledContextDoesNotStopTheRun", func(t *testing.T) {
		s := newService(t)
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, s.Start(ctx))
		cancel()
		time.Sleep(50 * time.Millisecond)
		require.False(t, closed(s.Stopped()), "the start-up context ended the run")
		within(t, "Stop", s.Stop)
		goleak.VerifyNone(t, leak...)
	})
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		fn()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatalf("%s did not return within %v", what, wait)
	}
}
