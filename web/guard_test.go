package web_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/web"
)

func TestLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{"127.0.0.1:8080": true, "[::1]:80": true, "localhost:1": true, "127.0.0.2:80": true,
		"0.0.0.0:8080": false, "[::]:80": false, "192.168.1.2:80": false, "localhost": false} {
		require.Equal(t, want, web.Loopback(addr), addr)
	}
}

// withHost sends a request with the given Host header.
func (c client) withHost(method, path, host string) (*http.Response, string) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.url+path, nil)
	require.NoError(c.t, err)
	req.Host = host
	return c.send(req)
}

// TestALocalServerAnswersOnlyLocalHosts: without authentication on the
// loopback, a request for another Host is refused: a web page whose name
// an attacker resolves to 127.0.0.1 (DNS rebinding) is same-origin to the
// browser, and could otherwise create a shell queue and submit to it.
func TestALocalServerAnswersOnlyLocalHosts(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{LocalOnly: true})
	for _, host := range []string{"localhost:8080", "LOCALHOST", "127.0.0.1:8080", "[::1]:8080", "127.0.0.1"} {
		resp, body := c.withHost("GET", "/api/v1/queues", host)
		require.Equal(t, 200, resp.StatusCode, "%s: %s", host, body)
	}
	for _, host := range []string{"attacker.example:8080", "attacker.example", "10.0.0.1:8080", "localhost.attacker.example"} {
		resp, body := c.withHost("GET", "/api/v1/queues", host)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s: %s", host, body)
		require.Contains(t, body, `"code":"forbidden","message":"this server has no authentication`, "the v1 error shape")
		resp, body = c.withHost("GET", "/queues", host)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s: %s", host, body)
		require.Contains(t, body, `"error":"this server has no authentication`)
	}
	open := setup(t, web.Options{})
	resp, body := open.withHost("GET", "/api/v1/queues", "attacker.example:8080")
	require.Equal(t, 200, resp.StatusCode, "not asked for: %s", body)
}

// TestCrossSiteWritesAreRefused: a page of another site cannot make an
// operator's browser (which holds the credentials) change anything: not
// by a form posted to 4.103's routes, which read form bodies and query
// strings, nor by an empty POST to a v1 control route. Programs that send
// no Sec-Fetch-Site or Origin (the CLIs, curl) and the dashboard's own
// same-origin requests pass, and so do reads.
func TestCrossSiteWritesAreRefused(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{Users: users(t)})
	form := "application/x-www-form-urlencoded"
	for _, hdr := range [][]string{
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site"},
		{"Origin", "http://attacker.example"},
	} {
		resp, body := c.do("POST", "/queues", "writer", "name=x&plugin=Disbatch::Plugin::Demo", append([]string{"Content-Type", form}, hdr...)...)
		require.Equal(t, 403, resp.StatusCode, "%v: %s", hdr, body)
		require.Contains(t, body, `"error":"a cross-origin POST is refused`)
		resp, body = c.do("POST", "/api/v1/nodes/n1/drain", "boss", "", append([]string{"Content-Type", form}, hdr...)...)
		require.Equal(t, 403, resp.StatusCode, "%v: %s", hdr, body)
		require.Contains(t, body, `"code":"forbidden","message":"a cross-origin POST`, "the v1 error shape")
		resp, body = c.do("GET", "/queues", "reader", "", hdr...)
		require.Equal(t, 200, resp.StatusCode, "a read: %v: %s", hdr, body)
		require.NotContains(t, body, `"name":"x"`, "%v: the queue was made", hdr)
	}
	resp, body := c.do("PUT", "/v1/scheduler/kill?id=6b0d00000000000000000001", "writer", "", "Sec-Fetch-Site", "cross-site")
	require.Equal(t, 403, resp.StatusCode, body)
	require.Contains(t, body, `"code":"forbidden"`, "the scheduler's routes answer in the v1 shape")
	_, body = c.do("GET", "/metrics", "", "")
	require.Contains(t, body, `disbatch_web_requests_total{code="403",method="POST",route="refused"} 6`, "refusals are counted as such, not as the routes they asked for")
	resp, body = c.do("POST", "/queues", "writer", "name=cli&plugin=Disbatch::Plugin::Demo", "Content-Type", form)
	require.Equal(t, 200, resp.StatusCode, "no browser headers (a CLI): %s", body)
	resp, body = c.do("POST", "/queues", "writer", "name=dash&plugin=Disbatch::Plugin::Demo", "Content-Type", form, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, 200, resp.StatusCode, "the dashboard's own: %s", body)
	resp, body = c.do("POST", "/queues", "writer", "name=origin&plugin=Disbatch::Plugin::Demo", "Content-Type", form, "Origin", c.url)
	require.Equal(t, 200, resp.StatusCode, "an Origin that is this server: %s", body)
}

