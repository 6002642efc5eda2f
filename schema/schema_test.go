package schema

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// doc turns canonical extended JSON into a raw document, so cases read like
// the documents they stand for.
func doc(t *testing.T, extJSON string) bson.Raw {
	t.Helper()
	var raw bson.Raw
	require.NoError(t, bson.UnmarshalExtJSON([]byte(extJSON), false, &raw), extJSON)
	return raw
}

const qid = `{"$oid":"571f8951b75bf335634ec271"}`

func TestDecodeQueueSeedExample(t *testing.T) {
	t.Parallel()
	q, err := DecodeQueue(doc(t, `{"_id":`+qid+`,"constructor":"Disbatch::Plugin::Demo","name":"demo",
		"count_total":{"$numberInt":"0"},"count_todo":{"$numberLong":"7"},"count_running":{"$numberInt":"3"},"count_failed":{"$numberInt":"1"},"maxthreads":{"$numberInt":"0"},"sort":"fifo"}`))
	require.NoError(t, err)
	require.Equal(t, "571f8951b75bf335634ec271", q.ID.Hex())
	require.Equal(t, "demo", q.Name)
	require.Equal(t, "Disbatch::Plugin::Demo", q.Constructor)
	require.Equal(t, 0, *q.MaxThreads)
	require.Equal(t, SortFIFO, q.Sort)
	require.Equal(t, int64(7), *q.CountTodo)
	require.Equal(t, int64(0), *q.CountTotal)
	require.Equal(t, int64(3), *q.CountRunning)
	require.Equal(t, int64(1), *q.CountFailed)
	require.Empty(t, q.Warnings)
}

func TestDecodeQueueOddButValid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, json     string
		constructor    string
		maxThreads     *int
		sort           Sort
		counts         bool
		pin, ignore    []string
		warningContain string
	}{
		{name: "perl dialect plugin and threads", json: `{"_id":` + qid + `,"name":"q","plugin":"P","threads":{"$numberInt":"4"}}`, constructor: "P", maxThreads: ptr(4)},
		{name: "threads as double", json: `{"_id":` + qid + `,"name":"q","plugin":"P","threads":{"$numberDouble":"3.0"}}`, constructor: "P", maxThreads: ptr(3)},
		{name: "threads as digit string from the perl web form", json: `{"_id":` + qid + `,"name":"q","plugin":"P","threads":"12"}`, constructor: "P", maxThreads: ptr(12)},
		{name: "maxthreads null", json: `{"_id":` + qid + `,"name":"q","constructor":"C","maxthreads":null}`, constructor: "C"},
		{name: "maxthreads missing", json: `{"_id":` + qid + `,"name":"q","constructor":"C"}`, constructor: "C"},
		{name: "null constructor falls back to plugin", json: `{"_id":` + qid + `,"name":"q","constructor":null,"plugin":"P"}`, constructor: "P"},
		{name: "counters null", json: `{"_id":` + qid + `,"name":"q","constructor":"C","count_todo":null,"count_total":null}`, constructor: "C"},
		{name: "sort missing", json: `{"_id":` + qid + `,"name":"q","constructor":"C","sort":null}`, constructor: "C"},
		{name: "unknown sort warns", json: `{"_id":` + qid + `,"name":"q","constructor":"C","sort":"random"}`, constructor: "C", sort: "random", warningContain: "unknown sort"},
		{name: "maxthreads and threads disagree warns", json: `{"_id":` + qid + `,"name":"q","constructor":"C","maxthreads":{"$numberInt":"2"},"threads":{"$numberInt":"5"}}`, constructor: "C", maxThreads: ptr(2), warningContain: "disagree"},
		{name: "pin and ignore lists", json: `{"_id":` + qid + `,"name":"q","constructor":"C","nodes_pin":["a","b"],"nodes_ignore":"c"}`, constructor: "C", pin: []string{"a", "b"}, ignore: []string{"c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := DecodeQueue(doc(t, tc.json))
			require.NoError(t, err)
			require.Equal(t, tc.constructor, q.Constructor)
			require.Equal(t, tc.maxThreads, q.MaxThreads)
			require.Equal(t, tc.sort, q.Sort)
			require.Equal(t, tc.pin, q.NodesPin)
			require.Equal(t, tc.ignore, q.NodesIgnore)
			if tc.warningContain == "" {
				require.Empty(t, q.Warnings)
			} else {
				require.Len(t, q.Warnings, 1)
				require.Contains(t, q.Warnings[0], tc.warningContain)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestDecodeQueueCountRunning: count_running is read like count_todo, and
// nil when missing or null (an older database, or a 4.103 queue).
func TestDecodeQueueCountRunning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, json string
		want       *int64
	}{
		{"missing", `{"_id":` + qid + `,"name":"q","constructor":"C","count_todo":{"$numberInt":"4"},"count_total":{"$numberInt":"9"}}`, nil},
		{"null", `{"_id":` + qid + `,"name":"q","constructor":"C","count_running":null}`, nil},
		{"int32", `{"_id":` + qid + `,"name":"q","constructor":"C","count_running":{"$numberInt":"2"}}`, ptr[int64](2)},
		{"int64", `{"_id":` + qid + `,"name":"q","constructor":"C","count_running":{"$numberLong":"5000000000"}}`, ptr[int64](5000000000)},
		{"zero", `{"_id":` + qid + `,"name":"q","constructor":"C","count_running":{"$numberInt":"0"}}`, ptr[int64](0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := DecodeQueue(doc(t, tc.json))
			require.NoError(t, err)
			require.Equal(t, tc.want, q.CountRunning)
		})
	}
}

// TestDecodeQueueCountFailed: count_failed is read like count_running, and
// nil when missing or null (a queue from before it, or a 4.103 queue).
func TestDecodeQueueCountFailed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, json string
		want       *int64
	}{
		{"missing", `{"_id":` + qid + `,"name":"q","constructor":"C","count_todo":{"$numberInt":"4"},"count_total":{"$numberInt":"9"},"count_running":{"$numberInt":"1"}}`, nil},
		{"null", `{"_id":` + qid + `,"name":"q","constructor":"C","count_failed":null}`, nil},
		{"int32", `{"_id":` + qid + `,"name":"q","constructor":"C","count_failed":{"$numberInt":"2"}}`, ptr[int64](2)},
		{"zero", `{"_id":` + qid + `,"name":"q","constructor":"C","count_failed":{"$numberInt":"0"}}`, ptr[int64](0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := DecodeQueue(doc(t, tc.json))
			require.NoError(t, err)
			require.Equal(t, tc.want, q.CountFailed)
		})
	}
}

