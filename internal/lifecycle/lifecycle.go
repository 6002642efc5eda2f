// Package lifecycle gives every long-lived service of this project the same
// Start/Stop rules, in the spirit of River's startstop:
//
//   - Start runs the service's start-up synchronously and returns its error.
//     The context given to Start bounds the start-up only: once started, the
//     service runs until Stop, on a context of its own that keeps the
//     values (trace context) of the caller's.
//   - Start on a running service does nothing and returns nil.
//   - A start-up that fails leaves nothing running: what it had started is
//     undone, and Start may be called again.
//   - Stop cancels the run's context, waits for every goroutine the run
//     started with Go or Every, then runs its cleanups, the last registered
//     first. Stop on a service that is not running (never started, already
//     stopped) returns at once; concurrent Stops all return once it stopped.
//   - After Stop, Start starts a new run.
//   - Started is closed once a run's start-up succeeded, Stopped once that
//     run has fully stopped (or its start-up failed). Before the first run
//     they are the first run's; a new run gets new ones.
//
// A service embeds a Base (or holds one) and calls Start with its start-up
// function; Stop, Started and Stopped come with it.
package lifecycle

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/disbatch-go/disbatch/internal/clock"
)

// ErrStopped is the cause of a run's context when Stop ends it.
var ErrStopped = errors.New("service stopped")

// Base implements the lifecycle. The zero value is ready to use.
type Base struct {
	// op serializes Start and Stop: a Stop during start-up waits for it.
	op sync.Mutex

	mu      sync.Mutex
	run     *Run // the current run, nil when not running
	started chan struct{}
	stopped chan struct{}
}

// Run is one run of a service, handed to its start-up function.
type Run struct {
	ctx      context.Context
	cancel   context.CancelCauseFunc
	wg       sync.WaitGroup
	mu       sync.Mutex
	cleanups []func()
}

// Context is the run's context: cancelled (cause ErrStopped) by Stop.
func (r *Run) Context() context.Context { return r.ctx }

// Go runs fn in a goroutine that Stop waits for; fn must return when ctx
// (the run's context) ends.
func (r *Run) Go(fn func(ctx context.Context)) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		fn(r.ctx)
	}()
}

// Every calls fn every interval d of clock c (first after d) until Stop.
// A call that outlasts the interval delays the next one rather than
// piling up. The ticker exists when Every returns, so time that passes
// after it (a fake clock advanced by a test) is counted.
func (r *Run) Every(c clock.Clock, d time.Duration, fn func(ctx context.Context)) {
	t := clock.Or(c).NewTicker(d)
	r.Go(func(ctx context.Context) {
		tick(ctx, t, fn)
	})
}

// Every calls fn every interval d of clock c (first after d) until ctx
// ends: the ticker loop of services that run one outside a Run.
func Every(ctx context.Context, c clock.Clock, d time.Duration, fn func(ctx context.Context)) {
	tick(ctx, clock.Or(c).NewTicker(d), fn)
}

func tick(ctx context.Context, t clock.Ticker, fn func(ctx context.Context)) {
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		// A tick and the end can be ready together, and select picks
		// either: no call starts once ctx ended.
		if ctx.Err() != nil {
			return
		}
		fn(ctx)
	}
}

// Cleanup registers fn to run at Stop, after the run's goroutines ended,
// in the reverse order of registration; or at once, in that order, if the
// start-up fails after registering it.
func (r *Run) Cleanup(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, fn)
}

func (r *Run) finish() {
	r.cancel(ErrStopped)
	r.wg.Wait()
	r.mu.Lock()
	cleanups := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
}

// Start starts a run unless one is running: start is called with the
// caller's ctx for its start-up work and the run, whose Go, Every and
// Cleanup it uses. An error from start undoes the run and is returned.
func (b *Base) Start(ctx context.Context, start func(ctx context.Context, run *Run) error) error {
	b.op.Lock()
	defer b.op.Unlock()
	b.mu.Lock()
	if b.run != nil {
		b.mu.Unlock()
		return nil
	}
	b.freshChannels()
	started, stopped := b.started, b.stopped
	b.mu.Unlock()

	rctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	run := &Run{ctx: rctx, cancel: cancel}
	if err := start(ctx, run); err != nil {
		run.finish()
		close(stopped)
		return err
	}
	b.mu.Lock()
	b.run = run
	b.mu.Unlock()
	close(started)
	return nil
}

// freshChannels makes new signal channels when the last run is over (mu
// held).
func (b *Base) freshChannels() {
	if b.started == nil || isClosed(b.stopped) {
		b.started, b.stopped = make(chan struct{}), make(chan struct{})
	}
}

func isClosed(ch chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Stop ends the run, if any, and returns when it has fully stopped.
func (b *Base) Stop() {
	b.op.Lock()
	defer b.op.Unlock()
	b.mu.Lock()
	run, stopped := b.run, b.stopped
	b.mu.Unlock()
	if run == nil {
		return
	}
	run.finish()
	b.mu.Lock()
	b.run = nil
	b.mu.Unlock()
	close(stopped)
}

// Running reports whether a run has started and not stopped.
func (b *Base) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.run != nil
}

// Started is closed once the current (or next) run's start-up succeeded.
func (b *Base) Started() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started == nil {
		b.started, b.stopped = make(chan struct{}), make(chan struct{})
	}
	return b.started
}

// Stopped is closed once the current (or next) run has fully stopped.
func (b *Base) Stopped() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped == nil {
		b.started, b.stopped = make(chan struct{}), make(chan struct{})
	}
	return b.stopped
}