// TestATrustedOriginMayWrite: behind a plain-HTTP proxy that passes its
// own Host, a browser sends no Sec-Fetch-Site and an Origin that is not
// the Host this server sees; the origin named trusted may write, others
// may not.
func TestATrustedOriginMayWrite(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{Users: users(t), TrustedOrigins: []string{"http://disbatch.example.com"}})
	ct := []string{"Content-Type", "application/json"}
	resp, body := c.do("POST", "/api/v1/queues", "writer", `{"name":"a","plugin":"Disbatch::Plugin::Demo"}`, append(ct, "Origin", "http://disbatch.example.com")...)
	require.Equal(t, 201, resp.StatusCode, body)
	resp, body = c.do("POST", "/api/v1/queues", "writer", `{"name":"b","plugin":"Disbatch::Plugin::Demo"}`, append(ct, "Origin", "http://other.example.com")...)
	require.Equal(t, 403, resp.StatusCode, body)
	require.Contains(t, body, "--trusted-origin")
	require.NoError(t, web.CheckOrigin("https://disbatch.example.com:8443"))
	require.Error(t, web.CheckOrigin("disbatch.example.com"))
	require.Error(t, web.CheckOrigin("http://disbatch.example.com/path"))
}

// TestDotSegmentsAreRefused: the roles judge a cleaned path and 4.103's
// routes match the raw one, so "/nodes/..%2Fsearch-tasks-json" (a read
// route, once cleaned) reached the admin's node route with a read role.
func TestDotSegmentsAreRefused(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{Users: users(t)})
	for _, p := range []string{"/nodes/..%2Fsearch-tasks-json", "/queues/a%2F..%2F..%2Fsearch-tasks-json?threads=0", "/api/v1/queues/.%2Fx"} {
		resp, body := c.do("POST", p, "reader", `{"maxthreads":1}`, "Content-Type", "application/json")
		require.Equal(t, 404, resp.StatusCode, "%s: %s", p, body)
		require.Contains(t, body, "no route has a path with . or .. segments", p)
	}
	resp, body := c.do("POST", "/nodes/n1", "reader", `{"maxthreads":1}`, "Content-Type", "application/json")
	require.Equal(t, 403, resp.StatusCode, "the plain path needs admin: %s", body)
}

// TestNoAnswerMayBeFramed: every answer forbids framing (4.103's queue
// page has delete buttons: clickjacking) and sniffing; the dashboard
// keeps its own, stricter policy.
func TestNoAnswerMayBeFramed(t *testing.T) {
	t.Parallel()
	c := setup(t, web.Options{})
	for _, p := range []string{"/index.html", "/queues", "/api/v1/queues", "/"} {
		resp, _ := c.do("GET", p, "", "")
		require.Equal(t, 200, resp.StatusCode, p)
		require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"), p)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), p)
		require.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'", p)
	}
	resp, _ := c.do("GET", "/", "", "")
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src", "the dashboard's own policy")
}
