package apiv1

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/store"
)

type hostile struct {
	name           string
	method, target string
	body           any
	hdr            []string
	status         int
	code, field    string
}

func deep(open, close string, n int, inner string) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

// nestedParams is a parameters object n levels deep: {"a":{"a":…{}}}.
func nestedParams(n int) string { return deep(`{"a":`, `}`, n-1, `{}`) }

func hostileCases() []hostile {
	const q = "/api/v1/queues"
	const tasks = "/api/v1/tasks"
	task := func(params string) string { return `{"queue":"target","tasks":[{"params":` + params + `}]}` }
	bad := func(name, method, target string, body any, status int, code, field string, hdr ...string) hostile {
		return hostile{name: name, method: method, target: target, body: body, hdr: hdr, status: status, code: code, field: field}
	}
	return []hostile{
		// Content types.
		bad("text/plain", "POST", q, `{"name":"x","plugin":"P"}`, 415, CodeUnsupportedMediaType, "", "Content-Type", "text/plain"),
		bad("no content type", "POST", q, `{"name":"x","plugin":"P"}`, 415, CodeUnsupportedMediaType, "", "Content-Type", ""),
		bad("latin1", "POST", tasks, task(`{}`), 415, CodeUnsupportedMediaType, "", "Content-Type", "application/json; charset=latin1"),
		bad("json with params", "PATCH", q+"/target", `{"sort":"fifo"}`, 415, CodeUnsupportedMediaType, "", "Content-Type", "application/json; boundary=x"),
		bad("form", "PATCH", "/api/v1/nodes/n1", `maxthreads=1`, 415, CodeUnsupportedMediaType, "", "Content-Type", "application/x-www-form-urlencoded"),
		bad("garbage content type", "POST", q, `{}`, 415, CodeUnsupportedMediaType, "", "Content-Type", ";;;"),
		// Not JSON, not one value, not UTF-8.
		bad("empty body", "POST", q, ``, 400, CodeInvalidJSON, ""),
		bad("truncated", "POST", q, `{"name":"x"`, 400, CodeInvalidJSON, ""),
		bad("trailing data", "POST", q, `{"name":"x","plugin":"P"} {}`, 400, CodeInvalidJSON, ""),
		bad("two values", "POST", tasks, task(`{}`)+"\n"+task(`{}`), 400, CodeInvalidJSON, ""),
		bad("single quotes", "POST", q, `{'name':'x'}`, 400, CodeInvalidJSON, ""),
		bad("trailing comma", "POST", q, `{"name":"x","plugin":"P",}`, 400, CodeInvalidJSON, ""),
		bad("NaN", "POST", tasks, task(`{"n":NaN}`), 400, CodeInvalidJSON, "tasks[0].params.n"),
		bad("leading zero", "POST", tasks, task(`{"n":01}`), 400, CodeInvalidJSON, "tasks[0].params.n"),
		bad("raw control character", "POST", q, "{\"name\":\"a\tb\",\"plugin\":\"P\"}", 400, CodeInvalidJSON, "name"),
		bad("invalid UTF-8", "POST", q, []byte("{\"name\":\"\xff\xfe\",\"plugin\":\"P\"}"), 400, CodeInvalidJSON, "name"),
		bad("byte order mark", "POST", q, "\ufeff{\"name\":\"x\",\"plugin\":\"P\"}", 400, CodeInvalidJSON, ""),
		bad("duplicate key", "POST", q, `{"name":"x","plugin":"P","name":"y"}`, 400, CodeInvalidJSON, "name"),
		bad("duplicate param key", "POST", tasks, task(`{"a":1,"b":2,"a":3}`), 400, CodeInvalidJSON, "tasks[0].params.a"),
		bad("bad escape", "POST", q, `{"name":"\q","plugin":"P"}`, 400, CodeInvalidJSON, "name"),
		// Not an object.
		bad("array body", "POST", q, `[{"name":"x","plugin":"P"}]`, 400, CodeInvalidField, ""),
		bad("null body", "POST", tasks, `null`, 400, CodeInvalidField, ""),
		bad("string body", "PATCH", "/api/v1/nodes/n1", `"maxthreads"`, 400, CodeInvalidField, ""),
		// Deep JSON.
		bad("10,000-deep params", "POST", tasks, task(nestedParams(10000)), 400, CodeTooDeep, "tasks[0].params"),
		bad("10,000-deep arrays in params", "POST", tasks, task(`{"x":`+deep("[", "]", 10000, "")+`}`), 400, CodeTooDeep, "tasks[0].params"),
		bad("65-deep params", "POST", tasks, task(nestedParams(65)), 400, CodeTooDeep, "tasks[0].params"),
		bad("10,000-deep name", "POST", q, `{"name":`+deep("[", "]", 10000, "")+`}`, 400, CodeTooDeep, "name"),
		bad("10,000-deep body", "POST", q, deep("[", "]", 10000, ""), 400, CodeTooDeep, ""),
		bad("10,000-deep unknown field", "PATCH", "/api/v1/nodes/n1", `{"x":`+deep(`{"x":`, "}", 10000, "1")+`}`, 400, CodeTooDeep, "x"),
		// Wrong types and values: queues.
		bad("name a number", "POST", q, `{"name":5,"plugin":"P"}`, 400, CodeInvalidField, "name"),
		bad("name empty", "POST", q, `{"name":"","plugin":"P"}`, 400, CodeInvalidField, "name"),
		bad("name padded", "POST", q, `{"name":" x","plugin":"P"}`, 400, CodeInvalidField, "name"),
		bad("name ends in NBSP", "POST", q, `{"name":"x\u00a0","plugin":"P"}`, 400, CodeInvalidField, "name"),
		bad("name with NUL", "POST", q, `{"name":"a\u0000b","plugin":"P"}`, 400, CodeInvalidField, "name"),
		bad("name with a C1 control", "POST", q, `{"name":"a\u0085b","plugin":"P"}`, 400, CodeInvalidField, "name"),
		bad("name an ObjectId", "POST", q, `{"name":"0123456789ABCDEF01234567","plugin":"P"}`, 400, CodeInvalidField, "name"),
		bad("name too long", "POST", q, `{"name":"`+strings.Repeat("é", 257)+`","plugin":"P"}`, 400, CodeInvalidField, "name"),
		bad("name missing", "POST", q, `{"plugin":"P"}`, 400, CodeMissingField, "name"),
		bad("plugin missing", "POST", q, `{"name":"x"}`, 400, CodeMissingField, "plugin"),
		bad("plugin an array", "POST", q, `{"name":"x","plugin":[]}`, 400, CodeInvalidField, "plugin"),
		bad("plugin null", "POST", q, `{"name":"x","plugin":null}`, 400, CodeInvalidField, "plugin"),
		bad("maxthreads a string", "POST", q, `{"name":"x","plugin":"P","maxthreads":"1"}`, 400, CodeInvalidField, "maxthreads"),
		bad("maxthreads negative", "POST", q, `{"name":"x","plugin":"P","maxthreads":-1}`, 400, CodeInvalidField, "maxthreads"),
		bad("maxthreads fraction", "POST", q, `{"name":"x","plugin":"P","maxthreads":1.5}`, 400, CodeInvalidField, "maxthreads"),
		bad("maxthreads past int32", "POST", q, `{"name":"x","plugin":"P","maxthreads":2147483648}`, 400, CodeInvalidField, "maxthreads"),
		bad("maxthreads huge", "POST", q, `{"name":"x","plugin":"P","maxthreads":1e400}`, 400, CodeInvalidField, "maxthreads"),
		bad("maxthreads true", "PATCH", q+"/target", `{"maxthreads":true}`, 400, CodeInvalidField, "maxthreads"),
		bad("sort unknown", "POST", q, `{"name":"x","plugin":"P","sort":"random"}`, 400, CodeInvalidField, "sort"),
		bad("sort empty", "PATCH", q+"/target", `{"sort":""}`, 400, CodeInvalidField, "sort"),
		bad("nodes_pin a string", "POST", q, `{"name":"x","plugin":"P","nodes_pin":"n1"}`, 400, CodeInvalidField, "nodes_pin"),
		bad("nodes_pin numbers", "POST", q, `{"name":"x","plugin":"P","nodes_pin":["n1",2]}`, 400, CodeInvalidField, "nodes_pin[1]"),
		bad("nodes_ignore empty name", "PATCH", q+"/target", `{"nodes_ignore":[""]}`, 400, CodeInvalidField, "nodes_ignore[0]"),
		bad("unknown field", "POST", q, `{"name":"x","plugin":"P","threads":1}`, 400, CodeUnknownField, "threads"),
		bad("unknown unicode field", "PATCH", q+"/target", `{"naïve":1}`, 400, CodeUnknownField, `["naïve"]`),
		bad("nothing to change", "PATCH", q+"/target", `{}`, 400, CodeInvalidField, ""),
		bad("id field", "PATCH", q+"/target", `{"id":"0123456789abcdef01234567"}`, 400, CodeUnknownField, "id"),
		// Wrong types and values: tasks.
		bad("queue missing", "POST", tasks, `{"tasks":[{"params":{}}]}`, 400, CodeMissingField, "queue"),
		bad("queue a number", "POST", tasks, `{"queue":1,"tasks":[{"params":{}}]}`, 400, CodeInvalidField, "queue"),
		bad("queue empty", "POST", tasks, `{"queue":"","tasks":[{"params":{}}]}`, 400, CodeInvalidField, "queue"),
		bad("tasks missing", "POST", tasks, `{"queue":"target"}`, 400, CodeMissingField, "tasks"),
		bad("tasks an object", "POST", tasks, `{"queue":"target","tasks":{"params":{}}}`, 400, CodeInvalidField, "tasks"),
		bad("no tasks", "POST", tasks, `{"queue":"target","tasks":[]}`, 400, CodeInvalidField, "tasks"),
		bad("task a string", "POST", tasks, `{"queue":"target","tasks":[{"params":{}},"x"]}`, 400, CodeInvalidField, "tasks[1]"),
		bad("task unknown field", "POST", tasks, `{"queue":"target","tasks":[{"params":{},"urgency":1}]}`, 400, CodeUnknownField, "tasks[0].urgency"),
		bad("params missing", "POST", tasks, `{"queue":"target","tasks":[{"params":{}},{}]}`, 400, CodeMissingField, "tasks[1].params"),
		bad("params an array", "POST", tasks, task(`[1,2]`), 400, CodeInvalidField, "tasks[0].params"),
		bad("params null", "POST", tasks, task(`null`), 400, CodeInvalidField, "tasks[0].params"),
		bad("params key $", "POST", tasks, task(`{"$where":"1"}`), 400, CodeInvalidField, `tasks[0].params["$where"]`),
		bad("params key with a dot", "POST", tasks, task(`{"a.b":1}`), 400, CodeInvalidField, `tasks[0].params["a.b"]`),
		bad("params key empty", "POST", tasks, task(`{"":1}`), 400, CodeInvalidField, `tasks[0].params[""]`),
		bad("params key NUL", "POST", tasks, task(`{"a\u0000":1}`), 400, CodeInvalidField, `tasks[0].params["a\x00"]`),
		bad("nested key $", "POST", tasks, task(`{"a":[{"ok":1},{"$oid":"x"}]}`), 400, CodeInvalidField, `tasks[0].params.a[1]["$oid"]`),
		bad("number out of range", "POST", tasks, task(`{"n":-1e400}`), 400, CodeInvalidField, "tasks[0].params.n"),
		// Past the document's maximum, 1.7976931348623157e308, yet rounded
		// to the largest double by ParseFloat (found by make fuzz-api).
		bad("number just past the largest double", "POST", tasks, task(`{"n":17976931348623157`+strings.Repeat("0", 291)+`1}`), 400, CodeInvalidField, "tasks[0].params.n"),
		bad("number just below the lowest double", "POST", tasks, task(`{"n":[-1.79769313486231571e308]}`), 400, CodeInvalidField, "tasks[0].params.n[0]"),
		bad("too many tasks", "POST", tasks, `{"queue":"target","tasks":[`+strings.Repeat(`{"params":{}},`, MaxSubmit)+`{"params":{}}]}`, 400, CodeInvalidField, "tasks"),
		bad("params too large", "POST", tasks, task(`{"s":"`+strings.Repeat("x", 17<<20)+`"}`), 413, CodeTooLarge, "tasks[0].params"),
		// Nodes.
		bad("node maxthreads a string", "PATCH", "/api/v1/nodes/n1", `{"maxthreads":"5"}`, 400, CodeInvalidField, "maxthreads"),
		bad("node maxthreads missing", "PATCH", "/api/v1/nodes/n1", `{}`, 400, CodeMissingField, "maxthreads"),
		bad("node drain field", "PATCH", "/api/v1/nodes/n1", `{"maxthreads":1,"drain":true}`, 400, CodeUnknownField, "drain"),
		// Path and query parameters.
		bad("task id not hex", "GET", "/api/v1/tasks/xyz", nil, 400, CodeInvalidParameter, "id"),
		bad("task id upper case", "GET", "/api/v1/tasks/0123456789ABCDEF01234567", nil, 400, CodeInvalidParameter, "id"),
		bad("task id too long", "GET", "/api/v1/tasks/0123456789abcdef012345670", nil, 400, CodeInvalidParameter, "id"),
		bad("task id unicode", "GET", "/api/v1/tasks/0123456789abcdef0123456%C3%A9", nil, 400, CodeInvalidParameter, "id"),
		bad("stderr id", "GET", "/api/v1/tasks/%00/stderr", nil, 400, CodeInvalidParameter, "id"),
		bad("unknown parameter", "GET", "/api/v1/queues?verbose=1", nil, 400, CodeUnknownParameter, "verbose"),
		bad("misspelt filter", "GET", "/api/v1/tasks?staus=1", nil, 400, CodeUnknownParameter, "staus"),
		bad("parameter on a route that takes none", "POST", "/api/v1/nodes/n1/drain?now=1", nil, 400, CodeUnknownParameter, "now"),
		bad("query not UTF-8", "GET", "/api/v1/tasks?node=%FF", nil, 400, CodeInvalidParameter, "node"),
		bad("query semicolon", "GET", "/api/v1/tasks?limit=1;x=2", nil, 400, CodeInvalidParameter, ""),
		bad("status unknown", "GET", "/api/v1/tasks?status=bogus", nil, 400, CodeInvalidParameter, "status"),
		bad("status too long", "GET", "/api/v1/tasks?status=9999999999", nil, 400, CodeInvalidParameter, "status"),
		bad("status empty", "GET", "/api/v1/tasks?status=", nil, 400, CodeInvalidParameter, "status"),
		bad("limit zero", "GET", "/api/v1/tasks?limit=0", nil, 400, CodeInvalidParameter, "limit"),
		bad("limit over", "GET", "/api/v1/tasks?limit=1001", nil, 400, CodeInvalidParameter, "limit"),
		bad("limit text", "GET", "/api/v1/tasks?limit=ten", nil, 400, CodeInvalidParameter, "limit"),
		bad("limit twice", "GET", "/api/v1/tasks?limit=1&limit=2", nil, 400, CodeInvalidParameter, "limit"),
		bad("order", "GET", "/api/v1/tasks?order=up", nil, 400, CodeInvalidParameter, "order"),
		bad("cursor", "GET", "/api/v1/tasks?cursor=zzz", nil, 400, CodeInvalidParameter, "cursor"),
		bad("created_after", "GET", "/api/v1/tasks?created_after=yesterday", nil, 400, CodeInvalidParameter, "created_after"),
		bad("created_before a date", "GET", "/api/v1/tasks?created_before=2026-01-02", nil, 400, CodeInvalidParameter, "created_before"),
		bad("queue filter empty", "GET", "/api/v1/tasks?queue=", nil, 400, CodeInvalidParameter, "queue"),
		bad("node filter empty", "GET", "/api/v1/tasks?node=", nil, 400, CodeInvalidParameter, "node"),
		bad("param filter $", "GET", "/api/v1/tasks?param[$where]=1", nil, 400, CodeInvalidParameter, "param[$where]"),
		bad("param filter empty key", "GET", "/api/v1/tasks?param[]=1", nil, 400, CodeInvalidParameter, "param[]"),
		bad("param filter empty segment", "GET", "/api/v1/tasks?param[a..b]=1", nil, 400, CodeInvalidParameter, "param[a..b]"),
		bad("param filter 33 values", "GET", "/api/v1/tasks?param[a]=1"+strings.Repeat("&param[a]=2", 32), nil, 400, CodeInvalidParameter, "param[a]"),
		bad("param without brackets", "GET", "/api/v1/tasks?param=1", nil, 400, CodeUnknownParameter, "param"),
		bad("force", "DELETE", q+"/target?force=1", nil, 400, CodeInvalidParameter, "force"),
		bad("unknown queue filter", "GET", "/api/v1/tasks?queue=%F0%9F%90%8D", nil, 404, CodeNotFound, "queue"),
		bad("unknown queue", "GET", q+"/%F0%9F%90%8D", nil, 404, CodeNotFound, "queue"),
		bad("unknown queue name with a slash", "GET", q+"/a%2Fb", nil, 404, CodeNotFound, "queue"),
		bad("submit to unknown queue", "POST", tasks, `{"queue":"nope","tasks":[{"params":{}}]}`, 404, CodeNotFound, "queue"),
		bad("unknown task", "GET", "/api/v1/tasks/0123456789abcdef01234567", nil, 404, CodeNotFound, "id"),
		bad("unknown node", "POST", "/api/v1/nodes/%E2%80%AE/drain", nil, 404, CodeNotFound, "node"),
	}
}

