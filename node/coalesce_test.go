package node

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCoalescerFlushesALoneWriteAtOnceAndGroupsTheRest(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var sizes []int
	gate := make(chan struct{})
	c := newCoalescer(3, func(items []int) []error {
		mu.Lock()
		sizes = append(sizes, len(items))
		first := len(sizes) == 1
		mu.Unlock()
		if first {
			<-gate // hold the first flush while others queue up
		}
		errs := make([]error, len(items))
		for i, it := range items {
			if it < 0 {
				errs[i] = errors.New("negative")
			}
		}
		return errs
	})
	ctx := context.Background()
	res := make(chan error, 10)
	go func() { res <- c.do(ctx, 1) }()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes) == 1 }, time.Second, time.Millisecond, "a lone write is flushed at once")
	for _, v := range []int{2, 3, -4, 5, 6} {
		go func() { res <- c.do(ctx, v) }()
	}
	require.Eventually(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.pending) == 5 }, time.Second, time.Millisecond)
	close(gate)
	var failed int
	for range 6 {
		if err := <-res; err != nil {
			require.EqualError(t, err, "negative")
			failed++
		}
	}
	require.Equal(t, 1, failed, "each write gets its own error")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1, 3, 2}, sizes, "then groups of at most max")
}

func TestCoalescerCallerMayGiveUp(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	c := newCoalescer(8, func(items []int) []error { <-gate; return make([]error, len(items)) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.do(ctx, 1), context.DeadlineExceeded)
	close(gate)
	require.NoError(t, c.do(context.Background(), 2), "the loop lives on")
}
