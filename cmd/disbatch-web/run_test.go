package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/cmdline"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/internal/syncbuf"
	"github.com/disbatch-go/disbatch/web/auth"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

func runCmd(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, env{getenv: func(string) string { return "" }, stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut})
	return code, out.String(), errOut.String()
}

func TestUsageErrorsBeforeConnecting(t *testing.T) {
	t.Parallel()
	users := filepath.Join(t.TempDir(), "users")
	require.NoError(t, os.WriteFile(users, []byte("not a line\n"), 0o600))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:8080"}, "reachable from other machines: give --users FILE (authentication) or --insecure"},
		{[]string{"--listen", "10.1.2.3:8080"}, "give --users FILE"},
		{[]string{"--listen", "nope"}, "want HOST:PORT or PORT"},
		{[]string{"--tls-cert", "x.pem"}, "--tls-cert and --tls-key go together"},
		{[]string{"--max-body-bytes", "0"}, "--max-body-bytes must be positive"},
		{[]string{"--users", users}, "--users: "},
		{[]string{"--users", filepath.Join(t.TempDir(), "missing")}, "--users: "},
		{[]string{"extra"}, "takes no arguments"},
		{[]string{"--log-format", "xml"}, "--log-format"},
		{[]string{"--mongo-uri", "http://x"}, "--mongo-uri"},
		{[]string{"--web-root", filepath.Join(t.TempDir(), "missing")}, "--web-root"},
		{[]string{"--trusted-origin", "disbatch.example.com"}, "--trusted-origin"},
		{[]string{"passwd", "alice"}, "want 2 argument(s) (NAME ROLE), got 1"},
		{[]string{"token", "a", "b", "c"}, "want 2 argument(s) (NAME ROLE), got 3"},
	} {
		code, _, stderr := runCmd(t, "", tc.args...)
		require.Equal(t, cmdline.ExitUsage, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
		require.Contains(t, stderr, "Run 'disbatch-web --help' for usage.")
	}
}

func TestPasswdAndTokenMakeLinesTheServerAccepts(t *testing.T) {
	t.Parallel()
	code, out, stderr := runCmd(t, "s3cret\n", "passwd", "alice", "write")
	require.Zero(t, code, stderr)
	require.Regexp(t, `^user alice write pbkdf2-sha256\$\d+\$\S+\$\S+\n$`, out)
	require.NotContains(t, out, "s3cret")
	userLine := out

	// The token on stderr, its line alone on stdout: "token ... >> FILE"
	// appends only the line (it appended the token too, and the server
	// then refused the file).
	code, out, stderr = runCmd(t, "", "token", "ci", "read")
	require.Zero(t, code, stderr)
	require.Regexp(t, `^token ci read sha256\$\S+\n$`, out)
	token := strings.TrimSpace(stderr)
	require.NotContains(t, token, "\n")

	users, err := auth.Parse(strings.NewReader(userLine + out))
	require.NoError(t, err)
	r, _ := http.NewRequest("GET", "/queues", nil)
	r.SetBasicAuth("alice", "s3cret")
	p, err := users.Authenticate(r)
	require.NoError(t, err)
	require.Equal(t, auth.RoleWrite, p.Role)
	r, _ = http.NewRequest("GET", "/queues", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	p, err = users.Authenticate(r)
	require.NoError(t, err)
	require.Equal(t, "ci", p.Name)

	code, _, stderr = runCmd(t, "", "passwd", "alice", "write")
	require.Equal(t, cmdline.ExitUsage, code)
	require.Contains(t, stderr, "empty password")
	code, _, stderr = runCmd(t, "x\n", "passwd", "alice", "root")
	require.Equal(t, cmdline.ExitUsage, code, stderr)
}

// TestServesAndStopsOnSignal runs the server against a real replica set:
// 4.103 routes, v1, metrics, then SIGTERM ends it (with an event stream
// open) promptly and with exit 0.
func TestServesAndStopsOnSignal(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	srv := startServer(t, servingMsg, "--mongo-uri", mongotest.URI(t), "--database", db.Name(), "--listen", "127.0.0.1:0")
	base, errOut := srv.base, srv.errOut

	get := func(path string) (int, string) {
		resp, err := http.Get(base + strings.TrimPrefix(path, "/"))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/plugins")
	require.Equal(t, 200, code)
	require.Equal(t, `["Disbatch::Plugin::Demo","exec","shell"]`, body)
	code, body = get("/api/v1/queues")
	require.Equal(t, 200, code, body)
	code, body = get("/metrics")
	require.Equal(t, 200, code)
	require.Contains(t, body, `disbatch_web_requests_total{code="200",method="GET",route="/plugins"} 1`)
	code, _ = get("/healthz")
	require.Equal(t, 200, code)

	resp, err := http.Get(base + "api/v1/events")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))

	start := time.Now()
	srv.stop(t)
	require.Less(t, time.Since(start), 10*time.Second, "an open event stream held the shutdown")
	require.Contains(t, errOut.String(), "stopped")
}

