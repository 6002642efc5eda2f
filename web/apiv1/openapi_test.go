package apiv1

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/httpserver"
	"github.com/disbatch-go/disbatch/store"
)

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func docOperations(t *testing.T, raw []byte) []string {
	t.Helper()
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))
	var ops []string
	for p, item := range doc["paths"].(map[string]any) {
		for m := range item.(map[string]any) {
			if slices.Contains(httpMethods, m) {
				ops = append(ops, strings.ToUpper(m)+" "+p)
			}
		}
	}
	slices.Sort(ops)
	return ops
}

// TestOpenAPIDescribesEveryRoute: the routes the handler registers are
// exactly the document's operations, with and without the event stream.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	t.Parallel()
	for _, events := range []http.Handler{nil, http.NotFoundHandler()} {
		h := New(Options{Events: events}).(*handler)
		var routes []string
		for _, rt := range h.routeTable(events) {
			routes = append(routes, rt.method+" "+rt.path)
		}
		slices.Sort(routes)
		doc, err := Document(Options{Events: events})
		require.NoError(t, err)
		require.Equal(t, routes, docOperations(t, doc))
		require.Equal(t, doc, h.doc)
	}
	full := docOperations(t, openAPIDocument)
	require.Contains(t, full, "GET /api/v1/events")
	require.Len(t, full, 25)
}

