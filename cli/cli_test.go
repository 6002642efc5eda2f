package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

type result struct {
	out, err string
	code     int
}

// env is a test's database and a way to run the CLI against it.
type env struct {
	t   *testing.T
	db  *mongo.Database
	uri string
}

func (e *env) exec(stdin string, args ...string) result {
	var out, errb bytes.Buffer
	args = append(args, "--mongo-uri", e.uri, "--database", e.db.Name())
	code := Run(context.Background(), args, IO{In: strings.NewReader(stdin), Out: &out, Err: &errb, Getenv: func(string) string { return "" }})
	return result{out.String(), errb.String(), code}
}

func setup(t *testing.T) *env {
	t.Parallel()
	return &env{t: t, db: mongotest.Database(t), uri: mongotest.URI(t)}
}

func (e *env) run(stdin string, args ...string) result {
	e.t.Helper()
	return e.exec(stdin, args...)
}

func (e *env) ok(stdin string, args ...string) string {
	e.t.Helper()
	r := e.run(stdin, args...)
	require.Equal(e.t, 0, r.code, "disbatch %v: stderr: %s", args, r.err)
	return r.out
}

func (e *env) count(coll string, filter any) int64 {
	e.t.Helper()
	n, err := e.db.Collection(coll).CountDocuments(context.Background(), filter)
	require.NoError(e.t, err)
	return n
}

