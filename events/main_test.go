package events_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/events"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

// testContext is a context that ends with the test or after d.
func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// got is one event received from the bus.
type got struct {
	Topic string
	Ev    any
}

func (g got) String() string { return fmt.Sprintf("%s %+v", g.Topic, g.Ev) }

// collector receives every event of the bus, in publish order (it acks a
// message only after queueing it, and the bus blocks until the ack).
type collector struct {
	ch chan got
}

// newBus returns a bus closed after the test.
func newBus(t *testing.T) *gochannel.GoChannel {
	bus := events.NewBus(slog.New(slog.DiscardHandler))
	t.Cleanup(func() { require.NoError(t, bus.Close()) })
	return bus
}

// collect subscribes to the three topics of bus (before any Start, so
// nothing is missed); the subscriptions end after the test.
func collect(t *testing.T, bus *gochannel.GoChannel) *collector {
	t.Helper()
	return collectHook(t, bus, nil)
}

// collectHook is collect with a hook called with each event before it is
// acknowledged, so while the Stream waits in Publish.
func collectHook(t *testing.T, bus *gochannel.GoChannel, hook func(got)) *collector {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{ch: make(chan got, 10000)}
	var wg sync.WaitGroup
	spawn := func(f func(context.Context)) { wg.Go(func() { f(ctx) }) }
	for _, topic := range []string{events.TopicTasks, events.TopicQueues, events.TopicRescan} {
		require.NoError(t, events.Listen(ctx, bus, topic, spawn, func(ev any, err error) {
			if err != nil {
				t.Errorf("decode %s: %v", topic, err)
			}
			if hook != nil {
				hook(got{topic, ev})
			}
			c.ch <- got{topic, ev}
		}))
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return c
}

// next returns the next event, failing the test if none comes within d.
func (c *collector) next(t *testing.T, d time.Duration) got {
	t.Helper()
	select {
	case g := <-c.ch:
		return g
	case <-time.After(d):
		t.Fatalf("no event within %v", d)
		return got{}
	}
}

// until returns the first event for which ok is true, skipping the others
// (which it returns too), failing the test if none comes within d.
func (c *collector) until(t *testing.T, d time.Duration, ok func(got) bool) (got, []got) {
	t.Helper()
	deadline := time.After(d)
	var skipped []got
	for {
		select {
		case g := <-c.ch:
			if ok(g) {
				return g, skipped
			}
			skipped = append(skipped, g)
		case <-deadline:
			t.Fatalf("no matching event within %v; got instead: %v", d, skipped)
			return got{}, nil
		}
	}
}

// taskEvent reports whether g is a TaskChanged of op for id.
func taskEvent(op events.Op, id bson.ObjectID) func(got) bool {
	return func(g got) bool {
		tc, ok := g.Ev.(events.TaskChanged)
		return ok && tc.Op == op && tc.ID == id
	}
}

func isRescan(g got) bool { return g.Topic == events.TopicRescan }

// requireTask checks that g is the TaskChanged {op, id, queue, status}.
func requireTask(t *testing.T, g got, op events.Op, id, queue bson.ObjectID, status *schema.Status) events.TaskChanged {
	t.Helper()
	require.Equal(t, events.TopicTasks, g.Topic, "%v", g)
	tc, ok := g.Ev.(events.TaskChanged)
	require.True(t, ok, "%v", g)
	require.Equal(t, op, tc.Op, "%v", g)
	require.Equal(t, id, tc.ID, "%v", g)
	require.Equal(t, queue, tc.Queue, "%v", g)
	if status == nil {
		require.Nil(t, tc.Status, "%v", g)
	} else {
		require.NotNil(t, tc.Status, "%v", g)
		require.Equal(t, *status, *tc.Status, "%v", g)
	}
	require.WithinDuration(t, time.Now(), tc.At, time.Minute, "event time %v", g)
	return tc
}

func statusPtr(s schema.Status) *schema.Status { return &s }

// insertTasks inserts n queued tasks into queue q and returns their ids.
func insertTasks(t *testing.T, st *store.Store, q bson.ObjectID, n int) []bson.ObjectID {
	t.Helper()
	ids, err := st.TaskInsertMany(testContext(t, 30*time.Second), store.TaskInsertManyParams{Queue: q, Parameters: make([]bson.Raw, n)})
	require.NoError(t, err)
	require.Len(t, ids, n)
	return ids
}

// logs records a Stream's log.
type logs struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}
func (l *logs) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logs) WithGroup(string) slog.Handler      { return l }

// serverErrors returns the MongoDB server errors logged (attribute "error").
func (l *logs) serverErrors() []mongo.ServerError {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []mongo.ServerError
	for _, r := range l.recs {
		r.Attrs(func(a slog.Attr) bool {
			if err, ok := a.Value.Any().(error); ok {
				var se mongo.ServerError
				if errors.As(err, &se) {
					out = append(out, se)
				}
			}
			return true
		})
	}
	return out
}

// String is the log as text, one record a line.
func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.recs {
		fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		b.WriteByte('\n')
	}
	return b.String()
}

// startStream starts a stream over db (its tokens in st) publishing on
// bus, stopped after the test.
func startStream(t *testing.T, cfg events.Config) *events.Stream {
	t.Helper()
	s := events.New(cfg)
	require.NoError(t, s.Start(testContext(t, 30*time.Second)))
	t.Cleanup(s.Stop)
	return s
}

// eventually polls cond in the test's goroutine every tick until it is true,
// failing the test after d.
func eventually(t *testing.T, cond func() bool, d, tick time.Duration, msgAndArgs ...any) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			require.Fail(t, fmt.Sprintf("condition not met within %v", d), msgAndArgs...)
		}
		time.Sleep(tick)
	}
}
