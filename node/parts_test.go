package node

import (
	"context"
	"log/slog"
	"testing"
	"time"

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
func (fakeParts) heartbeatQueues() []schema.NodeQueue                           { return nil }
func (fakeParts) fence(time.Duration)                                           {}
func (fakeParts) rejoin()                                                       {}
func (fakeParts) drain()                                                        {}
func (fakeParts) held() int                                                     { return 0 }
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
