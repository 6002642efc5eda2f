package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func TestNodeListAndDrain(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	s := store.New(e.db, store.Options{})
	_, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "alive", State: schema.NodeStateRunning, Queues: []schema.NodeQueue{{Name: "q", ID: "571f8951b75bf335634ec271", TasksDoing: 3}},
		Serves: []string{"571f8951b75bf335634ec271"}, Full: []string{"571f8951b75bf335634ec271"}, WakeupStream: true})
	require.NoError(t, err)
	_, err = e.db.Collection("nodes").InsertOne(ctx, bson.D{
		{Key: "node", Value: "gone"}, {Key: "timestamp", Value: time.Now().Add(-time.Hour)},
		{Key: "dead", Value: true}, {Key: "dead_by", Value: "alive"}, {Key: "dead_at", Value: time.Now()},
	})
	require.NoError(t, err)
	_, err = e.db.Collection("nodes").InsertOne(ctx, bson.D{{Key: "node", Value: "perl"}, {Key: "timestamp", Value: time.Now()}})
	require.NoError(t, err)
	_, err = s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "poller", State: schema.NodeStateRunning, Serves: []string{}, WakeupStream: false,
		OwnMaxThreads: ptr(8)})
	require.NoError(t, err)
	_, err = s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "capped", State: schema.NodeStateRunning, OwnMaxThreads: ptr(8)})
	require.NoError(t, err)
	_, err = e.db.Collection("nodes").UpdateOne(ctx, bson.D{{Key: "node", Value: "capped"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "maxthreads", Value: 2}}}})
	require.NoError(t, err)
	// Silent for 30 s, past its own --fence-after of 10 s (said with that
	// heartbeat: serves_at is its timestamp).
	beat := time.Now().Add(-30 * time.Second).Truncate(time.Millisecond)
	_, err = e.db.Collection("nodes").InsertOne(ctx, bson.D{{Key: "node", Value: "cutoff"}, {Key: "state", Value: "running"},
		{Key: "timestamp", Value: beat}, {Key: "serves_at", Value: beat}, {Key: "fence_after_ms", Value: int64(10000)}})
	require.NoError(t, err)

	out := e.ok("", "node", "list")
	require.Regexp(t, `(?m)^NODE\s+STATE\s+HEARTBEAT\s+RUNNING\s+MAXTHREADS\s+NOTES$`, out)
	require.Regexp(t, `(?m)^alive\s+running\s+[0-9.]+m?s ago\s+3\s+-\s+full: q$`, out)
	require.Regexp(t, `(?m)^poller\s+running\s+[0-9.]+m?s ago\s+0\s+8\s+polling only$`, out, "its own cap, from its heartbeat")
	require.Regexp(t, `(?m)^capped\s+running\s+[0-9.]+m?s ago\s+0\s+2 \(set\)\s*`, out, "an operator's lower cap")
	require.Regexp(t, `(?m)^perl\s+-\s+[0-9.]+m?s ago\s+0\s+-\s*$`, out, "4.103's node says nothing of wake-ups")
	require.Regexp(t, `(?m)^cutoff\s+running\s+[0-9.]+s ago\s+0\s+-\s+fenced: no heartbeat for its --fence-after \(10s\)$`, out)
	// An hour ago, give or take the moments a loaded machine takes to list it.
	require.Regexp(t, `(?m)^gone\s+-\s+1h0m[0-9.]+s ago\s+0\s+-\s+DEAD \(declared by alive at `, out)

	out = e.ok("", "node", "drain", "alive")
	require.Contains(t, out, "asked node alive to drain")
	n, err := s.NodeGet(ctx, "alive")
	require.NoError(t, err)
	require.True(t, n.Drain)
	require.Regexp(t, `(?m)^alive\s+.*\s+drain requested; full: q$`, e.ok("", "node", "list"))

	var nodes []map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "node", "list", "--json")), &nodes))
	require.Len(t, nodes, 6)
	require.Equal(t, "alive", nodes[0]["node"])
	require.Equal(t, true, nodes[0]["drain"])
	require.Equal(t, "capped", nodes[1]["node"])
	require.EqualValues(t, 2, nodes[1]["maxthreads"])
	require.EqualValues(t, 8, nodes[1]["own_maxthreads"])
	require.Nil(t, nodes[1]["fence_after_ms"], "not said")
	require.Equal(t, "cutoff", nodes[2]["node"])
	require.EqualValues(t, 10000, nodes[2]["fence_after_ms"])
	require.Equal(t, true, nodes[3]["dead"])
	require.Equal(t, []any{"571f8951b75bf335634ec271"}, nodes[0]["serves"])
	require.Equal(t, []any{"571f8951b75bf335634ec271"}, nodes[0]["full"])
	require.Equal(t, true, nodes[0]["wakeup_stream"])
	require.NotContains(t, nodes[4], "serves", "4.103's node does not say")

	r := e.run("", "node", "drain", "nobody")
	require.Equal(t, ExitRuntime, r.code)
	require.Contains(t, r.err, `no node named "nobody"`)
	r = e.run("", "node", "drain")
	require.Equal(t, ExitUsage, r.code)
	require.Contains(t, r.err, "give NAME, or set DISBATCH_NODE")
	require.Equal(t, int64(0), e.count("nodes", bson.D{{Key: "node", Value: "nobody"}}), "nothing written")
}

