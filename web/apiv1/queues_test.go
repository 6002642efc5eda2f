package apiv1

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func TestQueueLifecycle(t *testing.T) {
	e := setup(t)
	ctx := ctxT(t)

	var empty struct {
		Queues  []Queue `json:"queues"`
		Skipped int     `json:"skipped"`
	}
	e.want(200, "GET", "/api/v1/queues", nil).decode(t, &empty)
	require.Empty(t, empty.Queues)

	r := e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "démo ✓", "plugin": "Disbatch::Plugin::Demo"})
	var q Queue
	r.decode(t, &q)
	require.Equal(t, "/api/v1/queues/"+q.ID, r.header.Get("Location"))
	require.Equal(t, "démo ✓", q.Name)
	require.Equal(t, "Disbatch::Plugin::Demo", q.Plugin)
	require.Equal(t, 1, *q.MaxThreads, "a new queue runs by default")
	require.Equal(t, "default", q.Sort)
	require.Equal(t, []string{}, q.NodesPin)
	require.Equal(t, Counts{}, q.Counts, "no counters until a node creates them")
	require.Equal(t, map[string]any{"queued": nil, "running": 0.0, "finished": nil, "failed": nil, "total": nil, "count_running": nil}, r.json(t)["counts"])

	// Both dialects are written, so 4.103 nodes run it too.
	raw, err := e.db.Collection(schema.CollQueues).FindOne(ctx, bson.D{{Key: "name", Value: "démo ✓"}}).Raw()
	require.NoError(t, err)
	require.Equal(t, "Disbatch::Plugin::Demo", raw.Lookup("plugin").StringValue())
	require.EqualValues(t, 1, raw.Lookup("threads").AsInt64())

	// By id and by (escaped) name.
	var got Queue
	e.want(200, "GET", "/api/v1/queues/"+q.ID, nil).decode(t, &got)
	require.Equal(t, q, got)
	e.want(200, "GET", "/api/v1/queues/d%C3%A9mo%20%E2%9C%93", nil).decode(t, &got)
	require.Equal(t, q.ID, got.ID)

	// Counters as the projection keeps them, running tasks counted live.
	qid, _ := bson.ObjectIDFromHex(q.ID)
	ids, err := e.st.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: qid, Parameters: make([]bson.Raw, 5)})
	require.NoError(t, err)
	_, err = e.st.TaskClaim(ctx, store.TaskClaimParams{Queue: qid, Node: "n1"})
	require.NoError(t, err)
	_, err = e.db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: qid}}, bson.D{{Key: "$set", Value: bson.D{{Key: "count_todo", Value: 4}, {Key: "count_total", Value: 6}}}})
	require.NoError(t, err)
	e.want(200, "GET", "/api/v1/queues/"+q.ID, nil).decode(t, &got)
	require.Equal(t, Counts{Queued: ptr[int64](3), Running: 1, Finished: ptr[int64](2), Total: ptr[int64](6)}, got.Counts, "no count_running or count_failed yet: null")
	require.Len(t, ids, 5)
	// count_running and count_failed as the projection keeps them (here
	// count_running set apart from the live count, to tell them apart), in
	// the answer as JSON.
	_, err = e.db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: qid}}, bson.D{{Key: "$set", Value: bson.D{{Key: "count_running", Value: 2}, {Key: "count_failed", Value: 1}}}})
	require.NoError(t, err)
	r = e.want(200, "GET", "/api/v1/queues/"+q.ID, nil)
	r.decode(t, &got)
	require.Equal(t, Counts{Queued: ptr[int64](3), Running: 1, Finished: ptr[int64](2), Failed: ptr[int64](1), Total: ptr[int64](6), CountRunning: ptr[int64](2)}, got.Counts)
	var asJSON map[string]any
	r.decode(t, &asJSON)
	require.Equal(t, map[string]any{"queued": 3.0, "running": 1.0, "finished": 2.0, "failed": 1.0, "total": 6.0, "count_running": 2.0}, asJSON["counts"])

	// PATCH: every field, answered as stored.
	e.want(200, "PATCH", "/api/v1/queues/"+q.ID, map[string]any{
		"name": "renamed", "plugin": "P2", "maxthreads": nil, "sort": "lifo", "nodes_pin": []string{"n1", "n2"}, "nodes_ignore": []string{"n3"},
	}).decode(t, &got)
	require.Equal(t, "renamed", got.Name)
	require.Equal(t, "P2", got.Plugin)
	require.Nil(t, got.MaxThreads)
	require.Equal(t, "lifo", got.Sort)
	require.Equal(t, []string{"n1", "n2"}, got.NodesPin)
	require.Equal(t, []string{"n3"}, got.NodesIgnore)
	require.Equal(t, int64(1), got.Counts.Running)
	e.want(200, "PATCH", "/api/v1/queues/renamed", map[string]any{"nodes_pin": []string{}, "maxthreads": 4}).decode(t, &got)
	require.Equal(t, []string{}, got.NodesPin)
	require.Equal(t, 4, *got.MaxThreads)
	raw, err = e.db.Collection(schema.CollQueues).FindOne(ctx, bson.D{{Key: "_id", Value: qid}}).Raw()
	require.NoError(t, err)
	require.EqualValues(t, 4, raw.Lookup("threads").AsInt64())
	require.Equal(t, "P2", raw.Lookup("constructor").StringValue())

	var list struct {
		Queues  []Queue `json:"queues"`
		Skipped int     `json:"skipped"`
	}
	e.want(200, "GET", "/api/v1/queues", nil).decode(t, &list)
	require.Len(t, list.Queues, 1)
	require.Equal(t, got, list.Queues[0])

	// DELETE: refused while tasks are unfinished, then forced.
	e.wantErr(409, CodeUnfinishedTasks, "force", "DELETE", "/api/v1/queues/renamed", nil)
	e.wantErr(400, CodeInvalidParameter, "force", "DELETE", "/api/v1/queues/renamed?force=yes", nil)
	var del struct {
		ID           string `json:"id"`
		Name         string `json:"name"`
		TasksDeleted int64  `json:"tasks_deleted"`
	}
	e.want(200, "DELETE", "/api/v1/queues/renamed?force=true", nil).decode(t, &del)
	require.Equal(t, q.ID, del.ID)
	require.EqualValues(t, 5, del.TasksDeleted)
	e.wantErr(404, CodeNotFound, "queue", "GET", "/api/v1/queues/"+q.ID, nil)
	e.wantErr(404, CodeNotFound, "queue", "DELETE", "/api/v1/queues/renamed", nil)
	e.wantErr(404, CodeNotFound, "queue", "PATCH", "/api/v1/queues/renamed", map[string]any{"sort": "fifo"})
}