func TestQueueCommands(t *testing.T) {
	e := setup(t)
	out := e.ok("", "queue", "create", "demo", "--constructor", "Disbatch::Plugin::Demo", "--sort", "fifo")
	require.Contains(t, out, "created queue demo")
	require.Contains(t, out, "maxthreads 1", "a new queue runs by default")

	e.ok(`{"commands":"a"}`+"\n"+`{"commands":"b"}`, "task", "submit", "demo")
	list := e.ok("", "queue", "list")
	require.Regexp(t, `(?m)^NAME\s+CONSTRUCTOR\s+MAXTHREADS\s+SORT\s+TODO\s+RUNNING\s+TOTAL\s+FAILED\s+ID$`, list)
	require.Regexp(t, `(?m)^demo\s+Disbatch::Plugin::Demo\s+1\s+fifo\s+2\s+0\s+2\s+0\s+[0-9a-f]{24}$`, list, "no counters yet: recounted")

	e.ok("", "queue", "set", "demo", "maxthreads=5", "sort=lifo", "nodes_ignore=n1, n2")
	var queues []map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "queue", "list", "--json")), &queues))
	require.Len(t, queues, 1)
	require.EqualValues(t, 5, queues[0]["maxthreads"])
	require.Equal(t, "lifo", queues[0]["sort"])
	require.Equal(t, []any{"n1", "n2"}, queues[0]["nodes_ignore"])
	require.EqualValues(t, 2, queues[0]["count_todo"])
	require.EqualValues(t, 0, queues[0]["count_running"])
	require.EqualValues(t, 2, queues[0]["count_total"])
	require.EqualValues(t, 0, queues[0]["count_failed"])

	// One task claimed, one running (by another program): a recount
	// counts both while the counters are not all there.
	_, err := e.db.Collection("tasks").UpdateOne(context.Background(), bson.D{{Key: "parameters.commands", Value: "a"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -1}}}})
	require.NoError(t, err)
	_, err = e.db.Collection("tasks").UpdateOne(context.Background(), bson.D{{Key: "parameters.commands", Value: "b"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 0}}}})
	require.NoError(t, err)
	_, err = e.db.Collection("queues").UpdateOne(context.Background(), bson.D{{Key: "name", Value: "demo"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "count_todo", Value: 7}, {Key: "count_total", Value: 9}}}})
	require.NoError(t, err)
	require.Regexp(t, `(?m)^demo\s+\S+\s+5\s+lifo\s+2\s+2\s+2\s+0\s`, e.ok("", "queue", "list"), "count_running missing: the queue is recounted")
	require.Contains(t, e.ok("", "queue", "show", "demo"), "tasks:         2 to do (2 claimed or running), 2 in all, 0 failed\n")

	// A queue from before count_failed (the other three there) is
	// recounted too: here one task failed.
	qid, err := bson.ObjectIDFromHex(queues[0]["id"].(string))
	require.NoError(t, err)
	_, err = e.db.Collection("tasks").InsertOne(context.Background(), bson.D{{Key: "queue", Value: qid}, {Key: "status", Value: 2}})
	require.NoError(t, err)
	_, err = e.db.Collection("queues").UpdateOne(context.Background(), bson.D{{Key: "name", Value: "demo"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "count_running", Value: 3}}}})
	require.NoError(t, err)
	require.Regexp(t, `(?m)^demo\s+\S+\s+5\s+lifo\s+2\s+2\s+3\s+1\s`, e.ok("", "queue", "list"), "count_failed missing: the queue is recounted")
	require.Contains(t, e.ok("", "queue", "show", "demo"), "tasks:         2 to do (2 claimed or running), 3 in all, 1 failed\n")

	// Stored counters (kept by the nodes) are shown as they are.
	_, err = e.db.Collection("queues").UpdateOne(context.Background(), bson.D{{Key: "name", Value: "demo"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "count_failed", Value: 4}}}})
	require.NoError(t, err)
	require.Regexp(t, `(?m)^demo\s+\S+\s+5\s+lifo\s+7\s+3\s+9\s+4\s`, e.ok("", "queue", "list"))
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "queue", "list", "--json")), &queues))
	require.EqualValues(t, 7, queues[0]["count_todo"])
	require.EqualValues(t, 3, queues[0]["count_running"])
	require.EqualValues(t, 9, queues[0]["count_total"])
	require.EqualValues(t, 4, queues[0]["count_failed"])
	require.Contains(t, e.ok("", "queue", "show", "demo"), "tasks:         7 to do (3 claimed or running), 9 in all, 4 failed\n")
	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "queue", "show", "demo", "--json")), &shown))
	require.EqualValues(t, 3, shown["count_running"])
	require.EqualValues(t, 4, shown["count_failed"])

	for _, bad := range [][]string{
		{"queue", "set", "demo", "color=blue"},
		{"queue", "set", "demo", "maxthreads=-1"},
		{"queue", "set", "demo", "maxthreads=lots"},
		{"queue", "set", "demo", "maxthreads=3000000000"}, // past what readers take
		{"queue", "set", "demo", "sort=random"},
		{"queue", "set", "demo", "maxthreads"},
		{"queue", "set", "demo"},
		{"queue", "create", "x"},
		{"queue", "create", "x", "--constructor", "C", "--maxthreads", "-3"},
		{"queue", "create", "x", "--constructor", "C", "--sort", "up"},
		{"queue", "create", "--constructor", "C"},
		{"queue", "create", "x", "--constructor", "C", "--maxthreads", "2147483648"},
		{"queue", "frobnicate"},
		{"task", "frobnicate"},
	} {
		r := e.run("", bad...)
		require.Equal(t, ExitUsage, r.code, "%v: %s", bad, r.err)
		require.Contains(t, r.err, "disbatch: ")
	}
	var q map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "queue", "list", "--json")), &queues))
	q = queues[0]
	require.EqualValues(t, 5, q["maxthreads"], "rejected settings changed nothing")

	r := e.run("", "queue", "create", "demo", "--constructor", "C")
	require.Equal(t, ExitRuntime, r.code)
	require.Contains(t, r.err, "already exists")

	r = e.run("", "queue", "delete", "demo")
	require.Equal(t, ExitRuntime, r.code)
	require.Contains(t, r.err, "2 unfinished tasks")
	require.Contains(t, r.err, "--force")
	require.Equal(t, int64(1), e.count("queues", bson.D{}))

	require.Contains(t, e.ok("", "queue", "delete", "demo", "--force"), "deleted queue demo with 3 tasks")
	require.Zero(t, e.count("queues", bson.D{}))
	require.Zero(t, e.count("tasks", bson.D{}))

	r = e.run("", "queue", "delete", "demo")
	require.Equal(t, ExitRuntime, r.code)
	require.Contains(t, r.err, `queue "demo": not found`)
}

