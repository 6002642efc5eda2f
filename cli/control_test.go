package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// tasks creates queue q and n queued tasks in it, and returns their ids
// in submission order.
func (e *env) tasks(n int) []bson.ObjectID {
	e.t.Helper()
	e.ok("", "queue", "create", "q", "--constructor", "C")
	e.ok(strings.Repeat(`{"a":1}`+"\n", n), "task", "submit", "q")
	cur, err := e.db.Collection("tasks").Find(context.Background(), bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	require.NoError(e.t, err)
	var docs []struct {
		ID bson.ObjectID `bson:"_id"`
	}
	require.NoError(e.t, cur.All(context.Background(), &docs))
	require.Len(e.t, docs, n)
	ids := make([]bson.ObjectID, n)
	for i, d := range docs {
		ids[i] = d.ID
	}
	return ids
}

// set writes fields of a task directly, as a node (or time) would have.
func (e *env) set(id bson.ObjectID, fields bson.D) {
	e.t.Helper()
	_, err := e.db.Collection("tasks").UpdateByID(context.Background(), id, bson.D{{Key: "$set", Value: fields}})
	require.NoError(e.t, err)
}

func (e *env) task(id bson.ObjectID) bson.Raw {
	e.t.Helper()
	raw, err := e.db.Collection("tasks").FindOne(context.Background(), bson.D{{Key: "_id", Value: id}}).Raw()
	require.NoError(e.t, err)
	return raw
}

func status(raw bson.Raw) int64 { return raw.Lookup("status").AsInt64() }

func (e *env) runningOn(id bson.ObjectID, node string) {
	e.set(id, bson.D{{Key: "status", Value: 0}, {Key: "node", Value: node}})
}

func TestTaskKillOfAQueuedTaskCancelsIt(t *testing.T) {
	e := setup(t)
	ids := e.tasks(2)
	out := e.ok("", "task", "kill", ids[0].Hex(), "--reason", "wrong input", "--by", "alice")
	require.Contains(t, out, "requested 0 ")
	require.Contains(t, out, "cancelled 1 had not started")
	require.NotContains(t, out, "skipped")

	killed := e.task(ids[0])
	require.EqualValues(t, 2, status(killed))
	require.Equal(t, "cancelled", killed.Lookup("reason").StringValue())
	require.Equal(t, "alice", killed.Lookup("kill", "by").StringValue())
	require.Equal(t, "wrong input", killed.Lookup("kill", "reason").StringValue())
	require.EqualValues(t, -2, status(e.task(ids[1])), "only the task named")
}

func TestTaskKillOfARunningTaskAsksItsNode(t *testing.T) {
	e := setup(t)
	ids := e.tasks(1)
	e.runningOn(ids[0], "n1")
	out := e.ok("", "task", "kill", ids[0].Hex(), "--by", "alice", "--reason", "stuck")
	require.Contains(t, out, "requested 1 running or claimed: their nodes kill them")

	raw := e.task(ids[0])
	require.EqualValues(t, 0, status(raw), "the node kills it, not the CLI")
	require.Equal(t, "n1", raw.Lookup("kill", "node").StringValue())
	require.Equal(t, "alice", raw.Lookup("kill", "by").StringValue())
	require.Equal(t, "stuck", raw.Lookup("kill", "reason").StringValue())
	_, hasAt := raw.Lookup("kill", "at").TimeOK()
	require.True(t, hasAt)

	// Asking again is what was asked: reported, not an error.
	r := e.run("", "task", "kill", ids[0].Hex())
	require.Equal(t, 0, r.code, r.err)
	require.Contains(t, r.out, "skipped "+ids[0].Hex()+": a kill was already requested")
	require.Equal(t, "alice", e.task(ids[0]).Lookup("kill", "by").StringValue(), "the first request stands")
}

func TestTaskKillOfAFinishedTaskFailsAndChangesNothing(t *testing.T) {
	e := setup(t)
	ids := e.tasks(2)
	e.set(ids[0], bson.D{{Key: "status", Value: 1}, {Key: "node", Value: "n1"}})
	before := e.task(ids[0])
	missing := bson.NewObjectID()

	r := e.run("", "task", "kill", ids[0].Hex(), missing.Hex(), ids[1].Hex())
	require.Equal(t, ExitRuntime, r.code, "scripts notice: %s", r.out)
	require.Contains(t, r.out, "cancelled 1 ", "the queued one is still cancelled")
	require.Contains(t, r.out, "skipped "+ids[0].Hex()+": already finished (status succeeded)")
	require.Contains(t, r.out, "skipped "+missing.Hex()+": no such task")
	require.Contains(t, r.err, "2 task id(s) could not be killed")
	require.Equal(t, before, e.task(ids[0]), "the finished task is left alone")

	var res map[string]any
	r = e.run("", "task", "kill", ids[0].Hex(), ids[0].Hex(), "--json") // a repeat is one task
	require.Equal(t, ExitRuntime, r.code)
	require.NoError(t, json.Unmarshal([]byte(r.out), &res))
	require.EqualValues(t, 0, res["requested"])
	require.Equal(t, []any{map[string]any{"id": ids[0].Hex(), "why": "already finished (status succeeded): nothing to kill"}}, res["skipped"])
}

func TestTaskKillByFilter(t *testing.T) {
	e := setup(t)
	ids := e.tasks(4)
	e.runningOn(ids[0], "n1")
	e.runningOn(ids[1], "n2")
	out := e.ok("", "task", "kill", "--queue", "q", "--status", "running", "--node", "n1", "--reason", "wrong input")
	require.Contains(t, out, "requested 1 ")
	require.Equal(t, "wrong input", e.task(ids[0]).Lookup("kill", "reason").StringValue(), "a filter's kill with its reason")
	require.Contains(t, out, "cancelled 0 ")
	require.Equal(t, "n1", e.task(ids[0]).Lookup("kill", "node").StringValue())
	_, err := e.task(ids[1]).LookupErr("kill")
	require.Error(t, err, "n2's task is not asked")
	require.EqualValues(t, -2, status(e.task(ids[2])), "queued tasks do not match --status running")
}

func TestTaskCancel(t *testing.T) {
	e := setup(t)
	ids := e.tasks(3)
	e.runningOn(ids[1], "n1")
	before := e.task(ids[1])

	r := e.run("", "task", "cancel", ids[0].Hex(), ids[1].Hex(), "--by", "bob", "--reason", "typo")
	require.Equal(t, ExitRuntime, r.code, "a running task was not cancelled: %s", r.out)
	require.Contains(t, r.out, "cancelled 1 had not started")
	require.Contains(t, r.out, "skipped "+ids[1].Hex()+": running on node n1: kill it instead")
	cancelled := e.task(ids[0])
	require.EqualValues(t, 2, status(cancelled))
	require.Equal(t, "cancelled", cancelled.Lookup("reason").StringValue())
	require.Equal(t, "bob", cancelled.Lookup("cancel", "by").StringValue())
	require.Equal(t, "typo", cancelled.Lookup("cancel", "reason").StringValue())
	require.Equal(t, before, e.task(ids[1]), "the running task is left alone")

	require.Contains(t, e.ok("", "task", "cancel", "--queue", "q", "--status", "queued", "--reason", "wrong input"), "cancelled 1 ")
	require.EqualValues(t, 2, status(e.task(ids[2])))
	require.Equal(t, "wrong input", e.task(ids[2]).Lookup("cancel", "reason").StringValue(), "a filter's cancel with its reason")

	// Cancelling again: already finished, so scripts notice.
	r = e.run("", "task", "cancel", ids[0].Hex())
	require.Equal(t, ExitRuntime, r.code)
	require.Contains(t, r.out, "skipped "+ids[0].Hex()+": already finished (status failed)")
}

func TestTaskRetry(t *testing.T) {
	e := setup(t)
	ids := e.tasks(4)
	attempts := bson.A{bson.D{{Key: "node", Value: "n1"}, {Key: "finished", Value: time.Now()}, {Key: "status", Value: 2}}}
	e.set(ids[0], bson.D{{Key: "status", Value: 2}, {Key: "node", Value: "n1"}, {Key: "attempts", Value: attempts}, {Key: "attempt", Value: 1}})
	e.set(ids[1], bson.D{{Key: "status", Value: 2}, {Key: "node", Value: "n1"}})
	e.runningOn(ids[2], "n1")
	failed := bson.D{{Key: "status", Value: 2}}

	// Dry runs count and change nothing.
	require.Contains(t, e.ok("", "task", "retry", ids[0].Hex(), "--dry-run"), "would requeue 1 (dry run: nothing was changed)")
	require.Contains(t, e.ok("", "task", "retry", "--queue", "q", "--status", "failed", "--dry-run"), "would requeue 2 ")
	require.Equal(t, int64(2), e.count("tasks", failed), "dry runs change nothing")

	// A running task is refused, and scripts notice.
	before := e.task(ids[2])
	r := e.run("", "task", "retry", ids[2].Hex())
	require.Equal(t, ExitRuntime, r.code, r.out)
	require.Contains(t, r.out, "requeued 0")
	require.Contains(t, r.out, "skipped "+ids[2].Hex()+": running on node n1: only finished or orphaned tasks are retried")
	require.Equal(t, before, e.task(ids[2]))

	// By id: back in the queue, its history kept.
	require.Contains(t, e.ok("", "task", "retry", ids[0].Hex(), "--by", "carol"), "requeued 1")
	raw := e.task(ids[0])
	require.EqualValues(t, -2, status(raw))
	require.EqualValues(t, -1, raw.Lookup("node").AsInt64())
	require.Equal(t, "requeued", raw.Lookup("reason").StringValue())
	require.Equal(t, "carol", raw.Lookup("requeued", "by").StringValue())
	require.Equal(t, "n1", raw.Lookup("attempts", "0", "node").StringValue(), "attempts stay")

	// By filter, with the bar on a terminal stderr.
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"task", "retry", "--queue", "q", "--status", "failed,orphaned", "--reason", "", "--mongo-uri", e.uri, "--database", e.db.Name()},
		IO{In: strings.NewReader(""), Out: &out, Err: &errb, ErrTerminal: true, Getenv: func(string) string { return "" }})
	require.Equal(t, ExitUsage, code, "an empty --reason is refused: %s", errb.String())
	out.Reset()
	errb.Reset()
	code = Run(context.Background(), []string{"task", "retry", "--queue", "q", "--status", "failed,orphaned", "--mongo-uri", e.uri, "--database", e.db.Name()},
		IO{In: strings.NewReader(""), Out: &out, Err: &errb, ErrTerminal: true, Getenv: func(string) string { return "" }})
	require.Equal(t, 0, code, errb.String())
	require.Contains(t, out.String(), "requeued 1")
	require.Contains(t, errb.String(), "\r[##############################] 1/1\r\033[K", "the bar is drawn, then erased")
	require.Zero(t, e.count("tasks", failed))
	require.EqualValues(t, -2, status(e.task(ids[1])))

	// Without a terminal, a retry this short prints no progress at all.
	e.set(ids[1], bson.D{{Key: "status", Value: 2}})
	r = e.run("", "task", "retry", "--queue", "q", "--reason", "requeued", "--status", "2")
	require.Equal(t, 0, r.code, r.err)
	require.Contains(t, r.out, "requeued 1")
	require.Empty(t, r.err)
}

