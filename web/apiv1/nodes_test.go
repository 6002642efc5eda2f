package apiv1

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func TestNodes(t *testing.T) {
	e := setup(t)
	ctx := ctxT(t)
	var list struct {
		Nodes   []Node `json:"nodes"`
		Skipped int    `json:"skipped"`
	}
	e.want(200, "GET", "/api/v1/nodes", nil).decode(t, &list)
	require.Empty(t, list.Nodes)

	qid := bson.NewObjectID().Hex()
	_, err := e.st.NodeUpsert(ctx, store.NodeUpsertParams{Node: "n2.example.com", State: schema.NodeStateRunning, Queues: []schema.NodeQueue{
		{Name: "q", ID: qid, Constructor: "P", MaxThreads: ptr(2), TasksTodo: 4, TasksDoing: 1, TasksDone: 9},
	}, Serves: []string{qid}, Full: []string{qid}, WakeupStream: true, FenceAfter: 7500 * time.Millisecond})
	require.NoError(t, err)
	_, err = e.st.NodeUpsert(ctx, store.NodeUpsertParams{Node: "n1 ünï"})
	require.NoError(t, err)
	e.want(200, "GET", "/api/v1/nodes", nil).decode(t, &list)
	require.Len(t, list.Nodes, 2)
	n1, n2 := list.Nodes[0], list.Nodes[1]
	require.Equal(t, "n1 ünï", n1.Node)
	require.Nil(t, n1.State)
	require.Equal(t, "n2.example.com", n2.Node)
	require.Equal(t, "running", *n2.State)
	require.NotNil(t, n2.Timestamp)
	require.NotNil(t, n2.HeartbeatAgeMS)
	require.Less(t, *n2.HeartbeatAgeMS, int64(60_000))
	require.False(t, n2.Drain)
	require.Nil(t, n2.MaxThreads)
	require.Equal(t, []NodeQueue{{ID: n2.Queues[0].ID, Name: "q", Plugin: "P", MaxThreads: ptr(2), TasksTodo: 4, TasksDoing: 1, TasksDone: 9}}, n2.Queues)
	require.Equal(t, []string{qid}, n2.Serves)
	require.Equal(t, []string{qid}, n2.Full)
	require.True(t, *n2.WakeupStream)
	require.Equal(t, []string{}, n1.Serves, "serves nothing")
	require.Equal(t, []string{}, n1.Full)
	require.False(t, *n1.WakeupStream)
	require.Equal(t, int64(7500), *n2.FenceAfterMS, "its --fence-after, as its heartbeat says")
	require.Nil(t, n1.FenceAfterMS, "a node that does not say")

	var n Node
	e.want(200, "GET", "/api/v1/nodes/n2.example.com", nil).decode(t, &n)
	require.Equal(t, n2.Node, n.Node)
	e.want(200, "GET", "/api/v1/nodes/"+*n2.ID, nil).decode(t, &n)
	require.Equal(t, n2.Node, n.Node)
	e.want(200, "GET", "/api/v1/nodes/n1%20%C3%BCn%C3%AF", nil).decode(t, &n)
	require.Equal(t, "n1 ünï", n.Node)
	e.wantErr(404, CodeNotFound, "node", "GET", "/api/v1/nodes/n3", nil)
	e.wantErr(404, CodeNotFound, "node", "GET", "/api/v1/nodes/"+bson.NewObjectID().Hex(), nil)

	// maxthreads: set, by id too, and null; the node's own fields stay.
	e.want(200, "PATCH", "/api/v1/nodes/n2.example.com", map[string]any{"maxthreads": 5}).decode(t, &n)
	require.Equal(t, 5, *n.MaxThreads)
	require.Equal(t, "running", *n.State)
	e.want(200, "PATCH", "/api/v1/nodes/"+*n2.ID, `{"maxthreads":0}`).decode(t, &n)
	require.Equal(t, 0, *n.MaxThreads)
	e.want(200, "PATCH", "/api/v1/nodes/n2.example.com", `{"maxthreads":null}`).decode(t, &n)
	require.Nil(t, n.MaxThreads)
	raw, err := e.st.NodeDoc(ctx, "n2.example.com")
	require.NoError(t, err)
	require.Equal(t, bson.TypeNull, raw.Lookup("maxthreads").Type)
	e.wantErr(404, CodeNotFound, "node", "PATCH", "/api/v1/nodes/n3", `{"maxthreads":1}`)
	e.wantErr(400, CodeInvalidField, "maxthreads", "PATCH", "/api/v1/nodes/n3", `{"maxthreads":-1}`)

	// Drain, by name and by id; twice is fine.
	e.want(200, "POST", "/api/v1/nodes/n1%20%C3%BCn%C3%AF/drain", nil).decode(t, &n)
	require.True(t, n.Drain)
	e.want(200, "POST", "/api/v1/nodes/"+*n2.ID+"/drain", nil).decode(t, &n)
	require.True(t, n.Drain)
	require.Equal(t, "n2.example.com", n.Node)
	e.want(200, "POST", "/api/v1/nodes/n2.example.com/drain", nil)
	e.wantErr(404, CodeNotFound, "node", "POST", "/api/v1/nodes/n3/drain", nil)
	e.wantErr(404, CodeNotFound, "node", "POST", "/api/v1/nodes/"+bson.NewObjectID().Hex()+"/drain", nil)

	// A node declared dead by another.
	_, err = e.db.Collection(schema.CollNodes).UpdateOne(ctx, bson.D{{Key: "node", Value: "n1 ünï"}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: "dead", Value: true}, {Key: "dead_by", Value: "n2.example.com"}, {Key: "dead_at", Value: bson.NewDateTimeFromTime(n2Time(t, n2))}}}})
	require.NoError(t, err)
	e.want(200, "GET", "/api/v1/nodes/n1%20%C3%BCn%C3%AF", nil).decode(t, &n)
	require.True(t, n.Dead)
	require.Equal(t, "n2.example.com", *n.DeadBy)
	require.Equal(t, *n2.Timestamp, *n.DeadAt)

	// Documents other tools wrote.
	_, err = e.db.Collection(schema.CollNodes).InsertOne(ctx, bson.D{{Key: "node", Value: "bad"}, {Key: "maxthreads", Value: "lots"}})
	require.NoError(t, err)
	_, err = e.db.Collection(schema.CollNodes).InsertOne(ctx, bson.D{{Key: "node", Value: "perl"}, {Key: "timestamp", Value: time.Now()}}) // 4.103's
	require.NoError(t, err)
	e.want(200, "GET", "/api/v1/nodes/perl", nil).decode(t, &n)
	require.Nil(t, n.Serves, "not said")
	require.Nil(t, n.Full)
	require.Nil(t, n.WakeupStream)
	_, err = e.db.Collection(schema.CollNodes).DeleteOne(ctx, bson.D{{Key: "node", Value: "perl"}})
	require.NoError(t, err)
	e.want(200, "GET", "/api/v1/nodes", nil).decode(t, &list)
	require.Len(t, list.Nodes, 2)
	require.Equal(t, 1, list.Skipped)
	e.wantErr(500, CodeMalformedDocument, "", "GET", "/api/v1/nodes/bad", nil)
}

func n2Time(t *testing.T, n Node) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339, *n.Timestamp)
	require.NoError(t, err)
	return tm
}