// TestHostileInput sends every route what a careless or hostile client
// would: each gets a clear 4xx naming the field, nothing is written, and
// the server goes on serving, also with all of them at once.
func TestHostileInput(t *testing.T) {
	e := setup(t)
	e.newQueue("target")
	e.submit("target", `{"keep":true}`)
	_, err := e.st.NodeUpsert(ctxT(t), store.NodeUpsertParams{Node: "n1"})
	require.NoError(t, err)
	snapshot := func() (int64, int, []byte) {
		n, err := e.st.TaskCount(ctxT(t), nil, 0, 0)
		require.NoError(t, err)
		queues, err := e.st.QueueDocs(ctxT(t))
		require.NoError(t, err)
		node, err := e.st.NodeDoc(ctxT(t), "n1")
		require.NoError(t, err)
		return n, len(queues), bytes.Clone(node)
	}
	tasks0, queues0, node0 := snapshot()

	cases := hostileCases()
	for _, c := range cases {
		r := e.do(c.method, c.target, c.body, c.hdr...)
		require.Equal(t, c.status, r.status, "%s: %s", c.name, clip(string(r.body)))
		d := r.apiErr(t)
		require.Equal(t, c.code, d.Code, "%s: %s", c.name, d.Message)
		require.Equal(t, c.field, d.field(), "%s: %s", c.name, d.Message)
		require.NotEmpty(t, d.Message, c.name)
	}
	// All at once, from many clients.
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := e.do(c.method, c.target, c.body, c.hdr...); r.status != c.status {
				t.Errorf("%s concurrently: %d %s", c.name, r.status, clip(string(r.body)))
			}
		}()
	}
	wg.Wait()

	tasks1, queues1, node1 := snapshot()
	require.Equal(t, tasks0, tasks1, "no task was written")
	require.Equal(t, queues0, queues1, "no queue was written")
	require.Equal(t, node0, node1, "the node was not written")
	var q Queue
	e.want(200, "GET", "/api/v1/queues/target", nil).decode(t, &q)
	require.Equal(t, 1, *q.MaxThreads)
	require.Equal(t, "default", q.Sort)
	var n Node
	e.want(200, "GET", "/api/v1/nodes/n1", nil).decode(t, &n)
	require.Nil(t, n.MaxThreads)
	require.False(t, n.Drain)
	require.Len(t, e.list("").Tasks, 1)
}

