package httpserver_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/httpserver"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/internal/lifecycle/lifecycletest"
)

func get(t *testing.T, url string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestHealthReadinessAndTheHandler(t *testing.T) {
	var ready atomic.Bool
	s := httpserver.New(httpserver.Config{
		Name: "test", Addr: "127.0.0.1:0", Ready: ready.Load, NotReady: "not yet",
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "handled "+r.URL.Path) }),
	})
	require.NoError(t, s.Start(context.Background()))
	defer s.Stop()
	base := "http://" + s.Addr()
	code, body := get(t, base+"/healthz", nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	code, body = get(t, base+"/readyz", nil)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "not yet\n", body)
	ready.Store(true)
	code, body = get(t, base+"/readyz", nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ready\n", body)
	code, body = get(t, base+"/anything/else", nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "handled /anything/else", body)
}

func TestLimitsAndTimeouts(t *testing.T) {
	s := httpserver.New(httpserver.Config{
		Name: "test", Addr: "127.0.0.1:0", ReadHeaderTimeout: 200 * time.Millisecond, MaxHeaderBytes: 4 << 10,
		Handler: http.NotFoundHandler(),
	})
	require.NoError(t, s.Start(context.Background()))
	defer s.Stop()

	// Headers over the limit: 431.
	code, _ := get(t, "http://"+s.Addr()+"/healthz", http.Header{"X-Big": {strings.Repeat("x", 64<<10)}})
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, code)

	// A client that never finishes its headers is cut off.
	conn, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n"))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	start := time.Now()
	_, err = io.ReadAll(conn)
	require.NoError(t, err, "the server closes the connection (EOF), it does not wait for ever")
	require.Less(t, time.Since(start), 4*time.Second)
}

func TestListenAddr(t *testing.T) {
	got, err := httpserver.ListenAddr("web address", "8080")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8080", got)
	_, err = httpserver.ListenAddr("web address", "host:http")
	require.EqualError(t, err, `web address "host:http": the port must be a number from 0 to 65535`)
}

func TestStartFailsOnABusyAddress(t *testing.T) {
	a := httpserver.New(httpserver.Config{Name: "first", Addr: "127.0.0.1:0"})
	require.NoError(t, a.Start(context.Background()))
	defer a.Stop()
	b := httpserver.New(httpserver.Config{Name: "second", Addr: a.Addr()})
	require.ErrorContains(t, b.Start(context.Background()), "second: listen tcp")
	b.Stop()
}

func TestServerLifecycle(t *testing.T) {
	lifecycletest.Check(t, func(*testing.T) lifecycle.Service {
		return httpserver.New(httpserver.Config{Name: "test", Addr: "127.0.0.1:0"})
	}, lifecycletest.Options{})
}
