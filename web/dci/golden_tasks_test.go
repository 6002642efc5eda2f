package dci_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web/dci"
)

const updated = `{"MongoDB::UpdateResult":{"matched_count":1,"modified_count":1,"upserted_id":null,"write_concern_errors":[],"write_errors":[]}}`

func TestGoldenQueues(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	b.run([]exchange{
		{name: "post empty", method: "POST", path: "/queues", ctype: "json", body: `{}`, status: 400, want: `{"error":"name and plugin required"}`},
		{name: "post name only", method: "POST", path: "/queues", ctype: "json", body: `{"name":"q1"}`, status: 400, want: `{"error":"name and plugin required"}`},
		{name: "post empty name", method: "POST", path: "/queues", ctype: "json", body: `{"name":"","plugin":"Disbatch::Plugin::Demo"}`, status: 400, want: `{"error":"name and plugin required"}`},
		{name: "post unknown key", method: "POST", path: "/queues", ctype: "json", body: `{"name":"q1","plugin":"Disbatch::Plugin::Demo","threads":1}`, status: 400, want: `{"error":"Invalid param","param":"threads"}`},
		{name: "post unknown plugin", method: "POST", path: "/queues", ctype: "json", body: `{"name":"q1","plugin":"Nope"}`, status: 400, want: `{"error":"Unknown plugin","plugin":"Nope"}`},
	})
	for _, x := range []struct{ name, ctype, body string }{
		{"q1", "json", `{"name":"q1","plugin":"Disbatch::Plugin::Demo"}`},
		{"q2", "form", `name=q2&plugin=Disbatch%3A%3APlugin%3A%3ADemo`},
	} {
		status, _, body := b.do("POST", "/queues", x.ctype, x.body)
		require.Equal(t, 200, status, body)
		id, err := b.st.QueueResolve(context.Background(), x.name)
		require.NoError(t, err)
		b.vars[x.name] = id.Hex()
		require.Equal(t, b.sub(`{"MongoDB::InsertOneResult":{"inserted_id":{"$oid":"{{`+x.name+`}}"},"write_concern_errors":[],"write_errors":[]},"id":{"$oid":"{{`+x.name+`}}"}}`), body)
	}
	status, _, body := b.do("POST", "/queues", "json", `{"name":"q1","plugin":"Disbatch::Plugin::Demo"}`)
	require.Equal(t, 400, status)
	require.Regexp(t, `^\{"MongoDB::DuplicateKeyError":\{"code":11000,"error_labels":\[\],"message":"E11000 duplicate key error collection: golden.queues index: name_1 dup key: \{ name: \\"q1\\" \}","previous_exception":"","result":\{"MongoDB::InsertOneResult":\{"inserted_id":\{"\$oid":"[0-9a-f]{24}"\},"write_concern_errors":\[\],"write_errors":\[\{"code":11000,"errmsg":"E11000 duplicate key error collection: golden.queues index: name_1 dup key: \{ name: \\"q1\\" \}","index":0,"keyPattern":\{"name":1\},"keyValue":\{"name":"q1"\},"op":\{"name":"q1","plugin":"Disbatch::Plugin::Demo"\}\}\]\}\}\},"error":"MongoDB::DuplicateKeyError: E11000 duplicate key error collection: golden.queues index: name_1 dup key: \{ name: \\"q1\\" \}","id":null\}$`, body)

	b.run([]exchange{
		{name: "queues two", method: "GET", path: "/queues", status: 200,
			want: `[{"completed":0,"id":"{{q1}}","name":"q1","plugin":"Disbatch::Plugin::Demo","queued":0,"running":0,"threads":null},{"completed":0,"id":"{{q2}}","name":"q2","plugin":"Disbatch::Plugin::Demo","queued":0,"running":0,"threads":null}]`},
		{name: "queue by name", method: "GET", path: "/queues/q1", status: 200,
			want: `{"completed":0,"id":"{{q1}}","name":"q1","plugin":"Disbatch::Plugin::Demo","queued":0,"running":0,"threads":null}`},
		{name: "queue by id", method: "GET", path: "/queues/{{q1}}", status: 200,
			want: `{"completed":0,"id":"{{q1}}","name":"q1","plugin":"Disbatch::Plugin::Demo","queued":0,"running":0,"threads":null}`},
		{name: "queue missing (4.103: 500)", method: "GET", path: "/queues/nosuch", status: 200, want: `null`},
		{name: "update empty", method: "POST", path: "/queues/q1", ctype: "json", body: `{}`, status: 400, want: `{"error":"no params"}`},
		{name: "update unknown param", method: "POST", path: "/queues/q1", ctype: "json", body: `{"maxthreads":1}`, status: 400, want: `{"error":"unknown param","param":"maxthreads"}`},
		{name: "update unknown plugin", method: "POST", path: "/queues/q1", ctype: "json", body: `{"plugin":"Nope"}`, status: 400, want: `{"error":"unknown plugin","plugin":"Nope"}`},
		{name: "threads abc", method: "POST", path: "/queues/q1", ctype: "json", body: `{"threads":"abc"}`, status: 400, want: `{"error":"threads must be a non-negative integer"}`},
		{name: "threads negative", method: "POST", path: "/queues/q1", ctype: "json", body: `{"threads":-1}`, status: 400, want: `{"error":"threads must be a non-negative integer"}`},
		{name: "threads null", method: "POST", path: "/queues/q1", ctype: "json", body: `{"threads":null}`, status: 400, want: `{"error":"threads must be a non-negative integer"}`},
		{name: "name empty", method: "POST", path: "/queues/q1", ctype: "json", body: `{"name":""}`, status: 400, want: `{"error":"name must be a string"}`},
		{name: "name array", method: "POST", path: "/queues/q1", ctype: "json", body: `{"name":["a"]}`, status: 400, want: `{"error":"name must be a string"}`},
		{name: "threads json", method: "POST", path: "/queues/q1", ctype: "json", body: `{"threads":2}`, status: 200, want: updated},
		{name: "threads same", method: "POST", path: "/queues/q1", ctype: "json", body: `{"threads":2}`, status: 200,
			want: `{"MongoDB::UpdateResult":{"matched_count":1,"modified_count":0,"upserted_id":null,"write_concern_errors":[],"write_errors":[]}}`},
		{name: "threads form", method: "POST", path: "/queues/{{q2}}", ctype: "form", body: `threads=3`, status: 200, want: updated},
		{name: "update no match", method: "POST", path: "/queues/nosuch", ctype: "json", body: `{"threads":2}`, status: 400,
			want: `{"MongoDB::UpdateResult":{"matched_count":0,"modified_count":0,"upserted_id":null,"write_concern_errors":[],"write_errors":[]},"error":"no queue nosuch"}`},
		{name: "rename", method: "POST", path: "/queues/q2", ctype: "json", body: `{"name":"q2renamed"}`, status: 200, want: updated},
		{name: "rename to a taken name", method: "POST", path: "/queues/q2renamed", ctype: "json", body: `{"name":"q1"}`, status: 400,
			want: `{"MongoDB::DuplicateKeyError":{"code":11000,"error_labels":[],"message":"E11000 duplicate key error collection: golden.queues index: name_1 dup key: { name: \"q1\" }","previous_exception":"","result":null},"error":"MongoDB::DuplicateKeyError: E11000 duplicate key error collection: golden.queues index: name_1 dup key: { name: \"q1\" }"}`},
		{name: "after updates", method: "GET", path: "/queues", status: 200,
			want: `[{"completed":0,"id":"{{q1}}","name":"q1","plugin":"Disbatch::Plugin::Demo","queued":0,"running":0,"threads":2},{"completed":0,"id":"{{q2}}","name":"q2renamed","plugin":"Disbatch::Plugin::Demo","queued":0,"running":0,"threads":3}]`},
		{name: "delete missing", method: "DELETE", path: "/queues/nosuch", status: 400,
			want: `{"MongoDB::DeleteResult":{"deleted_count":0,"write_concern_errors":[],"write_errors":[]},"error":"no queue nosuch"}`},
		{name: "delete by name", method: "DELETE", path: "/queues/q2renamed", status: 200,
			want: `{"MongoDB::DeleteResult":{"deleted_count":1,"write_concern_errors":[],"write_errors":[]}}`},
	})
}