func TestTaskWait(t *testing.T) {
	e := setup(t)
	ids := e.tasks(3)
	e.set(ids[0], bson.D{{Key: "status", Value: 1}, {Key: "node", Value: "n1"}})
	e.set(ids[1], bson.D{{Key: "status", Value: 2}, {Key: "node", Value: "n1"}, {Key: "reason", Value: "killed"}})

	start := time.Now()
	out := e.ok("", "task", "wait", ids[0].Hex())
	require.Less(t, time.Since(start), 10*time.Second, "finished tasks need no waiting")
	require.Equal(t, ids[0].Hex()+" succeeded\n", out)

	missing := bson.NewObjectID()
	r := e.run("", "task", "wait", ids[0].Hex(), ids[1].Hex(), missing.Hex())
	require.Equal(t, ExitRuntime, r.code, r.err)
	require.Equal(t, ids[0].Hex()+" succeeded\n"+ids[1].Hex()+" failed (reason killed)\n"+missing.Hex()+" not found\n", r.out)
	require.Contains(t, r.err, "2 of 3 task(s) did not succeed")

	// Orphaned has ended too.
	e.set(ids[1], bson.D{{Key: "status", Value: -6}, {Key: "reason", Value: "orphaned"}})
	r = e.run("", "task", "wait", ids[1].Hex())
	require.Equal(t, ExitRuntime, r.code, r.err)
	require.Contains(t, r.out, "orphaned")

	start = time.Now()
	r = e.run("", "task", "wait", ids[0].Hex(), ids[2].Hex(), "--timeout", "500ms")
	require.Equal(t, ExitTimeout, r.code, r.err)
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond)
	require.Equal(t, ids[0].Hex()+" succeeded\n"+ids[2].Hex()+" still queued\n", r.out)
	require.Contains(t, r.err, "timed out after 500ms: 1 of 2 task(s) have not ended")

	var states []map[string]any
	r = e.run("", "task", "wait", ids[2].Hex(), "--timeout", "100ms", "--json")
	require.Equal(t, ExitTimeout, r.code, r.err)
	require.NoError(t, json.Unmarshal([]byte(r.out), &states))
	require.Equal(t, false, states[0]["ended"])
	require.Equal(t, "queued", states[0]["status_name"])
}

