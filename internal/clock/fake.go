package clock

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Fake is a Clock that moves only when a test says so. Timers and tickers
// fire, in time order, as Advance passes their deadlines; like the real
// ones, their channels hold one value and a tick nobody received is
// dropped.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*fakeWaiter
	changed chan struct{} // closed and replaced when waiters change
}

type fakeWaiter struct {
	at     time.Time
	period time.Duration // 0 for a timer
	ch     chan time.Time
}

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, changed: make(chan struct{})}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Since is Now().Sub(t).
func (f *Fake) Since(t time.Time) time.Duration { return f.Now().Sub(t) }

// After returns a channel that receives once d has been advanced past.
func (f *Fake) After(d time.Duration) <-chan time.Time { return f.NewTimer(d).C() }

// NewTimer returns a timer that fires once d has been advanced past.
func (f *Fake) NewTimer(d time.Duration) Timer {
	w := &fakeWaiter{ch: make(chan time.Time, 1)}
	f.mu.Lock()
	defer f.mu.Unlock()
	w.at = f.now.Add(d)
	f.add(w)
	return &fakeTimer{f: f, w: w}
}

// NewTicker returns a ticker that fires every d of advanced time.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	w := &fakeWaiter{period: d, ch: make(chan time.Time, 1)}
	f.mu.Lock()
	defer f.mu.Unlock()
	w.at = f.now.Add(d)
	f.add(w)
	return &fakeTicker{f: f, w: w}
}

// Advance moves the clock forward by d, firing every timer and ticker whose
// time comes, in order, each at its own time.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	end := f.now.Add(d)
	for {
		sort.SliceStable(f.waiters, func(i, j int) bool { return f.waiters[i].at.Before(f.waiters[j].at) })
		if len(f.waiters) == 0 || f.waiters[0].at.After(end) {
			break
		}
		w := f.waiters[0]
		f.now = w.at
		select {
		case w.ch <- w.at:
		default: // not received yet: dropped, as time.Ticker does
		}
		if w.period > 0 {
			w.at = w.at.Add(w.period)
		} else {
			f.remove(w)
		}
	}
	f.now = end
}

// Waiters returns how many timers and tickers are waiting to fire.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// BlockUntil waits until at least n timers and tickers are waiting, so a
// test can advance time knowing the goroutines it means to wake are
// listening. It returns ctx's error if ctx ends first.
func (f *Fake) BlockUntil(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		have, changed := len(f.waiters), f.changed
		f.mu.Unlock()
		if have >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// add and remove are called with mu held.
func (f *Fake) add(w *fakeWaiter) {
	f.waiters = append(f.waiters, w)
	f.notify()
}

func (f *Fake) remove(w *fakeWaiter) bool {
	for i, x := range f.waiters {
		if x == w {
			f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
			f.notify()
			return true
		}
	}
	return false
}

func (f *Fake) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

type fakeTimer struct {
	f *Fake
	w *fakeWaiter
}

func (t *fakeTimer) C() <-chan time.Time { return t.w.ch }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.f.remove(t.w)
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	active := t.f.remove(t.w)
	t.w.at = t.f.now.Add(d)
	t.f.add(t.w)
	return active
}

type fakeTicker struct {
	f *Fake
	w *fakeWaiter
}

func (t *fakeTicker) C() <-chan time.Time { return t.w.ch }

func (t *fakeTicker) Stop() {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.f.remove(t.w)
}

func (t *fakeTicker) Reset(d time.Duration) {
	if d <= 0 {
		panic("clock: non-positive interval for Reset")
	}
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.f.remove(t.w)
	t.w.period, t.w.at = d, t.f.now.Add(d)
	t.f.add(t.w)
}
