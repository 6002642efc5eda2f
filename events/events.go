package events

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// Topics of the bus.
const (
	TopicTasks  = "disbatch.tasks"
	TopicQueues = "disbatch.queues"
	TopicRescan = "disbatch.rescan"
	TopicKills  = "disbatch.kills"
)

// Op is the kind of change.
type Op string

// Ops, as MongoDB names them.
const (
	OpInsert  Op = "insert"
	OpUpdate  Op = "update"
	OpReplace Op = "replace"
	OpDelete  Op = "delete"
)

// TaskChanged is a task that was inserted, deleted, replaced, or whose
// status (or queue) changed.
type TaskChanged struct {
	Op Op            `json:"op"`
	ID bson.ObjectID `json:"id"`
	// Queue is the task's queue when the event carries it (inserts,
	// replaces, moves between queues); zero otherwise.
	Queue bson.ObjectID `json:"queue,omitzero"`
	// Status is the new status when the event carries it; nil for deletes.
	Status *schema.Status `json:"status,omitempty"`
	// At is when MongoDB applied the change (the event's wall time).
	At time.Time `json:"at"`
	// NodeMinusOne: the event shows the task's node as -1 (seed 000's
	// unclaimed). False when it shows null or none (Disbatch 4.103's
	// unclaimed), anything else, or nothing (an update that leaves the
	// node alone): the claimer then looks for node null in the queue too.
	NodeMinusOne bool `json:"node_minus_one,omitempty"`
}

// QueueChanged is a queue that was created, changed or deleted.
// AdmissionsOnly: an update that moved only its admissions under
// max_running (a capped claim or a release), not its settings.
type QueueChanged struct {
	Op             Op            `json:"op"`
	ID             bson.ObjectID `json:"id"`
	AdmissionsOnly bool          `json:"admissions_only,omitempty"`
}

// KillRequested is an operator's request to kill a task, for the node it
// names (Request.Node) to carry out.
type KillRequested struct {
	ID      bson.ObjectID      `json:"id"`
	Request schema.KillRequest `json:"request"`
}

// Rescan says events were lost: re-read the database. Quiet: the stream
// was closed while its node needed no wake-ups (Stream.Quiet), a routine
// matter, not a fault.
type Rescan struct {
	Reason string `json:"reason"`
	Quiet  bool   `json:"quiet,omitempty"`
}

// NewBus returns the in-process bus. Publishing blocks until every
// subscriber has acknowledged the message, which keeps events in order and
// lets a slow subscriber push back instead of piling up goroutines. A
// publisher waits holding the bus's subscriber lock, which Subscribe
// takes: an event published to a subscription nobody reads yet would
// stall the next Subscribe, and the service subscribing, for ever. So
// subscribers subscribe through Listen, which starts the reading with the
// subscription, and acknowledge without blocking. Watermill's own info
// logs are demoted to debug.
func NewBus(log *slog.Logger) *gochannel.GoChannel {
	return gochannel.NewGoChannel(gochannel.Config{
		OutputChannelBuffer:            256,
		BlockPublishUntilSubscriberAck: true,
	}, watermill.NewSlogLoggerWithLevelMapping(log, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug}))
}

// Encode turns an event into a message.
func Encode(ev any) (*message.Message, error) {
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	return message.NewMessage(strconv.FormatUint(msgSeq.Add(1), 36), b), nil
}

// msgSeq numbers messages: the bus is in-process, so a counter is as
// unique as a UUID, without a tenth of the node's CPU spent making them.
var msgSeq atomic.Uint64

// Listen subscribes to topic and, before it returns, hands spawn the loop
// that reads the subscription; spawn starts it at once in a goroutine (a
// lifecycle run's Go does). The loop reads until ctx ends or the bus
// closes: each message decoded and handed to handle (an event,
// or an error for a message that does not decode), then acknowledged. The
// reading starts with the subscription because the bus holds a publisher,
// and its subscriber lock, until every subscriber has acknowledged: an
// event published to a subscription not yet read would stall the next
// Subscribe for ever (a node's start did, in the fault suite). Events are
// handled in the stream's order across topics too: a queue's change
// before the insert that followed it (which, handled first, would be
// claimed under the queue's old settings). handle must be quick.
func Listen(ctx context.Context, sub message.Subscriber, topic string, spawn func(func(context.Context)), handle func(ev any, err error)) error {
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return fmt.Errorf("subscribe to %s: %w", topic, err)
	}
	spawn(func(ctx context.Context) { consume(ctx, topic, ch, handle) })
	return nil
}

func consume(ctx context.Context, topic string, ch <-chan *message.Message, handle func(ev any, err error)) {
	for {
		var msg *message.Message
		select {
		case <-ctx.Done():
			return
		case msg = <-ch:
		}
		if msg == nil {
			return // the bus closed
		}
		ev, err := Decode(topic, msg)
		handle(ev, err)
		msg.Ack()
	}
}

// Decode reads the event of a message published on topic into a
// TaskChanged, QueueChanged, KillRequested or Rescan.
func Decode(topic string, msg *message.Message) (any, error) {
	var err error
	switch topic {
	case TopicTasks:
		var ev TaskChanged
		err = json.Unmarshal(msg.Payload, &ev)
		return ev, err
	case TopicQueues:
		var ev QueueChanged
		err = json.Unmarshal(msg.Payload, &ev)
		return ev, err
	case TopicRescan:
		var ev Rescan
		err = json.Unmarshal(msg.Payload, &ev)
		return ev, err
	case TopicKills:
		var ev KillRequested
		err = json.Unmarshal(msg.Payload, &ev)
		return ev, err
	}
	return nil, fmt.Errorf("unknown topic %q", topic)
}
