package apiv1

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// newQueue creates a queue through the API and returns its id.
func (e *env) newQueue(name string) bson.ObjectID {
	e.t.Helper()
	var q Queue
	e.want(201, "POST", "/api/v1/queues", map[string]any{"name": name, "plugin": "P"}).decode(e.t, &q)
	id, err := bson.ObjectIDFromHex(q.ID)
	require.NoError(e.t, err)
	return id
}

type submitted struct {
	Queue string   `json:"queue"`
	IDs   []string `json:"ids"`
}

func (e *env) submit(queue string, params ...string) []string {
	e.t.Helper()
	tasks := make([]string, len(params))
	for i, p := range params {
		tasks[i] = `{"params":` + p + `}`
	}
	var s submitted
	e.want(201, "POST", "/api/v1/tasks", `{"queue":`+mustJSON(queue)+`,"tasks":[`+strings.Join(tasks, ",")+`]}`).decode(e.t, &s)
	require.Len(e.t, s.IDs, len(params))
	return s.IDs
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func oid(t *testing.T, hex string) bson.ObjectID {
	t.Helper()
	id, err := bson.ObjectIDFromHex(hex)
	require.NoError(t, err)
	return id
}

func TestTaskSubmitStoresParamsExactly(t *testing.T) {
	e := setup(t)
	ctx := ctxT(t)
	qid := e.newQueue("q")
	params := `{"z":1,"a":"ünïcødé 🚀 עברית","n":{"int":5,"big":1099511627776,"beyond":123456789012345678901234,"f":1.5,"e":1e3,"neg":-0},` +
		`"list":[true,false,null,[],{}],"empty":"","esc":"\u0000\n\"\\\/\ud83d\ude80"}`
	ids := e.submit("q", params, `{}`)

	raw, err := e.db.Collection(schema.CollTasks).FindOne(ctx, bson.D{{Key: "_id", Value: oid(t, ids[0])}}).Raw()
	require.NoError(t, err)
	p := raw.Lookup("parameters").Document()
	elems, err := p.Elements()
	require.NoError(t, err)
	var order []string
	for _, el := range elems {
		order = append(order, el.Key())
	}
	require.Equal(t, []string{"z", "a", "n", "list", "empty", "esc"}, order, "key order kept")
	n := p.Lookup("n").Document()
	require.Equal(t, bson.TypeInt32, n.Lookup("int").Type)
	require.Equal(t, bson.TypeInt64, n.Lookup("big").Type)
	require.Equal(t, bson.TypeDouble, n.Lookup("beyond").Type, "beyond 64 bits: a double")
	require.Equal(t, bson.TypeDouble, n.Lookup("f").Type)
	require.Equal(t, bson.TypeDouble, n.Lookup("e").Type)
	require.Equal(t, "\x00\n\"\\/🚀", p.Lookup("esc").StringValue())
	// Seed 000's shape.
	require.EqualValues(t, -2, raw.Lookup("status").AsInt64())
	require.EqualValues(t, -1, raw.Lookup("node").AsInt64())
	require.Equal(t, qid, raw.Lookup("queue").ObjectID())

	var task Task
	e.want(200, "GET", "/api/v1/tasks/"+ids[0], nil).decode(t, &task)
	require.Equal(t, ids[0], task.ID)
	require.Equal(t, qid.Hex(), task.Queue)
	require.Equal(t, -2, task.Status)
	require.Equal(t, "queued", *task.StatusName)
	require.Nil(t, task.Node)
	require.Nil(t, task.Stdout)
	require.NotNil(t, task.CTime)
	ctime, err := time.Parse(time.RFC3339, *task.CTime)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), ctime, time.Minute)
	want := `{"z":1,"a":"ünïcødé 🚀 עברית","n":{"int":5,"big":1099511627776,"beyond":1.2345678901234568e+23,"f":1.5,"e":1000.0,"neg":0},` +
		`"list":[true,false,null,[],{}],"empty":"","esc":"\u0000\n\"\\/🚀"}`
	require.JSONEq(t, want, string(task.Params))

	e.want(200, "GET", "/api/v1/tasks/"+ids[1], nil).decode(t, &task)
	require.JSONEq(t, `{}`, string(task.Params))

	// By id too; the answer names the queue by id.
	var s submitted
	e.want(201, "POST", "/api/v1/tasks", map[string]any{"queue": qid.Hex(), "tasks": []any{map[string]any{"params": map[string]any{"x": 1}}}}).decode(t, &s)
	require.Equal(t, qid.Hex(), s.Queue)
	e.wantErr(404, CodeNotFound, "queue", "POST", "/api/v1/tasks", map[string]any{"queue": "nope", "tasks": []any{map[string]any{"params": map[string]any{}}}})
	e.wantErr(404, CodeNotFound, "id", "GET", "/api/v1/tasks/"+bson.NewObjectID().Hex(), nil)
}