// insertFixtures puts q1's tasks of every status straight into tasks, as
// the 4.103 replay did, with a GridFS-stored output of string chunks.
func insertFixtures(t *testing.T, b *bench) {
	ctx := context.Background()
	q1, err := bson.ObjectIDFromHex(b.vars["q1"])
	require.NoError(t, err)
	statuses := []int32{-6, -2, -1, 0, 1, 2}
	names := map[int32]string{-6: "orphan", -2: "queued", -1: "claimed", 0: "running", 1: "done", 2: "failed"}
	ms := []int64{0, 100, 120, 123, 574, 999}
	var docs []any
	for i, s := range statuses {
		id, _ := bson.ObjectIDFromHex("5d00000000000000000000" + []string{"01", "02", "03", "04", "05", "06"}[i])
		var node, stdout, stderr any
		if s >= -1 {
			node = "node-a"
		}
		if s >= 1 {
			stdout = "out " + names[s] + "\n"
		}
		if s == 2 {
			stderr = "err"
		}
		docs = append(docs, bson.D{{Key: "_id", Value: id}, {Key: "queue", Value: q1}, {Key: "status", Value: s}, {Key: "node", Value: node},
			{Key: "params", Value: bson.D{{Key: "commands", Value: names[s]}}}, {Key: "stdout", Value: stdout}, {Key: "stderr", Value: stderr},
			{Key: "ctime", Value: bson.NewDateTimeFromTime(time.UnixMilli(1548272576000 + ms[i]))}, {Key: "mtime", Value: bson.NewDateTimeFromTime(time.UnixMilli(1548272577035))}})
	}
	gfs, _ := bson.ObjectIDFromHex("5d0000000000000000000007")
	files := map[string]bson.ObjectID{}
	for _, name := range []string{"stdout", "stderr"} {
		fid := bson.NewObjectID()
		files[name] = fid
		content := "gridfs " + name + " content\n"
		_, err := b.db.Collection("tasks.files").InsertOne(ctx, bson.D{{Key: "_id", Value: fid}, {Key: "length", Value: int64(len(content))}, {Key: "chunkSize", Value: 261120},
			{Key: "filename", Value: name}, {Key: "metadata", Value: bson.D{{Key: "task_id", Value: gfs}}}})
		require.NoError(t, err)
		_, err = b.db.Collection("tasks.chunks").InsertOne(ctx, bson.D{{Key: "files_id", Value: fid}, {Key: "n", Value: 0}, {Key: "data", Value: content}})
		require.NoError(t, err)
	}
	b.vars["gfsout"], b.vars["gfserr"] = files["stdout"].Hex(), files["stderr"].Hex()
	docs = append(docs, bson.D{{Key: "_id", Value: gfs}, {Key: "queue", Value: q1}, {Key: "status", Value: int32(1)}, {Key: "node", Value: "node-a"},
		{Key: "params", Value: bson.D{{Key: "commands", Value: "gfs"}}}, {Key: "stdout", Value: files["stdout"]}, {Key: "stderr", Value: files["stderr"]},
		{Key: "ctime", Value: bson.NewDateTimeFromTime(time.Unix(1548272578, 0))}, {Key: "mtime", Value: bson.NewDateTimeFromTime(time.Unix(1548272578, 0))}})
	_, err = b.db.Collection("tasks").InsertMany(ctx, docs)
	require.NoError(t, err)
}

