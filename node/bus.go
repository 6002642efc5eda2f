package node

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/disbatch-go/disbatch/events"
)

// bus carries the change stream's events to the claimer. Each run of the
// node gets a fresh Watermill channel (a closed one cannot be reopened,
// and closing it is what waits for its subscribers' goroutines); the
// stream publishes to, and the claimer and the kill listener subscribe
// through, this holder.
type bus struct {
	log *slog.Logger
	mu  sync.Mutex
	ch  *gochannel.GoChannel
}

func newBus(log *slog.Logger) *bus { return &bus{log: log} }

func (b *bus) open() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ch = events.NewBus(b.log)
}

func (b *bus) close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		return nil
	}
	err := b.ch.Close()
	b.ch = nil
	return err
}

func (b *bus) current() (*gochannel.GoChannel, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		return nil, errors.New("the node's event bus is closed")
	}
	return b.ch, nil
}

// Publish is message.Publisher's.
func (b *bus) Publish(topic string, msgs ...*message.Message) error {
	ch, err := b.current()
	if err != nil {
		return err
	}
	return ch.Publish(topic, msgs...)
}

// Subscribe is message.Subscriber's.
func (b *bus) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ch, err := b.current()
	if err != nil {
		return nil, err
	}
	return ch.Subscribe(ctx, topic)
}

// Close is message.Publisher's and message.Subscriber's: the node closes
// the bus itself at the end of a run.
func (b *bus) Close() error { return nil }
