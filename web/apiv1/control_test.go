package apiv1

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// counted records what Options.Controlled was told.
type counted struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *counted) add(action string, n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int64{}
	}
	c.n[action] += n
}

func (c *counted) get() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int64{}
	for k, v := range c.n {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func controlSetup(t *testing.T) (*env, *counted) {
	c := &counted{}
	return setup(t, func(o *Options, _ *store.Options) { o.Controlled = c.add }), c
}

// setTask changes a task in the database directly, as a node would.
func (e *env) setTask(id string, set bson.D) {
	e.t.Helper()
	res, err := e.db.Collection(schema.CollTasks).UpdateOne(ctxT(e.t), bson.D{{Key: "_id", Value: oid(e.t, id)}}, bson.D{{Key: "$set", Value: set}})
	require.NoError(e.t, err)
	require.EqualValues(e.t, 1, res.MatchedCount)
}

func (e *env) running(id, node string) {
	e.t.Helper()
	e.setTask(id, bson.D{{Key: "status", Value: int32(schema.StatusRunning)}, {Key: "node", Value: node}})
}

func (e *env) finished(id string, status schema.Status) {
	e.t.Helper()
	e.setTask(id, bson.D{{Key: "status", Value: int32(status)}, {Key: "node", Value: "n1"}, {Key: "stdout", Value: "out"}, {Key: "stderr", Value: ""}})
}

func (e *env) task(id string) Task {
	e.t.Helper()
	var task Task
	e.want(200, "GET", "/api/v1/tasks/"+id, nil).decode(e.t, &task)
	return task
}

// tasksAsStored is every task document, in _id order: what "nothing
// changed" compares.
func (e *env) tasksAsStored() []bson.Raw {
	e.t.Helper()
	cur, err := e.db.Collection(schema.CollTasks).Find(ctxT(e.t), bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	require.NoError(e.t, err)
	var docs []bson.Raw
	require.NoError(e.t, cur.All(ctxT(e.t), &docs))
	return docs
}

func requireSameTasks(t *testing.T, before, after []bson.Raw, msgAndArgs ...any) {
	t.Helper()
	require.Len(t, after, len(before), msgAndArgs...)
	for i := range before {
		require.True(t, bytes.Equal(before[i], after[i]), append([]any{"task %d changed: %s\nnow %s"}, i, before[i], after[i])...)
	}
}

func TestTaskKill(t *testing.T) {
	e, c := controlSetup(t)
	e.newQueue("q")
	ids := e.submit("q", `{"i":0}`, `{"i":1}`, `{"i":2}`, `{"i":3}`, `{"i":4}`)
	queued, running, done, orphan := ids[0], ids[1], ids[2], ids[3]
	e.running(running, "n1")
	e.finished(done, schema.StatusSucceeded)
	e.setTask(orphan, bson.D{{Key: "status", Value: int32(schema.StatusOrphaned)}, {Key: "node", Value: "gone"}})

	// A queued task is cancelled at once.
	var res KillResult
	e.want(200, "POST", "/api/v1/tasks/"+queued+"/kill", map[string]any{"reason": "wrong input"}).decode(t, &res)
	require.Equal(t, KillResult{Cancelled: 1, Skipped: []Skipped{}}, res)
	task := e.task(queued)
	require.Equal(t, 2, task.Status)
	require.Equal(t, "cancelled", *task.Reason)
	require.NotNil(t, task.Kill)
	require.Nil(t, task.Kill.Node, "it was not claimed")
	require.Equal(t, Anonymous, task.Kill.By)
	require.Equal(t, "wrong input", task.Kill.Reason)
	require.NotNil(t, task.Kill.At)

	// A running one gets a kill request naming its node; the node carries
	// it out, so the status stays.
	e.want(200, "POST", "/api/v1/tasks/"+running+"/kill", nil).decode(t, &res)
	require.Equal(t, KillResult{Requested: 1, Skipped: []Skipped{}}, res)
	task = e.task(running)
	require.Equal(t, 0, task.Status)
	require.Equal(t, "n1", *task.Kill.Node)
	require.Equal(t, "", task.Kill.Reason)
	require.Nil(t, task.Reason)
	// Asked again: nothing to change, 409.
	d := e.wantErr(409, CodeTaskState, "id", "POST", "/api/v1/tasks/"+running+"/kill", `{}`)
	require.Contains(t, d.Message, "already requested")

	// A finished one: 409, and nothing changes.
	before := e.tasksAsStored()
	d = e.wantErr(409, CodeTaskState, "id", "POST", "/api/v1/tasks/"+done+"/kill", nil)
	require.Contains(t, d.Message, "finished")
	requireSameTasks(t, before, e.tasksAsStored())

	// An unknown one: 404; a bad id: 400.
	e.wantErr(404, CodeNotFound, "id", "POST", "/api/v1/tasks/"+bson.NewObjectID().Hex()+"/kill", nil)
	e.wantErr(400, CodeInvalidParameter, "id", "POST", "/api/v1/tasks/nope/kill", nil)

	// The orphan is settled: finished as killed.
	e.want(200, "POST", "/api/v1/tasks/"+orphan+"/kill", nil).decode(t, &res)
	require.Equal(t, KillResult{Settled: 1, Skipped: []Skipped{}}, res)
	task = e.task(orphan)
	require.Equal(t, 2, task.Status)
	require.Equal(t, "killed", *task.Reason)

	require.Equal(t, map[string]int64{ActionCancelled: 1, ActionKillRequested: 1, ActionSettled: 1}, c.get())

	// Bulk, by ids: what was changed is counted, what was not is listed in
	// order, with why; repeats count once.
	unknown := bson.NewObjectID().Hex()
	e.want(200, "POST", "/api/v1/tasks/kill", map[string]any{"ids": []string{done, ids[4], unknown, running, ids[4]}, "reason": "bulk"}).decode(t, &res)
	require.EqualValues(t, 1, res.Cancelled)
	require.Zero(t, res.Requested)
	require.Len(t, res.Skipped, 3)
	require.Equal(t, []string{done, unknown, running}, []string{res.Skipped[0].ID, res.Skipped[1].ID, res.Skipped[2].ID})
	require.Contains(t, res.Skipped[0].Why, "finished")
	require.Equal(t, "no such task", res.Skipped[1].Why)
	require.Contains(t, res.Skipped[2].Why, "already requested")
	require.Equal(t, "bulk", e.task(ids[4]).Kill.Reason)
	require.Equal(t, map[string]int64{ActionCancelled: 2, ActionKillRequested: 1, ActionSettled: 1}, c.get())

	// Bulk, by filter: nothing left to kill in q.
	e.want(200, "POST", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"queue": "q"}}).decode(t, &res)
	require.Equal(t, KillResult{Skipped: []Skipped{}}, res)
}

