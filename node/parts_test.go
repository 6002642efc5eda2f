package node

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/internal/lifecycle/lifecycletest"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// fakeParts stands in for the store and the rest of the node, for the
// lifecycle of liveness and strays alone.
type fakeParts struct{}

func (fakeParts) NodeUpsert(context.Context, store.NodeUpsertParams) (schema.Node, error) {
	return schema.Node{}, nil
}
func (fakeParts) TaskListClaimed(context.Context, store.TaskListClaimedParams) ([]bson.ObjectID, error) {
	return nil, nil
}
func (fakeParts) TaskRelease(context.Context, store.TaskTransitionParams) error { return nil }
func (fakeParts) TaskUnstart(context.Context, store.TaskTransitionParams) error { return nil }
func (fakeParts) heartbeatQueues() ([]schema.NodeQueue, []string, []string)     { return nil, nil, nil }
func (fakeParts) fence(time.Duration)                                           {}
func (fakeParts) rejoin()                                                       {}
func (fakeParts) drain()                                                        {}
func (fakeParts) held() int                                                     { return 0 }
func (fakeParts) leftBehind() int                                               { return 0 }
func (fakeParts) beatAcked(time.Time)                                           {}
func (fakeParts) setMaxThreads(*int)                                            {}

func TestLivenessAndStraysKeepTheLifecycle(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	t.Run("liveness", func(t *testing.T) {
		lifecycletest.Check(t, func(*testing.T) lifecycle.Service {
			return newLiveness(livenessConfig{Name: "n", Store: fakeParts{}, Heartbeat: time.Millisecond, FenceAfter: time.Second, DeadAfter: 3 * time.Second},
				fakeParts{}, clock.Real(), log)
		}, lifecycletest.Options{IgnoreGoroutines: mongotest.ClientGoroutines()}) // other tests' clients run meanwhile
	})
	t.Run("strays", func(t *testing.T) {
		lifecycletest.Check(t, func(*testing.T) lifecycle.Service {
			return &strays{node: "n", store: fakeParts{}, holds: func(bson.ObjectID) bool { return false }, fenced: func() bool { return false }, clock: clock.Real(), log: log}
		}, lifecycletest.Options{IgnoreGoroutines: mongotest.ClientGoroutines()}) // other tests' clients run meanwhile
	})
}

// fenceOrder records what liveness did to the node last; its fence waits
// for release, as a fence that kills tasks takes a while.
type fenceOrder struct {
	fakeParts
	entered, release chan struct{}
	mu               sync.Mutex
	paused           bool
}

func (f *fenceOrder) fence(time.Duration) {
	close(f.entered)
	<-f.release
	f.mu.Lock()
	f.paused = true
	f.mu.Unlock()
}

func (f *fenceOrder) rejoin() {
	f.mu.Lock()
	f.paused = false
	f.mu.Unlock()
}

// TestARejoinDuringAFenceIsNotLost: a heartbeat acknowledged while the
// fence is still pausing the node rejoins after the pause, not before it
// (which left a node paused for good: CI's fault suite saw one run
// nothing after a step-down).
func TestARejoinDuringAFenceIsNotLost(t *testing.T) {
	target := &fenceOrder{entered: make(chan struct{}), release: make(chan struct{})}
	l := newLiveness(livenessConfig{Name: "n", Store: fakeParts{}, Heartbeat: time.Second, FenceAfter: time.Second, DeadAfter: 3 * time.Second},
		target, clock.Real(), slog.New(slog.DiscardHandler))
	fenced := make(chan struct{})
	go func() {
		defer close(fenced)
		l.fence(2 * time.Second)
	}()
	<-target.entered
	wrote := make(chan error, 1)
	go func() { wrote <- l.write(context.Background(), nil, schema.NodeStateRunning, false) }()
	select {
	case err := <-wrote: // the heartbeat did not wait for the fence
		require.NoError(t, err)
		wrote <- nil
	case <-time.After(200 * time.Millisecond):
	}
	close(target.release)
	<-fenced
	require.NoError(t, <-wrote)
	target.mu.Lock()
	defer target.mu.Unlock()
	require.False(t, target.paused, "the acknowledged heartbeat's rejoin must come after the fence's pause")
}