func TestQueueCreateNullMaxThreads(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "paused", "--constructor", "C", "--maxthreads", "null")
	raw, err := e.db.Collection("queues").FindOne(context.Background(), bson.D{}).Raw()
	require.NoError(t, err)
	require.Equal(t, bson.TypeNull, raw.Lookup("maxthreads").Type)
	require.Equal(t, bson.TypeNull, raw.Lookup("threads").Type)
}

func TestSubmitValidatesEverythingFirst(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "q", "--constructor", "C")
	in := `{"n":1}
{"n":2,}
{"n":3}
["n",4]
{"n":5}
`
	r := e.run(in, "task", "submit", "q")
	require.Equal(t, ExitRuntime, r.code)
	require.Contains(t, r.err, "stdin: line 2: invalid JSON")
	require.Contains(t, r.err, "stdin: line 4: parameters must be a JSON object, got an array")
	require.Contains(t, r.err, "2 of 5 items in stdin are invalid; nothing was inserted")
	require.Zero(t, e.count("tasks", bson.D{}), "nothing inserted")

	out := e.ok(in, "task", "submit", "q", "-", "--skip-invalid")
	require.Regexp(t, `submitted 3 tasks to queue q, skipped 2 invalid \(first [0-9a-f]{24}, last [0-9a-f]{24}\)`, out)
	require.Equal(t, int64(3), e.count("tasks", bson.D{{Key: "status", Value: -2}, {Key: "node", Value: -1}}))

	r = e.run("\n\n", "task", "submit", "q")
	require.Equal(t, ExitRuntime, r.code)
	require.Contains(t, r.err, "no tasks in stdin")

	r = e.run(`{"a":1}`, "task", "submit", "nosuchqueue")
	require.Equal(t, ExitRuntime, r.code)
	require.Contains(t, r.err, `queue "nosuchqueue": not found`)

	r = e.run("", "task", "submit", "q", filepath.Join(t.TempDir(), "missing.json"))
	require.Equal(t, ExitRuntime, r.code)
	require.Contains(t, r.err, "open input")
}

func TestSubmitFileKeepsInputOrderAcrossParallelBatches(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "q", "--constructor", "C", "--sort", "fifo")
	const n = 5000
	var b strings.Builder
	b.WriteString("[\n")
	for i := range n {
		if i > 0 {
			b.WriteString(",\n")
		}
		fmt.Fprintf(&b, `{"i": %d, "user": "u%d@example.com"}`, i, i)
	}
	b.WriteString("\n]\n")
	file := filepath.Join(t.TempDir(), "tasks.json")
	require.NoError(t, os.WriteFile(file, []byte(b.String()), 0o600))

	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "task", "submit", "q", file, "--batch-size", "97", "--parallel", "6", "--json")), &res))
	require.EqualValues(t, n, res["submitted"])
	require.Equal(t, int64(n), e.count("tasks", bson.D{}))

	cur, err := e.db.Collection("tasks").Find(context.Background(), bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	require.NoError(t, err)
	var docs []bson.Raw
	require.NoError(t, cur.All(context.Background(), &docs))
	for i, d := range docs {
		require.Equal(t, int64(i), d.Lookup("parameters", "i").AsInt64(), "task %d out of order", i)
	}
	require.Equal(t, docs[0].Lookup("_id").ObjectID().Hex(), res["first"])
	require.Equal(t, docs[n-1].Lookup("_id").ObjectID().Hex(), res["last"])
}