func TestTaskKillByFilter(t *testing.T) {
	e, c := controlSetup(t)
	e.newQueue("q1")
	e.newQueue("q2")
	a := e.submit("q1", `{}`, `{}`, `{}`)
	b := e.submit("q2", `{}`)
	e.running(a[1], "n1")
	e.running(a[2], "n2")
	var res KillResult
	e.want(200, "POST", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"queue": "q1", "status": []any{"running", -2}, "node": "n2"}}).decode(t, &res)
	require.Equal(t, KillResult{Requested: 1, Skipped: []Skipped{}}, res)
	require.Equal(t, "n2", *e.task(a[2]).Kill.Node)
	require.Nil(t, e.task(a[1]).Kill)
	e.want(200, "POST", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"queue": "q1", "status": []any{"queued"}}}).decode(t, &res)
	require.Equal(t, KillResult{Cancelled: 1, Skipped: []Skipped{}}, res)
	require.Equal(t, -2, e.task(b[0]).Status, "another queue's task is left alone")
	// A queue by id need not exist; by name it must.
	e.want(200, "POST", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"queue": bson.NewObjectID().Hex()}}).decode(t, &res)
	require.Equal(t, KillResult{Skipped: []Skipped{}}, res)
	e.wantErr(404, CodeNotFound, "filter.queue", "POST", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"queue": "nope"}})
	require.Equal(t, map[string]int64{ActionCancelled: 1, ActionKillRequested: 1}, c.get())
}

func TestTaskCancel(t *testing.T) {
	e, c := controlSetup(t)
	e.newQueue("q")
	ids := e.submit("q", `{}`, `{}`, `{}`, `{}`)
	e.running(ids[1], "n1")
	e.finished(ids[2], schema.StatusFailed)

	var res CancelResult
	e.want(200, "POST", "/api/v1/tasks/"+ids[0]+"/cancel", map[string]any{"reason": "not needed"}).decode(t, &res)
	require.Equal(t, CancelResult{Cancelled: 1, Skipped: []Skipped{}}, res)
	task := e.task(ids[0])
	require.Equal(t, 2, task.Status)
	require.Equal(t, "cancelled", *task.Reason)
	require.Nil(t, task.Kill)
	require.Equal(t, &RecordView{By: Anonymous, At: task.Cancel.At, Reason: "not needed"}, task.Cancel)
	require.NotNil(t, task.Cancel.At)

	before := e.tasksAsStored()
	d := e.wantErr(409, CodeTaskState, "id", "POST", "/api/v1/tasks/"+ids[1]+"/cancel", nil)
	require.Contains(t, d.Message, "kill it instead")
	e.wantErr(409, CodeTaskState, "id", "POST", "/api/v1/tasks/"+ids[2]+"/cancel", nil)
	e.wantErr(404, CodeNotFound, "id", "POST", "/api/v1/tasks/"+bson.NewObjectID().Hex()+"/cancel", nil)
	requireSameTasks(t, before, e.tasksAsStored())

	// Bulk by filter: the queued task; the running one is not cancelled.
	e.want(200, "POST", "/api/v1/tasks/cancel", map[string]any{"filter": map[string]any{"queue": "q"}}).decode(t, &res)
	require.Equal(t, CancelResult{Cancelled: 1, Skipped: []Skipped{}}, res)
	require.Equal(t, 2, e.task(ids[3]).Status)
	require.Equal(t, 0, e.task(ids[1]).Status)
	require.Equal(t, map[string]int64{ActionCancelled: 2}, c.get())
}

