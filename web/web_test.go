package web_test

import (
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
	resp, _ = c.do("GET", "/queues", "", "")
	require.Equal(t, 200, resp.StatusCode, "still serving")
}