func TestTaskWaitReturnsWhenTheTaskEnds(t *testing.T) {
	e := setup(t)
	ids := e.tasks(1)
	done := make(chan result, 1)
	go func() { done <- e.exec("", "task", "wait", ids[0].Hex(), "--timeout", "60s") }()
	time.Sleep(300 * time.Millisecond) // let it start waiting; it must hear the change either way
	e.set(ids[0], bson.D{{Key: "status", Value: 1}, {Key: "node", Value: "n1"}})
	select {
	case r := <-done:
		require.Equal(t, 0, r.code, r.err)
		require.Equal(t, ids[0].Hex()+" succeeded\n", r.out)
	case <-time.After(30 * time.Second):
		t.Fatal("wait did not return when its task finished")
	}
}

func TestSubmitWithControl(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "q", "--constructor", "C")
	before := time.Now()
	out := e.ok(`{"a":1}`, "task", "submit", "q", "--not-before", "+1h")
	require.Contains(t, out, "; not before ")
	raw, err := e.db.Collection("tasks").FindOne(context.Background(), bson.D{}).Raw()
	require.NoError(t, err)
	require.EqualValues(t, -4, status(raw), "held until not_before")
	nb := raw.Lookup("not_before").Time()
	require.WithinDuration(t, before.Add(time.Hour), nb, time.Minute)

	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok(`{"a":2}`, "task", "submit", "q", "--timeout", "90s", "--expires-at", "2099-01-02T03:04:05Z", "--json")), &res))
	require.EqualValues(t, 90, res["timeout"])
	require.Equal(t, "2099-01-02T03:04:05Z", res["expires_at"])
	id, err := bson.ObjectIDFromHex(res["first"].(string))
	require.NoError(t, err)
	raw = e.task(id)
	require.EqualValues(t, -2, status(raw))
	require.EqualValues(t, 90, raw.Lookup("timeout").AsFloat64())
	require.Equal(t, time.Date(2099, 1, 2, 3, 4, 5, 0, time.UTC), raw.Lookup("expires_at").Time().UTC())

	show := e.ok("", "task", "show", id.Hex())
	require.Contains(t, show, "timeout:    1m30s\n")
	require.Contains(t, show, "expires_at: 2099-01-02T03:04:05Z\n")
	require.NotContains(t, show, "priority:")

	out = e.ok(`{"a":3}`, "task", "submit", "q", "--priority", "9")
	require.Contains(t, out, "; priority 9")
	raw, err = e.db.Collection("tasks").FindOne(context.Background(), bson.D{{Key: "params.a", Value: 3}}).Raw()
	if err != nil { // the seed-000 name
		raw, err = e.db.Collection("tasks").FindOne(context.Background(), bson.D{{Key: "parameters.a", Value: 3}}).Raw()
	}
	require.NoError(t, err)
	require.EqualValues(t, 9, raw.Lookup("priority").AsInt64())
	id = raw.Lookup("_id").ObjectID()
	require.Contains(t, e.ok("", "task", "show", id.Hex()), "priority:   9\n")
	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "task", "show", id.Hex(), "--json")), &shown))
	require.EqualValues(t, 9, shown["priority"])
}