func TestTaskRetry(t *testing.T) {
	e, c := controlSetup(t)
	e.newQueue("q")
	ids := e.submit("q", `{}`, `{}`, `{}`, `{}`)
	e.finished(ids[0], schema.StatusFailed)
	e.finished(ids[1], schema.StatusSucceeded)
	e.setTask(ids[2], bson.D{{Key: "status", Value: int32(schema.StatusOrphaned)}, {Key: "node", Value: "gone"}})
	e.running(ids[3], "n1")
	e.setTask(ids[0], bson.D{{Key: "tries", Value: 1}, {Key: "attempt", Value: 1}, {Key: "attempts", Value: bson.A{bson.D{{Key: "node", Value: "n1"},
		{Key: "finished", Value: time.Date(2026, 5, 1, 8, 0, 0, 0, time.UTC)}, {Key: "status", Value: 2}, {Key: "reason", Value: "timeout"}}}}})

	// A dry run by filter counts and changes nothing.
	before := e.tasksAsStored()
	var res RetryResult
	e.want(200, "POST", "/api/v1/tasks/retry", map[string]any{"filter": map[string]any{"queue": "q"}, "dry_run": true}).decode(t, &res)
	require.Equal(t, RetryResult{Requeued: 3, DryRun: true, Skipped: []Skipped{}}, res)
	e.want(200, "POST", "/api/v1/tasks/retry", map[string]any{"filter": map[string]any{"status": []any{"failed"}}, "dry_run": true}).decode(t, &res)
	require.EqualValues(t, 1, res.Requeued)
	e.want(200, "POST", "/api/v1/tasks/"+ids[1]+"/retry", map[string]any{"dry_run": true}).decode(t, &res)
	require.Equal(t, RetryResult{Requeued: 1, DryRun: true, Skipped: []Skipped{}}, res)
	requireSameTasks(t, before, e.tasksAsStored(), "a dry run changes nothing")
	require.Empty(t, c.get())
	require.Equal(t, 1, *e.task(ids[0]).Tries)

	// A running task is not retried.
	d := e.wantErr(409, CodeTaskState, "id", "POST", "/api/v1/tasks/"+ids[3]+"/retry", nil)
	require.Contains(t, d.Message, "only finished or orphaned")
	e.wantErr(409, CodeTaskState, "id", "POST", "/api/v1/tasks/"+ids[3]+"/retry", map[string]any{"dry_run": true})
	requireSameTasks(t, before, e.tasksAsStored())

	// By filter, for real: back to the queue, history kept.
	e.want(200, "POST", "/api/v1/tasks/retry", map[string]any{"filter": map[string]any{"queue": "q", "status": []any{2, "orphaned"}}}).decode(t, &res)
	require.Equal(t, RetryResult{Requeued: 2, Skipped: []Skipped{}}, res)
	task := e.task(ids[0])
	require.Equal(t, -2, task.Status)
	require.Nil(t, task.Node)
	require.Equal(t, "requeued", *task.Reason)
	require.Equal(t, 1, *task.Attempt)
	require.Nil(t, task.Tries, "spent retries are cleared")
	require.Equal(t, Anonymous, task.Requeued.By)
	require.NotNil(t, task.Requeued.At)
	require.Equal(t, []AttemptView{{Node: "n1", Finished: ptr("2026-05-01T08:00:00.000Z"), Status: 2, Reason: ptr("timeout")}}, task.Attempts)
	require.Equal(t, -2, e.task(ids[2]).Status)
	require.Equal(t, 1, e.task(ids[1]).Status, "not selected")

	// By ids.
	e.want(200, "POST", "/api/v1/tasks/retry", map[string]any{"ids": []string{ids[1], ids[3]}}).decode(t, &res)
	require.EqualValues(t, 1, res.Requeued)
	require.Equal(t, []Skipped{{ID: ids[3], Why: res.Skipped[0].Why}}, res.Skipped)
	require.Equal(t, map[string]int64{ActionRequeued: 3}, c.get())
}

