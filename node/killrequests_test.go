package node

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

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

// publishingBetween is the node's bus as the change stream uses it while
// the listener starts: when the listener subscribes to Rescan, a kill has
// just been published on its first topic, before anyone read it.
type publishingBetween struct {
	*gochannel.GoChannel
	id      bson.ObjectID
	blocked chan struct{} // closed when the publish did not return
}

func (p *publishingBetween) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == events.TopicRescan {
		msg, err := events.Encode(events.KillRequested{ID: p.id, Request: schema.KillRequest{Node: "n1", By: "ops"}})
		if err != nil {
			return nil, err
		}
		done := make(chan error, 1)
		go func() { done <- p.Publish(events.TopicKills, msg) }()
		select {
		case err := <-done:
			if err != nil {
				return nil, err
			}
		case <-time.After(5 * time.Second):
			// The subscriber lock is held by the stalled publish: a
			// Subscribe now would never return.
			close(p.blocked)
			return nil, errors.New("a kill published between the listener's subscriptions was never read")
		}
	}
	return p.GoChannel.Subscribe(ctx, topic)
}

// A kill published while the listener starts (the stream runs from before
// it: a stepdown's resume, an operator's kill) does not stall the
// listener's next subscription, and with it the node's start: seen in the
// fault suite, a node restarted during a stepdown that never said
// "node started".
func TestAKillPublishedWhileTheListenerSubscribesDoesNotStallIt(t *testing.T) {
	// Not parallel: goleak must see only this listener's goroutines.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	bus := &publishingBetween{GoChannel: events.NewBus(nil), id: bson.NewObjectID(), blocked: make(chan struct{})}
	defer bus.Close()
	killed := make(chan bson.ObjectID, 1)
	s := &killRequests{node: "n1", store: &pendingKills{}, events: bus, tick: time.Hour, clock: clock.NewFake(time.Now()),
		log: slog.New(slog.DiscardHandler), kill: func(id bson.ObjectID, _ error) bool { killed <- id; return true }}
	err := s.Start(context.Background())
	select {
	case <-bus.blocked:
		t.Fatal("the kill published between the subscriptions was never read: the next Subscribe would wait for ever")
	default:
	}
	require.NoError(t, err)
	defer s.Stop()
	select {
	case got := <-killed:
		require.Equal(t, bus.id, got)
	case <-time.After(5 * time.Second):
		t.Fatal("the kill published while the listener started was not carried out")
	}
}