func TestTaskListAndShow(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "q", "--constructor", "C", "--sort", "fifo")
	e.ok(`{"commands":"a"}`+"\n"+`{"commands":"b"}`+"\n"+`{"commands":"c"}`, "task", "submit", "q")

	// A node finishes the first task with output big enough for GridFS.
	s := store.New(e.db, store.Options{OutputThreshold: 1000})
	ctx := context.Background()
	task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: mustQueue(t, s, "q"), Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.NoError(t, s.TaskStart(ctx, store.TaskTransitionParams{ID: task.ID, Node: "n1"}))
	big := strings.Repeat("line of output\n", 200)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: schema.StatusSucceeded, Stdout: big, Stderr: "warn"}))

	list := e.ok("", "task", "list", "q")
	require.Regexp(t, `(?m)^ID\s+STATUS\s+REASON\s+NODE\s+MTIME\s+PARAMETERS$`, list)
	require.Regexp(t, `(?m)^`+task.ID.Hex()+`\s+succeeded\s+-\s+n1\s+`, list)
	require.Equal(t, 2, strings.Count(list, "queued"))

	var tasks []map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "task", "list", "q", "--status", "queued", "--limit", "1", "--json")), &tasks))
	require.Len(t, tasks, 1)
	require.EqualValues(t, -2, tasks[0]["status"])
	require.EqualValues(t, -1, tasks[0]["node"])
	require.Equal(t, map[string]any{"commands": "b"}, tasks[0]["parameters"])

	require.NoError(t, json.Unmarshal([]byte(e.ok("", "task", "list", "q", "--status", "1", "--json")), &tasks))
	require.Len(t, tasks, 1)

	show := e.ok("", "task", "show", task.ID.Hex())
	require.Contains(t, show, "status:     1 (succeeded)")
	require.Contains(t, show, "queue:      q (")
	require.Contains(t, show, "stdout: (GridFS ")
	require.Contains(t, show, "  line of output\n  line of output")
	require.Contains(t, show, "stderr:\n  warn")

	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.ok("", "task", "show", task.ID.Hex(), "--json")), &shown))
	require.Equal(t, big, shown["stdout"])
	require.Equal(t, "n1", shown["node"])

	for _, bad := range [][]string{{"task", "list", "q", "--status", "bogus"}, {"task", "show", "xyz"}, {"task", "list"}, {"task", "list", "q", "--limit", "-1"}} {
		r := e.run("", bad...)
		require.Equal(t, ExitUsage, r.code, "%v: %s", bad, r.err)
	}
	r := e.run("", "task", "show", bson.NewObjectID().Hex())
	require.Equal(t, ExitRuntime, r.code)
	require.Contains(t, r.err, "not found")
}

func mustQueue(t *testing.T, s *store.Store, name string) bson.ObjectID {
	q, err := s.QueueGet(context.Background(), store.QueueGetParams{Ref: name})
	require.NoError(t, err)
	return q.ID
}

func TestConnectionFailureIsQuickAndClear(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	start := time.Now()
	code := Run(context.Background(), []string{"queue", "list", "--mongo-uri", "mongodb://alice:s3cret@127.0.0.1:1/?replicaSet=rs0"},
		IO{In: strings.NewReader(""), Out: &out, Err: &errb, Getenv: func(string) string { return "" }})
	require.Equal(t, ExitRuntime, code)
	require.Less(t, time.Since(start), 15*time.Second, "no 30 s driver timeout")
	msg := errb.String()
	require.Contains(t, msg, "cannot reach MongoDB at mongodb://alice:xxxxx@127.0.0.1:1/?replicaSet=rs0")
	require.Contains(t, msg, "make run")
	require.NotContains(t, msg, "s3cret")
	require.Equal(t, 2, strings.Count(msg, "\n"), "one error line and one hint: %q", msg)
}

func TestUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bogus"},
		{"queue", "list", "--no-such-flag"},
		{"queue", "list", "extra"},
		{"task", "submit"},
		{"task", "submit", "q", "f", "g"},
		{"queue", "list", "--mongo-uri", "http://not-mongo"},
	} {
		var out, errb bytes.Buffer
		code := Run(context.Background(), args, IO{In: strings.NewReader(""), Out: &out, Err: &errb, Getenv: func(string) string { return "" }})
		require.Equal(t, ExitUsage, code, "%v: %s", args, errb.String())
		require.Contains(t, errb.String(), "disbatch --help")
	}
}