// TestNodeDrainWaits: drain takes its node from DISBATCH_NODE when given
// no NAME (a Kubernetes preStop hook in the node's container) and, with
// --wait, returns once the node says it has stopped, or exits 3 when the
// wait is over first.
func TestNodeDrainWaits(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	s := store.New(e.db, store.Options{})
	for _, name := range []string{"pod-1", "stuck"} {
		_, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: name, State: schema.NodeStateRunning})
		require.NoError(t, err)
	}
	drain := func(env map[string]string, args ...string) result {
		var out, errb bytes.Buffer
		args = append(args, "--mongo-uri", e.uri, "--database", e.db.Name())
		code := Run(ctx, args, IO{In: strings.NewReader(""), Out: &out, Err: &errb, Getenv: func(k string) string { return env[k] }})
		return result{out.String(), errb.String(), code}
	}
	done := make(chan result, 1)
	go func() { done <- drain(map[string]string{"DISBATCH_NODE": "pod-1"}, "node", "drain", "--wait", "30s") }()
	require.Eventually(t, func() bool {
		n, err := s.NodeGet(ctx, "pod-1")
		return err == nil && n.Drain
	}, 10*time.Second, 10*time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("returned before the node stopped: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}
	_, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "pod-1", State: schema.NodeStateStopped})
	require.NoError(t, err)
	r := <-done
	require.Equal(t, ExitOK, r.code, r.err)
	require.Contains(t, r.out, "asked node pod-1 to drain")
	require.Contains(t, r.out, "node pod-1 has stopped")

	r = drain(nil, "node", "drain", "stuck", "--wait", "300ms")
	require.Equal(t, ExitTimeout, r.code, r.err)
	require.Contains(t, r.err, "node stuck has not stopped after 300ms")
}

func TestQueueNamesFallBackToTheID(t *testing.T) {
	t.Parallel()
	n := schema.Node{Queues: []schema.NodeQueue{{ID: "571f8951b75bf335634ec271", Name: "q"}, {ID: "571f8951b75bf335634ec272"}}}
	require.Equal(t, "q, 571f8951b75bf335634ec272, 571f8951b75bf335634ec273",
		queueNames(n, []string{"571f8951b75bf335634ec271", "571f8951b75bf335634ec272", "571f8951b75bf335634ec273"}), "a queue without a name, or not listed, stays an id")
}

func ptr[T any](v T) *T { return &v }

// flakyNodes fails its first reads, then says the node has stopped.
type flakyNodes struct{ fails int }

func (f *flakyNodes) NodeGet(context.Context, string) (schema.Node, error) {
	if f.fails > 0 {
		f.fails--
		return schema.Node{}, errors.New("server selection error: no primary")
	}
	return schema.Node{Node: "pod-1", State: schema.NodeStateStopped}, nil
}

// TestNodeDrainWaitsThroughFailedReads: a read that fails (a failover)
// is read again until the wait is over; the wait ended at the first (a
// preStop hook that gives up lets SIGTERM cut the node's tasks short).
func TestNodeDrainWaitsThroughFailedReads(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	g := &globals{io: IO{Out: &out, Err: &errb}}
	require.NoError(t, waitDrained(context.Background(), g, &flakyNodes{fails: 3}, "pod-1", 10*time.Second, 5*time.Millisecond))
	require.Contains(t, out.String(), "node pod-1 has stopped")
	require.Equal(t, 3, strings.Count(errb.String(), "reading again"))
}