// TestHugeBodies: bodies over the limit are refused with 413 whether
// their length is announced or not, and the connection's server goes on.
func TestHugeBodies(t *testing.T) {
	e := setup(t)
	e.newQueue("target")
	huge := `{"queue":"target","tasks":[{"params":{"s":"` + strings.Repeat("x", 40<<20) + `"}}]}`
	e.wantErr(413, CodeTooLarge, "", "POST", "/api/v1/tasks", huge)

	// Length unknown (chunked): the limit stops the read.
	req := httptest.NewRequest("POST", "/api/v1/tasks", io.MultiReader(strings.NewReader(huge)))
	req.ContentLength = -1
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	require.Equal(t, 413, rec.Code)
	require.Contains(t, rec.Body.String(), `"too_large"`)

	// Over real HTTP, then the server answers the next request.
	srv := e.server()
	res, err := http.Post(srv.URL+"/api/v1/tasks", "application/json", strings.NewReader(huge))
	if err == nil { // the server may close before the client has sent it all
		require.Equal(t, 413, res.StatusCode)
		require.NoError(t, res.Body.Close())
	}
	res, err = http.Get(srv.URL + "/api/v1/queues")
	require.NoError(t, err)
	require.Equal(t, 200, res.StatusCode)
	require.NoError(t, res.Body.Close())

	n, err := e.st.TaskCount(ctxT(t), nil, 0, 0)
	require.NoError(t, err)
	require.Zero(t, n)

	t.Run("smaller limit", func(t *testing.T) {
		small := setup(t, func(o *Options, _ *store.Options) { o.MaxBodyBytes = 100 })
		small.wantErr(413, CodeTooLarge, "", "POST", "/api/v1/queues", `{"name":"`+strings.Repeat("x", 100)+`","plugin":"P"}`)
		small.want(201, "POST", "/api/v1/queues", `{"name":"x","plugin":"P"}`)
	})
}