// TestTaskControlBadInput: every invalid request is a 400 naming the
// field, changes nothing, and counts nothing.
func TestTaskControlBadInput(t *testing.T) {
	e, c := controlSetup(t)
	e.newQueue("q")
	ids := e.submit("q", `{}`, `{}`)
	e.running(ids[1], "n1")
	many := make([]string, store.MaxControlIDs+1)
	for i := range many {
		many[i] = bson.NewObjectID().Hex()
	}
	many[0] = ids[0]
	before := e.tasksAsStored()
	for _, x := range []struct {
		name, target string
		body         any
		code, field  string
	}{
		{"1001 ids", "/api/v1/tasks/kill", map[string]any{"ids": many}, CodeInvalidField, "ids"},
		{"1001 ids, cancel", "/api/v1/tasks/cancel", map[string]any{"ids": many}, CodeInvalidField, "ids"},
		{"1001 ids, retry", "/api/v1/tasks/retry", map[string]any{"ids": many}, CodeInvalidField, "ids"},
		{"no ids", "/api/v1/tasks/kill", map[string]any{"ids": []string{}}, CodeInvalidField, "ids"},
		{"ids and filter", "/api/v1/tasks/kill", map[string]any{"ids": []string{ids[0]}, "filter": map[string]any{"queue": "q"}}, CodeInvalidField, ""},
		{"neither", "/api/v1/tasks/cancel", map[string]any{"reason": "x"}, CodeMissingField, "ids"},
		{"empty body object", "/api/v1/tasks/retry", map[string]any{}, CodeMissingField, "ids"},
		{"bad id", "/api/v1/tasks/kill", map[string]any{"ids": []string{ids[0], "xyz"}}, CodeInvalidField, "ids[1]"},
		{"upper-case id", "/api/v1/tasks/kill", map[string]any{"ids": []string{strings.ToUpper(ids[0])}}, CodeInvalidField, "ids[0]"},
		{"id a number", "/api/v1/tasks/kill", map[string]any{"ids": []any{1}}, CodeInvalidField, "ids[0]"},
		{"ids a string", "/api/v1/tasks/kill", map[string]any{"ids": ids[0]}, CodeInvalidField, "ids"},
		{"empty filter", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{}}, CodeInvalidField, "filter"},
		{"unknown status", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"status": []any{"queued", "done"}}}, CodeInvalidField, "filter.status[1]"},
		{"status a fraction", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"status": []any{1.5}}}, CodeInvalidField, "filter.status[0]"},
		{"status not a list", "/api/v1/tasks/cancel", map[string]any{"filter": map[string]any{"status": "queued"}}, CodeInvalidField, "filter.status"},
		{"unknown reason", "/api/v1/tasks/retry", map[string]any{"filter": map[string]any{"reason": "bored"}}, CodeInvalidField, "filter.reason"},
		{"malformed since", "/api/v1/tasks/retry", map[string]any{"filter": map[string]any{"since": "yesterday"}}, CodeInvalidField, "filter.since"},
		{"a date, no time", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"until": "2026-01-02"}}, CodeInvalidField, "filter.until"},
		{"a comma before the fraction", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"since": "2026-01-02T15:04:05,5Z"}}, CodeInvalidField, "filter.since"},
		{"a leap second that is none", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"since": "2016-12-31T10:59:60Z"}}, CodeInvalidField, "filter.since"},
		{"unknown filter field", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"queue": "q", "params": map[string]any{}}}, CodeUnknownField, "filter.params"},
		{"empty node", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"node": ""}}, CodeInvalidField, "filter.node"},
		{"empty queue", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"queue": ""}}, CodeInvalidField, "filter.queue"},
		{"reason too long", "/api/v1/tasks/kill", map[string]any{"ids": ids, "reason": strings.Repeat("é", 1025)}, CodeInvalidField, "reason"},
		{"reason with a newline", "/api/v1/tasks/cancel", map[string]any{"ids": ids, "reason": "a\nb"}, CodeInvalidField, "reason"},
		{"dry_run on kill a string", "/api/v1/tasks/kill", map[string]any{"ids": ids, "dry_run": "yes"}, CodeInvalidField, "dry_run"},
		{"reason on retry", "/api/v1/tasks/retry", map[string]any{"ids": ids, "reason": "x"}, CodeUnknownField, "reason"},
		{"dry_run a string", "/api/v1/tasks/retry", map[string]any{"ids": ids, "dry_run": "yes"}, CodeInvalidField, "dry_run"},
		{"one: dry_run on cancel a number", "/api/v1/tasks/" + ids[0] + "/cancel", map[string]any{"dry_run": 1}, CodeInvalidField, "dry_run"},
		{"one: ids", "/api/v1/tasks/" + ids[0] + "/cancel", map[string]any{"ids": ids}, CodeUnknownField, "ids"},
		{"one: reason a number", "/api/v1/tasks/" + ids[0] + "/kill", map[string]any{"reason": 5}, CodeInvalidField, "reason"},
		{"one: body an array", "/api/v1/tasks/" + ids[0] + "/retry", `[]`, CodeInvalidField, ""},
		{"one: not JSON", "/api/v1/tasks/" + ids[0] + "/retry", `{`, CodeInvalidJSON, ""},
	} {
		e.wantErr(400, x.code, x.field, "POST", x.target, x.body)
	}
	e.wantErr(415, CodeUnsupportedMediaType, "", "POST", "/api/v1/tasks/"+ids[0]+"/kill", `reason=x`, "Content-Type", "application/x-www-form-urlencoded")
	e.wantErr(415, CodeUnsupportedMediaType, "", "POST", "/api/v1/tasks/kill", `{"ids":[]}`, "Content-Type", "text/plain")
	requireSameTasks(t, before, e.tasksAsStored(), "an invalid request changes nothing")
	require.Empty(t, c.get())

	// An optional body may be empty, with or without a Content-Type.
	var res KillResult
	e.want(200, "POST", "/api/v1/tasks/"+ids[0]+"/kill", "").decode(t, &res)
	require.EqualValues(t, 1, res.Cancelled)
	e.want(200, "POST", "/api/v1/tasks/"+ids[1]+"/kill", "", "Content-Type", "").decode(t, &res)
	require.EqualValues(t, 1, res.Requested)

	// The literal paths of these routes are not task ids: 405.
	r := e.want(405, "GET", "/api/v1/tasks/kill", nil)
	require.Equal(t, "POST", r.header.Get("Allow"))
	require.Equal(t, CodeMethodNotAllowed, r.apiErr(t).Code)
	require.Equal(t, "GET, HEAD", e.want(405, "POST", "/api/v1/tasks/wait", nil).header.Get("Allow"))
	require.Equal(t, "POST", e.want(405, "DELETE", "/api/v1/tasks/"+ids[0]+"/retry", nil).header.Get("Allow"))
}

