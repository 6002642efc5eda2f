package projections_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/projections"
)

// repeat is n copies of d.
func repeat(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// TestLagFiguresSummariseTheLatestLagWindowEvents: LagP50 and LagP99 are
// over the latest LagWindow events' lags, so a benchmark that sets the
// window above a drain's events sees the drain's first events too, and the
// default window lets old ones go.
func TestLagFiguresSummariseTheLatestLagWindowEvents(t *testing.T) {
	t.Parallel()
	// A slow start: 200 events at 1 s (2% of 10,200), then 10,000 at
	// 1 ms, in a window that keeps them all.
	s := projections.New(projections.Config{Node: "n1", LagWindow: 20_000})
	s.Record(repeat(time.Second, 200)...)
	for range 10 {
		s.Record(repeat(time.Millisecond, 1000)...)
	}
	require.Equal(t, time.Second, s.Stats().LagP99, "the window holds the slow start")

	// The default window (8,192) has let the slow start go.
	s = projections.New(projections.Config{Node: "n1"})
	s.Record(repeat(time.Second, 200)...)
	for range 10 {
		s.Record(repeat(time.Millisecond, 1000)...)
	}
	require.Equal(t, time.Millisecond, s.Stats().LagP99, "only the latest %d events", projections.DefaultLagWindow)

	// A window smaller than what came keeps the latest: the ring turns.
	s = projections.New(projections.Config{Node: "n1", LagWindow: 100})
	s.Record(repeat(time.Millisecond, 150)...)
	require.Equal(t, time.Millisecond, s.Stats().LagP50)
	s.Record(repeat(time.Second, 60)...)
	require.Equal(t, time.Second, s.Stats().LagP50, "60 of the latest 100 are slow (and what came since the last Stats counts)")
	require.Equal(t, int64(210), s.Stats().Events)
}

// TestLagFiguresLetOldLagsGo: a lag counts for LagMaxAge; a slow spell
// (a new term's catch-up) stops counting once it is that old, however few
// events come after it (on a quiet cluster it counted for hours, and the
// lag alert never resolved).
func TestLagFiguresLetOldLagsGo(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	s := projections.New(projections.Config{Node: "n1", Clock: clk})
	s.Record(repeat(10*time.Second, 100)...)
	s.Record(repeat(time.Millisecond, 20)...)
	require.Equal(t, 10*time.Second, s.Stats().LagP99)
	clk.Advance(projections.LagMaxAge - time.Second)
	require.Equal(t, 10*time.Second, s.Stats().LagP99, "not yet that old")
	s.Record(repeat(2*time.Millisecond, 5)...)
	clk.Advance(2 * time.Second)
	st := s.Stats()
	require.Equal(t, 2*time.Millisecond, st.LagP99, "only the recent lags")
	clk.Advance(projections.LagMaxAge)
	st = s.Stats()
	require.Zero(t, st.LagP99, "none recent")
	require.Zero(t, st.LagP50)
}