// TestDecodeQueueBadCounterLeavesTheQueueServed: a counter is a
// projection, so one that is not a non-negative integer (a fraction or a
// whole double from a shell, a negative, a string) makes that count
// unknown, with a warning, and never the queue malformed: 4.103 nodes,
// which count on demand, run it too.
func TestDecodeQueueBadCounterLeavesTheQueueServed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, field, value, describe string
	}{
		{"fraction", "count_todo", `{"$numberDouble":"2.5"}`, "double 2.5"},
		{"whole double", "count_total", `{"$numberDouble":"3.0"}`, "double 3"},
		{"negative", "count_todo", `{"$numberInt":"-3"}`, "32-bit integer -3"},
		{"negative running", "count_running", `{"$numberLong":"-1"}`, "64-bit integer -1"},
		{"string", "count_failed", `"two"`, `string "two"`},
		{"decimal", "count_running", `{"$numberDecimal":"4"}`, "128-bit decimal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fields := map[string]string{"count_todo": `{"$numberInt":"4"}`, "count_total": `{"$numberInt":"9"}`, "count_running": `{"$numberInt":"1"}`, "count_failed": `{"$numberInt":"2"}`}
			fields[tc.field] = tc.value
			json := `{"_id":` + qid + `,"name":"q","constructor":"C"`
			for f, v := range fields {
				json += `,"` + f + `":` + v
			}
			q, err := DecodeQueue(doc(t, json+`}`))
			require.NoError(t, err)
			got := map[string]*int64{"count_todo": q.CountTodo, "count_total": q.CountTotal, "count_running": q.CountRunning, "count_failed": q.CountFailed}
			want := map[string]*int64{"count_todo": ptr[int64](4), "count_total": ptr[int64](9), "count_running": ptr[int64](1), "count_failed": ptr[int64](2)}
			want[tc.field] = nil
			require.Equal(t, want, got)
			require.Len(t, q.Warnings, 1)
			require.Contains(t, q.Warnings[0], tc.field+": want a non-negative integer counter, got "+tc.describe)
		})
	}
}

