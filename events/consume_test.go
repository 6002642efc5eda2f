package events_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

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
	spawn := spawner(t, ctx)
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
		require.NoError(t, bus.Publish(ev.topic, msg))
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 2
	}, 5*time.Second, time.Millisecond)
	require.Equal(t, []string{"queue", "task"}, order)
}

// spawner is a lifecycle run's Go for Listen: goroutines on a context of
// ctx's, ended and waited for when the test ends.
func spawner(t *testing.T, ctx context.Context) func(func(context.Context)) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return func(f func(context.Context)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(ctx)
		}()
	}
}

// TestListenReadsItsSubscriptionBeforeItReturns: an event published on a
// topic just listened to is read at once, so the publisher, which holds the
// bus's subscriber lock until every subscriber acknowledged, does not stall
// the next Listen (a node's start stalled so in the fault suite).
func TestListenReadsItsSubscriptionBeforeItReturns(t *testing.T) {
	bus := events.NewBus(slog.New(slog.DiscardHandler))
	t.Cleanup(func() { _ = bus.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	spawn := spawner(t, ctx)
	heard := make(chan any, 1)
	require.NoError(t, events.Listen(ctx, bus, events.TopicKills, spawn, func(ev any, err error) { heard <- ev }))

	id := bson.NewObjectID()
	msg, err := events.Encode(events.KillRequested{ID: id})
	require.NoError(t, err)
	published := make(chan error, 1)
	go func() { published <- bus.Publish(events.TopicKills, msg) }()
	select {
	case err := <-published:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("a publish on a topic listened to was never acknowledged: Listen returned before its subscription was read")
	}
	require.Equal(t, events.KillRequested{ID: id}, <-heard)

	listened := make(chan error, 1)
	go func() { listened <- events.Listen(ctx, bus, events.TopicRescan, spawn, func(any, error) {}) }()
	select {
	case err := <-listened:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the next Listen never returned")
	}
}

// TestListenSaysWhichSubscriptionFailed: a closed bus's refusal names the
// topic.
func TestListenSaysWhichSubscriptionFailed(t *testing.T) {
	bus := events.NewBus(slog.New(slog.DiscardHandler))
	require.NoError(t, bus.Close())
	err := events.Listen(context.Background(), bus, events.TopicKills, func(func(context.Context)) { t.Error("spawned a reader for a failed subscription") }, func(any, error) {})
	require.ErrorContains(t, err, "subscribe to "+events.TopicKills)
}
