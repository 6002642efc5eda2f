package live

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func raw(d bson.D) bson.Raw {
	b, _ := bson.Marshal(d)
	return b
}

func oid(id bson.ObjectID) bson.RawValue {
	return bson.RawValue{Type: bson.TypeObjectID, Value: id[:]}
}

// data returns the JSON of an item's frame.
func data(t *testing.T, it *item) map[string]any {
	t.Helper()
	require.NotNil(t, it)
	fr := string(it.frame)
	i := strings.Index(fr, "\ndata: ")
	require.Positive(t, i)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSuffix(fr[i+len("\ndata: "):], "\n\n")), &m))
	return m
}

func TestConvertEdgeCases(t *testing.T) {
	nm := newNames()
	q, task, node := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	tok := token(5, 1, 0)

	// A task update without a pre-image: from and queue unknown.
	it := convert(store.ChangeEvent{Op: "update", Coll: schema.CollTasks, ID: oid(task), Token: tok,
		Updated: raw(bson.D{{Key: schema.TaskStatus, Value: int32(1)}})}, nm, true)
	d := data(t, it)
	require.Nil(t, d["from"])
	require.Nil(t, d["queue"])
	require.Equal(t, 1.0, d["to"])
	require.Contains(t, d, "node")
	require.False(t, it.hasQueue)

	// A node change alone, with the pre-image: a transition from == to.
	it = convert(store.ChangeEvent{Op: "update", Coll: schema.CollTasks, ID: oid(task), Token: tok,
		Before:  raw(bson.D{{Key: schema.TaskQueue, Value: q}, {Key: schema.TaskStatus, Value: int32(-1)}, {Key: schema.TaskNode, Value: "n1"}}),
		Updated: raw(bson.D{{Key: schema.TaskNode, Value: "n2"}})}, nm, true)
	d = data(t, it)
	require.Equal(t, -1.0, d["from"])
	require.Equal(t, -1.0, d["to"])
	require.Equal(t, "n2", d["node"])
	require.Equal(t, q.Hex(), d["queue"])
	require.NotContains(t, d, "from_queue")

	// An unclaimed task's node is null; a removed status is to null.
	it = convert(store.ChangeEvent{Op: "update", Coll: schema.CollTasks, ID: oid(task), Token: tok,
		Before:  raw(bson.D{{Key: schema.TaskQueue, Value: q}, {Key: schema.TaskStatus, Value: int32(-1)}, {Key: schema.TaskNode, Value: "n1"}}),
		Updated: raw(bson.D{{Key: schema.TaskNode, Value: int32(-1)}}), Removed: []string{schema.TaskStatus}}, nm, true)
	d = data(t, it)
	require.Nil(t, d["node"])
	require.Nil(t, d["to"])

	// Queues: counters alone are no event; a removal is.
	require.Nil(t, convert(store.ChangeEvent{Op: "update", Coll: schema.CollQueues, ID: oid(q), Token: tok,
		Updated: raw(bson.D{{Key: schema.QueueCountTodo, Value: int64(3)}})}, nm, true))
	require.Nil(t, convert(store.ChangeEvent{Op: "update", Coll: schema.CollQueues, ID: oid(q), Token: tok,
		Updated: raw(bson.D{{Key: schema.QueueCountRunning, Value: int64(2)}})}, nm, true), "a claim or finish changes count_running alone")
	require.Nil(t, convert(store.ChangeEvent{Op: "update", Coll: schema.CollQueues, ID: oid(q), Token: tok,
		Removed: []string{schema.QueueCountRunning}}, nm, true))
	require.Nil(t, convert(store.ChangeEvent{Op: "update", Coll: schema.CollQueues, ID: oid(q), Token: tok,
		Updated: raw(bson.D{{Key: schema.QueueCountFailed, Value: int64(1)}, {Key: schema.QueueCountTodo, Value: int64(2)}})}, nm, true), "a failure changes count_failed and count_todo alone")
	require.Nil(t, convert(store.ChangeEvent{Op: "update", Coll: schema.CollQueues, ID: oid(q), Token: tok,
		Updated: raw(bson.D{{Key: schema.QueueCountTodo, Value: int64(2)}, {Key: schema.QueueCountsApplied, Value: bson.D{{Key: "t", Value: bson.Timestamp{T: 1, I: 1}}, {Key: "token", Value: "82"}}}})}, nm, true),
		"a projector's batch moves its position with the counters")
	it = convert(store.ChangeEvent{Op: "update", Coll: schema.CollQueues, ID: oid(q), Token: tok,
		Updated: raw(bson.D{{Key: schema.QueueCountTodo, Value: int64(3)}}), Removed: []string{schema.QueueNodesPin}}, nm, true)
	d = data(t, it)
	require.Equal(t, []any{schema.QueueNodesPin}, d["removed"])
	require.NotContains(t, d, "fields")
	require.Nil(t, d["name"], "not known")
	it = convert(store.ChangeEvent{Op: "replace", Coll: schema.CollQueues, ID: oid(q), Token: tok,
		Doc: raw(bson.D{{Key: "_id", Value: q}, {Key: schema.QueueName, Value: "q"}, {Key: schema.QueueCountTotal, Value: 9}})}, nm, true)
	d = data(t, it)
	require.Equal(t, map[string]any{"name": "q"}, d["fields"])
	it = convert(store.ChangeEvent{Op: "delete", Coll: schema.CollQueues, ID: oid(q), Token: tok}, nm, true)
	require.Equal(t, "q", data(t, it)["name"], "remembered from the replace")
	require.Nil(t, nm.get(nm.queues, oid(q)), "forgotten after the delete")

	// Nodes: removed fields.
	nm.setID(nm.nodes, node, ptr("n1"))
	it = convert(store.ChangeEvent{Op: "update", Coll: schema.CollNodes, ID: oid(node), Token: tok,
		Updated: raw(bson.D{{Key: schema.NodeState, Value: "draining"}}), Removed: []string{schema.NodeDrain, schema.NodeMaxThreads, schema.NodeDead}}, nm, true)
	d = data(t, it)
	require.Equal(t, map[string]any{"type": "node", "op": "update", "id": node.Hex(), "node": "n1", "state": "draining",
		"drain": false, "maxthreads": nil, "dead": false, "time": d["time"], "cluster_time": d["cluster_time"]}, d)

	// Drops are resets; invalidates nothing.
	it = convert(store.ChangeEvent{Op: "drop", Coll: schema.CollTasks, Token: tok}, nm, true)
	require.Equal(t, kindControl, it.kind)
	require.Contains(t, string(it.frame), "event: reset\n")
	require.Contains(t, data(t, it)["reason"], "tasks collection was dropped")
	require.Nil(t, convert(store.ChangeEvent{Op: "invalidate", Token: tok}, nm, true))
}

func ptr(s string) *string { return &s }

func TestIDsRoundTrip(t *testing.T) {
	tok := token(7, 3, 1)
	id := encodeID(tok)
	got, err := decodeID(id)
	require.NoError(t, err)
	require.Equal(t, tok, got)
	for _, bad := range []string{"", "!!", "AAAA", encodeID(raw(bson.D{{Key: "x", Value: 1}}))} {
		_, err := decodeID(bad)
		require.Error(t, err, bad)
	}
}