func TestDecodeMalformedNamesCollectionIDAndField(t *testing.T) {
	t.Parallel()
	tid := `{"$oid":"571fac85ee63413233049fbd"}`
	for _, tc := range []struct {
		name, json, field, contains string
		decode                      func(bson.Raw) error
	}{
		{"queue without constructor", `{"_id":` + qid + `,"name":"q"}`, "constructor", "missing", decodeQ},
		{"queue with empty constructor", `{"_id":` + qid + `,"name":"q","constructor":""}`, "constructor", "empty", decodeQ},
		{"queue without name", `{"_id":` + qid + `,"constructor":"C"}`, "name", "missing", decodeQ},
		{"queue string maxthreads", `{"_id":` + qid + `,"name":"q","constructor":"C","maxthreads":"ten"}`, "maxthreads", `string "ten"`, decodeQ},
		{"queue negative maxthreads", `{"_id":` + qid + `,"name":"q","constructor":"C","maxthreads":{"$numberInt":"-1"}}`, "maxthreads", "out of range", decodeQ},
		{"queue fractional maxthreads", `{"_id":` + qid + `,"name":"q","constructor":"C","maxthreads":{"$numberDouble":"1.5"}}`, "maxthreads", "integer", decodeQ},
		{"queue name not a string", `{"_id":` + qid + `,"name":{"$numberInt":"3"},"constructor":"C"}`, "name", "want a string, got 32-bit integer 3", decodeQ},
		{"queue pin list of numbers", `{"_id":` + qid + `,"name":"q","constructor":"C","nodes_pin":[{"$numberInt":"1"}]}`, "nodes_pin.0", "want a string", decodeQ},
		{"task queue not an ObjectId", `{"_id":` + tid + `,"queue":"demo","status":{"$numberInt":"-2"}}`, "queue", `want an ObjectId, got string "demo"`, decodeT},
		{"task without queue", `{"_id":` + tid + `,"status":{"$numberInt":"-2"}}`, "queue", "missing", decodeT},
		{"task parameters not an object", `{"_id":` + tid + `,"queue":` + qid + `,"status":{"$numberInt":"-2"},"parameters":[1,2]}`, "parameters", "want an object, got array", decodeT},
		{"task params string", `{"_id":` + tid + `,"queue":` + qid + `,"status":{"$numberInt":"-2"},"params":"x"}`, "params", "want an object", decodeT},
		{"task status string", `{"_id":` + tid + `,"queue":` + qid + `,"status":"done"}`, "status", "want an integer", decodeT},
		{"task status missing", `{"_id":` + tid + `,"queue":` + qid + `}`, "status", "missing", decodeT},
		{"task status fractional", `{"_id":` + tid + `,"queue":` + qid + `,"status":{"$numberDouble":"0.5"}}`, "status", "integer", decodeT},
		{"task status huge", `{"_id":` + tid + `,"queue":` + qid + `,"status":{"$numberLong":"99999999999"}}`, "status", "want a 32-bit status code, got 64-bit integer 99999999999", decodeT},
		{"task parameters a double", `{"_id":` + tid + `,"queue":` + qid + `,"status":{"$numberInt":"-2"},"parameters":{"$numberDouble":"2.5"}}`, "parameters", "want an object, got double 2.5", decodeT},
		{"task node a number other than -1", `{"_id":` + tid + `,"queue":` + qid + `,"status":{"$numberInt":"-2"},"node":{"$numberInt":"7"}}`, "node", "node name, -1 or null", decodeT},
		{"task stdout a number", `{"_id":` + tid + `,"queue":` + qid + `,"status":{"$numberInt":"1"},"stdout":{"$numberInt":"7"}}`, "stdout", "GridFS ObjectId", decodeT},
		{"task mtime a bool", `{"_id":` + tid + `,"queue":` + qid + `,"status":{"$numberInt":"1"},"mtime":true}`, "mtime", "want a date", decodeT},
		{"task _id a string", `{"_id":"abc","queue":` + qid + `,"status":{"$numberInt":"1"}}`, "_id", "want an ObjectId", decodeT},
		{"node maxthreads string", `{"node":"n1","maxthreads":"lots"}`, "maxthreads", `string "lots"`, decodeN},
		{"node without name", `{"timestamp":{"$date":"2016-04-26T19:26:33.649Z"}}`, "node", "missing", decodeN},
		{"node queues not an array", `{"node":"n1","queues":{"a":1}}`, "queues", "want an array", decodeN},
		{"config activequeues a number", `{"activequeues":{"$numberInt":"1"}}`, "activequeues", "array of strings", decodeC},
		{"config active a string", `{"active":"yes"}`, "active", "boolean", decodeC},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.decode(doc(t, tc.json))
			require.Error(t, err)
			var de *DecodeError
			require.True(t, errors.As(err, &de), "%T", err)
			require.Equal(t, tc.field, de.Field)
			require.Contains(t, err.Error(), tc.contains)
			require.Contains(t, err.Error(), `field "`+tc.field+`"`)
		})
	}
}