// TestOpenAPIDocument checks the document's own consistency: every $ref
// resolves, every schema compiles (JSON Schema 2020-12), every operation
// has an id, declares its path parameters and the error responses every
// route can give, and every response is described.
func TestOpenAPIDocument(t *testing.T) {
	t.Parallel()
	c, err := newChecker(openAPIDocument)
	require.NoError(t, err)
	doc := c.doc
	require.Equal(t, "3.1.0", doc["openapi"])

	// Every $ref resolves; every schema compiles.
	var walk func(ptr string, v any)
	walk = func(ptr string, v any) {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				target, _ := c.at(ref[1:])
				require.NotNil(t, target, "%s: $ref %s resolves to nothing", ptr, ref)
			}
			for k, e := range x {
				p := ptr + pointer(k)
				if k == "schema" {
					_, err := c.schema(p)
					require.NoError(t, err, "%s", p)
				}
				walk(p, e)
			}
		case []any:
			for i, e := range x {
				walk(ptr+"/"+itoa(i), e)
			}
		}
	}
	walk("", doc)
	for name := range doc["components"].(map[string]any)["schemas"].(map[string]any) {
		_, err := c.schema(pointer("components", "schemas", name))
		require.NoError(t, err, name)
	}

	ids := map[string]bool{}
	for p, item := range doc["paths"].(map[string]any) {
		require.True(t, strings.HasPrefix(p, "/api/v1/"), p)
		wantParams := map[string]bool{}
		for _, m := range regexp.MustCompile(`\{([^}]+)\}`).FindAllStringSubmatch(p, -1) {
			wantParams[m[1]] = true
		}
		for m, o := range item.(map[string]any) {
			if m == "parameters" {
				continue
			}
			require.Contains(t, httpMethods, m)
			opPtr := pointer("paths", p, m)
			op := o.(map[string]any)
			id, _ := op["operationId"].(string)
			require.NotEmpty(t, id, opPtr)
			require.False(t, ids[id], "operationId %s twice", id)
			ids[id] = true
			require.NotEmpty(t, op["summary"], opPtr)
			require.NotEmpty(t, op["description"], opPtr)
			// Path parameters: declared, required, exactly those of the path.
			got := map[string]bool{}
			for _, base := range []string{pointer("paths", p), opPtr} {
				ps, _ := c.at(base + "/parameters")
				list, _ := ps.([]any)
				for i := range list {
					pv, _ := c.at(base + "/parameters/" + itoa(i))
					pm := pv.(map[string]any)
					require.NotNil(t, pm["schema"], "%s parameter %v has a schema", opPtr, pm["name"])
					if pm["in"] == "path" {
						got[pm["name"].(string)] = true
						require.Equal(t, true, pm["required"], "%s: path parameters are required", opPtr)
					}
				}
			}
			require.Equal(t, wantParams, got, opPtr)
			responses := op["responses"].(map[string]any)
			for _, code := range []string{"400", "401", "403", "413", "431", "500"} {
				require.Contains(t, responses, code, "%s declares %s", opPtr, code)
			}
			if rb, ok := op["requestBody"].(map[string]any); ok {
				require.Contains(t, responses, "415", opPtr)
				// Only the control of one task (its path names it) may
				// leave its body out.
				require.Equal(t, !optionalBodies[id], rb["required"], opPtr)
				body, _ := c.at(opPtr + "/requestBody/content/application~1json/schema")
				require.Equal(t, false, body.(map[string]any)["additionalProperties"], "%s: request bodies refuse unknown fields", opPtr)
			}
			for code := range responses {
				r, _ := c.at(opPtr + pointer("responses", code))
				require.NotEmpty(t, r.(map[string]any)["description"], "%s %s", opPtr, code)
				if code >= "400" {
					// 431 is net/http's own answer, before any handler:
					// plain text (TestHeadersTooLarge).
					mediaType := "application/json"
					if code == "431" {
						mediaType = "text/plain"
					}
					_, ok := r.(map[string]any)["content"].(map[string]any)[mediaType]
					require.True(t, ok, "%s %s: errors are %s", opPtr, code, mediaType)
				}
			}
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// optionalBodies are the operations whose body may be left out.
var optionalBodies = map[string]bool{"killTask": true, "cancelTask": true, "retryTask": true}

// TestCheckerCatches makes sure the conformance check is not vacuous.
func TestCheckerCatches(t *testing.T) {
	t.Parallel()
	c, err := newChecker(openAPIDocument)
	require.NoError(t, err)
	js := http.Header{"Content-Type": {"application/json"}}
	jsReq := http.Header{"Content-Type": {"application/json"}}
	queue := `{"id":"0123456789abcdef01234567","name":"q","plugin":"P","maxthreads":1,"sort":"default","nodes_pin":[],"nodes_ignore":[],"counts":{"queued":null,"running":0,"finished":null,"failed":null,"total":null,"count_running":null},` +
		`"priority":0,"weight":20,"max_getwork":0,"max_running":0,"admitted":0,"paused":false,"continuous":false,"interval":0}`
	ok := exchange{method: "GET", target: "/api/v1/queues/q", status: 200, header: js, body: []byte(queue)}
	require.NoError(t, c.check(ok))
	created := exchange{method: "POST", target: "/api/v1/queues", reqHeader: jsReq, reqBody: []byte(`{"name":"q","plugin":"P"}`), status: 201,
		header: http.Header{"Content-Type": {"application/json"}, "Location": {"/api/v1/queues/x"}}, body: []byte(queue)}
	require.NoError(t, c.check(created))
	for name, x := range map[string]exchange{
		"undeclared status":   {method: "GET", target: "/api/v1/queues/q", status: 418, header: js, body: []byte(`{}`)},
		"extra field":         {method: "GET", target: "/api/v1/queues/q", status: 200, header: js, body: []byte(strings.Replace(queue, `"name"`, `"x":1,"name"`, 1))},
		"wrong type":          {method: "GET", target: "/api/v1/queues/q", status: 200, header: js, body: []byte(strings.Replace(queue, `"maxthreads":1`, `"maxthreads":"1"`, 1))},
		"bad id":              {method: "GET", target: "/api/v1/queues/q", status: 200, header: js, body: []byte(strings.Replace(queue, `0123456789abcdef01234567`, `X123456789abcdef01234567`, 1))},
		"wrong content type":  {method: "GET", target: "/api/v1/queues/q", status: 200, header: http.Header{"Content-Type": {"text/html"}}, body: []byte(queue)},
		"missing Location":    {method: "POST", target: "/api/v1/queues", reqHeader: jsReq, reqBody: []byte(`{"name":"q","plugin":"P"}`), status: 201, header: js, body: []byte(queue)},
		"2xx for invalid":     {method: "POST", target: "/api/v1/queues", reqHeader: jsReq, reqBody: []byte(`{"name":"q"}`), status: 201, header: created.header, body: []byte(queue)},
		"400 for valid":       {method: "POST", target: "/api/v1/queues", reqHeader: jsReq, reqBody: []byte(`{"name":"q","plugin":"P"}`), status: 400, header: js, body: []byte(`{"error":{"code":"invalid_field","message":"m","field":"name"}}`)},
		"400 for valid query": {method: "GET", target: "/api/v1/tasks?limit=5", status: 400, header: js, body: []byte(`{"error":{"code":"invalid_parameter","message":"m","field":"limit"}}`)},
		"2xx for bad query":   {method: "GET", target: "/api/v1/tasks?limit=5000", status: 200, header: js, body: []byte(`{"tasks":[],"next":null,"skipped":0}`)},
		"error code":          {method: "GET", target: "/api/v1/queues/q", status: 404, header: js, body: []byte(`{"error":{"code":"conflict","message":"m","field":null}}`)},
		"no route not 404":    {method: "GET", target: "/api/v1/nope", status: 200, header: js, body: []byte(`{}`)},
		"405 without Allow":   {method: "PUT", target: "/api/v1/queues", status: 405, header: js, body: []byte(`{"error":{"code":"method_not_allowed","message":"m","field":null}}`)},
		"date-time":           {method: "GET", target: "/api/v1/nodes", status: 200, header: js, body: []byte(`{"nodes":[{"id":null,"node":"n","timestamp":"yesterday","heartbeat_age_ms":null,"state":null,"drain":false,"maxthreads":null,"dead":false,"dead_at":null,"dead_by":null,"queues":[],"serves":null,"full":null,"wakeup_stream":null}],"skipped":0}`)},
	} {
		require.Error(t, c.check(x), name)
	}
}

// TestUnknownRoutesAndMethods: 404 and 405 in the error shape.
func TestUnknownRoutesAndMethods(t *testing.T) {
	e := setup(t)
	e.wantErr(404, CodeNotFound, "", "GET", "/api/v1/nope", nil)
	e.wantErr(404, CodeNotFound, "", "GET", "/api/v1/queues/", nil)
	e.wantErr(404, CodeNotFound, "", "GET", "/api/v1/tasks/0123456789abcdef01234567/stdin", nil)
	e.wantErr(404, CodeNotFound, "", "POST", "/api/v1/", nil)
	r := e.want(405, "PUT", "/api/v1/queues", nil)
	require.Equal(t, "GET, HEAD, POST", r.header.Get("Allow"))
	require.Equal(t, CodeMethodNotAllowed, r.apiErr(t).Code)
	r = e.want(405, "DELETE", "/api/v1/tasks/0123456789abcdef01234567", nil)
	require.Equal(t, "GET, HEAD", r.header.Get("Allow"))
	r = e.want(405, "GET", "/api/v1/nodes/n1/drain", nil)
	require.Equal(t, "POST", r.header.Get("Allow"))
	e.wantErr(404, CodeNotFound, "", "GET", "/api/v1/events", nil) // not mounted
	// HEAD is GET without the body.
	res, err := http.Head(e.server().URL + "/api/v1/queues")
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, 200, res.StatusCode)
	require.Equal(t, "application/json", res.Header.Get("Content-Type"))
}

// TestHeadersTooLarge: a request line and headers over the server's limit
// (a long query string) get net/http's own 431 in plain text, which the
// document declares for every operation (found by make fuzz-api).
func TestHeadersTooLarge(t *testing.T) {
	e := setup(t)
	srv := httptest.NewUnstartedServer(e.h)
	srv.Config.MaxHeaderBytes = httpserver.DefaultMaxHeaderBytes
	srv.Start()
	t.Cleanup(srv.Close)
	target := "/api/v1/tasks?node=" + strings.Repeat("n", httpserver.DefaultMaxHeaderBytes+8<<10)
	res, err := http.Get(srv.URL + target)
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, res.StatusCode)
	require.NoError(t, e.chk.check(exchange{method: "GET", target: target, status: res.StatusCode, header: res.Header, body: body}))
}