type waitResult struct {
	Done      bool        `json:"done"`
	Succeeded bool        `json:"succeeded"`
	Tasks     []WaitState `json:"tasks"`
}

func (e *env) wait(query string) (waitResult, time.Duration) {
	e.t.Helper()
	start := time.Now()
	var w waitResult
	e.want(200, "GET", "/api/v1/tasks/wait?"+query, nil).decode(e.t, &w)
	return w, time.Since(start)
}

func TestTaskWait(t *testing.T) {
	e := setup(t)
	e.newQueue("q")
	ids := e.submit("q", `{}`, `{}`, `{}`, `{}`)
	e.finished(ids[0], schema.StatusSucceeded)
	e.finished(ids[1], schema.StatusSucceeded)
	e.setTask(ids[2], bson.D{{Key: "status", Value: int32(schema.StatusOrphaned)}})

	// Ended already: at once, whatever the timeout.
	w, took := e.wait("id=" + ids[0] + "," + ids[1] + "," + ids[0] + "&timeout=300s")
	require.Less(t, took, time.Minute)
	require.True(t, w.Done)
	require.True(t, w.Succeeded)
	require.Equal(t, []WaitState{
		{ID: ids[0], Found: true, Status: ptr(1), StatusName: ptr("succeeded")},
		{ID: ids[1], Found: true, Status: ptr(1), StatusName: ptr("succeeded")},
	}, w.Tasks, "in order, repeats dropped")
	unknown := bson.NewObjectID().Hex()
	w, _ = e.wait("id=" + ids[2] + "," + unknown)
	require.True(t, w.Done, "orphaned and unknown tasks have ended")
	require.False(t, w.Succeeded)
	require.Equal(t, WaitState{ID: unknown}, w.Tasks[1])

	// Not ended: done false once the timeout passes.
	w, took = e.wait("id=" + ids[0] + "," + ids[3] + "&timeout=1.5s")
	require.GreaterOrEqual(t, took, 1500*time.Millisecond)
	require.False(t, w.Done)
	require.False(t, w.Succeeded)
	require.Equal(t, WaitState{ID: ids[3], Found: true, Status: ptr(-2), StatusName: ptr("queued")}, w.Tasks[1])
	w, _ = e.wait("id=" + ids[3] + "&timeout=0")
	require.False(t, w.Done)

	// Finished while waiting (by a direct write, as a node finishes it):
	// the wait answers then, long before its timeout.
	type answer struct {
		r    *response
		took time.Duration
	}
	got := make(chan answer, 1)
	go func() {
		start := time.Now()
		r := e.do("GET", "/api/v1/tasks/wait?id="+ids[3]+"&timeout=5m", nil) // safe off the test's goroutine
		got <- answer{r, time.Since(start)}
	}()
	time.Sleep(300 * time.Millisecond)
	e.setTask(ids[3], bson.D{{Key: "status", Value: int32(schema.StatusFailed)}, {Key: "reason", Value: "killed"}})
	select {
	case a := <-got:
		require.Equal(t, 200, a.r.status, "%s", a.r.body)
		var w waitResult
		a.r.decode(t, &w)
		require.True(t, w.Done)
		require.False(t, w.Succeeded)
		require.Equal(t, WaitState{ID: ids[3], Found: true, Status: ptr(2), StatusName: ptr("failed"), Reason: ptr("killed")}, w.Tasks[0])
		require.Less(t, a.took, 2*time.Minute)
	case <-time.After(2 * time.Minute):
		t.Fatal("the wait did not answer within 2 minutes of the task finishing")
	}

	// Bad parameters.
	for q, field := range map[string]string{
		"":                                                "id",
		"id=":                                             "id",
		"id=" + ids[0] + ",":                              "id",
		"id=" + ids[0] + "&id=" + ids[1]:                  "id",
		"id=" + strings.ToUpper(ids[0]):                   "id",
		"id=" + ids[0] + "&timeout=301s":                  "timeout",
		"id=" + ids[0] + "&timeout=300.5":                 "timeout",
		"id=" + ids[0] + "&timeout=-1s":                   "timeout",
		"id=" + ids[0] + "&timeout=6m":                    "timeout",
		"id=" + ids[0] + "&timeout=1h":                    "timeout",
		"id=" + ids[0] + "&timeout=soon":                  "timeout",
		"id=" + ids[0] + "&timeout=":                      "timeout",
		"id=" + ids[0] + "&timeout=1s&timeout=2s":         "timeout",
		"id=" + strings.Repeat(ids[0]+",", 1000) + ids[1]: "id",
	} {
		e.wantErr(400, CodeInvalidParameter, field, "GET", "/api/v1/tasks/wait?"+q, nil)
	}
	e.wantErr(400, CodeUnknownParameter, "ids", "GET", "/api/v1/tasks/wait?ids="+ids[0], nil)
	// The largest list, and the other timeout forms.
	w, _ = e.wait("id=" + strings.Repeat(ids[0]+",", 999) + ids[1] + "&timeout=300000ms")
	require.True(t, w.Done)
	require.Len(t, w.Tasks, 2)
	for _, s := range []string{"0", "300", "5m", "0.5m", "250ms", "299.999s", "12"} {
		d, aerr := parseWaitTimeout(s)
		require.Nil(t, aerr, s)
		require.LessOrEqual(t, d, MaxWaitTimeout, s)
	}
	d, _ := parseWaitTimeout("1.5m")
	require.Equal(t, 90*time.Second, d)
}

