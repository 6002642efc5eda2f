package dci_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web/dci"
)

// These tests replay what the real Disbatch 4.103 web API (Disbatch::Web
// on Limper, run beside this project against the same kind of database)
// answered, byte for byte: the expected bodies below are its answers with
// generated ids replaced by {{name}} placeholders. Where 4.103 answered a
// 500 (a Perl exception) the expectation is this package's sane 4xx in the
// same shape, marked "4.103: 500".

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

type bench struct {
	t    *testing.T
	db   *mongo.Database
	st   *store.Store
	srv  *httptest.Server
	vars map[string]string
}

func setup(t *testing.T, legacy bool) *bench {
	t.Helper()
	db := mongotest.Database(t)
	st := store.New(db, store.Options{})
	ctx := context.Background()
	// The indexes Disbatch 4.103's ensure_indexes makes (GET /tasks reads
	// which filters are valid from them).
	_, err := db.Collection("tasks").Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: bson.D{{Key: "node", Value: 1}, {Key: "status", Value: 1}, {Key: "queue", Value: 1}, {Key: "_id", Value: 1}}},
		{Keys: bson.D{{Key: "queue", Value: 1}, {Key: "status", Value: 1}}},
	})
	require.NoError(t, err)
	_, err = db.Collection("queues").Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "name", Value: 1}}, Options: options.Index().SetUnique(true)})
	require.NoError(t, err)
	h := dci.New(dci.Options{Store: st, Database: "golden", Plugins: []string{"Disbatch::Plugin::Demo"}, LegacyTasks: legacy, Monitoring: true,
		Balance: map[string]any{"enabled": 0, "log": 1, "pretend": 0, "verbose": 0}})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &bench{t: t, db: db, st: st, srv: srv, vars: map[string]string{}}
}

type exchange struct {
	name   string
	method string
	path   string
	ctype  string // "json", "form" or a Content-Type
	body   string
	status int
	want   string // the body, {{var}} substituted; "" with prefix set: checked by prefix
	prefix string
}

func (b *bench) sub(s string) string {
	for k, v := range b.vars {
		s = strings.ReplaceAll(s, "{{"+k+"}}", v)
	}
	return s
}

