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
	mu    sync.Mutex
	nodes []string
	ages  []time.Duration
	dead  []store.NodesDeadRecoverParams
	err   error
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
	f.ages = append(f.ages, p.OlderThan)
	return 0, nil
}

func (f *fakeStore) NodesDeadRecover(_ context.Context, p store.NodesDeadRecoverParams) ([]store.DeadNode, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dead = append(f.dead, p)
	return []store.DeadNode{{Node: "gone", Requeued: 2, Orphaned: 3}}, nil
}

func TestStartOrphansOwnTasksFirstThenSweepsStaleClaimsAndDeadNodes(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := &fakeStore{}
	swept := make(chan int64, 10)
	r := New(Config{Node: "n1", Store: f, OrphanAfter: 5 * time.Minute, DeadAfter: 7 * time.Second, Every: 10 * time.Millisecond, Reaped: func(n int64) { swept <- n }})
	require.NoError(t, r.Start(context.Background()))
	f.mu.Lock()
	require.Equal(t, []string{"n1"}, f.nodes, "own leftovers are orphaned synchronously in Start")
	f.mu.Unlock()
	select {
	case n := <-swept:
		require.Equal(t, int64(5), n, "a sweep counts the dead node's requeued and orphaned tasks")
	case <-time.After(5 * time.Second):
		t.Fatal("no sweep")
	}
	r.Stop()
	r.Stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.NotEmpty(t, f.ages)
	require.Equal(t, 5*time.Minute, f.ages[0], "stale means claimed longer ago than OrphanAfter (by the server's clock)")
	require.NotEmpty(t, f.dead)
	require.Equal(t, store.NodesDeadRecoverParams{DeadAfter: 7 * time.Second, By: "n1"}, f.dead[0])
}

func TestStartFailsWhenOwnOrphansCannotBeWritten(t *testing.T) {
	f := &fakeStore{err: errors.New("no primary")}
	r := New(Config{Node: "n1", Store: f})
	err := r.Start(context.Background())
	require.ErrorContains(t, err, "no primary")
	r.Stop() // nothing started: no-op
}

func TestNoJudgingUntilAllowed(t *testing.T) {
	f := &fakeStore{}
	may := false
	r := New(Config{Node: "n1", Store: f, MayJudge: func() bool { return may }})
	require.Equal(t, int64(0), r.Sweep(context.Background()))
	require.Empty(t, f.dead, "not yet allowed")
	require.Len(t, f.ages, 1, "stale claims are still swept")
	may = true
	require.Equal(t, int64(5), r.Sweep(context.Background()))
	require.Len(t, f.dead, 1)
}

func TestNegativeDeadAfterTurnsDetectionOff(t *testing.T) {
	f := &fakeStore{}
	r := New(Config{Node: "n1", Store: f, DeadAfter: -1})
	require.Equal(t, int64(0), r.Sweep(context.Background()))
	require.Empty(t, f.dead)
	require.Len(t, f.ages, 1)
}
