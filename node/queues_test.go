package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// nodesStore serves node documents and counts their reads, and queues;
// it has no config document.
type nodesStore struct {
	mu     sync.Mutex
	reads  int
	fail   bool
	now    time.Time
	nodes  []schema.Node
	queues []schema.Queue
}

func (s *nodesStore) QueueList(context.Context) (store.QueueListResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return store.QueueListResult{Queues: append([]schema.Queue(nil), s.queues...)}, nil
}

func (s *nodesStore) ConfigGet(context.Context, string) (schema.Config, error) {
	return schema.Config{}, store.ErrNotFound
}

func (s *nodesStore) NodeList(context.Context) (store.NodeListResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if s.fail {
		return store.NodeListResult{}, errors.New("no primary")
	}
	return store.NodeListResult{Nodes: append([]schema.Node(nil), s.nodes...), Now: s.now}, nil
}

func (s *nodesStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// TestLiveOthersReadsTheNodesOnceASecond: the peers a queue read names
// come from a read of the nodes at most othersFresh old, so that nodes
// reading their queues several times a second do not each read every
// heartbeat each time; a failed read is not kept.
func TestLiveOthersReadsTheNodesOnceASecond(t *testing.T) {
	start := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	fake := clock.NewFake(start)
	beat := func(name, queue string) schema.Node {
		return schema.Node{Node: name, State: schema.NodeStateRunning, Timestamp: start, Queues: []schema.NodeQueue{{ID: queue}}}
	}
	st := &nodesStore{now: start, nodes: []schema.Node{beat("a", "q1"), beat("b", "q1")}}
	qs := &queueSet{node: "a", store: st, live: 10 * time.Second, clock: fake, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx := context.Background()
	othersOf := func() map[string]peer {
		others, _ := qs.liveOthers(ctx)
		return others
	}

	first := map[string]peer{"b": {serves: map[string]bool{"q1": true}, stream: true}}
	others, self := qs.liveOthers(ctx)
	require.Equal(t, first, others)
	require.Equal(t, peer{serves: map[string]bool{"q1": true}, stream: true}, self, "its own heartbeat, read with the others'")
	require.Equal(t, 1, st.count())

	st.mu.Lock()
	st.nodes = append(st.nodes, beat("c", "q2")) // a node joins
	// Nodes that say what they serve: d serves one of the two queues it
	// can read, by ticks alone, and its slots for it are taken; e serves
	// none.
	d := beat("d", "q1")
	d.Queues, d.Serves, d.Full = append(d.Queues, schema.NodeQueue{ID: "q3"}), []string{"q3"}, []string{"q3"}
	e := beat("e", "q1")
	e.Serves, e.WakeupStream = []string{}, true
	st.nodes = append(st.nodes, d, e)
	st.mu.Unlock()
	fake.Advance(othersFresh - time.Millisecond)
	_, err := qs.refresh(ctx)
	require.NoError(t, err)
	require.Equal(t, first, othersOf(), "within a second: the last read")
	require.Equal(t, 1, st.count(), "queue reads within a second read the nodes once")

	fake.Advance(time.Millisecond)
	require.Equal(t, map[string]peer{"b": first["b"], "c": {serves: map[string]bool{"q2": true}, stream: true},
		"d": {serves: map[string]bool{"q3": true}, full: map[string]bool{"q3": true}}, "e": {serves: map[string]bool{}, stream: true}}, othersOf(),
		"a second on: read again; serves, where written, says what a node serves, not queues")
	require.Equal(t, 2, st.count())

	fake.Advance(othersFresh)
	st.mu.Lock()
	st.fail = true
	st.mu.Unlock()
	require.Nil(t, othersOf(), "unreadable: no peers")
	st.mu.Lock()
	st.fail = false
	st.mu.Unlock()
	require.Len(t, othersOf(), 4, "a failed read is not kept: read again at once")
	require.Equal(t, 4, st.count())
}

// TestAQueuesPeersDeafAndFullAreWhatTheHeartbeatsSay: the claimer is
// told which of a queue's nodes serve it, which have no stream and which
// are full by their heartbeats, this node's own included (as read with
// the others', not its slots now), so that every node ranks the same ones
// last for listening; this node's serves lists the queues it would serve
// but for a pause, not those it has no plugin for; and its full the
// served queues its claimer says are full.
func TestAQueuesPeersDeafAndFullAreWhatTheHeartbeatsSay(t *testing.T) {
	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	fake := clock.NewFake(start)
	q := schema.Queue{ID: bson.NewObjectID(), Name: "q", Constructor: "C", MaxThreads: ptr(2)}
	paused := schema.Queue{ID: bson.NewObjectID(), Name: "paused", Constructor: "C", MaxThreads: ptr(2)}
	paused.Sched.Paused = true
	alien := schema.Queue{ID: bson.NewObjectID(), Name: "alien", Constructor: "nope", MaxThreads: ptr(2)}
	beat := func(name string, full bool, stream bool) schema.Node {
		n := schema.Node{Node: name, State: schema.NodeStateRunning, Timestamp: start, Serves: []string{q.ID.Hex()}, WakeupStream: stream,
			Queues: []schema.NodeQueue{{ID: q.ID.Hex()}}}
		if full {
			n.Full = []string{q.ID.Hex()}
		}
		return n
	}
	st := &nodesStore{now: start, nodes: []schema.Node{beat("a", false, true), beat("b", true, true), beat("c", false, true), beat("d", false, false)},
		queues: []schema.Queue{q, paused, alien}}
	reg := plugin.NewRegistry()
	reg.Register("C", plugin.Func(func(context.Context, plugin.Task) plugin.Result { return plugin.Result{} }))
	qs := &queueSet{node: "a", store: st, plugins: reg, live: 10 * time.Second, clock: fake, log: slog.New(slog.DiscardHandler)}
	ctx := context.Background()

	served, err := qs.refresh(ctx)
	require.NoError(t, err)
	require.Len(t, served, 1)
	require.ElementsMatch(t, []string{"b", "c", "d"}, served[0].Peers)
	require.Equal(t, []string{"d"}, served[0].Deaf, "d has no stream")
	require.Equal(t, []string{"b"}, served[0].Full, "b's heartbeat has its slots taken")

	none := func(bson.ObjectID) int { return 0 }
	_, serves, full := qs.stats(none, func(id bson.ObjectID, max int) bool { return id == q.ID && max == 2 })
	require.ElementsMatch(t, []string{q.ID.Hex(), paused.ID.Hex()}, serves, "paused for every node, not the plugin-less one")
	require.Equal(t, []string{q.ID.Hex()}, full)
	_, _, full = qs.stats(none, func(bson.ObjectID, int) bool { return false })
	require.Empty(t, full)

	st.mu.Lock()
	st.nodes[0] = beat("a", true, true) // this node's next heartbeat says it is full
	st.mu.Unlock()
	fake.Advance(othersFresh)
	served, err = qs.refresh(ctx)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"a", "b"}, served[0].Full, "its own heartbeat, as its peers read it")
}