func (b *bench) do(method, path, ctype, body string, hdr ...string) (int, http.Header, string) {
	b.t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+b.sub(path), strings.NewReader(b.sub(body)))
	require.NoError(b.t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	switch ctype {
	case "json":
		req.Header.Set("Content-Type", "application/json")
	case "form":
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	case "":
	default:
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return resp.StatusCode, resp.Header, string(out)
}

func (b *bench) run(xs []exchange) {
	b.t.Helper()
	for _, x := range xs {
		status, hdr, body := b.do(x.method, x.path, x.ctype, x.body)
		require.Equal(b.t, x.status, status, "%s: status; body %s", x.name, body)
		if x.prefix != "" {
			require.True(b.t, strings.HasPrefix(body, b.sub(x.prefix)), "%s: body %s", x.name, body)
			continue
		}
		require.Equal(b.t, b.sub(x.want), body, x.name)
		if strings.HasPrefix(x.want, "{") || strings.HasPrefix(x.want, "[") || x.want == "null" {
			require.Equal(b.t, "application/json", hdr.Get("Content-Type"), x.name)
		}
	}
}

const tasksIndexes = `"indexes":[["id"],["node","status","queue","id"],["queue","status"]]`

func TestGoldenEmptyDatabaseAndNodes(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	b.run([]exchange{
		{name: "info", method: "GET", path: "/info", status: 200,
			want: `{"database":"golden","routes":{"DELETE":["(?^u:^/queues/(?<queue>.+)$)"],"GET":["/","/info","/nodes","(?^u:^/nodes/(?<node>.+))","/plugins","/queues","(?^u:^/queues/(?<queue>.+)$)","/tasks","(?^u:^/tasks/(?<id>[0-9a-f]{24})$)","/balance","/monitoring","(?^u:^/)"],"POST":["(?^u:^/nodes/(?<node>.+))","/queues","(?^u:^/queues/(?<queue>.+)$)","/tasks","/balance"]},"web_extensions":[]}`},
		{name: "nodes empty", method: "GET", path: "/nodes", status: 200, want: `[]`},
		{name: "queues empty", method: "GET", path: "/queues", status: 200, want: `[]`},
		{name: "plugins", method: "GET", path: "/plugins", status: 200, want: `["Disbatch::Plugin::Demo"]`},
		{name: "node missing (4.103: 500)", method: "GET", path: "/nodes/nosuch", status: 200, want: `null`},
		{name: "monitoring no nodes", method: "GET", path: "/monitoring", status: 200,
			want: `{"disbatch":{"message":"No Disbatch nodes found","status":"WARNING"},"queuebalance":{"message":"queuebalance disabled","status":"OK"}}`},
		{name: "balance empty", method: "GET", path: "/balance", status: 200,
			want: "{\n   \"known_queues\" : [],\n   \"notice\" : \"balance document not found\",\n   \"settings\" : {\n      \"enabled\" : 0,\n      \"log\" : 1,\n      \"pretend\" : 0,\n      \"verbose\" : 0\n   }\n}\n"},
		{name: "unknown GET", method: "GET", path: "/nope", status: 404, want: "This is the void"},
		{name: "unknown POST", method: "POST", path: "/nope", status: 404, want: "This is the void"},
		{name: "unknown PUT", method: "PUT", path: "/queues", status: 404, want: "This is the void"},
		{name: "DELETE /tasks", method: "DELETE", path: "/tasks", status: 404, want: "This is the void"},
	})

	now := time.Now()
	ctx := context.Background()
	for _, d := range []bson.D{
		{{Key: "node", Value: "node-a"}, {Key: "timestamp", Value: bson.NewDateTimeFromTime(now)}, {Key: "maxthreads", Value: 5}},
		{{Key: "node", Value: "node-b"}, {Key: "timestamp", Value: bson.NewDateTimeFromTime(time.UnixMilli(1795397422000))}},
		{{Key: "node", Value: "node-c"}, {Key: "timestamp", Value: bson.NewDateTimeFromTime(now.Add(-5 * time.Second))},
			{Key: "queues", Value: bson.A{bson.D{{Key: "name", Value: "x"}, {Key: "maxthreads", Value: 1}}}}, {Key: "extra", Value: "kept"}},
	} {
		res, err := b.db.Collection("nodes").InsertOne(ctx, d)
		require.NoError(t, err)
		name := d[0].Value.(string)
		b.vars[name] = res.InsertedID.(bson.ObjectID).Hex()
	}
	tsA := bson.NewDateTimeFromTime(now).Time().UnixMilli()
	tsC := bson.NewDateTimeFromTime(now.Add(-5 * time.Second)).Time().UnixMilli()
	b.vars["tsA"], b.vars["tsC"] = strconv.FormatInt(tsA, 10), strconv.FormatInt(tsC, 10)
	b.run([]exchange{
		{name: "nodes", method: "GET", path: "/nodes", status: 200,
			want: `[{"_id":{"$oid":"{{node-a}}"},"id":"{{node-a}}","maxthreads":5,"node":"node-a","timestamp":{{tsA}}},{"_id":{"$oid":"{{node-b}}"},"id":"{{node-b}}","node":"node-b","timestamp":1795397422000},{"_id":{"$oid":"{{node-c}}"},"extra":"kept","id":"{{node-c}}","node":"node-c","queues":[{"maxthreads":1,"name":"x"}],"timestamp":{{tsC}}}]`},
		{name: "node by name", method: "GET", path: "/nodes/node-b", status: 200,
			want: `{"_id":{"$oid":"{{node-b}}"},"id":"{{node-b}}","node":"node-b","timestamp":1795397422000}`},
		{name: "node by id", method: "GET", path: "/nodes/{{node-b}}", status: 200,
			want: `{"_id":{"$oid":"{{node-b}}"},"id":"{{node-b}}","node":"node-b","timestamp":1795397422000}`},
		{name: "node trailing path (4.103: 500)", method: "GET", path: "/nodes/node-a/extra", status: 200, want: `null`},
		{name: "node post no body", method: "POST", path: "/nodes/node-a", status: 400, want: `{"error":"No params"}`},
		{name: "node post empty json", method: "POST", path: "/nodes/node-a", ctype: "json", body: `{}`, status: 400, want: `{"error":"No params"}`},
		{name: "node post invalid param", method: "POST", path: "/nodes/node-a", ctype: "json", body: `{"maxthreads":1,"foo":2}`, status: 400, want: `{"error":"Invalid param","param":"foo"}`},
		{name: "node post invalid param form", method: "POST", path: "/nodes/node-a", ctype: "form", body: `foo=2`, status: 400, want: `{"error":"Invalid param","param":"foo"}`},
		{name: "maxthreads abc", method: "POST", path: "/nodes/node-a", ctype: "json", body: `{"maxthreads":"abc"}`, status: 400, want: `{"error":"maxthreads must be a non-negative integer or null"}`},
		{name: "maxthreads negative", method: "POST", path: "/nodes/node-a", ctype: "json", body: `{"maxthreads":-1}`, status: 400, want: `{"error":"maxthreads must be a non-negative integer or null"}`},
		{name: "maxthreads float", method: "POST", path: "/nodes/node-a", ctype: "json", body: `{"maxthreads":1.5}`, status: 400, want: `{"error":"maxthreads must be a non-negative integer or null"}`},
		{name: "maxthreads form", method: "POST", path: "/nodes/node-a", ctype: "form", body: `maxthreads=7`, status: 200,
			want: `{"MongoDB::UpdateResult":{"matched_count":1,"modified_count":1,"upserted_id":null,"write_concern_errors":[],"write_errors":[]}}`},
		{name: "maxthreads json string", method: "POST", path: "/nodes/node-a", ctype: "json", body: `{"maxthreads":"5"}`, status: 200,
			want: `{"MongoDB::UpdateResult":{"matched_count":1,"modified_count":1,"upserted_id":null,"write_concern_errors":[],"write_errors":[]}}`},
		{name: "maxthreads same", method: "POST", path: "/nodes/node-a", ctype: "json", body: `{"maxthreads":5}`, status: 200,
			want: `{"MongoDB::UpdateResult":{"matched_count":1,"modified_count":0,"upserted_id":null,"write_concern_errors":[],"write_errors":[]}}`},
		{name: "maxthreads null by id", method: "POST", path: "/nodes/{{node-b}}", ctype: "json", body: `{"maxthreads":null}`, status: 200,
			want: `{"MongoDB::UpdateResult":{"matched_count":1,"modified_count":1,"upserted_id":null,"write_concern_errors":[],"write_errors":[]}}`},
		{name: "maxthreads query string", method: "POST", path: "/nodes/node-c?maxthreads=2", status: 200,
			want: `{"MongoDB::UpdateResult":{"matched_count":1,"modified_count":1,"upserted_id":null,"write_concern_errors":[],"write_errors":[]}}`},
		{name: "node post missing node", method: "POST", path: "/nodes/nosuch", ctype: "json", body: `{"maxthreads":1}`, status: 400,
			want: `{"MongoDB::UpdateResult":{"matched_count":0,"modified_count":0,"upserted_id":null,"write_concern_errors":[],"write_errors":[]},"error":{"matched_count":0,"modified_count":0,"upserted_id":null,"write_concern_errors":[],"write_errors":[]}}`},
		{name: "node post bad json (4.103: 500)", method: "POST", path: "/nodes/node-a", ctype: "json", body: `{"maxthreads":`, status: 400, want: `{"error":"No params"}`},
		{name: "monitoring fresh and stale", method: "GET", path: "/monitoring", status: 200,
			prefix: `{"disbatch":{"message":"Disbatch is running on one or more nodes","nodes":{"fresh":{"node-a":`},
	})
}

func TestQueueBrowserPageWithoutAWebRoot(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	status, hdr, body := b.do("GET", "/", "", "")
	require.Equal(t, 200, status)
	require.Equal(t, "text/html", hdr.Get("Content-Type"))
	require.Contains(t, body, `<script src="/js/queues.js">`)
	status, hdr, body = b.do("GET", "/js/queues.js", "", "")
	require.Equal(t, 200, status)
	require.Equal(t, "application/javascript", hdr.Get("Content-Type"))
	for _, call := range []string{`call("GET", "/queues")`, `call("GET", "/nodes")`, `call("GET", "/plugins")`, `call("POST", "/queues"`} {
		require.Contains(t, body, call)
	}
	status, _, _ = b.do("GET", "/js/../../etc/passwd", "", "")
	require.Equal(t, 404, status)
	status, _, body = b.do("GET", "/js/", "", "")
	require.Equal(t, 404, status, body)
}
