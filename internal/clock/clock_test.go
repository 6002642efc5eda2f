package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/clock"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func received(ch <-chan time.Time) (time.Time, bool) {
	select {
	case v := <-ch:
		return v, true
	default:
		return time.Time{}, false
	}
}

func TestFakeTimerFiresOnlyWhenAdvancedPast(t *testing.T) {
	t.Parallel()
	f := clock.NewFake(t0)
	tm := f.NewTimer(time.Second)
	f.Advance(999 * time.Millisecond)
	_, ok := received(tm.C())
	require.False(t, ok, "fired early")
	f.Advance(time.Millisecond)
	at, ok := received(tm.C())
	require.True(t, ok)
	require.Equal(t, t0.Add(time.Second), at)
	require.Zero(t, f.Waiters(), "a fired timer is gone")
	f.Advance(time.Hour)
	_, ok = received(tm.C())
	require.False(t, ok, "a timer fires once")
	require.Equal(t, t0.Add(time.Hour+time.Second), f.Now())
	require.Equal(t, time.Hour, f.Since(t0.Add(time.Second)))
}

func TestFakeTimerStopAndReset(t *testing.T) {
	t.Parallel()
	f := clock.NewFake(t0)
	tm := f.NewTimer(time.Second)
	require.True(t, tm.Stop())
	require.False(t, tm.Stop())
	f.Advance(2 * time.Second)
	_, ok := received(tm.C())
	require.False(t, ok, "a stopped timer does not fire")
	require.False(t, tm.Reset(time.Second), "it was not active")
	f.Advance(time.Second)
	at, ok := received(tm.C())
	require.True(t, ok)
	require.Equal(t, t0.Add(3*time.Second), at, "reset counts from the time of the reset")
}

func TestFakeTickerDropsUnreceivedTicksAndKeepsItsPhase(t *testing.T) {
	t.Parallel()
	f := clock.NewFake(t0)
	tk := f.NewTicker(100 * time.Millisecond)
	f.Advance(350 * time.Millisecond)
	at, ok := received(tk.C())
	require.True(t, ok)
	require.Equal(t, t0.Add(100*time.Millisecond), at, "the first tick stays; later ones are dropped while it is unread")
	_, ok = received(tk.C())
	require.False(t, ok)
	f.Advance(50 * time.Millisecond)
	at, ok = received(tk.C())
	require.True(t, ok)
	require.Equal(t, t0.Add(400*time.Millisecond), at)
	tk.Reset(time.Second)
	f.Advance(999 * time.Millisecond)
	_, ok = received(tk.C())
	require.False(t, ok)
	f.Advance(time.Millisecond)
	_, ok = received(tk.C())
	require.True(t, ok)
	tk.Stop()
	f.Advance(time.Hour)
	_, ok = received(tk.C())
	require.False(t, ok)
}

func TestFakeFiresInTimeOrderAndNowIsEachDeadline(t *testing.T) {
	t.Parallel()
	f := clock.NewFake(t0)
	late := f.NewTimer(300 * time.Millisecond)
	early := f.NewTimer(100 * time.Millisecond)
	after := f.After(200 * time.Millisecond)
	f.Advance(time.Second)
	a, _ := received(early.C())
	b, _ := received(after)
	c, _ := received(late.C())
	require.Equal(t, []time.Time{t0.Add(100 * time.Millisecond), t0.Add(200 * time.Millisecond), t0.Add(300 * time.Millisecond)}, []time.Time{a, b, c})
}

func TestBlockUntilWaitsForWaiters(t *testing.T) {
	t.Parallel()
	f := clock.NewFake(t0)
	done := make(chan error, 1)
	go func() { done <- f.BlockUntil(context.Background(), 2) }()
	f.NewTicker(time.Second)
	select {
	case <-done:
		t.Fatal("returned with one waiter")
	case <-time.After(20 * time.Millisecond):
	}
	f.NewTimer(time.Second)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("BlockUntil did not return with two waiters")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, f.BlockUntil(ctx, 3), context.Canceled)
}

func TestRealClockTicks(t *testing.T) {
	t.Parallel()
	c := clock.Or(nil)
	start := c.Now()
	tk := c.NewTicker(time.Millisecond)
	defer tk.Stop()
	<-tk.C()
	<-c.After(time.Millisecond)
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	require.GreaterOrEqual(t, c.Since(start), 2*time.Millisecond)
}