func TestHelpShowsEnvironmentDefaultsWithoutPassword(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	env := map[string]string{EnvMongoURI: "mongodb://ops:hunter2@db1:27017/?replicaSet=prod", EnvDatabase: "jobs"}
	code := Run(context.Background(), []string{"--help"}, IO{In: strings.NewReader(""), Out: &out, Err: &out, Getenv: func(k string) string { return env[k] }})
	require.Equal(t, 0, code)
	require.Contains(t, out.String(), "mongodb://ops:xxxxx@db1:27017/?replicaSet=prod")
	require.Contains(t, out.String(), `(default "jobs")`)
	require.NotContains(t, out.String(), "hunter2")
}

func TestSubmitDrawsProgressOnlyOnATerminal(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "q", "--constructor", "C")
	in := strings.Repeat(`{"a":1}`+"\n", 50)
	for _, terminal := range []bool{true, false} {
		var out, errb bytes.Buffer
		args := []string{"task", "submit", "q", "--batch-size", "10", "--parallel", "1", "--mongo-uri", e.uri, "--database", e.db.Name()}
		code := Run(context.Background(), args, IO{In: strings.NewReader(in), Out: &out, Err: &errb, Terminal: terminal, Getenv: func(string) string { return "" }})
		require.Equal(t, 0, code, errb.String())
		if terminal {
			require.Contains(t, out.String(), "] 50/50", "the bar reaches the end")
			require.Contains(t, out.String(), "\r[##############################] 50/50\r\033[K", "and is erased before the summary")
		} else {
			require.NotContains(t, out.String(), "\r", "no bar when stdout is a pipe")
		}
		require.Contains(t, out.String(), "submitted 50 tasks to queue q")
	}
}

// TestAFailedSubmitSaysWhichLinesWereInserted: batches go in at once, so a
// failure leaves tasks from before and after the bad line; the error says
// how many and which lines exactly, as the database has them (it gave the
// count of batches done before the failure: a resubmit "from the line
// on" made duplicates). A collection validator refuses one line.
func TestAFailedSubmitSaysWhichLinesWereInserted(t *testing.T) {
	e := setup(t)
	e.ok("", "queue", "create", "q", "--constructor", "C")
	require.NoError(t, e.db.RunCommand(context.Background(), bson.D{{Key: "create", Value: "tasks"},
		{Key: "validator", Value: bson.D{{Key: "parameters.bad", Value: bson.D{{Key: "$exists", Value: false}}}}}}).Err())
	var b strings.Builder
	for i := 1; i <= 400; i++ {
		if i == 150 {
			b.WriteString(`{"bad": 1}` + "\n")
			continue
		}
		fmt.Fprintf(&b, `{"i": %d}`+"\n", i)
	}
	r := e.run(b.String(), "task", "submit", "q", "--batch-size", "10", "--parallel", "4")
	require.Equal(t, 1, r.code, r.err)
	in := e.count("tasks", bson.D{})
	require.Contains(t, r.err, fmt.Sprintf("; %d of 400 tasks were inserted, input lines 1-149", in))
	require.Regexp(t, `not inserted: lines 150(-\d+)?(, |$|\n)`, r.err)
	// The lines it names as not inserted are exactly those missing.
	cur, err := e.db.Collection("tasks").Find(context.Background(), bson.D{}, options.Find().SetProjection(bson.D{{Key: "parameters.i", Value: 1}}))
	require.NoError(t, err)
	var docs []bson.Raw
	require.NoError(t, cur.All(context.Background(), &docs))
	have := map[int64]bool{}
	for _, d := range docs {
		have[d.Lookup("parameters", "i").AsInt64()] = true
	}
	_, notIn, _ := strings.Cut(r.err, "not inserted: lines ")
	for _, part := range strings.Split(strings.TrimSpace(notIn), ", ") {
		lo, hi, ok := strings.Cut(part, "-")
		if !ok {
			hi = lo
		}
		from, err1 := strconv.Atoi(lo)
		to, err2 := strconv.Atoi(hi)
		require.NoError(t, err1, part)
		require.NoError(t, err2, part)
		for l := from; l <= to; l++ {
			require.False(t, have[int64(l)], "line %d named not inserted, but it is", l)
		}
	}
	require.Len(t, have, int(in))
}