// configStore answers ConfigGet with err, once set, and otherwise with a
// config whose activequeues is "mine".
type configStore struct {
	nodesStore
	err error
}

func (s *configStore) ConfigGet(context.Context, string) (schema.Config, error) {
	if s.err != nil {
		return schema.Config{}, s.err
	}
	return schema.Config{ActiveQueues: []string{"mine"}}, nil
}

// TestAConfigNotReadKeepsTheQueuesServed: a read of the config document
// that fails (no primary, a broken connection) fails the refresh, and the
// claimer keeps the queues it has; taken for no config, it would serve
// the queues the config's activequeues keeps from this node. A document
// that is there but unusable (malformed, or one of several) counts as
// none, and says so.
func TestAConfigNotReadKeepsTheQueuesServed(t *testing.T) {
	mine := schema.Queue{ID: bson.NewObjectID(), Name: "mine", Constructor: "C", MaxThreads: ptr(2)}
	other := mine
	other.ID, other.Name = bson.NewObjectID(), "other"
	st := &configStore{nodesStore: nodesStore{queues: []schema.Queue{mine, other}}}
	reg := plugin.NewRegistry()
	reg.Register("C", plugin.Func(func(context.Context, plugin.Task) plugin.Result { return plugin.Result{} }))
	qs := &queueSet{node: "a", store: st, plugins: reg, live: time.Second, clock: clock.NewFake(time.Now()), log: slog.New(slog.DiscardHandler)}
	names := func(served []claimer.Queue) []string {
		var out []string
		for _, q := range served {
			out = append(out, q.Name)
		}
		return out
	}
	ctx := context.Background()
	served, err := qs.refresh(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"mine"}, names(served))

	st.err = errors.New("read config: server selection error: no primary")
	served, err = qs.refresh(ctx)
	require.Error(t, err, "served %v without its config", names(served))

	for _, bad := range []error{&schema.DecodeError{Collection: schema.CollConfig, Field: "activequeues", Err: errors.New("not an array")}, store.ErrConfigAmbiguous} {
		st.err = bad
		served, err = qs.refresh(ctx)
		require.NoError(t, err, "%v", bad)
		require.ElementsMatch(t, []string{"mine", "other"}, names(served), "%v: as if there were no config", bad)
	}
}
