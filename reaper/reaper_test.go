package reaper

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/disbatch-go/disbatch/store"
)

type fakeStore struct {
	mu     sync.Mutex
	nodes  []string
	before []time.Time
	err    error
}

func (f *fakeStore) TaskOrphanNode(_ context.Context, p store.TaskOrphanNodeParams) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = append(f.nodes, p.Node)
	return 2, f.err
}

func (f *fakeStore) TaskOrphanStale(_ context.Context, p store.TaskOrphanStaleParams) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.before = append(f.before, p.ClaimedBefore)
	return 0, nil
}

func TestStartOrphansOwnTasksFirstThenSweepsWithTheClock(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := &fakeStore{}
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	swept := make(chan int64, 10)
	r := New(Config{Node: "n1", Store: f, OrphanAfter: 5 * time.Minute, Every: 10 * time.Millisecond, Now: func() time.Time { return now }, Reaped: func(n int64) { swept <- n }})
	require.NoError(t, r.Start(context.Background()))
	f.mu.Lock()
	require.Equal(t, []string{"n1"}, f.nodes, "own leftovers are orphaned synchronously in Start")
	f.mu.Unlock()
	select {
	case <-swept:
	case <-time.After(5 * time.Second):
		t.Fatal("no sweep")
	}
	r.Stop()
	r.Stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.NotEmpty(t, f.before)
	require.Equal(t, now.Add(-5*time.Minute), f.before[0], "stale means claimed before now - OrphanAfter, by the injected clock")
}

func TestStartFailsWhenOwnOrphansCannotBeWritten(t *testing.T) {
	f := &fakeStore{err: errors.New("no primary")}
	r := New(Config{Node: "n1", Store: f})
	err := r.Start(context.Background())
	require.ErrorContains(t, err, "no primary")
	r.Stop() // nothing started: no-op
}