func decodeQ(r bson.Raw) error { _, err := DecodeQueue(r); return err }
func decodeT(r bson.Raw) error { _, err := DecodeTask(r); return err }
func decodeN(r bson.Raw) error { _, err := DecodeNode(r); return err }
func decodeC(r bson.Raw) error { _, err := DecodeConfig(r); return err }

func TestDecodeErrorNamesCollectionAndID(t *testing.T) {
	t.Parallel()
	_, err := DecodeQueue(doc(t, `{"_id":`+qid+`,"name":"q"}`))
	require.EqualError(t, err, `queues document ObjectId("571f8951b75bf335634ec271"): field "constructor": missing`)
}

func TestDecodeGarbageBytesNeverPanics(t *testing.T) {
	t.Parallel()
	for _, b := range [][]byte{nil, {1, 2, 3}, {0xff, 0xff, 0xff, 0x7f, 0}, {13, 0, 0, 0, 0x10, 'a', 0, 1, 0, 0, 0, 0}} {
		_, err := DecodeTask(bson.Raw(b))
		require.ErrorContains(t, err, "tasks document (no _id): not a valid BSON document")
		_, err = DecodeQueue(bson.Raw(b))
		require.ErrorContains(t, err, "queues document (no _id): not a valid BSON document")
	}
	// An empty document is valid BSON, but not a task.
	_, err := DecodeTask(bson.Raw{5, 0, 0, 0, 0})
	require.EqualError(t, err, `tasks document (no _id): field "_id": missing`)
}

func TestDecodeTaskSeedExampleAndPerlDialect(t *testing.T) {
	t.Parallel()
	task, err := DecodeTask(doc(t, `{"_id":{"$oid":"571fac85ee63413233049fbd"},
		"parameters":{"migration":"oneoff","commands":"*"},
		"ctime":{"$date":"2016-04-26T17:59:33Z"},"status":{"$numberInt":"1"},"mtime":{"$date":"2016-04-26T18:37:40Z"},
		"queue":{"$oid":"54a700074b485f0b00000000"},"node":"mig01.example.com",
		"stderr":{"$oid":"571fbac9d8590b78fe4830b4"},"stdout":"hello"}`))
	require.NoError(t, err)
	require.Equal(t, StatusSucceeded, task.Status)
	require.Equal(t, "mig01.example.com", task.Node)
	require.Equal(t, "*", task.Parameters.Lookup("commands").StringValue())
	require.Equal(t, time.Date(2016, 4, 26, 17, 59, 33, 0, time.UTC), task.CTime)
	require.Equal(t, Output{Text: "hello", Set: true}, task.Stdout)
	require.True(t, task.Stderr.InGridFS())
	require.Equal(t, "571fbac9d8590b78fe4830b4", task.Stderr.FileID.Hex())

	// Disbatch 4.103: params, node null, mtime as epoch seconds, int64 status.
	perl, err := DecodeTask(doc(t, `{"_id":{"$oid":"571fac85ee63413233049fbd"},"queue":{"$oid":"54a700074b485f0b00000000"},
		"params":{"user":"a"},"node":null,"status":{"$numberLong":"-2"},"mtime":{"$numberDouble":"1461693573.5"},"stdout":null,"complete":true}`))
	require.NoError(t, err)
	require.Equal(t, "", perl.Node)
	require.Equal(t, StatusQueued, perl.Status)
	require.Equal(t, "a", perl.Parameters.Lookup("user").StringValue())
	require.Equal(t, time.Unix(1461693573, 5e8).UTC(), perl.MTime)
	require.False(t, perl.Stdout.Set)

	// node -1 stored as a double is still unclaimed.
	dbl, err := DecodeTask(doc(t, `{"_id":{"$oid":"571fac85ee63413233049fbd"},"queue":{"$oid":"54a700074b485f0b00000000"},"node":{"$numberDouble":"-1"},"status":{"$numberDouble":"-2"}}`))
	require.NoError(t, err)
	require.Equal(t, "", dbl.Node)
	require.Equal(t, StatusQueued, dbl.Status)
	require.Nil(t, dbl.Parameters)
}