func TestTaskShowControlFields(t *testing.T) {
	e := setup(t)
	ids := e.tasks(1)
	at := time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)
	e.set(ids[0], bson.D{
		{Key: "status", Value: 0}, {Key: "node", Value: "n2"}, {Key: "reason", Value: "rerun"},
		{Key: "attempt", Value: 2}, {Key: "tries", Value: 1},
		{Key: "attempts", Value: bson.A{
			bson.D{{Key: "node", Value: "n1"}, {Key: "claimed", Value: at}, {Key: "started", Value: at.Add(time.Second)}, {Key: "finished", Value: at.Add(time.Minute)}, {Key: "status", Value: 2}, {Key: "reason", Value: "timeout"}},
			bson.D{{Key: "node", Value: "n3"}, {Key: "finished", Value: at.Add(time.Hour)}, {Key: "status", Value: -6}, {Key: "reason", Value: "orphaned"}},
		}},
		{Key: "kill", Value: bson.D{{Key: "node", Value: "n2"}, {Key: "by", Value: "alice"}, {Key: "at", Value: at}, {Key: "reason", Value: "stuck"}}},
		{Key: "not_before", Value: at}, {Key: "timeout", Value: 30},
		{Key: "result", Value: 3}, {Key: "mixedout", Value: "out\nerr\n"}, {Key: "then_error", Value: "then queue \"x\": no such queue"},
	})
	show := e.ok("", "task", "show", ids[0].Hex())
	for _, want := range []string{
		"reason:     rerun\n",
		"result:     3 (the command's exit code)\n",
		"then error: then queue \"x\": no such queue\n",
		"timeout:    30s\n",
		"not_before: 2030-05-06T07:08:09Z\n",
		"kill:       requested by alice at 2030-05-06T07:08:09Z: \"stuck\"; node n2\n",
		"attempts:   2 ended (1 failed since submitted or requeued: the queue's retries spent)\n",
		"  #1 node n1  claimed 2030-05-06T07:08:09Z  started 2030-05-06T07:08:10Z  finished 2030-05-06T07:09:09Z  status failed  reason timeout\n",
		"  #2 node n3  finished 2030-05-06T08:08:09Z  status orphaned  reason orphaned\n",
	} {
		require.Contains(t, show, want)
	}
	require.NotContains(t, show, "expires_at:", "absent fields are not shown")

	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "task", "show", ids[0].Hex(), "--json")), &shown))
	require.Equal(t, "rerun", shown["reason"])
	require.EqualValues(t, 2, shown["attempt"])
	require.EqualValues(t, 3, shown["result"])
	require.Equal(t, "out\nerr\n", shown["mixedout"])
	require.Equal(t, `then queue "x": no such queue`, shown["then_error"])
	require.Equal(t, map[string]any{"node": "n2", "by": "alice", "at": "2030-05-06T07:08:09Z", "reason": "stuck"}, shown["kill"])
	require.Len(t, shown["attempts"], 2)

	require.Regexp(t, `(?m)^`+ids[0].Hex()+`\s+running\s+rerun\s+n2\s+`, e.ok("", "task", "list", "q"))
}