// TestUsersOverPlainHTTPElsewhereAreWarnedOf: --users on an address other
// machines reach, without TLS, sends passwords and tokens in clear; the
// server says so at start. On the loopback (a TLS proxy on this host) it
// does not.
func TestUsersOverPlainHTTPElsewhereAreWarnedOf(t *testing.T) {
	t.Parallel()
	code, line, stderr := runCmd(t, "", "token", "ci", "read")
	require.Zero(t, code, stderr)
	users := filepath.Join(t.TempDir(), "users")
	require.NoError(t, os.WriteFile(users, []byte(line), 0o600))
	const warning = "--users without TLS on an address other machines reach"
	for listen, warned := range map[string]bool{"0.0.0.0:0": true, "127.0.0.1:0": false} {
		srv := startServer(t, "listening", "--mongo-uri", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200&connectTimeoutMS=200",
			"--listen", listen, "--users", users)
		if warned {
			require.Contains(t, srv.errOut.String(), warning, listen)
		} else {
			require.NotContains(t, srv.errOut.String(), warning, listen)
		}
		srv.stop(t)
	}
}

// syncBuffer is safe for a process and a test at once.
type syncBuffer = syncbuf.Buffer

// TestHealthzWhileMongoDBIsUnreachable: the server listens at once; the
// API and /readyz answer 503 until MongoDB answers, and a signal stops it.
func TestHealthzWhileMongoDBIsUnreachable(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "listening", "--mongo-uri", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=200&connectTimeoutMS=200", "--listen", "127.0.0.1:0")
	base := srv.base
	status := func(path string) int {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, 200, status("healthz"))
	require.Equal(t, 503, status("readyz"))
	require.Equal(t, 503, status("queues"))
	// The v1 API says so in its own error shape.
	resp, err := http.Get(base + "api/v1/queues")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode)
	require.JSONEq(t, `{"error":{"code":"unavailable","message":"not ready: connecting to MongoDB; try again","field":null}}`, string(body))
	srv.stop(t)
}