func TestDecodeNodeSeedExample(t *testing.T) {
	t.Parallel()
	n, err := DecodeNode(doc(t, `{"_id":{"$oid":"56fc05087aa3a33942e42a6a"},"node":"mig01.example.com",
		"timestamp":{"$date":"2016-04-26T19:26:33.649Z"},
		"queues":[{"maxthreads":{"$numberInt":"0"},"constructor":"Disbatch::Plugin::Demo","name":"demo","tasks_doing":{"$numberInt":"0"},
		"tasks_done":{"$numberInt":"3"},"preemptive":{"$numberInt":"1"},"id":"571f8951b75bf335634ec271","tasks_todo":{"$numberInt":"2"},"tasks_backfill":{"$numberInt":"0"}}, "junk"],
		"maxthreads":{"$numberInt":"5"}}`))
	require.NoError(t, err)
	require.Equal(t, "mig01.example.com", n.Node)
	require.Equal(t, 5, *n.MaxThreads)
	require.Len(t, n.Queues, 1)
	require.Equal(t, NodeQueue{Name: "demo", ID: "571f8951b75bf335634ec271", Constructor: "Disbatch::Plugin::Demo", MaxThreads: ptr(0), TasksTodo: 2, TasksDone: 3}, n.Queues[0])
}

// TestDecodeNodeServes: a node of this version says which queues it
// serves, which are full and whether it follows a stream, with its
// heartbeat's time; a document without them (a 4.103 node, or ours
// before), or with them from an earlier heartbeat than its timestamp (a
// node rolled back to an earlier version), decodes to nil, told apart
// from serving nothing; if one of serves, full and wakeup_stream is
// malformed (or missing), none is said, and the node still decodes.
func TestDecodeNodeServes(t *testing.T) {
	t.Parallel()
	const at = `{"$date":"2026-11-29T12:00:00.123Z"}`
	n, err := DecodeNode(doc(t, `{"node":"a","timestamp":`+at+`,"serves_at":`+at+`,"serves":["571f8951b75bf335634ec271","571f8951b75bf335634ec272"],
		"full":["571f8951b75bf335634ec272"],"wakeup_stream":true}`))
	require.NoError(t, err)
	require.Equal(t, []string{"571f8951b75bf335634ec271", "571f8951b75bf335634ec272"}, n.Serves)
	require.Equal(t, []string{"571f8951b75bf335634ec272"}, n.Full)
	require.True(t, n.WakeupStream)
	none, err := DecodeNode(doc(t, `{"node":"b","timestamp":`+at+`,"serves_at":`+at+`,"serves":[],"full":[],"wakeup_stream":false}`))
	require.NoError(t, err)
	require.NotNil(t, none.Serves, "serving nothing is not unknown")
	require.Empty(t, none.Serves)
	require.False(t, none.WakeupStream)
	old, err := DecodeNode(doc(t, `{"node":"c","queues":[]}`))
	require.NoError(t, err)
	require.Nil(t, old.Serves)
	stale, err := DecodeNode(doc(t, `{"node":"d","timestamp":{"$date":"2026-11-29T12:00:01.000Z"},"serves_at":`+at+`,"serves":[],"full":[],"wakeup_stream":false}`))
	require.NoError(t, err)
	require.Nil(t, stale.Serves, "written by an earlier heartbeat")
	require.Nil(t, stale.Full)
	require.False(t, stale.WakeupStream)
	for _, fields := range []string{
		`"serves":[1],"full":[],"wakeup_stream":true`,
		`"serves":["x"],"full":[],"wakeup_stream":true`,
		`"serves":[],"full":{},"wakeup_stream":true`,
		`"serves":[],"full":[],"wakeup_stream":"yes"`,
		`"serves":[],"full":[]`,
	} {
		bad, err := DecodeNode(doc(t, `{"node":"e","timestamp":`+at+`,"serves_at":`+at+`,`+fields+`}`))
		require.NoError(t, err, fields)
		require.Nil(t, bad.Serves, fields)
		require.Nil(t, bad.Full, fields)
		require.False(t, bad.WakeupStream, fields)
	}
}