// TestTaskWaitOverTheWriteTimeout: a wait longer than the server's write
// and read timeouts still answers (its deadlines are lifted).
func TestTaskWaitOverTheWriteTimeout(t *testing.T) {
	e := setup(t)
	e.newQueue("q")
	ids := e.submit("q", `{}`)
	srv := httptest.NewUnstartedServer(e.h)
	srv.Config.WriteTimeout = 500 * time.Millisecond
	srv.Config.ReadTimeout = 500 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)
	target := "/api/v1/tasks/wait?id=" + ids[0] + "&timeout=2s"
	res, err := http.Get(srv.URL + target)
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, 200, res.StatusCode)
	require.NoError(t, e.chk.check(exchange{method: "GET", target: target, status: res.StatusCode, header: res.Header, body: body}))
	var w waitResult
	(&response{body: body}).decode(t, &w)
	require.False(t, w.Done)
}

func TestTaskSubmitControl(t *testing.T) {
	e := setup(t)
	e.newQueue("q")
	future := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	later := future.Add(time.Hour)
	body := map[string]any{"queue": "q", "tasks": []any{
		map[string]any{"params": map[string]any{"i": 0}, "timeout": 90.5},
		map[string]any{"params": map[string]any{"i": 1}},
		map[string]any{"params": map[string]any{"i": 2}, "not_before": future.Format(time.RFC3339Nano), "expires_at": later.Format(time.RFC3339Nano)},
		map[string]any{"params": map[string]any{"i": 3}, "timeout": 90.5},
		map[string]any{"params": map[string]any{"i": 4}, "expires_at": "2020-01-01t00:00:00z", "timeout": 0},
		map[string]any{"params": map[string]any{"i": 5}, "priority": 7},
		map[string]any{"params": map[string]any{"i": 6}, "priority": 0},
	}}
	var s submitted
	e.want(201, "POST", "/api/v1/tasks", body).decode(t, &s)
	require.Len(t, s.IDs, 7)
	p := e.list("?queue=q")
	require.Equal(t, s.IDs, taskIDs(p), "_id order is the order given")

	t0 := p.Tasks[0]
	require.Equal(t, 90.5, *t0.Timeout)
	require.Nil(t, t0.NotBefore)
	require.Equal(t, -2, t0.Status)
	require.Nil(t, p.Tasks[1].Timeout)
	t2 := p.Tasks[2]
	require.Equal(t, -4, t2.Status, "held until not_before")
	require.Equal(t, future.Format("2006-01-02T15:04:05.000Z07:00"), *t2.NotBefore)
	require.Equal(t, later.Format("2006-01-02T15:04:05.000Z07:00"), *t2.ExpiresAt)
	require.Equal(t, "2020-01-01T00:00:00.000Z", *p.Tasks[4].ExpiresAt)
	require.Nil(t, p.Tasks[4].Timeout, "0: the queue's")
	require.Equal(t, int64(7), *p.Tasks[5].Priority)
	require.Nil(t, p.Tasks[6].Priority, "0: none")
	require.Nil(t, p.Tasks[0].Priority)
	raw, err := e.db.Collection(schema.CollTasks).FindOne(ctxT(t), bson.D{{Key: "_id", Value: oid(t, s.IDs[0])}}).Raw()
	require.NoError(t, err)
	require.Equal(t, 90.5, raw.Lookup("timeout").Double())

	before := e.tasksAsStored()
	task := func(extra string) string { return `{"queue":"q","tasks":[{"params":{}},{"params":{}` + extra + `}]}` }
	for _, x := range []struct {
		body        string
		status      int
		code, field string
	}{
		{task(`,"timeout":-1`), 400, CodeInvalidField, "tasks[1].timeout"},
		{task(`,"timeout":31536001`), 400, CodeInvalidField, "tasks[1].timeout"},
		{task(`,"timeout":"90"`), 400, CodeInvalidField, "tasks[1].timeout"},
		{task(`,"expires_at":"tomorrow"`), 400, CodeInvalidField, "tasks[1].expires_at"},
		{task(`,"not_before":"2026-13-01T00:00:00Z"`), 400, CodeInvalidField, "tasks[1].not_before"},
		{task(`,"not_before":1767225600`), 400, CodeInvalidField, "tasks[1].not_before"},
		{task(`,"priority":-1`), 400, CodeInvalidField, "tasks[1].priority"},
		{task(`,"priority":2147483648`), 400, CodeInvalidField, "tasks[1].priority"},
		{task(`,"priority":1.5`), 400, CodeInvalidField, "tasks[1].priority"},
		{task(`,"priority":"high"`), 400, CodeInvalidField, "tasks[1].priority"},
		{task(`,"urgency":1`), 400, CodeUnknownField, "tasks[1].urgency"},
		{task(`,"not_before":"2030-01-01T00:00:00Z","expires_at":"2030-01-01T00:00:00Z"`), 409, CodeConflictingFields, "tasks[1].expires_at"},
		{task(`,"not_before":"2030-01-01T01:00:00+01:00","expires_at":"2029-12-31T23:59:59Z"`), 409, CodeConflictingFields, "tasks[1].expires_at"},
	} {
		e.wantErr(x.status, x.code, x.field, "POST", "/api/v1/tasks", x.body)
	}
	requireSameTasks(t, before, e.tasksAsStored(), "nothing was written")
}