func task(id, status, node, commands, stdout, stderr string) string {
	return `{"_id":{"$oid":"5d00000000000000000000` + id + `"},"ctime":"2019-01-23T19:42:56","mtime":"2019-01-23T19:42:57","node":` + node +
		`,"params":{"commands":"` + commands + `"},"queue":{"$oid":"{{q1}}"},"status":` + status + `,"stderr":` + stderr + `,"stdout":` + stdout + `}`
}

func TestGoldenTasks(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	for _, name := range []string{"q1", "q2"} {
		status, _, body := b.do("POST", "/queues", "json", `{"name":"`+name+`","plugin":"Disbatch::Plugin::Demo"}`)
		require.Equal(t, 200, status, body)
		id, err := b.st.QueueResolve(context.Background(), name)
		require.NoError(t, err)
		b.vars[name] = id.Hex()
	}
	_, err := b.db.Collection("users").InsertMany(context.Background(), []any{
		bson.D{{Key: "username", Value: "foo"}, {Key: "migration", Value: "test"}, {Key: "n", Value: 1}},
		bson.D{{Key: "username", Value: "bar"}, {Key: "migration", Value: "test"}, {Key: "n", Value: 2}},
	})
	require.NoError(t, err)
	const invalid = `{"error":"invalid parameters passed"}`
	b.run([]exchange{
		{name: "no queue", method: "POST", path: "/tasks", ctype: "json", body: `{"params":[{"a":1}]}`, status: 400, want: `{"error":"queue not found"}`},
		{name: "unknown queue name", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"nosuch","params":[{"a":1}]}`, status: 400, want: `{"error":"queue not found"}`},
		{name: "unknown queue id", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"5c0000000000000000000000","params":[{"a":1}]}`, status: 400, want: `{"error":"queue not found"}`},
		{name: "params empty array", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","params":[]}`, status: 400, want: `{"error":"'params' must be a JSON array of task params objects"}`},
		{name: "params non-object", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","params":[1]}`, status: 400, want: `{"error":"'params' must be a JSON array of task params objects"}`},
		{name: "params empty object element", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","params":[{}]}`, status: 400, want: `{"error":"'params' must be a JSON array of task params objects with key/value pairs"}`},
		{name: "params empty object", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","params":{}}`, status: 400, want: `{"error":"'params' must be a JSON array of task params objects with key/value pairs"}`},
		{name: "params string", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","params":"x"}`, status: 400, want: invalid},
		{name: "params missing", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1"}`, status: 400, want: invalid},
		{name: "extra key", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","params":[{"a":1}],"x":1}`, status: 400, want: invalid},
		{name: "bare array", method: "POST", path: "/tasks", ctype: "json", body: `[{"a":1}]`, status: 400, want: `{"error":"queue not found"}`},
		{name: "form", method: "POST", path: "/tasks", ctype: "form", body: `queue=q1&params=x`, status: 400, want: invalid},
		{name: "B filter not object", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","collection":"users","filter":[1],"params":{"a":"b"}}`, status: 400, want: `{"error":"'filter' must be a JSON object"}`},
		{name: "B collection empty", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","collection":"","filter":{},"params":{"a":"b"}}`, status: 400, want: `{"error":"'collection' required and must be a scalar (string)'"}`},
		{name: "B collection object", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","collection":{"a":1},"filter":{},"params":{"a":"b"}}`, status: 400, want: `{"error":"'collection' required and must be a scalar (string)'"}`},
		{name: "B params array", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","collection":"users","filter":{},"params":[{"a":"b"}]}`, status: 400, want: invalid},
		{name: "B no match", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","collection":"users","filter":{"migration":"none"},"params":{"a":"document.username"}}`, status: 400,
			want: `{"MongoDB::InsertManyResult":{"acknowledged":1,"inserted":[],"write_concern_errors":[],"write_errors":[]},"error":"Unknown error"}`},
		{name: "B bad filter", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","collection":"users","filter":{"$bad":1},"params":{"a":"document.username"}}`, status: 400,
			want: `{"error":"MongoDB::DatabaseError: unknown top level operator: $bad. If you have a field name that starts with a '$' symbol, consider using $getField or $setField."}`},
		{name: "B missing filter", method: "POST", path: "/tasks", ctype: "json", body: `{"queue":"q1","collection":"users","params":{"a":"document.username"}}`, status: 400, want: invalid},
	})

	// Success bodies carry new ids: check their shape, then the tasks.
	status, _, body := b.do("POST", "/tasks", "json", `{"queue":"q1","collection":"users","filter":{"migration":"test"},"params":{"user1":"document.username","migration":"document.migration","n":"document.n","missing":"document.nope","commands":"*","lit":"documents.x"}}`)
	require.Equal(t, 200, status, body)
	require.Regexp(t, `^\{"MongoDB::InsertManyResult":\{"acknowledged":1,"inserted":\[\{"_id":\{"\$oid":"[0-9a-f]{24}"\},"index":0\},\{"_id":\{"\$oid":"[0-9a-f]{24}"\},"index":1\}\],"write_concern_errors":\[\],"write_errors":\[\]\}\}$`, body)
	status, _, body = b.do("GET", "/tasks?queue={{q1}}&.fields=%7B%22params%22%3A1%2C%22_id%22%3A0%7D", "", "")
	require.Equal(t, 200, status, body)
	require.Equal(t, `[{"params":{"commands":"*","lit":"documents.x","migration":"test","missing":null,"n":1,"user1":"foo"}},{"params":{"commands":"*","lit":"documents.x","migration":"test","missing":null,"n":2,"user1":"bar"}}]`, body)

	status, _, body = b.do("POST", "/tasks", "json", `{"queue":"q2","params":[{"u":"é✓😀","h":"<>&/'\"\\","ctl":"a\tb\nc\u0001","n":1,"neg":-3,"f":1.5,"f2":0.1,"e":1e20,"big":12345678901234567,"s":"007","ns":"42","b":true,"bf":false,"z":null,"arr":[1,"2",null],"obj":{"k":{"deep":[]}},"empty":""}]}`)
	require.Equal(t, 200, status, body)
	status, _, body = b.do("GET", "/tasks", "json", `{"queue":"{{q2}}",".fields":["params"]}`)
	require.Equal(t, 200, status, body)
	require.Regexp(t, `^\[\{"_id":\{"\$oid":"[0-9a-f]{24}"\},"params":\{"arr":\[1,"2",null\],"b":true,"bf":false,"big":12345678901234567,"ctl":"a\\tb\\nc\\u0001","e":1e\+20,"empty":"","f":1\.5,"f2":0\.1,"h":"<>&/'\\"\\\\","n":1,"neg":-3,"ns":"42","obj":\{"k":\{"deep":\[\]\}\},"s":"007","u":"é✓😀","z":null\}\}\]$`, body)
	status, _, body = b.do("GET", "/tasks", "json", `{"queue":"{{q2}}",".fields":["params.obj"],".pretty":1}`)
	require.Equal(t, 200, status, body)
	require.Regexp(t, "^\\[\n   \\{\n      \"_id\" : \\{\n         \"\\$oid\" : \"[0-9a-f]{24}\"\n      \\},\n      \"params\" : \\{\n         \"obj\" : \\{\n            \"k\" : \\{\n               \"deep\" : \\[\\]\n            \\}\n         \\}\n      \\}\n   \\}\n\\]\n$", body)

	_, err = b.db.Collection("tasks").DeleteMany(context.Background(), bson.D{})
	require.NoError(t, err)
	insertFixtures(t, b)
	orphan := task("01", "-6", "null", "orphan", "null", "null")
	claimed := `{"_id":{"$oid":"5d0000000000000000000003"},"ctime":"2019-01-23T19:42:56","mtime":"2019-01-23T19:42:57","node":"node-a","params":{"commands":"claimed"},"queue":{"$oid":"{{q1}}"},"status":-1,"stderr":null,"stdout":null}`
	running := `{"_id":{"$oid":"5d0000000000000000000004"},"ctime":"2019-01-23T19:42:56","mtime":"2019-01-23T19:42:57","node":"node-a","params":{"commands":"running"},"queue":{"$oid":"{{q1}}"},"status":0,"stderr":null,"stdout":null}`
	done := `{"_id":{"$oid":"5d0000000000000000000005"},"ctime":"2019-01-23T19:42:56","mtime":"2019-01-23T19:42:57","node":"node-a","params":{"commands":"done"},"queue":{"$oid":"{{q1}}"},"status":1,"stderr":null,"stdout":"out done\n"}`
	gfsIDs := `{"_id":{"$oid":"5d0000000000000000000007"},"ctime":"2019-01-23T19:42:58","mtime":"2019-01-23T19:42:58","node":"node-a","params":{"commands":"gfs"},"queue":{"$oid":"{{q1}}"},"status":1,"stderr":{"$oid":"{{gfserr}}"},"stdout":{"$oid":"{{gfsout}}"}}`
	gfsFull := `{"_id":{"$oid":"5d0000000000000000000007"},"ctime":"2019-01-23T19:42:58","mtime":"2019-01-23T19:42:58","node":"node-a","params":{"commands":"gfs"},"queue":{"$oid":"{{q1}}"},"status":1,"stderr":"gridfs stderr content\n","stdout":"gridfs stdout content\n"}`
	doneTerse := `{"_id":{"$oid":"5d0000000000000000000005"},"ctime":"2019-01-23T19:42:56","mtime":"2019-01-23T19:42:57","node":"node-a","params":{"commands":"done"},"queue":{"$oid":"{{q1}}"},"status":1,"stderr":null,"stdout":"[terse mode]"}`
	const refuse = `{"error":"refusing to return everything - include one or more indexed search restrictions",` + tasksIndexes + `,"path":"/tasks","title":"Disbatch Tasks Query"}`
	b.run([]exchange{
		{name: "count json body", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}",".count":1}`, status: 200, want: `{"count":7}`},
		{name: "count query string", method: "GET", path: "/tasks?queue={{q1}}&.count=1", status: 200, want: `{"count":7}`},
		{name: ".count 0 is off, .limit 1 an object", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}",".count":0,".limit":1}`, status: 200, want: orphan},
		{name: "status as a numeric string, repeated in the query", method: "GET", path: "/tasks?queue={{q1}}&status=1", status: 200, want: `[` + done + `,` + gfsIDs + `]`},
		{name: "terse", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":1,".terse":1}`, status: 200, want: `[` + doneTerse + `,` + gfsIDs + `]`},
		{name: "full", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":1,".full":1}`, status: 200, want: `[` + done + `,` + gfsFull + `]`},
		{name: "status array is $or", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":[-1,"0"]}`, status: 200, want: `[` + claimed + `,` + running + `]`},
		{name: "id", method: "GET", path: "/tasks", ctype: "json", body: `{"id":"5d0000000000000000000003"}`, status: 200, want: `[` + claimed + `]`},
		{name: "node and status", method: "GET", path: "/tasks?node=node-a&status=0", status: 200, want: `[` + running + `]`},
		{name: "node numeric-looking", method: "GET", path: "/tasks", ctype: "json", body: `{"node":"123",".count":1}`, status: 200, want: `{"count":0}`},
		{name: "epoch", method: "GET", path: "/tasks", ctype: "json", body: `{"id":"5d0000000000000000000001",".epoch":1,".fields":["ctime","mtime"]}`, status: 200,
			want: `[{"_id":{"$oid":"5d0000000000000000000001"},"ctime":1548272576,"mtime":1548272577.035}]`},
		{name: ".fields as names and commas, as 4.103's CLI sends --fields (4.103: 500)", method: "GET", path: "/tasks", ctype: "json",
			body: `{"id":"5d0000000000000000000001",".fields":"ctime, mtime",".epoch":1}`, status: 200,
			want: `[{"_id":{"$oid":"5d0000000000000000000001"},"ctime":1548272576,"mtime":1548272577.035}]`},
		{name: ".fields as one name", method: "GET", path: "/tasks", ctype: "json", body: `{".limit":1,".fields":"status"}`, status: 200,
			want: `{"_id":{"$oid":"5d0000000000000000000001"},"status":-6}`},
		{name: ".fields with an empty name", method: "GET", path: "/tasks", ctype: "json", body: `{".limit":1,".fields":"status,"}`, status: 400,
			want: `{"error":".fields must name fields"}`},
		{name: "epoch with millis", method: "GET", path: "/tasks", ctype: "json", body: `{"id":"5d0000000000000000000002",".epoch":1,".fields":{"ctime":1,"_id":0}}`, status: 200,
			want: `[{"ctime":1548272576.1}]`},
		{name: "nothing matched", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"5c0000000000000000000000"}`, status: 200, want: `{}`},
		{name: "nothing matched, limit 1", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"5c0000000000000000000000",".limit":1}`, status: 200, want: `{}`},
		{name: "non-indexed status", method: "GET", path: "/tasks", ctype: "json", body: `{"status":1}`, status: 400,
			want: `{"error":"non-indexed params given",` + tasksIndexes + `,"invalid_params":["status"],"path":"/tasks","title":"Disbatch Tasks Query"}`},
		{name: "non-indexed, several", method: "GET", path: "/tasks", ctype: "json", body: `{"status":1,"params.commands":"x","queue":"5c0000000000000000000000","foo":"bar"}`, status: 400,
			want: `{"error":"non-indexed params given",` + tasksIndexes + `,"invalid_params":["params.commands","foo"],"path":"/tasks","title":"Disbatch Tasks Query"}`},
		{name: "refuse empty json", method: "GET", path: "/tasks", ctype: "json", body: `{}`, status: 400, want: refuse},
		{name: "refuse no params", method: "GET", path: "/tasks", status: 400, want: refuse},
		{name: "refuse empty value", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":""}`, status: 400, want: refuse},
		{name: "no filter, a limit", method: "GET", path: "/tasks", ctype: "json", body: `{".limit":1,".fields":["status"]}`, status: 200, want: `{"_id":{"$oid":"5d0000000000000000000001"},"status":-6}`},
		{name: "no filter count", method: "GET", path: "/tasks", ctype: "json", body: `{".count":1}`, status: 200, want: `{"count":7}`},
		{name: "a charset: the query string is read", method: "GET", path: "/tasks?queue={{q1}}&.count=1", ctype: "application/json; charset=UTF-8", body: `{"queue":"{{q2}}"}`, status: 200, want: `{"count":7}`},
		{name: "skip and limit", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}",".skip":2,".limit":2,".fields":["status"]}`, status: 200,
			want: `[{"_id":{"$oid":"5d0000000000000000000003"},"status":-1},{"_id":{"$oid":"5d0000000000000000000004"},"status":0}]`},
		{name: "pretty count", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}",".count":1,".pretty":1}`, status: 200, want: "{\n   \"count\" : 7\n}\n"},
		{name: "bad ObjectId (4.103: 500)", method: "GET", path: "/tasks?queue=xyz", status: 400, want: `{"error":"queue \"xyz\" is not an ObjectId"}`},
		// Every key given counts for the indexes; "", null and false are
		// then left out of the query, and true is 1 (Perl's reading), as
		// the real 4.103 answered on these statuses.
		{name: "4.103's query form: empty fields sent", method: "GET", path: "/tasks?id=&node=&status=1&queue=&.count=1", status: 200, want: `{"count":2}`},
		{name: "an empty queue still indexes status", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"","status":1,".count":1}`, status: 200, want: `{"count":2}`},
		{name: "an empty status alone is not indexed", method: "GET", path: "/tasks", ctype: "json", body: `{"status":""}`, status: 400,
			want: `{"error":"non-indexed params given",` + tasksIndexes + `,"invalid_params":["status"],"path":"/tasks","title":"Disbatch Tasks Query"}`},
		{name: "null is left out", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","node":null,".count":1}`, status: 200, want: `{"count":7}`},
		{name: "false is left out", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":false,".count":1}`, status: 200, want: `{"count":7}`},
		{name: "true is 1", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":true,".count":1}`, status: 200, want: `{"count":2}`},
		{name: "true in an array is 1", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":[true],".count":1}`, status: 200, want: `{"count":2}`},
		{name: "id null, a limit", method: "GET", path: "/tasks", ctype: "json", body: `{"id":null,".limit":1,".fields":["status"]}`, status: 200,
			want: `{"_id":{"$oid":"5d0000000000000000000001"},"status":-6}`},
		{name: "an empty array (4.103: 500)", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":[]}`, status: 400, want: `{"error":"status must not be an empty array"}`},
		{name: "queue true (4.103: 500)", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":true}`, status: 400, want: `{"error":"queue true is not an ObjectId"}`},
		// An object value is query operators, handed to MongoDB as 4.103
		// hands it (its counts, checked against the real 4.103 on these
		// statuses); where 4.103 answers 500 we answer 400 saying why, or,
		// for operators on id and queue, the tasks.
		{name: "status $lte", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":{"$lte":-2},".count":1}`, status: 200, want: `{"count":2}`},
		{name: "status $in", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":{"$in":[-1,0]}}`, status: 200, want: `[` + claimed + `,` + running + `]`},
		{name: "two operators", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":{"$gte":0,"$lt":2},".count":1}`, status: 200, want: `{"count":3}`},
		{name: "node $ne null", method: "GET", path: "/tasks", ctype: "json", body: `{"node":{"$ne":null},".count":1}`, status: 200, want: `{"count":5}`},
		{name: "an operator's string stays a string", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":{"$lte":"0"},".count":1}`, status: 200, want: `{"count":0}`},
		{name: "operators in an $or array", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":[{"$lte":-2},1],".count":1}`, status: 200, want: `{"count":4}`},
		{name: "$not", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":{"$not":{"$gte":-2}},".count":1}`, status: 200, want: `{"count":1}`},
		{name: "a document to match, as 4.103", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":{},".count":1}`, status: 200, want: `{"count":0}`},
		{name: "queue $in ObjectIds (4.103: 500)", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":{"$in":["{{q1}}",{"$oid":"{{q2}}"}]},".count":1}`, status: 200, want: `{"count":7}`},
		{name: "id $gt (4.103: 500)", method: "GET", path: "/tasks", ctype: "json", body: `{"id":{"$gt":"5d0000000000000000000005"},".count":1}`, status: 200, want: `{"count":2}`},
		{name: "queue $in a bad ObjectId", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":{"$in":["xyz"]}}`, status: 400, want: `{"error":"queue \"xyz\" is not an ObjectId"}`},
		{name: "queue a document (4.103: 500)", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":{"a":1}}`, status: 400,
			want: `{"error":"queue must be an ObjectId, an array of them, or an object of query operators"}`},
		{name: "$where (4.103: 500)", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":{"$where":"sleep(1000)"}}`, status: 400,
			want: `{"error":"status: $where is not a query operator GET /tasks accepts (it accepts $all $eq $exists $gt $gte $in $lt $lte $mod $ne $nin $not $options $regex $size $type)"}`},
		{name: "$in not an array (4.103: 500)", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":{"$in":1}}`, status: 400, want: `{"error":"status: $in needs an array"}`},
		{name: "operators and fields mixed (4.103: 500)", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":{"z":1,"$lte":0,"b":1,"$gt":-5}}`, status: 400,
			want: `{"error":"status mixes query operators ($gt) with fields (b) in one object"}`},
		{name: "$not of a value", method: "GET", path: "/tasks", ctype: "json", body: `{"queue":"{{q1}}","status":{"$not":1}}`, status: 400, want: `{"error":"status: $not needs an object of query operators"}`},
		{name: "non-indexed with an operator", method: "GET", path: "/tasks", ctype: "json", body: `{"status":{"$gt":0}}`, status: 400,
			want: `{"error":"non-indexed params given",` + tasksIndexes + `,"invalid_params":["status"],"path":"/tasks","title":"Disbatch Tasks Query"}`},
		{name: "task by id", method: "GET", path: "/tasks/5d0000000000000000000007", status: 200,
			want: "{\n   \"_id\" : {\n      \"$oid\" : \"5d0000000000000000000007\"\n   },\n   \"ctime\" : \"2019-01-23T19:42:58\",\n   \"mtime\" : \"2019-01-23T19:42:58\",\n   \"node\" : \"node-a\",\n   \"params\" : {\n      \"commands\" : \"gfs\"\n   },\n   \"queue\" : {\n      \"$oid\" : \"{{q1}}\"\n   },\n   \"status\" : 1,\n   \"stderr\" : {\n      \"$oid\" : \"{{gfserr}}\"\n   },\n   \"stdout\" : {\n      \"$oid\" : \"{{gfsout}}\"\n   }\n}\n"},
		{name: "task missing", method: "GET", path: "/tasks/5c0000000000000000000000", status: 404, want: "{\n   \"error\" : \"no task with id 5c0000000000000000000000\"\n}\n"},
		{name: "task id upper case", method: "GET", path: "/tasks/5D0000000000000000000007", status: 404, want: "This is the void"},
		{name: "queue counts", method: "GET", path: "/queues/q1", status: 200,
			want: `{"completed":3,"id":"{{q1}}","name":"q1","plugin":"Disbatch::Plugin::Demo","queued":2,"running":2,"threads":null}`},
	})

	// The same answer from projected counters (queued = count_todo -
	// running, completed = count_total - count_todo) while they are
	// integers; any other value (here doubles another program wrote, 6.5
	// and 9, which would read as queued 4; or a negative count_todo, which
	// would read as queued 0) is not a count, and the queue is counted the
	// 4.103 way.
	counters := func(todo, total any) {
		_, err := b.db.Collection(schema.CollQueues).UpdateOne(context.Background(), bson.D{{Key: "name", Value: "q1"}},
			bson.D{{Key: "$set", Value: bson.D{{Key: schema.QueueCountTodo, Value: todo}, {Key: schema.QueueCountTotal, Value: total}}}})
		require.NoError(t, err)
	}
	counts := exchange{name: "queue counts from the counters", method: "GET", path: "/queues/q1", status: 200,
		want: `{"completed":3,"id":"{{q1}}","name":"q1","plugin":"Disbatch::Plugin::Demo","queued":2,"running":2,"threads":null}`}
	counters(int64(4), int32(7))
	b.run([]exchange{counts})
	counters(6.5, 9.0)
	counts.name = "queue counts beside counters that are not integers"
	b.run([]exchange{counts})
	counters(int64(-1), int32(7))
	counts.name = "queue counts beside a negative counter"
	b.run([]exchange{counts})
}

// TestGoldenLegacyRoutes: Disbatch::Web::Tasks as the real 4.103 answered
// it, found by replaying the recorded requests against both servers.
func TestGoldenLegacyRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	for _, name := range []string{"q1", "q2"} {
		status, _, body := b.do("POST", "/queues", "json", `{"name":"`+name+`","plugin":"Disbatch::Plugin::Demo"}`)
		require.Equal(t, 200, status, body)
		id, err := b.st.QueueResolve(context.Background(), name)
		require.NoError(t, err)
		b.vars[name] = id.Hex()
	}
	insertFixtures(t, b)
	gfsIDs := `{"_id":{"$oid":"5d0000000000000000000007"},"ctime":"2019-01-23T19:42:58","mtime":"2019-01-23T19:42:58","node":"node-a","params":{"commands":"gfs"},"queue":{"$oid":"{{q1}}"},"status":1,"stderr":{"$oid":"{{gfserr}}"},"stdout":{"$oid":"{{gfsout}}"}}`
	b.run([]exchange{
		{name: "info lists search under the :queue pattern", method: "GET", path: "/info", status: 200,
			want: `{"database":"golden","routes":{"DELETE":["(?^u:^/queues/(?<queue>.+)$)"],"GET":["/","/info","/nodes","(?^u:^/nodes/(?<node>.+))","/plugins","/queues","(?^u:^/queues/(?<queue>.+)$)","/tasks","(?^u:^/tasks/(?<id>[0-9a-f]{24})$)","/balance","/monitoring","(?^u:^/)"],"POST":["(?^u:^/nodes/(?<node>.+))","/queues","(?^u:^/queues/(?<queue>.+)$)","/tasks","/balance","(?^u:^/tasks/(?<queue>[^/]+)$)","(?^u:^/tasks/(?<queue>.+?)/(?<collection>.+)$)"]},"web_extensions":["Disbatch::Web::Tasks"]}`},
		{name: "terse wins over full", method: "GET", path: "/tasks", ctype: "json", body: `{"id":"5d0000000000000000000007",".terse":1,".full":1}`, status: 200, want: `[` + gfsIDs + `]`},
		{name: "search with sort, skip and limit", method: "POST", path: "/tasks/search", ctype: "json",
			body: `{"filter":{"queue":{"$oid":"{{q1}}"},"status":{"$gte":1}},"options":{"limit":2,"skip":1,"sort":{"_id":-1}}}`, status: 200,
			want: `[{"_id":{"$oid":"5d0000000000000000000006"},"ctime":1548272576.999,"mtime":1548272577.035,"node":"node-a","params":{"commands":"failed"},"queue":{"$oid":"{{q1}}"},"status":2,"stderr":"[terse mode]","stdout":"[terse mode]"},{"_id":{"$oid":"5d0000000000000000000005"},"ctime":1548272576.574,"mtime":1548272577.035,"node":"node-a","params":{"commands":"done"},"queue":{"$oid":"{{q1}}"},"status":1,"stderr":null,"stdout":"[terse mode]"}]`},
		{name: "search bad queue id (4.103 adds a Perl file and line)", method: "POST", path: "/tasks/search", ctype: "json", body: `{"filter":{"queue":"xyz"}}`, status: 400,
			want: `{"error":"Bad OID passed: Invalid 'oid' field: OIDs must be 12 bytes"}`},
		{name: "search bad operator", method: "POST", path: "/tasks/search", ctype: "json", body: `{"filter":{"$bad":1}}`, status: 400,
			want: `{"error":"MongoDB::DatabaseError: unknown top level operator: $bad. If you have a field name that starts with a '$' symbol, consider using $getField or $setField."}`},
	})
	status, _, body := b.do("POST", "/tasks/q2", "json", `{"params":{"commands":"v4"}}`)
	require.Equal(t, 200, status, body)
	require.Regexp(t, `^\{"MongoDB::InsertManyResult":\{"acknowledged":1,"inserted":\[\{"_id":\{"\$oid":"[0-9a-f]{24}"\},"index":0\}\],"write_concern_errors":\[\],"write_errors":\[\]\}\}$`, body,
		"POST /tasks/:queue takes POST /tasks's body, an object included")
	status, _, body = b.do("GET", "/tasks", "json", `{"queue":"{{q2}}",".fields":{"params":1,"_id":0}}`)
	require.Equal(t, 200, status)
	require.Equal(t, `[{"params":{"commands":"v4"}}]`, body)
}

func TestWebRootIndexIsServedNotRedirected(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "index.html"), []byte("<p>4.103 page</p>"), 0o600))
	st := store.New(mongotest.Database(t), store.Options{})
	srv := httptest.NewServer(dci.New(dci.Options{Store: st, WebRoot: root}))
	t.Cleanup(srv.Close)
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, path := range []string{"/", "/index.html"} {
		resp, err := c.Get(srv.URL + path)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, path)
		require.Equal(t, "<p>4.103 page</p>", string(b), path)
	}
}

// TestASubmitJoinsTheCallersTrace: 4.103's POST /tasks stores the
// request's W3C trace context on the tasks it makes, as the v1 API and the
// CLI do, so that their traces on the node join the caller's; a malformed
// traceparent is not kept.
func TestASubmitJoinsTheCallersTrace(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	status, _, body := b.do("POST", "/queues", "json", `{"name":"q1","plugin":"Disbatch::Plugin::Demo"}`)
	require.Equal(t, 200, status, body)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const ts = "vendor=value"
	submit := func(traceparent string) {
		status, _, body := b.do("POST", "/tasks", "json", `{"queue":"q1","params":[{"a":1},{"a":2}]}`, "traceparent", traceparent, "tracestate", ts)
		require.Equal(t, 200, status, body)
	}
	submit(tp)
	submit("garbage")
	cur, err := b.db.Collection(schema.CollTasks).Find(context.Background(), bson.D{}, nil)
	require.NoError(t, err)
	var tasks []bson.Raw
	require.NoError(t, cur.All(context.Background(), &tasks))
	require.Len(t, tasks, 4)
	var joined, own int
	for _, raw := range tasks {
		switch v := raw.Lookup(schema.TaskTraceParent); v.Type {
		case bson.TypeString:
			require.Equal(t, tp, v.StringValue())
			require.Equal(t, ts, raw.Lookup(schema.TaskTraceState).StringValue())
			joined++
		case 0:
			require.Equal(t, bson.Type(0), raw.Lookup(schema.TaskTraceState).Type, "a trace state without its parent")
			own++
		default:
			t.Fatalf("trace parent of type %v", v.Type)
		}
	}
	require.Equal(t, [2]int{2, 2}, [2]int{joined, own}, "tasks that joined the caller's trace, and those that did not")
}