func TestQueueSetScheduling(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "q", "--constructor", "C")
	require.Contains(t, e.ok("", "queue", "show", "q"), "scheduling:    priority 0, weight 20\n")

	e.ok("", "queue", "set", "q", "priority=10", "weight=2.5", "max_getwork=16")
	raw, err := e.db.Collection("queues").FindOne(context.Background(), bson.D{}).Raw()
	require.NoError(t, err)
	require.EqualValues(t, 10, raw.Lookup("priority").AsFloat64())
	require.EqualValues(t, 2.5, raw.Lookup("weight").AsFloat64())
	require.EqualValues(t, 16, raw.Lookup("max_getwork").AsInt64())
	require.Contains(t, e.ok("", "queue", "show", "q"), "scheduling:    priority 10, weight 2.5, at most 16 per claim\n")

	require.Equal(t, "paused queue q\n", e.ok("", "queue", "pause", "q"))
	require.Contains(t, e.ok("", "queue", "show", "q"), ", paused\n")
	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "queue", "show", "q", "--json")), &shown))
	require.Equal(t, true, shown["paused"])
	require.EqualValues(t, 10, shown["priority"])
	require.Equal(t, "resumed queue q\n", e.ok("", "queue", "resume", "q"))
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "queue", "show", "q", "--json")), &shown))
	require.Equal(t, false, shown["paused"])

	e.ok("", "queue", "set", "q", "nice=25", "max_getwork=0")
	require.Contains(t, e.ok("", "queue", "show", "q"), "scheduling:    priority 10, weight -5, not scheduled (negative weight)\n")

	e.ok("", "queue", "set", "q", "maxthreads=3", "max_running=5")
	raw, err = e.db.Collection("queues").FindOne(context.Background(), bson.D{}).Raw()
	require.NoError(t, err)
	require.EqualValues(t, 5, raw.Lookup("max_running").AsInt64())
	require.EqualValues(t, 5, raw.Lookup("threads").AsInt64(), "4.103's name of the cap")
	require.EqualValues(t, 3, raw.Lookup("maxthreads").AsInt64(), "per node, unchanged")
	require.Contains(t, e.ok("", "queue", "show", "q"), ", at most 5 running across all nodes (0 admitted)")
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "queue", "show", "q", "--json")), &shown))
	require.EqualValues(t, 5, shown["max_running"])

	e.ok("", "queue", "set", "q", `config={"bucket": "b1", "n": 2}`)
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "queue", "show", "q", "--json")), &shown))
	require.Equal(t, map[string]any{"bucket": "b1", "n": 2.0}, shown["config"])

	e.ok("", "queue", "create", "next", "--constructor", "C")
	e.ok("", "queue", "set", "q", "then=next", "continuous=true", "interval=90")
	show := e.ok("", "queue", "show", "q")
	require.Contains(t, show, ", output then to next, continuous every 1m30s")
	r := e.run("", "queue", "set", "q", "then=nowhere")
	require.Equal(t, 1, r.code, "then to a missing queue")
	require.Contains(t, r.err, `no queue is named "nowhere"`)
	require.Contains(t, e.ok("", "queue", "show", "q"), ", output then to next,", "nothing written")

	for _, bad := range [][]string{{"weight=heavy"}, {"priority=NaN"}, {"max_getwork=-1"}, {"max_getwork=1.5"}, {"paused=maybe"}, {"weight=1", "nice=2"},
		{"max_running=-1"}, {"max_running=five"}, {"max_running=2147483648"}, {"config=nope"}, {"config=[1]"}, {`config="s"`},
		{"interval=-1"}, {"continuous=often"}} {
		before, err := e.db.Collection("queues").FindOne(context.Background(), bson.D{}).Raw()
		require.NoError(t, err)
		r := e.run("", append([]string{"queue", "set", "q"}, bad...)...)
		require.Equal(t, 2, r.code, "%v: a usage error: %s", bad, r.err)
		after, err := e.db.Collection("queues").FindOne(context.Background(), bson.D{}).Raw()
		require.NoError(t, err)
		require.Equal(t, before, after, "%v changed the queue", bad)
	}
}

