package node

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/events"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// pendingKills answers TaskKillsPending from a list (pure logic: the
// listener's timing, not the query, is under test).
type pendingKills struct {
	mu    sync.Mutex
	reqs  []store.TaskKillRequest
	swept chan struct{} // when set, told of each read
}

func (p *pendingKills) TaskKillsPending(context.Context, string) ([]store.TaskKillRequest, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.swept != nil {
		p.swept <- struct{}{}
	}
	return append([]store.TaskKillRequest(nil), p.reqs...), nil
}

// A kill request the stream never delivered (written while it was let go,
// or in history it lost) is carried out at the stream's Rescan, not a tick
// later: the reopened stream starts at the present, after the request.
func TestAKillTheStreamDidNotDeliverIsSweptAtItsRescan(t *testing.T) {
	bus := events.NewBus(nil)
	defer bus.Close()
	pending := &pendingKills{}
	killed := make(chan bson.ObjectID, 1)
	s := &killRequests{node: "n1", store: pending, events: bus, tick: time.Hour, clock: clock.NewFake(time.Now()),
		log: slog.New(slog.DiscardHandler), kill: func(id bson.ObjectID, _ error) bool { killed <- id; return true }}
	require.NoError(t, s.Start(context.Background()))
	defer s.Stop()

	id := bson.NewObjectID()
	pending.mu.Lock()
	pending.reqs = append(pending.reqs, store.TaskKillRequest{ID: id, Request: schema.KillRequest{Node: "n1", By: "ops"}})
	pending.mu.Unlock()
	select {
	case <-killed:
		t.Fatal("carried out before any sweep was due: the test proves nothing")
	case <-time.After(50 * time.Millisecond):
	}

	msg, err := events.Encode(events.Rescan{Reason: "wake-ups needed again after a quiet spell", Quiet: true})
	require.NoError(t, err)
	require.NoError(t, bus.Publish(events.TopicRescan, msg))
	select {
	case got := <-killed:
		require.Equal(t, id, got)
	case <-time.After(5 * time.Second):
		t.Fatal("the request was not carried out at the Rescan (the fake clock's tick is an hour away)")
	}
}

// While the stream is let go, requests are swept every QuietAfter, but
// only while the node holds a task: a node that is no queue's listener
// lets its stream go idle too, and with nothing to kill it sweeps by the
// tick.
func TestAQuietNodeSweepsOftenOnlyWhileItHoldsATask(t *testing.T) {
	pending := &pendingKills{swept: make(chan struct{}, 10)}
	fake := clock.NewFake(time.Now())
	var holding atomic.Bool
	s := &killRequests{node: "n1", store: pending, tick: time.Second, clock: fake, log: slog.New(slog.DiscardHandler),
		kill: func(bson.ObjectID, error) bool { return true }, quiet: func() bool { return true }, holding: holding.Load}
	require.NoError(t, s.Start(context.Background()))
	defer s.Stop()
	step := func(want bool, why string) {
		t.Helper()
		fake.Advance(claimer.QuietAfter)
		wait := 100 * time.Millisecond // none within this: none at all
		if want {
			wait = 10 * time.Second // a loaded machine may be slow to run it
		}
		select {
		case <-pending.swept:
			require.True(t, want, "swept: %s", why)
		case <-time.After(wait):
			require.False(t, want, "not swept: %s", why)
		}
	}
	step(true, "the first sweep")
	step(false, "holding nothing, a quarter of the tick since the last")
	step(false, "holding nothing, half the tick")
	step(false, "holding nothing, three quarters")
	step(true, "holding nothing, the tick")
	holding.Store(true)
	step(true, "holding a task, QuietAfter since the last")
	step(true, "holding a task, QuietAfter again")
}
