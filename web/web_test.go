package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web"
	"github.com/disbatch-go/disbatch/web/auth"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

func users(t *testing.T) *auth.Users {
	t.Helper()
	var lines []string
	for _, u := range []struct{ name, role string }{{"reader", "read"}, {"writer", "write"}, {"boss", "admin"}} {
		h, err := auth.HashPasswordWithIterations("pw-"+u.name, auth.MinIterations)
		require.NoError(t, err)
		role, err := auth.ParseRole(u.role)
		require.NoError(t, err)
		lines = append(lines, auth.Line(auth.KindUser, u.name, role, h))
	}
	us, err := auth.Parse(strings.NewReader(strings.Join(lines, "\n") + "\n"))
	require.NoError(t, err)
	return us
}

type client struct {
	t   *testing.T
	url string
}

func (c client) do(method, path, user, body string, hdr ...string) (*http.Response, string) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.url+path, strings.NewReader(body))
	require.NoError(c.t, err)
	if user != "" {
		req.SetBasicAuth(user, "pw-"+user)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return c.send(req)
}

// send sends req and reads its answer.
func (c client) send(req *http.Request) (*http.Response, string) {
	c.t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp, string(b)
}

func setup(t *testing.T, o web.Options) client {
	t.Helper()
	o.Store = store.New(mongotest.Database(t), store.Options{})
	o.Plugins = []string{"Disbatch::Plugin::Demo"}
	srv := httptest.NewServer(web.NewHandler(o))
	t.Cleanup(srv.Close)
	return client{t: t, url: srv.URL}
}

func TestAuthenticationAndRoles(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{Users: users(t)})

	// The 4.103 CLI sends credentials only after a 401 naming realm disbatch.
	resp, body := c.do("GET", "/queues", "", "")
	require.Equal(t, 401, resp.StatusCode)
	require.Contains(t, resp.Header.Values("WWW-Authenticate"), `Basic realm="disbatch"`)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Contains(t, body, `"error":`)
	resp, body = c.do("GET", "/api/v1/queues", "", "")
	require.Equal(t, 401, resp.StatusCode)
	require.Contains(t, body, `"code":"unauthorized"`, "the v1 error shape")

	resp, _ = c.do("GET", "/queues", "reader", "")
	require.Equal(t, 200, resp.StatusCode)
	resp, body = c.do("POST", "/queues", "reader", `{"name":"q","plugin":"Disbatch::Plugin::Demo"}`, "Content-Type", "application/json")
	require.Equal(t, 403, resp.StatusCode, body)
	resp, body = c.do("POST", "/queues", "writer", `{"name":"q","plugin":"Disbatch::Plugin::Demo"}`, "Content-Type", "application/json")
	require.Equal(t, 200, resp.StatusCode, body)
	resp, body = c.do("POST", "/nodes/n1", "writer", `{"maxthreads":1}`, "Content-Type", "application/json")
	require.Equal(t, 403, resp.StatusCode, "nodes need admin: %s", body)
	resp, body = c.do("POST", "/nodes/n1", "boss", `{"maxthreads":1}`, "Content-Type", "application/json")
	require.Equal(t, 400, resp.StatusCode, "admin passes (no such node): %s", body)
	resp, _ = c.do("GET", "/queues", "", "", "Authorization", "Basic "+"d3JpdGVyOndyb25n") // writer:wrong
	require.Equal(t, 401, resp.StatusCode)

	// Metrics are not behind authentication (scrapers).
	resp, _ = c.do("GET", "/metrics", "", "")
	require.Equal(t, 200, resp.StatusCode)
}

func TestMetricsByRouteAndCode(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{})
	c.do("GET", "/queues", "", "")
	c.do("GET", "/queues/nosuch", "", "")
	c.do("GET", "/nowhere", "", "")
	c.do("GET", "/api/v1/queues", "", "")
	_, body := c.do("GET", "/metrics", "", "")
	for _, want := range []string{
		`disbatch_web_requests_total{code="200",method="GET",route="/queues"} 1`,
		`disbatch_web_requests_total{code="200",method="GET",route="(?^u:^/queues/(?<queue>.+)$)"} 1`,
		`disbatch_web_requests_total{code="404",method="GET",route="(?^u:^/)"} 1`,
		`disbatch_web_requests_total{code="200",method="GET",route="GET /api/v1/queues"} 1`,
		`disbatch_web_request_duration_seconds_count{method="GET",route="/queues"} 1`,
	} {
		require.Contains(t, body, want)
	}
}