// TestUnicode: names, parameters and filters in any script round-trip.
func TestUnicode(t *testing.T) {
	e := setup(t)
	names := []string{"émoji 🐍🚀", "עברית", "中文队列", "Ελληνικά", "a\u200db", "\u202egnp.exe", "x y"}
	for _, name := range names {
		var q Queue
		e.want(201, "POST", "/api/v1/queues", map[string]any{"name": name, "plugin": "Ünïcode::Plügin"}).decode(t, &q)
		require.Equal(t, name, q.Name)
		var got Queue
		e.want(200, "GET", "/api/v1/queues/"+url.PathEscape(name), nil).decode(t, &got)
		require.Equal(t, q.ID, got.ID)
		ids := e.submit(name, `{"ключ":"значение 🔑","名前":["一","二"]}`)
		p := e.list("?queue=" + url.QueryEscape(name) + "&param[" + url.QueryEscape("ключ") + "]=" + url.QueryEscape("значение 🔑"))
		require.Equal(t, ids, taskIDs(p), name)
		require.JSONEq(t, `{"ключ":"значение 🔑","名前":["一","二"]}`, string(p.Tasks[0].Params))
	}
	var list struct {
		Queues []Queue `json:"queues"`
	}
	e.want(200, "GET", "/api/v1/queues", nil).decode(t, &list)
	require.Len(t, list.Queues, len(names))
}
