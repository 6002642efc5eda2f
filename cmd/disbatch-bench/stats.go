package main

import (
	"math"
	"slices"
	"time"
)

// Latency summarises a sample of durations, in milliseconds.
type Latency struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// summarize returns the percentiles of d (nearest rank); d is not changed.
func summarize(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return Latency{
		N:   len(s),
		P50: ms(percentile(s, 50)),
		P95: ms(percentile(s, 95)),
		P99: ms(percentile(s, 99)),
		Max: ms(s[len(s)-1]),
	}
}

// percentile is the nearest-rank p-th percentile of sorted, which must not
// be empty: the smallest value with at least p % of the sample at or below it.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// ratio is a/b, or 0 when that is not a finite number (JSON has no NaN;
// the sanity check reports the zero).
func ratio(a, b float64) float64 {
	r := a / b
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return 0
	}
	return r
}

// rate is n per second over d, or 0 when d is not positive.
func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
