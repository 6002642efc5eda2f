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

// TestConsumeKeepsTheOrderAcrossTopics: a queue's change is handled before
// the task event published after it, even when its handler is slower and
// each topic has its own consumer.
func TestConsumeKeepsTheOrderAcrossTopics(t *testing.T) {
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
	queues, err := bus.Subscribe(ctx, events.TopicQueues)
	require.NoError(t, err)
	tasks, err := bus.Subscribe(ctx, events.TopicTasks)
	require.NoError(t, err)
	go events.Consume(ctx, events.TopicQueues, queues, func(any, error) {
		time.Sleep(50 * time.Millisecond)
		record("queue")
	})
	go events.Consume(ctx, events.TopicTasks, tasks, func(any, error) { record("task") })

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