func TestQueueSetControl(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "q", "--constructor", "C")
	show := e.ok("", "queue", "show", "q")
	require.Contains(t, show, "timeout:       none\n")
	require.Contains(t, show, "retries:       0 (a failed attempt is final)\n")
	require.Contains(t, show, "rerun_orphans: false\n")

	e.ok("", "queue", "set", "q", "--timeout", "30s", "--retries", "3", "--retry-backoff", "2s,1m,0.1", "--rerun-orphans")
	raw, err := e.db.Collection("queues").FindOne(context.Background(), bson.D{}).Raw()
	require.NoError(t, err)
	require.EqualValues(t, 30, raw.Lookup("timeout").AsFloat64())
	require.EqualValues(t, 3, raw.Lookup("retries").AsInt64())
	require.EqualValues(t, 2, raw.Lookup("retry_backoff", "base").AsFloat64())
	require.EqualValues(t, 60, raw.Lookup("retry_backoff", "max").AsFloat64())
	require.EqualValues(t, 0.1, raw.Lookup("retry_backoff", "jitter").AsFloat64())
	require.True(t, raw.Lookup("rerun_orphans").Boolean())

	show = e.ok("", "queue", "show", "q")
	require.Contains(t, show, "timeout:       30s\n")
	require.Contains(t, show, "retries:       3, backoff 2s doubling up to 1m0s, jitter 0.1\n")
	require.Contains(t, show, "rerun_orphans: true\n")
	var queues []map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "queue", "list", "--json")), &queues))
	require.EqualValues(t, 30, queues[0]["timeout"])
	require.EqualValues(t, 3, queues[0]["retries"])
	require.Equal(t, map[string]any{"base": 2.0, "max": 60.0, "jitter": 0.1}, queues[0]["retry_backoff"])
	require.Equal(t, true, queues[0]["rerun_orphans"])

	// 0 removes the time limit; the rest stays unless named.
	e.ok("", "queue", "set", "q", "--timeout", "0", "--rerun-orphans=false", "maxthreads=2")
	raw, err = e.db.Collection("queues").FindOne(context.Background(), bson.D{}).Raw()
	require.NoError(t, err)
	_, err = raw.LookupErr("timeout")
	require.Error(t, err, "timeout removed")
	require.False(t, raw.Lookup("rerun_orphans").Boolean())
	require.EqualValues(t, 3, raw.Lookup("retries").AsInt64())
	require.EqualValues(t, 2, raw.Lookup("maxthreads").AsInt64())
}

