package events_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/events"
)

// TestListenKeepsTheOrderAcrossTopics: a queue's change is handled before
// the task event published after it, even when its handler is slower and
// each topic has its own consumer.
func TestListenKeepsTheOrderAcrossTopics(t *testing.T) {
	bus := events.NewBus(slog.New(slog.DiscardHandler))
	t.Cleanup(func() { _ = bus.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var mu sync.Mutex
	var order []string
	record := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, s)
	}
	spawn, _ := spawner(t, ctx)
	require.NoError(t, events.Listen(ctx, bus, events.TopicQueues, spawn, func(any, error) {
		time.Sleep(50 * time.Millisecond)
		record("queue")
	}))
	require.NoError(t, events.Listen(ctx, bus, events.TopicTasks, spawn, func(any, error) { record("task") }))

	q := bson.NewObjectID()
	for _, ev := range []struct {
		topic string
		ev    any
	}{
		{events.TopicQueues, events.QueueChanged{Op: events.OpUpdate, ID: q}},
		{events.TopicTasks, events.TaskChanged{Op: events.OpInsert, Queue: q}},
	} {
		msg, err := events.Encode(ev.ev)
		require.NoError(t, err)
		require.NoError(t, <-publish(bus, ev.topic, msg))
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 2
	}, 5*time.Second, time.Millisecond)
	require.Equal(t, []string{"queue", "task"}, order)
}

// spawner is a lifecycle run's Go for Listen: goroutines on a context of
// ctx's, ended and waited for when the test ends. It counts its calls.
func spawner(t *testing.T, ctx context.Context) (func(func(context.Context)), *atomic.Int32) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	var calls atomic.Int32
	return func(f func(context.Context)) {
		calls.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(ctx)
		}()
	}, &calls
}

// publish publishes msg on topic in a goroutine of its own, and reports
// its result, or an error if it has not returned within 5 s: a publish
// waits for every subscriber's acknowledgement, and a test must fail, not
// hang, when one never comes.
func publish(bus message.Publisher, topic string, msg *message.Message) <-chan error {
	res := make(chan error, 1)
	done := make(chan error, 1)
	go func() { done <- bus.Publish(topic, msg) }()
	go func() {
		select {
		case err := <-done:
			res <- err
		case <-time.After(5 * time.Second):
			res <- errors.New("the publish on " + topic + " was not acknowledged within 5 s")
		}
	}()
	return res
}

// TestListenReadsItsSubscriptionBeforeItReturns: Listen has started the
// reader when it returns, so an event published on the topic while the
// next Listen subscribes is read and acknowledged, and that Listen, which
// waits for the bus's subscriber lock the publisher holds meanwhile,
// returns (a node's start stalled so in the fault suite).
func TestListenReadsItsSubscriptionBeforeItReturns(t *testing.T) {
	bus := events.NewBus(slog.New(slog.DiscardHandler))
	t.Cleanup(func() { _ = bus.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	spawn, spawned := spawner(t, ctx)
	heard := make(chan any, 1)
	require.NoError(t, events.Listen(ctx, bus, events.TopicKills, spawn, func(ev any, err error) {
		select {
		case heard <- ev:
		default: // one is enough
		}
	}))
	require.EqualValues(t, 1, spawned.Load(), "Listen returned before it started the subscription's reader")

	id := bson.NewObjectID()
	msg, err := events.Encode(events.KillRequested{ID: id})
	require.NoError(t, err)
	published := publish(bus, events.TopicKills, msg)
	listened := make(chan error, 1)
	go func() {
		listened <- events.Listen(ctx, bus, events.TopicRescan, spawn, func(any, error) {})
	}()
	select {
	case err := <-listened:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the next Listen never returned: an event on the first topic was never read")
	}
	require.NoError(t, <-published, "an event on a topic listened to was never read")
	require.Equal(t, events.KillRequested{ID: id}, <-heard)
}

// TestListenSaysWhichSubscriptionFailed: a closed bus's refusal names the
// topic.
func TestListenSaysWhichSubscriptionFailed(t *testing.T) {
	bus := events.NewBus(slog.New(slog.DiscardHandler))
	require.NoError(t, bus.Close())
	err := events.Listen(context.Background(), bus, events.TopicKills, func(func(context.Context)) { t.Error("spawned a reader for a failed subscription") }, func(any, error) {})
	require.ErrorContains(t, err, "subscribe to "+events.TopicKills)
}