// TestServesFromThe4103ConfigFile: --perl-config alone connects to the
// file's database and answers its plugins, monitoring and balance
// settings; the legacy Tasks extension turns its routes on; the rest is
// reported.
func TestServesFromThe4103ConfigFile(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	root := t.TempDir()
	require.NoError(t, os.WriteFile(root+"/index.html", []byte("<p>site page</p>"), 0o600))
	file := t.TempDir() + "/config.json"
	require.NoError(t, os.WriteFile(file, []byte(`{
		"mongohost": "`+strings.TrimPrefix(mongotest.URI(t), "mongodb://")+`", "database": "`+db.Name()+`",
		"plugins": ["Disbatch::Plugin::Demo", "Site::Plugin"],  # what queues may use
		"web_root": "`+root+`", "monitoring": 1,
		"balance": {"enabled": 0, "log": 1, "verbose": 0, "pretend": 0},
		"web_extensions": {"Disbatch::Web::Tasks": null, "Site::Web::Extra": {}},
		"views_dir": "/etc/disbatch/views/",
	}`), 0o600))
	srv := startServer(t, servingMsg, "--perl-config", file, "--listen", "127.0.0.1:0")
	base, errOut := srv.base, srv.errOut
	get := func(path string) (int, string) {
		resp, err := http.Get(base + strings.TrimPrefix(path, "/"))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	_, body := get("/plugins")
	require.Equal(t, `["Disbatch::Plugin::Demo","Site::Plugin"]`, body)
	_, body = get("/info")
	require.Contains(t, body, db.Name(), "the file's database")
	_, body = get("/index.html")
	require.Equal(t, "<p>site page</p>", body, "the file's web_root")
	_, body = get("/monitoring")
	require.NotContains(t, body, "monitoring disabled", "monitoring: 1")
	require.Contains(t, body, `"queuebalance":{"message":"queuebalance disabled"`)
	_, body = get("/balance")
	require.Contains(t, body, `"settings"`)
	require.Contains(t, body, `"verbose"`)
	code, _ := http.Post(base+"tasks/search", "application/json", strings.NewReader(`{}`))
	require.NotEqual(t, 404, code.StatusCode, "Disbatch::Web::Tasks's routes are on")
	code.Body.Close()
	logs := errOut.String()
	require.Contains(t, logs, "web_extensions not served (Perl modules; only Disbatch::Web::Tasks has Go routes): Site::Web::Extra")
	require.Contains(t, logs, "not used: views_dir")
	srv.stop(t)
}

// TestALoopbackServerAnswersOtherHostsOnlyWhenInsecure: without --users a
// loopback server answers only Hosts that name the loopback (a rebound
// name is refused), unless --insecure says a proxy in front passes its
// own Host.
func TestALoopbackServerAnswersOtherHostsOnlyWhenInsecure(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	for _, insecure := range []bool{false, true} {
		args := []string{"--mongo-uri", mongotest.URI(t), "--database", db.Name(), "--listen", "127.0.0.1:0"}
		if insecure {
			args = append(args, "--insecure")
		}
		srv := startServer(t, servingMsg, args...)
		base := srv.base
		code := func(host string) int {
			req, err := http.NewRequest("GET", base+"api/v1/queues", nil)
			require.NoError(t, err)
			req.Host = host
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			return resp.StatusCode
		}
		require.Equal(t, 200, code("localhost"), "insecure %v", insecure)
		if insecure {
			require.Equal(t, 200, code("disbatch.example.com"), "--insecure: a proxy's Host")
		} else {
			require.Equal(t, 403, code("disbatch.example.com"), "a rebound name")
		}
		srv.stop(t)
	}
}

// served is a disbatch-web run started by startServer.
type served struct {
	base   string // its URL, ending in /
	errOut *syncBuffer
	sigs   chan os.Signal
	done   chan int
}

// stop sends SIGTERM and requires that the server exits 0 within 15 s.
func (s *served) stop(t *testing.T) {
	t.Helper()
	s.sigs <- syscall.SIGTERM
	select {
	case c := <-s.done:
		require.Zero(t, c, s.errOut.String())
	case <-time.After(15 * time.Second):
		t.Fatalf("still running 15 s after SIGTERM: %s", s.errOut.String())
	}
}

// startServer runs disbatch-web with args until the test sends a signal, and
// waits for it to log msg (with its URL) first.
func startServer(t *testing.T, msg string, args ...string) *served {
	t.Helper()
	s := &served{errOut: &syncBuffer{}, sigs: make(chan os.Signal, 1), done: make(chan int, 1)}
	go func() {
		s.done <- run(context.Background(), args,
			env{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: s.errOut, signals: s.sigs})
	}()
	require.Eventually(t, func() bool {
		_, after, ok := strings.Cut(s.errOut.String(), "msg="+msg+" url=")
		if ok {
			s.base = strings.Fields(after)[0]
		}
		return ok
	}, 30*time.Second, 20*time.Millisecond, "the server did not say where it serves: %s", s.errOut.String())
	return s
}

const servingMsg = `"serving the Disbatch HTTP API"`