func TestBodyLimit(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{MaxBodyBytes: 1000})
	big := `{"name":"` + strings.Repeat("x", 2000) + `","plugin":"Disbatch::Plugin::Demo"}`
	resp, body := c.do("POST", "/queues", "", big, "Content-Type", "application/json")
	require.Equal(t, 413, resp.StatusCode, body)
	require.Contains(t, body, `"error":`)
	resp, body = c.do("POST", "/api/v1/queues", "", big, "Content-Type", "application/json")
	require.Equal(t, 413, resp.StatusCode, body)
	require.Contains(t, body, `"code":"too_large"`)
	// Chunked (no Content-Length): read to the limit, then refused alike.
	for _, path := range []string{"/queues", "/tasks", "/api/v1/queues"} {
		req, err := http.NewRequest("POST", c.url+path, io.MultiReader(strings.NewReader(big)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, 413, resp.StatusCode, "chunked %s: %s", path, b)
		require.Contains(t, string(b), "larger than 1000 bytes", path)
	}
	// A chunked body within the limit is served as before.
	req, err := http.NewRequest("POST", c.url+"/queues", io.MultiReader(strings.NewReader(`{"name":"small","plugin":"Disbatch::Plugin::Demo"}`)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, 200, resp.StatusCode, string(b))
	resp, _ = c.do("GET", "/queues", "", "")
	require.Equal(t, 200, resp.StatusCode, "still serving")
}

// submit creates queue q and n tasks through the v1 API, and returns their
// ids.
func (c client) submit(user string, n int) []string {
	c.t.Helper()
	resp, body := c.do("POST", "/api/v1/queues", user, `{"name":"q","plugin":"Disbatch::Plugin::Demo"}`, "Content-Type", "application/json")
	require.Equal(c.t, 201, resp.StatusCode, body)
	tasks := strings.TrimSuffix(strings.Repeat(`{"params":{}},`, n), ",")
	resp, body = c.do("POST", "/api/v1/tasks", user, `{"queue":"q","tasks":[`+tasks+`]}`, "Content-Type", "application/json")
	require.Equal(c.t, 201, resp.StatusCode, body)
	var s struct {
		IDs []string `json:"ids"`
	}
	require.NoError(c.t, json.Unmarshal([]byte(body), &s))
	return s.IDs
}

// TestTaskControlRoles: kills, cancels and retries need write, waits read;
// the v1 and seed 002 routes alike, with the v1 error shape. The kill
// records who asked.
func TestTaskControlRoles(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{Users: users(t)})
	ids := c.submit("writer", 3)
	js := []string{"Content-Type", "application/json"}
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/api/v1/tasks/kill", `{"ids":["` + ids[0] + `"]}`},
		{"POST", "/api/v1/tasks/" + ids[0] + "/kill", ``},
		{"POST", "/api/v1/tasks/cancel", `{"ids":["` + ids[0] + `"]}`},
		{"POST", "/api/v1/tasks/" + ids[0] + "/retry", ``},
		{"PUT", "/v1/scheduler/kill?id=" + ids[0], ``},
	} {
		resp, body := c.do(r.method, r.path, "reader", r.body, js...)
		require.Equal(t, 403, resp.StatusCode, "%s %s: %s", r.method, r.path, body)
		require.Contains(t, body, `"code":"forbidden"`)
		resp, body = c.do(r.method, r.path, "", r.body, js...)
		require.Equal(t, 401, resp.StatusCode, "%s %s: %s", r.method, r.path, body)
		require.Contains(t, body, `"code":"unauthorized"`)
	}
	for _, p := range []string{"/api/v1/tasks/wait?id=" + ids[0] + "&timeout=0", "/v1/scheduler/wait?id=" + ids[0] + "&timeout=0"} {
		resp, body := c.do("GET", p, "reader", "")
		require.Equal(t, 200, resp.StatusCode, "%s: %s", p, body)
		require.Contains(t, body, `"done":false`)
		resp, _ = c.do("GET", p, "", "")
		require.Equal(t, 401, resp.StatusCode, p)
	}
	_, body := c.do("GET", "/api/v1/tasks/"+ids[0], "reader", "")
	require.Contains(t, body, `"status":-2`, "the reader changed nothing")

	resp, body := c.do("POST", "/api/v1/tasks/"+ids[0]+"/kill", "writer", `{"reason":"because"}`, js...)
	require.Equal(t, 200, resp.StatusCode, body)
	resp, body = c.do("PUT", "/v1/scheduler/kill?id="+ids[1]+","+ids[2], "boss", "")
	require.Equal(t, 200, resp.StatusCode, body)
	require.JSONEq(t, `{"requested":0,"cancelled":2,"settled":0,"skipped":[]}`, body)
	for i, by := range []string{"writer", "boss", "boss"} {
		_, body = c.do("GET", "/api/v1/tasks/"+ids[i], "reader", "")
		var task struct {
			Status int `json:"status"`
			Kill   struct {
				By string `json:"by"`
			} `json:"kill"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &task))
		require.Equal(t, 2, task.Status)
		require.Equal(t, by, task.Kill.By, body)
	}

	// Behind authentication, requests are still counted by their route.
	_, body = c.do("GET", "/metrics", "", "")
	for _, want := range []string{
		`disbatch_web_requests_total{code="200",method="POST",route="POST /api/v1/tasks/{id}/kill"} 1`,
		`disbatch_web_requests_total{code="403",method="POST",route="POST /api/v1/tasks/kill"} 1`,
		`disbatch_web_requests_total{code="200",method="PUT",route="PUT /v1/scheduler/kill"} 1`,
		`disbatch_web_requests_total{code="200",method="GET",route="GET /v1/scheduler/wait"} 1`,
		`disbatch_web_requests_total{code="201",method="POST",route="POST /api/v1/tasks"} 1`,
	} {
		require.Contains(t, body, want)
	}
}

// TestSchedulerRoutes: seed 002's routes are mounted beside the 4.103
// routes without shadowing any, and counted in the metrics.
func TestSchedulerRoutes(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{})
	ids := c.submit("", 2)

	resp, body := c.do("GET", "/v1/scheduler/wait?id="+ids[0]+"&timeout=100ms", "", "")
	require.Equal(t, 200, resp.StatusCode, body)
	require.Contains(t, body, `"done":false`)
	resp, body = c.do("PUT", "/v1/scheduler/kill?id="+ids[0]+","+ids[1]+","+ids[0], "", "")
	require.Equal(t, 200, resp.StatusCode, body)
	require.JSONEq(t, `{"requested":0,"cancelled":2,"settled":0,"skipped":[]}`, body)
	resp, body = c.do("GET", "/v1/scheduler/wait?id="+ids[0]+","+ids[1], "", "")
	require.Equal(t, 200, resp.StatusCode, body)
	require.Contains(t, body, `"done":true`)
	require.Contains(t, body, `"reason":"cancelled"`)
	resp, body = c.do("PUT", "/v1/scheduler/kill?id=nope", "", "")
	require.Equal(t, 400, resp.StatusCode, body)
	require.Contains(t, body, `"code":"invalid_parameter"`)
	resp, body = c.do("POST", "/v1/scheduler/kill?id="+ids[0], "", "")
	require.Equal(t, 405, resp.StatusCode, body)
	require.Equal(t, "PUT", resp.Header.Get("Allow"))

	// The rest of /v1/ and the 4.103 routes are 4.103's.
	resp, body = c.do("GET", "/v1/scheduler/nodes", "", "")
	require.Equal(t, 404, resp.StatusCode)
	require.Equal(t, "This is the void", body, "4.103's own 404")
	resp, body = c.do("GET", "/", "", "")
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, body, "<html")
	resp, _ = c.do("GET", "/queues", "", "")
	require.Equal(t, 200, resp.StatusCode)

	_, body = c.do("GET", "/metrics", "", "")
	for _, want := range []string{
		`disbatch_web_task_control_total{action="cancelled"} 2`,
		`disbatch_web_task_control_total{action="kill_requested"} 0`,
		`disbatch_web_task_control_total{action="requeued"} 0`,
		`disbatch_web_task_control_total{action="settled"} 0`,
		`disbatch_web_requests_total{code="200",method="PUT",route="PUT /v1/scheduler/kill"} 1`,
		`disbatch_web_requests_total{code="200",method="GET",route="GET /v1/scheduler/wait"} 2`,
	} {
		require.Contains(t, body, want)
	}
}

// TestTaskControlMetrics: every action is counted by the tasks it changed;
// a dry run counts nothing.
func TestTaskControlMetrics(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{})
	ids := c.submit("", 3)
	js := []string{"Content-Type", "application/json"}
	resp, body := c.do("POST", "/api/v1/tasks/cancel", "", `{"ids":["`+ids[0]+`","`+ids[1]+`"]}`, js...)
	require.Equal(t, 200, resp.StatusCode, body)
	resp, body = c.do("POST", "/api/v1/tasks/retry", "", `{"filter":{"queue":"q"},"dry_run":true}`, js...)
	require.Equal(t, 200, resp.StatusCode, body)
	require.Contains(t, body, `"requeued":2`)
	resp, body = c.do("POST", "/api/v1/tasks/"+ids[0]+"/retry", "", ``)
	require.Equal(t, 200, resp.StatusCode, body)
	_, body = c.do("GET", "/metrics", "", "")
	require.Contains(t, body, `disbatch_web_task_control_total{action="cancelled"} 2`)
	require.Contains(t, body, `disbatch_web_task_control_total{action="requeued"} 1`)
}

// TestDashboardRoutes: the dashboard answers / and /ui/ to anyone who may
// read; 4.103's queue browser keeps /index.html; GET /balance is the
// dashboard's editor for a browser and 4.103's JSON for everything else.
func TestDashboardRoutes(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{Users: users(t), JaegerURL: "http://jaeger.example:16686"})
	const browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
	for _, path := range []string{"/", "/ui/nodes", "/ui/tasks/0123456789abcdef01234567"} {
		resp, body := c.do("GET", path, "reader", "")
		require.Equal(t, 200, resp.StatusCode, path)
		require.Contains(t, body, `src="/ui/assets/app.js"`, path)
		require.Contains(t, body, `&#34;role&#34;:&#34;read&#34;`, path)
		require.Contains(t, body, `jaeger.example`, path)
		resp, _ = c.do("GET", path, "", "")
		require.Equal(t, 401, resp.StatusCode, "%s needs credentials", path)
	}
	resp, body := c.do("GET", "/index.html", "reader", "")
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, body, `<script src="/js/queues.js">`, "4.103's queue browser")
	resp, body = c.do("GET", "/balance", "reader", "", "Accept", browser)
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, body, `src="/ui/assets/app.js"`, "a browser gets the editor")
	require.Contains(t, body, `<h2>QueueBalancer settings</h2>`, "what 4.103's own web test looks for")
	resp, body = c.do("GET", "/balance", "reader", "")
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, body, `"known_queues"`, "curl and 4.103's CLI get JSON")
	resp, _ = c.do("POST", "/balance", "reader", `{"max_tasks":{},"queues":[]}`)
	require.Equal(t, 403, resp.StatusCode, "the balance is an admin's")
	resp, body = c.do("GET", "/ui/assets/app.js", "reader", "")
	require.Equal(t, 200, resp.StatusCode)
	require.Contains(t, body, "/api/v1/events")
	_, body = c.do("GET", "/metrics", "", "")
	require.Contains(t, body, `disbatch_web_requests_total{code="200",method="GET",route="dashboard"}`)
}
