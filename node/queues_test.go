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

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// nodesStore serves node documents and counts their reads; it has no
// queues and no config document.
type nodesStore struct {
	mu    sync.Mutex
	reads int
	fail  bool
	now   time.Time
	nodes []schema.Node
}

func (s *nodesStore) QueueList(context.Context) (store.QueueListResult, error) {
	return store.QueueListResult{}, nil
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
	peer := func(name, queue string) schema.Node {
		return schema.Node{Node: name, State: schema.NodeStateRunning, Timestamp: start, Queues: []schema.NodeQueue{{ID: queue}}}
	}
	st := &nodesStore{now: start, nodes: []schema.Node{peer("a", "q1"), peer("b", "q1")}}
	qs := &queueSet{node: "a", store: st, live: 10 * time.Second, clock: fake, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx := context.Background()

	first := map[string]map[string]bool{"b": {"q1": true}}
	require.Equal(t, first, qs.liveOthers(ctx))
	require.Equal(t, 1, st.count())

	st.mu.Lock()
	st.nodes = append(st.nodes, peer("c", "q2")) // a node joins
	st.mu.Unlock()
	fake.Advance(othersFresh - time.Millisecond)
	_, err := qs.refresh(ctx)
	require.NoError(t, err)
	require.Equal(t, first, qs.liveOthers(ctx), "within a second: the last read")
	require.Equal(t, 1, st.count(), "queue reads within a second read the nodes once")

	fake.Advance(time.Millisecond)
	require.Equal(t, map[string]map[string]bool{"b": {"q1": true}, "c": {"q2": true}}, qs.liveOthers(ctx), "a second on: read again")
	require.Equal(t, 2, st.count())

	fake.Advance(othersFresh)
	st.mu.Lock()
	st.fail = true
	st.mu.Unlock()
	require.Nil(t, qs.liveOthers(ctx), "unreadable: no peers")
	st.mu.Lock()
	st.fail = false
	st.mu.Unlock()
	require.Len(t, qs.liveOthers(ctx), 2, "a failed read is not kept: read again at once")
	require.Equal(t, 4, st.count())
}