// TestDecodeNodeFenceAfter: a node's --fence-after, in milliseconds as its
// heartbeat writes it (int64, or int32 from another writer), is read; one
// that is missing, not a positive whole number or past a year is not said,
// and the node still decodes. One written by an earlier heartbeat than the
// timestamp (a 4.103 node now heartbeats under the name) is not said.
func TestDecodeNodeFenceAfter(t *testing.T) {
	t.Parallel()
	const at = `{"$date":"2026-11-29T12:00:00.123Z"}`
	stale, err := DecodeNode(doc(t, `{"node":"a","timestamp":{"$date":"2026-11-29T12:00:09.000Z"},"serves_at":`+at+`,"fence_after_ms":{"$numberLong":"10000"}}`))
	require.NoError(t, err)
	require.Zero(t, stale.FenceAfter, "written by an earlier heartbeat")
	for fields, want := range map[string]time.Duration{
		`"fence_after_ms":{"$numberLong":"10000"}`:       10 * time.Second,
		`"fence_after_ms":{"$numberInt":"2500"}`:         2500 * time.Millisecond,
		``:                                               0,
		`"fence_after_ms":{"$numberLong":"0"}`:           0,
		`"fence_after_ms":{"$numberLong":"-5"}`:          0,
		`"fence_after_ms":"10000"`:                       0,
		`"fence_after_ms":{"$numberDouble":"10000.0"}`:   0,
		`"fence_after_ms":{"$numberLong":"40000000000"}`: 0,
	} {
		sep := ""
		if fields != "" {
			sep = ","
		}
		n, err := DecodeNode(doc(t, `{"node":"a","timestamp":`+at+`,"serves_at":`+at+sep+fields+`}`))
		require.NoError(t, err, fields)
		require.Equal(t, want, n.FenceAfter, fields)
	}
}

func TestDecodeConfig(t *testing.T) {
	t.Parallel()
	c, err := DecodeConfig(doc(t, `{"_id":{"$oid":"56fc05087aa3a33942e42a6a"},"label":"prod","active":true,
		"activequeues":["571f8951b75bf335634ec271",{"$oid":"571f8951b75bf335634ec272"}],"ignorequeues":[],"log4perl":{"x":1}}`))
	require.NoError(t, err)
	require.Equal(t, "prod", c.Label)
	require.True(t, c.Active)
	require.Equal(t, []string{"571f8951b75bf335634ec271", "571f8951b75bf335634ec272"}, c.ActiveQueues)
	require.Empty(t, c.IgnoreQueues)
}

func TestStatus(t *testing.T) {
	t.Parallel()
	require.Equal(t, "orphaned", StatusOrphaned.String())
	require.Equal(t, "7", Status(7).String())
	require.True(t, StatusRunning.Todo())
	require.True(t, Status(-9).Todo())
	require.False(t, StatusFailed.Todo())
	for _, s := range []string{"queued", "-2"} {
		got, err := ParseStatus(s)
		require.NoError(t, err)
		require.Equal(t, StatusQueued, got)
	}
	_, err := ParseStatus("bogus")
	require.ErrorContains(t, err, `unknown status "bogus"`)
}

// TestNumberComparesAcrossNumericTypes: Number reads every BSON number as
// MongoDB compares it, and nothing else.
func TestNumberComparesAcrossNumericTypes(t *testing.T) {
	dec, err := bson.ParseDecimal128("2")
	require.NoError(t, err)
	raw, err := bson.Marshal(bson.D{{Key: "i", Value: int32(-1)}, {Key: "l", Value: int64(1)}, {Key: "d", Value: 0.0},
		{Key: "m", Value: dec}, {Key: "s", Value: "1"}, {Key: "n", Value: nil}})
	require.NoError(t, err)
	doc := bson.Raw(raw)
	for key, want := range map[string]float64{"i": -1, "l": 1, "d": 0, "m": 2} {
		f, ok := Number(doc.Lookup(key))
		require.True(t, ok, key)
		require.Equal(t, want, f, key)
	}
	for _, key := range []string{"s", "n", "missing"} {
		_, ok := Number(doc.Lookup(key))
		require.False(t, ok, key)
	}
}