func TestQueueDeleteEmpty(t *testing.T) {
	e := setup(t)
	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "q", "plugin": "P", "maxthreads": 0, "sort": "fifo", "nodes_ignore": []string{"x"}})
	var del map[string]any
	e.want(200, "DELETE", "/api/v1/queues/q?force=false", nil).decode(t, &del)
	require.EqualValues(t, 0, del["tasks_deleted"])
}

// TestQueueDeleteOfAThenQueueIsRefused: a queue another queue's then
// names is not deleted, forced or not (409, saying which queue).
func TestQueueDeleteOfAThenQueueIsRefused(t *testing.T) {
	e := setup(t)
	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "dst", "plugin": "P"})
	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "src", "plugin": "P", "then": "dst"})
	d := e.wantErr(409, CodeConflict, "queue", "DELETE", "/api/v1/queues/dst?force=true", nil)
	require.Contains(t, d.Message, `is the then queue of "src"`)
	e.want(200, "PATCH", "/api/v1/queues/src", map[string]any{"then": ""})
	e.want(200, "DELETE", "/api/v1/queues/dst", nil)
}

// TestAQueueDeleteCutShortIsFinishedByItsID: a forced delete cut short
// after the queue document went (its tasks left) is run again by the
// queue's id, and deletes them; then there is nothing left to delete.
func TestAQueueDeleteCutShortIsFinishedByItsID(t *testing.T) {
	e := setup(t)
	qid := e.newQueue("cut")
	e.submit("cut", `{}`, `{}`)
	_, err := e.db.Collection(schema.CollQueues).DeleteOne(ctxT(t), bson.D{{Key: "_id", Value: qid}})
	require.NoError(t, err)
	e.wantErr(404, CodeNotFound, "queue", "DELETE", "/api/v1/queues/"+qid.Hex(), nil)
	var del map[string]any
	e.want(200, "DELETE", "/api/v1/queues/"+qid.Hex()+"?force=true", nil).decode(t, &del)
	require.EqualValues(t, 2, del["tasks_deleted"])
	e.wantErr(404, CodeNotFound, "queue", "DELETE", "/api/v1/queues/"+qid.Hex()+"?force=true", nil)
}