// TestTaskSubmitNumbersAtTheLargestDouble: the document bounds numbers in
// parameters by ±1.7976931348623157e308 as JSON Schema reads it, exactly;
// ParseFloat rounds a band of larger numbers down to the largest double,
// which the server took for in range (found by make fuzz-api). The
// refusals are in hostileCases.
func TestTaskSubmitNumbersAtTheLargestDouble(t *testing.T) {
	e := setup(t)
	e.newQueue("q")
	largest := "17976931348623157" + strings.Repeat("0", 292)
	ids := e.submit("q", `{"a":1.7976931348623157e308,"b":-`+largest+`,"c":0.17976931348623157E+309,"d":1797693134862315.7e293}`)
	var task Task
	e.want(200, "GET", "/api/v1/tasks/"+ids[0], nil).decode(t, &task)
	var got map[string]float64
	require.NoError(t, json.Unmarshal(task.Params, &got))
	require.Equal(t, map[string]float64{"a": math.MaxFloat64, "b": -math.MaxFloat64, "c": math.MaxFloat64, "d": math.MaxFloat64}, got)

	for lit, beyond := range map[string]bool{
		"1.7976931348623157e308": false, "-1.7976931348623157e308": false, largest: false, "-" + largest: false,
		"1.79769313486231570e308": false, "0.0017976931348623157e311": false, "179769313486231570e+291": false,
		"1.79769313486231571e308": true, "-1.7976931348623158e308": true, largest + "1": true, largest[:len(largest)-1] + "1": true,
		"1.7976931348623157000000000000000001e308": true, "17976931348623157e293": true, "1.8e308": true,
		"1.797693134862315e308": false, "1.79769313486231569999e308": false,
	} {
		require.Equal(t, beyond, beyondMaxDouble(lit), lit)
	}
}

func TestTaskSubmitDialect4103(t *testing.T) {
	e := setup(t, func(o *Options, _ *store.Options) { o.Dialect4103 = true })
	e.newQueue("q")
	ids := e.submit("q", `{"user":"alice"}`)
	raw, err := e.db.Collection(schema.CollTasks).FindOne(ctxT(t), bson.D{{Key: "_id", Value: oid(t, ids[0])}}).Raw()
	require.NoError(t, err)
	require.Equal(t, "alice", raw.Lookup("params", "user").StringValue())
	require.Equal(t, bson.TypeNull, raw.Lookup("node").Type)
	var list struct {
		Tasks []Task `json:"tasks"`
	}
	e.want(200, "GET", "/api/v1/tasks?param[user]=alice", nil).decode(t, &list)
	require.Len(t, list.Tasks, 1)
	require.JSONEq(t, `{"user":"alice"}`, string(list.Tasks[0].Params))
}

