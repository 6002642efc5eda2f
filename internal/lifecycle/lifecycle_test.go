package lifecycle_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/internal/lifecycle/lifecycletest"
)

// ticking is a service with a ticker loop, a plain goroutine and a cleanup.
type ticking struct {
	lifecycle.Base
	clock    clock.Clock
	ticks    atomic.Int64
	loops    atomic.Int64
	cleanups atomic.Int64
	failWith error
}

func (s *ticking) Start(ctx context.Context) error {
	return s.Base.Start(ctx, func(_ context.Context, run *lifecycle.Run) error {
		run.Every(s.clock, time.Millisecond, func(context.Context) { s.ticks.Add(1) })
		run.Go(func(ctx context.Context) {
			s.loops.Add(1)
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), lifecycle.ErrStopped) {
				panic("the run's context ended for another reason than Stop")
			}
		})
		run.Cleanup(func() { s.cleanups.Add(1) })
		return s.failWith
	})
}

func TestLifecycleRules(t *testing.T) {
	lifecycletest.Check(t, func(*testing.T) lifecycle.Service { return &ticking{clock: clock.Real()} }, lifecycletest.Options{})
}

func TestEveryTicksOnTheGivenClock(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	f := clock.NewFake(time.Unix(0, 0))
	s := &ticking{clock: f}
	require.NoError(t, s.Start(context.Background()))
	time.Sleep(20 * time.Millisecond)
	require.Zero(t, s.ticks.Load(), "ticked without the fake clock moving")
	for i := int64(1); i <= 3; i++ {
		f.Advance(time.Millisecond)
		require.Eventually(t, func() bool { return s.ticks.Load() == i }, 5*time.Second, time.Millisecond)
	}
	s.Stop()
	require.Equal(t, int64(1), s.cleanups.Load())
}

func TestFailedStartUndoesTheRunAndMayBeRetried(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	boom := errors.New("boom")
	s := &ticking{clock: clock.Real(), failWith: boom}
	stopped := s.Stopped()
	require.ErrorIs(t, s.Start(context.Background()), boom)
	require.False(t, s.Running())
	require.Equal(t, int64(1), s.cleanups.Load(), "the cleanups registered before the failure ran")
	select {
	case <-stopped:
	default:
		t.Fatal("Stopped is not closed after a failed start")
	}
	s.Stop() // nothing to stop
	s.failWith = nil
	require.NoError(t, s.Start(context.Background()))
	require.True(t, s.Running())
	require.Eventually(t, func() bool { return s.loops.Load() == 2 }, 5*time.Second, time.Millisecond)
	s.Stop()
	require.Equal(t, int64(2), s.cleanups.Load())
}

func TestCleanupsRunInReverseAfterTheGoroutines(t *testing.T) {
	var mu sync.Mutex
	var order []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, s)
	}
	var b lifecycle.Base
	require.NoError(t, b.Start(context.Background(), func(_ context.Context, run *lifecycle.Run) error {
		run.Cleanup(func() { note("first registered") })
		run.Go(func(ctx context.Context) {
			<-ctx.Done()
			time.Sleep(20 * time.Millisecond)
			note("goroutine")
		})
		run.Cleanup(func() { note("second registered") })
		return nil
	}))
	b.Stop()
	require.Equal(t, []string{"goroutine", "second registered", "first registered"}, order)
}

func TestStopDuringStartUpWaitsForIt(t *testing.T) {
	var b lifecycle.Base
	inStart, release := make(chan struct{}), make(chan struct{})
	var ran atomic.Bool
	go func() {
		_ = b.Start(context.Background(), func(_ context.Context, run *lifecycle.Run) error {
			close(inStart)
			<-release
			run.Cleanup(func() { ran.Store(true) })
			return nil
		})
	}()
	<-inStart
	stopped := make(chan struct{})
	go func() {
		b.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("Stop returned while the start-up ran")
	case <-time.After(30 * time.Millisecond):
	}
	close(release)
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not return after the start-up ended")
	}
	require.True(t, ran.Load(), "the run that started was stopped")
	require.False(t, b.Running())
}

// TestEveryCountsTimeFromItsCall: time that passes right after Start
// returns is counted, however late the ticking goroutine is scheduled.
func TestEveryCountsTimeFromItsCall(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for range 50 {
		f := clock.NewFake(time.Unix(0, 0))
		s := &ticking{clock: f}
		require.NoError(t, s.Start(context.Background()))
		require.Equal(t, 1, f.Waiters(), "the ticker exists when Start returns")
		f.Advance(time.Millisecond)
		require.Eventually(t, func() bool { return s.ticks.Load() == 1 }, 5*time.Second, time.Millisecond)
		s.Stop()
	}
}

// TestNoCallStartsAfterTheEnd: a tick that came while a call ran is ready
// together with the end; select would pick either, and a call started
// then would outlive its Stop (a heartbeat written after the last one).
func TestNoCallStartsAfterTheEnd(t *testing.T) {
	for range 40 {
		f := clock.NewFake(time.Unix(0, 0))
		ctx, cancel := context.WithCancel(context.Background())
		inCall, release := make(chan struct{}), make(chan struct{})
		var calls atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			lifecycle.Every(ctx, f, time.Millisecond, func(context.Context) {
				if calls.Add(1) == 1 {
					close(inCall)
					<-release
				}
			})
		}()
		require.NoError(t, f.BlockUntil(context.Background(), 1))
		f.Advance(time.Millisecond)
		<-inCall
		f.Advance(time.Millisecond) // the next tick waits while the call runs
		cancel()
		close(release)
		<-done
		require.EqualValues(t, 1, calls.Load(), "a call started after the context ended")
	}
}