// TestEventsRoute: the hub's handler is mounted as given, and the
// document describes it.
func TestEventsRoute(t *testing.T) {
	var got *http.Request
	events := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		if r.URL.Query().Get("types") == "bogus" {
			WriteError(w, http.StatusBadRequest, CodeInvalidParameter, "types must be a comma-separated subset of task, queue and node", "types")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write([]byte("retry: 2000\n\n"))
		w.(http.Flusher).Flush()
	})
	e := setup(t, func(o *Options, _ *store.Options) { o.Events = events })
	r := e.want(200, "GET", "/api/v1/events?queue=q1&types=task,queue", nil)
	require.Equal(t, "retry: 2000\n\n", string(r.body))
	require.Equal(t, "task,queue", got.URL.Query().Get("types"))
	e.wantErr(400, CodeInvalidParameter, "types", "GET", "/api/v1/events?types=bogus", nil)
	require.Equal(t, "GET, HEAD", e.want(405, "POST", "/api/v1/events", nil).header.Get("Allow"))

	// Through a real server, the stream is flushed.
	srv := e.server()
	res, err := http.Get(srv.URL + "/api/v1/events")
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
}

// TestDeny: web/auth's refusals in the v1 shape.
func TestDeny(t *testing.T) {
	t.Parallel()
	for status, code := range map[int]string{401: CodeUnauthorized, 403: CodeForbidden, 500: CodeInternal} {
		rec := httptest.NewRecorder()
		Deny(rec, httptest.NewRequest("GET", "/api/v1/queues", nil), status, "no")
		require.Equal(t, status, rec.Code)
		require.JSONEq(t, `{"error":{"code":"`+code+`","message":"no","field":null}}`, rec.Body.String())
		require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	}
}

// failing is a Store whose QueueList fails and whose other methods panic
// (the embedded nil interface).
type failing struct{ Store }

func (failing) QueueList(context.Context) (store.QueueListResult, error) {
	return store.QueueListResult{}, errors.New("connection refused: secret-host:27017")
}

// TestServerErrors: a failing store is a 500 that tells no details, a
// panic is a 500 too, and the handler goes on serving.
func TestServerErrors(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	h := New(Options{Store: failing{}, Logger: slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))})
	chk, err := newChecker(h.(*handler).doc)
	require.NoError(t, err)
	for range 2 {
		for target, code := range map[string]string{"/api/v1/queues": CodeInternal, "/api/v1/nodes": CodeInternal} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
			require.Equal(t, 500, rec.Code, target)
			require.NoError(t, chk.check(exchange{method: "GET", target: target, status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}))
			require.Contains(t, rec.Body.String(), `"code":"`+code+`"`)
			require.NotContains(t, rec.Body.String(), "secret-host")
		}
	}
	require.Contains(t, logs.String(), "secret-host", "the log has the details")
	require.Contains(t, logs.String(), "api handler panicked")
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}
