package ui_test

import (
	"context"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/web/auth"
	"github.com/disbatch-go/disbatch/web/ui"
)

func get(t *testing.T, h http.Handler, path string, ctx context.Context) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest("GET", path, nil).WithContext(ctx)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, err := io.ReadAll(rec.Result().Body)
	require.NoError(t, err)
	return rec.Result(), string(b)
}

var configRe = regexp.MustCompile(`data-config="([^"]*)"`)

func pageConfig(t *testing.T, body string) map[string]any {
	t.Helper()
	m := configRe.FindStringSubmatch(body)
	require.NotNil(t, m, "the page carries its config")
	var c map[string]any
	require.NoError(t, json.Unmarshal([]byte(html.UnescapeString(m[1])), &c))
	return c
}

func TestEveryPagePathAnswersTheShell(t *testing.T) {
	t.Parallel()
	h := ui.New(ui.Options{JaegerURL: "http://jaeger:16686"})
	for _, p := range []string{"/", "/ui/", "/ui/nodes", "/ui/queues/q%201", "/ui/tasks/0123456789abcdef01234567", "/ui/nowhere", "/balance"} {
		resp, body := get(t, h, p, context.Background())
		require.Equal(t, 200, resp.StatusCode, p)
		require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"), p)
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'self'", p)
		require.Contains(t, body, `<script src="/ui/assets/app.js" defer></script>`, p)
		c := pageConfig(t, body)
		require.Equal(t, "admin", c["role"], "authentication off: every action is allowed")
		require.Equal(t, false, c["auth"])
		require.Equal(t, "http://jaeger:16686", c["jaeger"])
	}
}

func TestThePageKnowsTheUsersRole(t *testing.T) {
	t.Parallel()
	users, err := auth.Parse(strings.NewReader(mustLine(t, "viewer", auth.RoleRead)))
	require.NoError(t, err)
	h := auth.Middleware(users, auth.RequiredRole, ui.New(ui.Options{Auth: true}))
	req := httptest.NewRequest("GET", "/", nil)
	req.SetBasicAuth("viewer", "secret")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, 200, rec.Code)
	c := pageConfig(t, rec.Body.String())
	require.Equal(t, "read", c["role"])
	require.Equal(t, "viewer", c["user"])
	require.Equal(t, true, c["auth"])

	req = httptest.NewRequest("GET", "/", nil)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, 401, rec.Code, "no credentials, no page")
}

func mustLine(t *testing.T, name string, role auth.Role) string {
	t.Helper()
	hash, err := auth.HashPassword("secret")
	require.NoError(t, err)
	return auth.Line(auth.KindUser, name, role, hash) + "\n"
}

func TestAssets(t *testing.T) {
	t.Parallel()
	h := ui.New(ui.Options{})
	for path, ct := range map[string]string{
		"/ui/assets/app.js":      "text/javascript; charset=utf-8",
		"/ui/assets/app.css":     "text/css; charset=utf-8",
		"/ui/assets/favicon.svg": "image/svg+xml",
	} {
		resp, body := get(t, h, path, context.Background())
		require.Equal(t, 200, resp.StatusCode, path)
		require.Equal(t, ct, resp.Header.Get("Content-Type"), path)
		require.NotEmpty(t, body, path)
		require.Equal(t, "no-cache", resp.Header.Get("Cache-Control"), "%s: asked again each time, so that an upgrade's takes over", path)
		etag := resp.Header.Get("ETag")
		require.NotEmpty(t, etag, path)
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("If-None-Match", etag)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusNotModified, rec.Code, "%s: unchanged, not sent again", path)
	}
	for _, path := range []string{"/ui/assets/nothing.js", "/ui/assets/index.html"} {
		resp, _ := get(t, h, path, context.Background())
		require.Equal(t, 404, resp.StatusCode, path)
	}
	// A path that climbs out of the assets is a page path, never a file.
	_, body := get(t, h, "/ui/assets/../ui.go", context.Background())
	require.NotContains(t, body, "package ui")
	require.Contains(t, body, "data-config=")
	req := httptest.NewRequest("POST", "/", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, 405, rec.Code)
}
