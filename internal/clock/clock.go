// Package clock is the time source of the services: the real clock in
// production, a fake one that tests advance by hand, so that time-based
// logic (heartbeats, fencing, leases, ticks) is tested without sleeping.
//
// Only the logic that decides something by time goes through a Clock.
// Timeouts of single operations (context.WithTimeout) stay on real time:
// they bound a wait on MongoDB, which a fake clock cannot speed up.
package clock

import "time"

// Clock tells the time and makes timers and tickers.
type Clock interface {
	Now() time.Time
	Since(t time.Time) time.Duration
	// After is time.After.
	After(d time.Duration) <-chan time.Time
	NewTimer(d time.Duration) Timer
	NewTicker(d time.Duration) Ticker
}

// Timer is a time.Timer.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is a time.Ticker.
type Ticker interface {
	C() <-chan time.Time
	Stop()
	Reset(d time.Duration)
}

// Real returns the system clock.
func Real() Clock { return real{} }

// Or returns c, or the real clock when c is nil: config defaults.
func Or(c Clock) Clock {
	if c == nil {
		return Real()
	}
	return c
}

type real struct{}

func (real) Now() time.Time                         { return time.Now() }
func (real) Since(t time.Time) time.Duration        { return time.Since(t) }
func (real) After(d time.Duration) <-chan time.Time { return time.After(d) }
func (real) NewTimer(d time.Duration) Timer         { return realTimer{time.NewTimer(d)} }
func (real) NewTicker(d time.Duration) Ticker       { return realTicker{time.NewTicker(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time        { return t.t.C }
func (t realTimer) Stop() bool                 { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time   { return t.t.C }
func (t realTicker) Stop()                 { t.t.Stop() }
func (t realTicker) Reset(d time.Duration) { t.t.Reset(d) }