func TestTaskSubmitTenThousand(t *testing.T) {
	e := setup(t)
	e.newQueue("bulk")
	var b strings.Builder
	b.WriteString(`{"queue":"bulk","tasks":[`)
	for i := range MaxSubmit {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"params":{"i":%d,"user":"user-%d","pad":"%s"}}`, i, i%7, strings.Repeat("x", 200))
	}
	b.WriteString(`]}`)
	var s submitted
	e.want(201, "POST", "/api/v1/tasks", b.String()).decode(t, &s)
	require.Len(t, s.IDs, MaxSubmit)
	n, err := e.st.TaskCount(ctxT(t), nil, 0, 0)
	require.NoError(t, err)
	require.EqualValues(t, MaxSubmit, n)
	// In the order given: fifo by _id is submission order.
	var last Task
	e.want(200, "GET", "/api/v1/tasks/"+s.IDs[MaxSubmit-1], nil).decode(t, &last)
	require.JSONEq(t, fmt.Sprintf(`{"i":%d,"user":"user-%d","pad":"%s"}`, MaxSubmit-1, (MaxSubmit-1)%7, strings.Repeat("x", 200)), string(last.Params))
	var page struct {
		Tasks []Task  `json:"tasks"`
		Next  *string `json:"next"`
	}
	e.want(200, "GET", "/api/v1/tasks?limit=3", nil).decode(t, &page)
	require.Equal(t, s.IDs[:3], []string{page.Tasks[0].ID, page.Tasks[1].ID, page.Tasks[2].ID})

	// One more is too many, and writes nothing.
	over := strings.Replace(b.String(), `]}`, `,{"params":{}}]}`, 1)
	e.wantErr(400, CodeInvalidField, "tasks", "POST", "/api/v1/tasks", over)
	n, err = e.st.TaskCount(ctxT(t), nil, 0, 0)
	require.NoError(t, err)
	require.EqualValues(t, MaxSubmit, n)
}

type taskPage struct {
	Tasks   []Task  `json:"tasks"`
	Next    *string `json:"next"`
	Skipped int     `json:"skipped"`
}

func (e *env) list(query string) taskPage {
	e.t.Helper()
	var p taskPage
	e.want(200, "GET", "/api/v1/tasks"+query, nil).decode(e.t, &p)
	return p
}

func taskIDs(p taskPage) []string {
	out := []string{}
	for _, t := range p.Tasks {
		out = append(out, t.ID)
	}
	return out
}

func TestTaskListFilters(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 5, 1, 8, 0, 0, 0, time.UTC)
	e := setup(t, func(_ *Options, so *store.Options) {
		so.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	})
	later := func() { mu.Lock(); defer mu.Unlock(); now = now.Add(time.Hour) }
	ctx := ctxT(t)
	q1 := e.newQueue("q1")
	e.newQueue("q2")
	a := e.submit("q1", `{"user":"alice","n":5,"deep":{"k":true}}`, `{"user":"bob","n":5.0}`)
	later()
	b := e.submit("q1", `{"user":"alice","n":"5","tag":"ü"}`)
	later()
	c := e.submit("q2", `{"user":"carol","n":6}`)
	// Claim and finish the first task of q1 on n1.
	task, err := e.st.TaskClaim(ctx, store.TaskClaimParams{Queue: q1, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.Equal(t, a[0], task.ID.Hex())
	require.NoError(t, e.st.TaskStart(ctx, store.TaskTransitionParams{ID: task.ID, Node: "n1"}))
	require.NoError(t, e.st.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: schema.StatusSucceeded, Stdout: "hello", Stderr: ""}))
	// Cancel q2's task: it carries a reason.
	cid, err := bson.ObjectIDFromHex(c[0])
	require.NoError(t, err)
	_, err = e.st.TaskCancel(ctx, store.TaskCancelParams{Target: store.TaskTarget{IDs: []bson.ObjectID{cid}}, By: "test"})
	require.NoError(t, err)

	all := e.list("")
	require.Equal(t, []string{a[0], a[1], b[0], c[0]}, taskIDs(all))
	require.Nil(t, all.Next)
	require.Equal(t, 0, all.Skipped)
	done := all.Tasks[0]
	require.Equal(t, 1, done.Status)
	require.Equal(t, "succeeded", *done.StatusName)
	require.Equal(t, "n1", *done.Node)
	require.Equal(t, &Output{Inline: true, Bytes: ptr[int64](5)}, done.Stdout)
	require.Equal(t, &Output{Inline: true, Bytes: ptr[int64](0)}, done.Stderr)
	require.Equal(t, "2026-05-01T08:00:00.000Z", *done.CTime)

	for query, want := range map[string][]string{
		"?queue=q1":                                {a[0], a[1], b[0]},
		"?queue=" + q1.Hex():                       {a[0], a[1], b[0]},
		"?queue=" + bson.NewObjectID().Hex():       {},
		"?status=queued":                           {a[1], b[0]},
		"?status=succeeded&status=2":               {a[0], c[0]},
		"?status=1&status=2&queue=q2":              {c[0]},
		"?reason=cancelled":                        {c[0]},
		"?reason=killed":                           {},
		"?node=n1":                                 {a[0]},
		"?node=n2":                                 {},
		"?created_after=2026-05-01T08:00:00Z":      {b[0], c[0]},
		"?created_before=2026-05-01T09:00:00.000Z": {a[0], a[1]},
		"?created_after=2026-05-01t08:30:00%2B00:00&created_before=2026-05-01T10:00:00Z": {b[0]},
		"?param[user]=alice":                   {a[0], b[0]},
		"?param[n]=5":                          {a[0], a[1], b[0]},
		"?param[n]=5.0":                        {a[0], a[1]},
		"?param[deep.k]=true":                  {a[0]},
		"?param[user]=alice&param[tag]=%C3%BC": {b[0]},
		"?param%5Buser%5D=bob":                 {a[1]},
		"?param[user]=nobody":                  {},
		"?param[user]=bob&param[user]=carol":   {a[1], c[0]},
		"?order=desc":                          {c[0], b[0], a[1], a[0]},
		"?order=asc&queue=q2":                  {c[0]},
	} {
		require.Equal(t, want, taskIDs(e.list(query)), query)
	}
	e.wantErr(404, CodeNotFound, "queue", "GET", "/api/v1/tasks?queue=nope", nil)
	e.wantErr(400, CodeInvalidParameter, "reason", "GET", "/api/v1/tasks?reason=bored", nil)

	// Pages, both ways.
	p1 := e.list("?limit=3")
	require.Equal(t, []string{a[0], a[1], b[0]}, taskIDs(p1))
	require.Equal(t, b[0], *p1.Next)
	p2 := e.list("?limit=3&cursor=" + *p1.Next)
	require.Equal(t, []string{c[0]}, taskIDs(p2))
	require.Nil(t, p2.Next)
	d1 := e.list("?limit=2&order=desc")
	require.Equal(t, []string{c[0], b[0]}, taskIDs(d1))
	d2 := e.list("?limit=2&order=desc&cursor=" + *d1.Next)
	require.Equal(t, []string{a[1], a[0]}, taskIDs(d2))
	require.Nil(t, d2.Next, "exactly two were left: no empty last page")
}

// TestTaskListPagesUnderInserts walks every page while other clients
// insert: every task that existed before the walk is seen exactly once,
// and nothing twice.
func TestTaskListPagesUnderInserts(t *testing.T) {
	e := setup(t)
	e.newQueue("q")
	var before []string
	for range 10 {
		params := make([]string, 100)
		for i := range params {
			params[i] = `{"i":` + fmt.Sprint(i) + `}`
		}
		before = append(before, e.submit("q", params...)...)
	}
	for _, order := range []string{"asc", "desc"} {
		stop := make(chan struct{})
		var inserted atomic.Int64
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					r := e.do("POST", "/api/v1/tasks", `{"queue":"q","tasks":[{"params":{"late":true}},{"params":{"late":true}}]}`)
					if r.status != 201 {
						t.Errorf("insert: %d %s", r.status, r.body)
						return
					}
					inserted.Add(2)
				}
			}()
		}
		seen := map[string]int{}
		cursor := ""
		pages := 0
		for {
			q := "?limit=37&order=" + order
			if cursor != "" {
				q += "&cursor=" + cursor
			}
			p := e.list(q)
			pages++
			for _, task := range p.Tasks {
				seen[task.ID]++
			}
			if p.Next == nil {
				break
			}
			cursor = *p.Next
			if order == "asc" && pages > 200 {
				break // the writers may outpace an ascending walk
			}
		}
		close(stop)
		wg.Wait()
		for id, n := range seen {
			require.Equal(t, 1, n, "task %s seen %d times", id, n)
		}
		for _, id := range before {
			require.Contains(t, seen, id, "%s walk lost a task", order)
		}
		require.Positive(t, inserted.Load())
		t.Logf("%s: %d pages, %d tasks seen, %d inserted meanwhile", order, pages, len(seen), inserted.Load())
	}
}

func TestTaskOutput(t *testing.T) {
	e := setup(t, func(_ *Options, so *store.Options) { so.OutputThreshold = 4 << 10 })
	ctx := ctxT(t)
	qid := e.newQueue("q")
	ids := e.submit("q", `{}`, `{}`, `{}`)
	finish := func(stdout, stderr string) bson.ObjectID {
		task, err := e.st.TaskClaim(ctx, store.TaskClaimParams{Queue: qid, Node: "n1", Sort: schema.SortFIFO})
		require.NoError(t, err)
		require.NoError(t, e.st.TaskStart(ctx, store.TaskTransitionParams{ID: task.ID, Node: "n1"}))
		require.NoError(t, e.st.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: schema.StatusFailed, Stdout: stdout, Stderr: stderr}))
		return task.ID
	}
	big := strings.Repeat("λx€\n", 150<<10) // 1.2 MiB: five GridFS chunks, runes across their edges
	small := finish("small out", "small err")
	gfs := finish(big, "err")
	srv := e.server()
	get := func(path string) (*http.Response, string) {
		res, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res, string(b)
	}

	res, body := get("/api/v1/tasks/" + small.Hex() + "/stdout")
	require.Equal(t, 200, res.StatusCode)
	require.Equal(t, "text/plain; charset=utf-8", res.Header.Get("Content-Type"))
	require.Equal(t, "small out", body)
	_, body = get("/api/v1/tasks/" + small.Hex() + "/stderr")
	require.Equal(t, "small err", body)

	res, body = get("/api/v1/tasks/" + gfs.Hex() + "/stdout")
	require.Equal(t, 200, res.StatusCode)
	require.EqualValues(t, len(big), res.ContentLength)
	require.Equal(t, big, body)
	var task Task
	e.want(200, "GET", "/api/v1/tasks/"+gfs.Hex(), nil).decode(t, &task)
	require.Equal(t, &Output{Inline: false, Bytes: ptr(int64(len(big)))}, task.Stdout)
	require.Equal(t, &Output{Inline: true, Bytes: ptr[int64](3)}, task.Stderr)

	// Not finished: no output yet, an empty text.
	res, body = get("/api/v1/tasks/" + ids[2] + "/stdout")
	require.Equal(t, 200, res.StatusCode)
	require.Empty(t, body)

	// A chunk gone mid-file: the stream stops short of Content-Length,
	// which the client sees.
	raw, err := e.db.Collection(schema.CollTasks).FindOne(ctx, bson.D{{Key: "_id", Value: gfs}}).Raw()
	require.NoError(t, err)
	file := raw.Lookup("stdout").ObjectID()
	_, err = e.db.Collection(schema.CollTasksChunks).DeleteOne(ctx, bson.D{{Key: "files_id", Value: file}, {Key: "n", Value: 2}})
	require.NoError(t, err)
	res, err = http.Get(srv.URL + "/api/v1/tasks/" + gfs.Hex() + "/stdout")
	require.NoError(t, err)
	_, err = io.ReadAll(res.Body)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.NoError(t, res.Body.Close())

	// The file gone altogether.
	_, err = e.db.Collection(schema.CollTasksFiles).DeleteOne(ctx, bson.D{{Key: "_id", Value: file}})
	require.NoError(t, err)
	e.wantErr(404, CodeNotFound, "stdout", "GET", "/api/v1/tasks/"+gfs.Hex()+"/stdout", nil)
	e.want(200, "GET", "/api/v1/tasks/"+gfs.Hex(), nil).decode(t, &task)
	require.Equal(t, &Output{Inline: false}, task.Stdout, "bytes null: the file is missing")

	e.wantErr(404, CodeNotFound, "id", "GET", "/api/v1/tasks/"+bson.NewObjectID().Hex()+"/stderr", nil)
	e.wantErr(400, CodeInvalidParameter, "id", "GET", "/api/v1/tasks/nope/stdout", nil)
}

func TestTaskMalformedDocuments(t *testing.T) {
	e := setup(t)
	ctx := ctxT(t)
	qid := e.newQueue("q")
	good := e.submit("q", `{}`)
	bad := bson.NewObjectID()
	_, err := e.db.Collection(schema.CollTasks).InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: bad}, {Key: "queue", Value: qid}, {Key: "status", Value: "done"}},
		bson.D{{Key: "_id", Value: "by hand"}, {Key: "queue", Value: qid}, {Key: "status", Value: -2}},
	})
	require.NoError(t, err)
	p := e.list("?queue=q")
	require.Equal(t, good, taskIDs(p))
	require.Equal(t, 1, p.Skipped)
	d := e.wantErr(500, CodeMalformedDocument, "", "GET", "/api/v1/tasks/"+bad.Hex(), nil)
	require.Contains(t, d.Message, `field "status"`)
	// The cursor moves past a malformed task at the end of a page.
	p = e.list("?queue=q&limit=1&order=desc")
	require.Empty(t, p.Tasks)
	require.Equal(t, 1, p.Skipped)
	p = e.list("?queue=q&limit=1&order=desc&cursor=" + *p.Next)
	require.Equal(t, good, taskIDs(p))

	// Strings that are not UTF-8 (other writers) are answered as U+FFFD.
	latin := bson.NewObjectID()
	_, err = e.db.Collection(schema.CollTasks).InsertOne(ctx, bson.D{{Key: "_id", Value: latin}, {Key: "queue", Value: qid}, {Key: "status", Value: -2},
		{Key: "parameters", Value: bson.D{{Key: "s", Value: "caf\xe9"}}}})
	require.NoError(t, err)
	r := e.want(200, "GET", "/api/v1/tasks/"+latin.Hex(), nil)
	var task Task
	r.decode(t, &task)
	require.JSONEq(t, `{"s":"caf\ufffd"}`, string(task.Params))

	// A negative priority another writer stored is shown as none, as
	// the document's minimum of 1 says.
	negative := bson.NewObjectID()
	_, err = e.db.Collection(schema.CollTasks).InsertOne(ctx, bson.D{{Key: "_id", Value: negative}, {Key: "queue", Value: qid}, {Key: "status", Value: -2},
		{Key: "parameters", Value: bson.D{}}, {Key: "priority", Value: -3}})
	require.NoError(t, err)
	task = Task{}
	e.want(200, "GET", "/api/v1/tasks/"+negative.Hex(), nil).decode(t, &task)
	require.Nil(t, task.Priority)
}

// TestALargeOutputOutlastsTheWriteTimeout: a task's output from GridFS,
// read by a client slower than the server's write timeout allows for the
// whole body, still arrives whole: each write has a deadline of its own.
func TestALargeOutputOutlastsTheWriteTimeout(t *testing.T) {
	e := setup(t, func(_ *Options, so *store.Options) { so.OutputThreshold = 4 << 10 })
	ctx := ctxT(t)
	qid := e.newQueue("q")
	e.submit("q", `{}`)
	task, err := e.st.TaskClaim(ctx, store.TaskClaimParams{Queue: qid, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.NoError(t, e.st.TaskStart(ctx, store.TaskTransitionParams{ID: task.ID, Node: "n1"}))
	big := strings.Repeat("0123456789abcdef", 3<<19) // 24 MiB, more than the sockets' buffers hold
	require.NoError(t, e.st.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: schema.StatusSucceeded, Stdout: big}))
	srv := httptest.NewUnstartedServer(e.h)
	srv.Config.WriteTimeout = 300 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)

	res, err := http.Get(srv.URL + "/api/v1/tasks/" + task.ID.Hex() + "/stdout")
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, 200, res.StatusCode)
	var got bytes.Buffer
	start, buf, pause := time.Now(), make([]byte, 128<<10), 1<<20
	for {
		n, err := res.Body.Read(buf)
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "cut off after %d bytes in %s", got.Len(), time.Since(start).Round(time.Millisecond))
		if got.Len() >= pause { // 50 ms each MiB: about 1.2 s in all
			time.Sleep(50 * time.Millisecond)
			pause += 1 << 20
		}
	}
	require.Greater(t, time.Since(start), time.Second, "read faster than the write timeout: the test proves nothing")
	require.Equal(t, len(big), got.Len())
	require.Equal(t, big, got.String())
}

// TestASubmitJoinsTheCallersTrace: a submit's W3C traceparent (a task or a
// graph) is stored on its tasks, so that their traces on the node join
// the caller's, as the CLI's do (a web or dashboard submit started a
// trace of its own on the node).
func TestASubmitJoinsTheCallersTrace(t *testing.T) {
	e := setup(t)
	e.newQueue("q")
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	var s submitted
	e.want(201, "POST", "/api/v1/tasks", `{"queue":"q","tasks":[{"params":{}}]}`, "traceparent", tp).decode(t, &s)
	var g graphSubmitted
	e.want(201, "POST", "/api/v1/tasks", `{"queue":"q","tasks":[{"ref":"a","params":{}},{"params":{},"parents":["a"]}]}`, "traceparent", tp).decode(t, &g)
	require.Len(t, g.IDs, 2)
	for _, id := range []string{s.IDs[0], g.IDs[0]} {
		raw, err := e.db.Collection(schema.CollTasks).FindOne(ctxT(t), bson.D{{Key: "_id", Value: oid(t, id)}}).Raw()
		require.NoError(t, err)
		require.Equal(t, tp, raw.Lookup(schema.TaskTraceParent).StringValue(), id)
	}
	e.want(201, "POST", "/api/v1/tasks", `{"queue":"q","tasks":[{"params":{}}]}`, "traceparent", "garbage").decode(t, &s)
	raw, err := e.db.Collection(schema.CollTasks).FindOne(ctxT(t), bson.D{{Key: "_id", Value: oid(t, s.IDs[0])}}).Raw()
	require.NoError(t, err)
	require.Equal(t, bson.Type(0), raw.Lookup(schema.TaskTraceParent).Type, "a malformed one is not kept")
}