func TestQueueControl(t *testing.T) {
	e := setup(t)
	var q Queue
	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "plain", "plugin": "P"}).decode(t, &q)
	require.Nil(t, q.Timeout)
	require.Nil(t, q.Retries)
	require.Nil(t, q.RetryBackoff)
	require.Nil(t, q.RerunOrphans)

	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": "q", "plugin": "P", "timeout": 600, "retries": 3,
		"retry_backoff": map[string]any{"base": 2, "max": 60, "jitter": 0.5}, "rerun_orphans": true}).decode(t, &q)
	require.Equal(t, 600.0, *q.Timeout)
	require.Equal(t, 3, *q.Retries)
	require.Equal(t, &Backoff{Base: 2, Max: 60, Jitter: 0.5}, q.RetryBackoff)
	require.True(t, *q.RerunOrphans)
	var got Queue
	e.want(200, "GET", "/api/v1/queues/q", nil).decode(t, &got)
	require.Equal(t, q, got)

	// Changed; a timeout of 0 removes it; a partial backoff takes the
	// defaults, max raised to a larger base.
	got = Queue{} // decode leaves what the answer omits
	e.want(200, "PATCH", "/api/v1/queues/q", map[string]any{"timeout": 0, "retries": 0, "rerun_orphans": false,
		"retry_backoff": map[string]any{"base": 600}}).decode(t, &got)
	require.Nil(t, got.Timeout)
	require.Equal(t, 0, *got.Retries)
	require.False(t, *got.RerunOrphans)
	require.Equal(t, &Backoff{Base: 600, Max: 600, Jitter: 0.2}, got.RetryBackoff)
	e.want(200, "PATCH", "/api/v1/queues/q", map[string]any{"retry_backoff": map[string]any{"max": 0.5}}).decode(t, &got)
	require.Equal(t, &Backoff{Base: 0.5, Max: 0.5, Jitter: 0.2}, got.RetryBackoff)
	e.want(200, "PATCH", "/api/v1/queues/q", map[string]any{"retry_backoff": map[string]any{}}).decode(t, &got)
	require.Equal(t, &Backoff{Base: 1, Max: 300, Jitter: 0.2}, got.RetryBackoff)
	raw, err := e.db.Collection(schema.CollQueues).FindOne(ctxT(t), bson.D{{Key: "name", Value: "q"}}).Raw()
	require.NoError(t, err)
	_, err = raw.LookupErr("timeout")
	require.Error(t, err, "removed")

	queuesBefore, err := e.st.QueueDocs(ctxT(t))
	require.NoError(t, err)
	for _, x := range []struct {
		method, target string
		body           map[string]any
		status         int
		code, field    string
	}{
		{"PATCH", "/api/v1/queues/q", map[string]any{"timeout": -1}, 400, CodeInvalidField, "timeout"},
		{"POST", "/api/v1/queues", map[string]any{"name": "x", "plugin": "P", "timeout": -0.5}, 400, CodeInvalidField, "timeout"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"retries": 1001}, 400, CodeInvalidField, "retries"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"retries": 1.5}, 400, CodeInvalidField, "retries"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"rerun_orphans": "yes"}, 400, CodeInvalidField, "rerun_orphans"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"retry_backoff": map[string]any{"jitter": 2}}, 400, CodeInvalidField, "retry_backoff.jitter"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"retry_backoff": map[string]any{"base": -1}}, 400, CodeInvalidField, "retry_backoff.base"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"retry_backoff": map[string]any{"min": 1}}, 400, CodeUnknownField, "retry_backoff.min"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"retry_backoff": 5}, 400, CodeInvalidField, "retry_backoff"},
		{"PATCH", "/api/v1/queues/q", map[string]any{"retry_backoff": map[string]any{"base": 10, "max": 5}}, 409, CodeConflictingFields, "retry_backoff.max"},
		{"POST", "/api/v1/queues", map[string]any{"name": "y", "plugin": "P", "retry_backoff": map[string]any{"base": 10, "max": 5}}, 409, CodeConflictingFields, "retry_backoff.max"},
	} {
		e.wantErr(x.status, x.code, x.field, x.method, x.target, x.body)
	}
	queuesAfter, err := e.st.QueueDocs(ctxT(t))
	require.NoError(t, err)
	require.Equal(t, queuesBefore, queuesAfter, "nothing was written")
}

