package node

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/store"
)

// fakeSource delivers n batches (their Lost naming them), then blocks
// until ctx ends; it counts the Next calls in progress.
type fakeSource struct {
	n, sent int
	inNext  atomic.Int32
}

func (s *fakeSource) Next(ctx context.Context) (store.StreamBatch, error) {
	s.inNext.Add(1)
	defer s.inNext.Add(-1)
	if s.sent < s.n {
		s.sent++
		return store.StreamBatch{Lost: strconv.Itoa(s.sent)}, nil
	}
	<-ctx.Done()
	return store.StreamBatch{}, ctx.Err()
}

// TestSharedStreamGivesEveryDutyEveryBatchInOrder: two duties on one
// source each hear every batch, in order; when one ends with an error the
// other is ended, the error is returned, and the source is no longer read.
func TestSharedStreamGivesEveryDutyEveryBatchInOrder(t *testing.T) {
	src := &fakeSource{n: 20}
	heard := make([][]string, 2)
	boom := errors.New("boom")
	otherEnded := make(chan error, 1)
	otherRead := make(chan struct{})
	read := func(i int, ctx context.Context, src batchSource) error {
		for len(heard[i]) < 20 {
			b, err := src.Next(ctx)
			if err != nil {
				return err
			}
			heard[i] = append(heard[i], b.Lost)
		}
		return nil
	}
	duties := []streamDuty{
		func(ctx context.Context, _ leadership.Term, src batchSource) error {
			if err := read(0, ctx, src); err != nil {
				return err
			}
			<-otherRead
			return boom
		},
		func(ctx context.Context, _ leadership.Term, src batchSource) error {
			if err := read(1, ctx, src); err != nil {
				return err
			}
			close(otherRead)
			_, err := src.Next(ctx) // nothing more comes: waits to be ended
			otherEnded <- err
			return nil
		},
	}
	done := make(chan error, 1)
	go func() { done <- teeRun(context.Background(), leadership.Term{}, src, duties) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, boom)
	case <-time.After(10 * time.Second):
		t.Fatal("teeRun did not return after a duty failed")
	}
	require.Error(t, <-otherEnded, "the other duty's Next ends when one duty ended")
	var want []string
	for i := 1; i <= 20; i++ {
		want = append(want, strconv.Itoa(i))
	}
	require.Equal(t, want, heard[0])
	require.Equal(t, want, heard[1])
	require.Zero(t, src.inNext.Load(), "the source is not read once teeRun returned")
}

// TestSharedStreamEndsWithItsContext: the term's end ends every duty and
// the reading of the source; no error.
func TestSharedStreamEndsWithItsContext(t *testing.T) {
	src := &fakeSource{}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{}, 2)
	duty := func(ctx context.Context, _ leadership.Term, src batchSource) error {
		started <- struct{}{}
		for {
			if _, err := src.Next(ctx); err != nil {
				return nil // ended
			}
		}
	}
	done := make(chan error, 1)
	go func() { done <- teeRun(ctx, leadership.Term{}, src, []streamDuty{duty, duty}) }()
	<-started
	<-started
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("teeRun did not end with its context")
	}
	require.Zero(t, src.inNext.Load())
}