func TestQueueCreateConflicts(t *testing.T) {
	e := setup(t)
	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "taken", "plugin": "P", "nodes_pin": []string{"n1"}})
	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "other", "plugin": "P"})
	e.wantErr(409, CodeConflict, "name", "POST", "/api/v1/queues", map[string]any{"name": "taken", "plugin": "P"})
	e.wantErr(409, CodeConflict, "name", "PATCH", "/api/v1/queues/other", map[string]any{"name": "taken"})
	e.want(200, "PATCH", "/api/v1/queues/taken", map[string]any{"name": "taken"})

	// Concurrent creates of one name: exactly one wins, nothing else is
	// written.
	var wg sync.WaitGroup
	statuses := make([]int, 16)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i] = e.do("POST", "/api/v1/queues", map[string]any{"name": "race", "plugin": "P"}).status
		}()
	}
	wg.Wait()
	won := 0
	for _, s := range statuses {
		switch s {
		case http.StatusCreated:
			won++
		case http.StatusConflict:
		default:
			t.Fatalf("status %d", s)
		}
	}
	require.Equal(t, 1, won)
	docs, err := e.st.QueueDocs(ctxT(t))
	require.NoError(t, err)
	require.Len(t, docs, 3)
}

func TestQueuePlugins(t *testing.T) {
	e := setup(t, func(o *Options, _ *store.Options) { o.Plugins = []string{"Disbatch::Plugin::Demo", "exec"} })
	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "q", "plugin": "exec"})
	d := e.wantErr(400, CodeInvalidField, "plugin", "POST", "/api/v1/queues", map[string]any{"name": "q2", "plugin": "nope"})
	require.Contains(t, d.Message, "Disbatch::Plugin::Demo, exec")
	e.wantErr(400, CodeInvalidField, "plugin", "PATCH", "/api/v1/queues/q", map[string]any{"plugin": "nope"})
	var doc map[string]any
	e.want(200, "GET", "/api/v1/openapi.json", nil).decode(t, &doc)
	enum := dig(doc, "components", "schemas", "PluginName", "enum")
	require.Equal(t, []any{"Disbatch::Plugin::Demo", "exec"}, enum)
}

func TestQueueListSkipsMalformed(t *testing.T) {
	e := setup(t)
	_, err := e.db.Collection(schema.CollQueues).InsertOne(ctxT(t), bson.D{{Key: "name", Value: "no plugin"}})
	require.NoError(t, err)
	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "good", "plugin": "P"})
	var list struct {
		Queues  []Queue `json:"queues"`
		Skipped int     `json:"skipped"`
	}
	e.want(200, "GET", "/api/v1/queues", nil).decode(t, &list)
	require.Len(t, list.Queues, 1)
	require.Equal(t, 1, list.Skipped)
	e.wantErr(500, CodeMalformedDocument, "", "GET", "/api/v1/queues/no%20plugin", nil)
}