// TestScheduler: seed 002's routes, as NewScheduler serves them (web
// mounts them; see web's tests for auth and the 4.103 routes).
func TestScheduler(t *testing.T) {
	e, c := controlSetup(t)
	h := NewScheduler(Options{Store: e.st, Controlled: c.add})
	do := func(method, target string) *response {
		req, err := http.NewRequest(method, target, nil)
		require.NoError(t, err)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return &response{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
	}
	e.newQueue("q")
	ids := e.submit("q", `{}`, `{}`, `{}`)
	e.running(ids[1], "n1")
	e.finished(ids[2], schema.StatusSucceeded)

	r := do("PUT", "/v1/scheduler/kill?id="+ids[0]+","+ids[1]+","+ids[2]+"&reason=stop")
	require.Equal(t, 200, r.status, "%s", r.body)
	var res KillResult
	r.decode(t, &res)
	require.Equal(t, KillResult{Requested: 1, Cancelled: 1, Skipped: []Skipped{{ID: ids[2], Why: res.Skipped[0].Why}}}, res)
	require.Equal(t, "stop", e.task(ids[1]).Kill.Reason)
	require.Equal(t, map[string]int64{ActionCancelled: 1, ActionKillRequested: 1}, c.get())

	r = do("GET", "/v1/scheduler/wait?id="+ids[0]+","+ids[2]+"&timeout=5s")
	require.Equal(t, 200, r.status, "%s", r.body)
	var w waitResult
	r.decode(t, &w)
	require.True(t, w.Done)
	require.False(t, w.Succeeded)
	r = do("GET", "/v1/scheduler/wait?id="+ids[1]+"&timeout=100ms")
	r.decode(t, &w)
	require.False(t, w.Done, "still running: its node has not killed it")

	before := e.tasksAsStored()
	for target, field := range map[string]string{
		"/v1/scheduler/kill":                                                 "id",
		"/v1/scheduler/kill?id=xyz":                                          "id",
		"/v1/scheduler/kill?id=" + ids[0] + "&reason=a%0Ab":                  "reason",
		"/v1/scheduler/kill?id=" + strings.Repeat(ids[0]+",", 1000) + ids[1]: "id",
		"/v1/scheduler/kill?ids=" + ids[0]:                                   "ids",
	} {
		r := do("PUT", target)
		require.Equal(t, 400, r.status, "%s: %s", target, r.body)
		require.Equal(t, field, r.apiErr(t).field(), target)
	}
	requireSameTasks(t, before, e.tasksAsStored())
	r = do("GET", "/v1/scheduler/kill?id="+ids[0])
	require.Equal(t, 405, r.status)
	require.Equal(t, "PUT", r.header.Get("Allow"))
	require.Equal(t, CodeMethodNotAllowed, r.apiErr(t).Code)
	r = do("PUT", "/v1/scheduler/wait?id="+ids[0])
	require.Equal(t, 405, r.status)
	require.Equal(t, "GET, HEAD", r.header.Get("Allow"))
}

// TestTaskShowsItsResultAndThenError: an exec or shell task's exit code
// (result) and why its output made no tasks (then_error) are part of the
// task, in a page of tasks as alone.
func TestTaskShowsItsResultAndThenError(t *testing.T) {
	e, _ := controlSetup(t)
	e.newQueue("q")
	ids := e.submit("q", `{}`, `{}`)
	e.finished(ids[0], schema.StatusFailed)
	e.setTask(ids[0], bson.D{{Key: "result", Value: int32(3)}, {Key: "mixedout", Value: "o\ne\n"}, {Key: "then_error", Value: "then queue \"x\": no such queue"}})
	task := e.task(ids[0])
	require.Equal(t, int64(3), *task.Result)
	require.Equal(t, `then queue "x": no such queue`, *task.ThenError)
	require.Nil(t, e.task(ids[1]).Result)
	var page struct {
		Tasks []Task `json:"tasks"`
	}
	e.want(200, "GET", "/api/v1/tasks?queue=q", nil).decode(t, &page)
	require.Len(t, page.Tasks, 2)
	require.Equal(t, int64(3), *page.Tasks[0].Result)
}

// TestKillAndCancelDryRun: with dry_run a kill or a cancel says what it
// would do, by filter and by id, and changes nothing (nor counts).
func TestKillAndCancelDryRun(t *testing.T) {
	e, c := controlSetup(t)
	e.newQueue("q")
	ids := e.submit("q", `{}`, `{}`, `{}`)
	e.running(ids[1], "n1")
	e.finished(ids[2], schema.StatusFailed)
	before := e.tasksAsStored()

	var kill KillResult
	e.want(200, "POST", "/api/v1/tasks/kill", map[string]any{"filter": map[string]any{"queue": "q"}, "dry_run": true}).decode(t, &kill)
	require.Equal(t, KillResult{Requested: 1, Cancelled: 1, DryRun: true, Skipped: []Skipped{}}, kill)
	var cancel CancelResult
	e.want(200, "POST", "/api/v1/tasks/cancel", map[string]any{"ids": []string{ids[0], ids[1]}, "dry_run": true}).decode(t, &cancel)
	require.Equal(t, int64(1), cancel.Cancelled)
	require.True(t, cancel.DryRun)
	require.Len(t, cancel.Skipped, 1)
	require.Equal(t, ids[1], cancel.Skipped[0].ID)
	e.want(200, "POST", "/api/v1/tasks/"+ids[0]+"/cancel", map[string]any{"dry_run": true}).decode(t, &cancel)
	require.Equal(t, CancelResult{Cancelled: 1, DryRun: true, Skipped: []Skipped{}}, cancel)
	e.wantErr(409, CodeTaskState, "id", "POST", "/api/v1/tasks/"+ids[2]+"/kill", map[string]any{"dry_run": true})

	requireSameTasks(t, before, e.tasksAsStored())
	require.Empty(t, c.get(), "a dry run counts nothing")
}