func TestControlBadInputIsAUsageErrorAndChangesNothing(t *testing.T) {
	e := setup(t)
	ids := e.tasks(1)
	id := ids[0].Hex()
	many := make([]string, 1001)
	for i := range many {
		many[i] = bson.NewObjectID().Hex()
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"task", "submit", "q", "--not-before", "tomorrow"}, `--not-before "tomorrow": want an RFC 3339 time`},
		{[]string{"task", "submit", "q", "--expires-at", "2030-13-01T00:00:00Z"}, `--expires-at "2030-13-01T00:00:00Z"`},
		{[]string{"task", "submit", "q", "--not-before", "+soon"}, "want +DURATION from now"},
		{[]string{"task", "submit", "q", "--not-before", "+-1h"}, "want +DURATION from now"},
		{[]string{"task", "submit", "q", "--timeout", "-5s"}, "--timeout must not be negative"},
		{[]string{"task", "submit", "q", "--timeout", "soon"}, `invalid argument "soon" for "--timeout"`},
		{[]string{"task", "submit", "q", "--not-before", "+2h", "--expires-at", "+1h"}, "must be after not_before"},
		{[]string{"task", "submit", "q", "--expires-at", "2001-01-01T00:00:00Z"}, "not in the future"},
		{[]string{"task", "submit", "q", "--timeout", "9000h"}, "timeout must be from 0 to"},
		{[]string{"task", "submit", "q", "--priority", "-1"}, "--priority must be from 0 to 2147483647, got -1"},
		{[]string{"task", "submit", "q", "--priority", "2147483648"}, "--priority must be from 0 to 2147483647"},
		{[]string{"task", "submit", "q", "--priority", "high"}, `invalid argument "high" for "--priority"`},
		{append([]string{"task", "kill"}, many...), "1001 task ids: at most 1000 at once; select more tasks with a filter"},
		{append([]string{"task", "retry"}, many...), "1001 task ids"},
		{append([]string{"task", "wait"}, many...), "1001 task ids"},
		{[]string{"task", "kill", id, "--queue", "q"}, "give task ids or a filter (--queue), not both"},
		{[]string{"task", "cancel", id, "--status", "queued", "--node", "n1"}, "not both"},
		{[]string{"task", "kill"}, "name the tasks: task ids, or a filter"},
		{[]string{"task", "cancel"}, "name the tasks"},
		{[]string{"task", "retry", "--dry-run"}, "name the tasks"},
		{[]string{"task", "kill", "xyz"}, `task id "xyz" is not an ObjectId`},
		{[]string{"task", "kill", "--status", "bogus"}, `unknown status "bogus"`},
		{[]string{"task", "kill", "--queue", ""}, "--queue is empty"},
		{[]string{"task", "retry", "--reason", "bored"}, `--reason "bored": want one of killed, cancelled`},
		{[]string{"task", "retry", "--since", "yesterday"}, `--since "yesterday"`},
		{[]string{"task", "retry", "--since", "-2h"}, "must not be negative"},
		{[]string{"task", "retry", "--since", "1h", "--until", "2h"}, "is not before --until"},
		{[]string{"task", "wait"}, "want at least one task ID"},
		{[]string{"task", "wait", id, "--timeout", "-1s"}, "--timeout must not be negative"},
		{[]string{"task", "wait", "nope"}, `task id "nope" is not an ObjectId`},
		{[]string{"queue", "set", "q", "--timeout", "-1s"}, "--timeout must be from 0"},
		{[]string{"queue", "set", "q", "--retries", "-1"}, "--retries must be from 0 to 1000"},
		{[]string{"queue", "set", "q", "--retries", "1001"}, "--retries must be from 0 to 1000"},
		{[]string{"queue", "set", "q", "--retry-backoff", "1s,5m"}, "want BASE,MAX,JITTER"},
		{[]string{"queue", "set", "q", "--retry-backoff", "1s,x,0.2"}, "MAX is not a duration"},
		{[]string{"queue", "set", "q", "--retry-backoff", "5m,1s,0.2"}, "is below its base"},
		{[]string{"queue", "set", "q", "--retry-backoff", "1s,5m,2"}, "jitter must be a fraction"},
		{[]string{"queue", "set", "q", "--rerun-orphans=maybe"}, "rerun-orphans"},
		{[]string{"queue", "set", "q"}, "want NAME and at least one KEY=VALUE"},
	} {
		before := e.task(ids[0])
		r := e.run(`{"a":1}`, c.args...)
		require.Equal(t, ExitUsage, r.code, "%v: %s", c.args, r.err)
		require.Contains(t, r.err, c.want, "%v", c.args)
		require.Equal(t, before, e.task(ids[0]), "%v changed the task", c.args)
	}
	require.Equal(t, int64(1), e.count("tasks", bson.D{}), "no submit got through")
	raw, err := e.db.Collection("queues").FindOne(context.Background(), bson.D{}).Raw()
	require.NoError(t, err)
	for _, f := range []string{"timeout", "retries", "retry_backoff", "rerun_orphans"} {
		_, err := raw.LookupErr(f)
		require.Error(t, err, "queue field %s written", f)
	}
}