// TestContentTypes: JSON with or without a UTF-8 charset, in any case;
// nothing else.
func TestContentTypes(t *testing.T) {
	e := setup(t)
	for i, ct := range []string{"application/json", "application/json; charset=UTF-8", "application/json;charset=utf-8", "Application/JSON; Charset=\"utf-8\""} {
		e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "q" + string(rune('a'+i)), "plugin": "P"}, "Content-Type", ct)
	}
	for _, ct := range []string{"text/plain", "application/json; charset=utf-16", "application/x-json", "multipart/form-data; boundary=x", "application/json; charset=utf-8; x=y"} {
		e.wantErr(415, CodeUnsupportedMediaType, "", "POST", "/api/v1/queues", map[string]any{"name": "no", "plugin": "P"}, "Content-Type", ct)
	}
	var list struct {
		Queues []Queue `json:"queues"`
	}
	e.want(200, "GET", "/api/v1/queues", nil).decode(t, &list)
	require.Len(t, list.Queues, 4)
}

// TestQueueScheduling: the scheduling fields are set at creation and by a
// patch, shown with their defaults, and bad values (or a then naming no
// queue) are refused with nothing written.
func TestQueueScheduling(t *testing.T) {
	e := setup(t)
	var q Queue
	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "next", "plugin": "P"}).decode(t, &q)
	require.Equal(t, 20.0, q.Weight, "the default weight")
	require.Zero(t, q.MaxRunning)
	require.False(t, q.Paused)

	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "q", "plugin": "P", "priority": 5, "max_running": 3,
		"config": map[string]any{"bucket": "b1"}, "then": "next"}).decode(t, &q)
	require.Equal(t, 5.0, q.Priority)
	require.Equal(t, 3, q.MaxRunning)
	require.Equal(t, "next", q.Then)
	require.JSONEq(t, `{"bucket":"b1"}`, string(q.Config))
	raw, err := e.db.Collection(schema.CollQueues).FindOne(ctxT(t), bson.D{{Key: "name", Value: "q"}}).Raw()
	require.NoError(t, err)
	require.EqualValues(t, 3, raw.Lookup("threads").AsInt64(), "4.103's name of the cap")

	var got Queue
	e.want(200, "PATCH", "/api/v1/queues/q", map[string]any{"weight": 2.5, "max_getwork": 8, "paused": true,
		"continuous": true, "interval": 30, "then": "", "config": map[string]any{}}).decode(t, &got)
	require.Equal(t, 2.5, got.Weight)
	require.Equal(t, 8, got.MaxGetwork)
	require.True(t, got.Paused)
	require.True(t, got.Continuous)
	require.Equal(t, 30.0, got.Interval)
	require.Empty(t, got.Then, "removed")
	require.Nil(t, got.Config, "removed")

	before, err := e.st.QueueDocs(ctxT(t))
	require.NoError(t, err)
	for _, x := range []struct {
		method, target string
		body           map[string]any
		field          string
	}{
		{"PATCH", "/api/v1/queues/q", map[string]any{"weight": "heavy"}, "weight"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"max_running": -1}, "max_running"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"max_running": 1.5}, "max_running"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"max_getwork": -1}, "max_getwork"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"paused": "yes"}, "paused"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"interval": -1}, "interval"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"config": []any{1}}, "config"},
	} {
		e.wantErr(400, CodeInvalidField, x.field, x.method, x.target, x.body)
	}
	e.wantErr(409, CodeConflict, "then", "PATCH", "/api/v1/queues/q", map[string]any{"then": "missing"})
	e.wantErr(409, CodeConflict, "then", "POST", "/api/v1/queues", map[string]any{"name": "x", "plugin": "P", "then": "missing"})
	after, err := e.st.QueueDocs(ctxT(t))
	require.NoError(t, err)
	require.Equal(t, before, after, "nothing was written")
}
