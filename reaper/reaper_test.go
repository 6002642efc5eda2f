package reaper

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/leadership"
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

func (f *fakeStore) LeaseSessionStart(context.Context, store.LeaseRef) (*store.LeaseSession, error) {
	return nil, nil
}

func TestOrphanOwnThenTheLeaderSweepsStaleClaimsAndDeadNodesEveryInterval(t *testing.T) {
	defer goleak.VerifyNone(t)
	f := &fakeStore{}
	swept := make(chan int64, 10)
	fake := clock.NewFake(time.Now())
	r := New(Config{Node: "n1", Store: f, OrphanAfter: 5 * time.Minute, DeadAfter: 7 * time.Second, Every: time.Second, Clock: fake, Reaped: func(n int64) { swept <- n }})
	require.NoError(t, r.OrphanOwn(context.Background()))
	f.mu.Lock()
	require.Equal(t, []string{"n1"}, f.nodes, "own leftovers are orphaned")
	f.mu.Unlock()

	// The duty runs while the term lasts, one sweep per interval.
	ctx, endTerm := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Lead(ctx, leadership.Term{}) }()
	require.NoError(t, fake.BlockUntil(ctx, 1))
	select {
	case <-swept:
		t.Fatal("swept before an interval passed")
	case <-time.After(20 * time.Millisecond):
	}
	for range 3 {
		fake.Advance(time.Second)
		select {
		case n := <-swept:
			require.Equal(t, int64(5), n, "a sweep counts the dead node's requeued and orphaned tasks")
		case <-time.After(5 * time.Second):
			t.Fatal("no sweep")
		}
	}
	endTerm()
	require.NoError(t, <-done)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.NotEmpty(t, f.ages)
	require.Equal(t, 5*time.Minute, f.ages[0], "stale means claimed longer ago than OrphanAfter (by the server's clock)")
	require.NotEmpty(t, f.dead)
	require.Equal(t, store.NodesDeadRecoverParams{DeadAfter: 7 * time.Second, By: "n1"}, f.dead[0])
}

func TestOrphanOwnFailsWhenItCannotBeWritten(t *testing.T) {
	f := &fakeStore{err: errors.New("no primary")}
	r := New(Config{Node: "n1", Store: f})
	require.ErrorContains(t, r.OrphanOwn(context.Background()), "no primary")
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