func TestProgressPrintsPlainLinesAtMostEveryInterval(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	p := &progress{w: &buf, label: "requeued", interval: 5 * time.Second, now: func() time.Time { return now }}
	p.start = now
	now = now.Add(time.Second)
	p.update(1000, 10000)
	require.Empty(t, buf.String(), "nothing in the first interval")
	now = now.Add(5 * time.Second)
	p.update(2000, 10000)
	now = now.Add(time.Second)
	p.update(3000, 10000)
	require.Equal(t, "requeued 2000 of 10000 (20%)\n", buf.String())
	now = now.Add(5 * time.Second)
	p.update(10000, 10000)
	require.Equal(t, "requeued 2000 of 10000 (20%)\n", buf.String(), "the end is left to the summary")
}

func TestByDefaultsToUserAtHost(t *testing.T) {
	t.Parallel()
	g := &globals{io: IO{Getenv: func(k string) string { return map[string]string{"USER": "tester"}[k] }}}
	require.Regexp(t, `^tester@\S+$`, g.who())
	g.by = "ops-bot"
	require.Equal(t, "ops-bot", g.who())
}

// TestKillAndCancelDryRunChangeNothing: --dry-run says what a kill or a
// cancel would do, by filter and by ids (with why each other id would be
// left alone), and changes no task.
func TestKillAndCancelDryRunChangeNothing(t *testing.T) {
	e := setup(t)
	ids := e.tasks(4)
	e.set(ids[1], bson.D{{Key: "status", Value: 0}, {Key: "node", Value: "n1"}})
	e.set(ids[2], bson.D{{Key: "status", Value: 1}, {Key: "node", Value: "n1"}})
	e.set(ids[3], bson.D{{Key: "status", Value: -6}, {Key: "node", Value: "gone"}})
	before := map[bson.ObjectID]string{}
	for _, id := range ids {
		before[id] = e.task(id).String()
	}
	out := e.ok("", "task", "kill", "--queue", "q", "--dry-run")
	require.Regexp(t, `(?m)^would be requested\s+1 `, out)
	require.Regexp(t, `(?m)^would be cancelled\s+1 `, out)
	require.Regexp(t, `(?m)^would be settled\s+1 `, out)
	require.Contains(t, out, "(dry run: nothing was changed)")
	r := e.run("", "task", "cancel", ids[0].Hex(), ids[1].Hex(), ids[2].Hex(), "--dry-run")
	require.Equal(t, ExitRuntime, r.code, "ids left alone: %s", r.out)
	require.Regexp(t, `(?m)^would be cancelled\s+1 `, r.out)
	require.Contains(t, r.out, ids[1].Hex()+": running on node n1: kill it instead")
	require.Contains(t, r.out, ids[2].Hex()+": already finished")
	for _, id := range ids {
		require.Equal(t, before[id], e.task(id).String(), "task %s changed", id.Hex())
	}
}
