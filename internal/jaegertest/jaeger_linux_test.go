package jaegertest

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStoppedAtCleanup checks that the Jaeger process and its ports are gone
// once the (sub)test that started it has ended.
func TestStoppedAtCleanup(t *testing.T) {
	var (
		pid   int
		query string
	)
	t.Run("start", func(t *testing.T) {
		j := Start(t)
		pid = j.PID()
		query = strings.TrimPrefix(j.QueryURL(), "http://")
		require.True(t, running(pid), "jaeger should be running")
	})
	require.NotZero(t, pid)
	require.False(t, running(pid), "jaeger (pid %d) still running after the subtest's cleanup", pid)
	c, err := net.DialTimeout("tcp", query, time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("something still listens on jaeger's query address %s", query)
	}
}

// TestDiesWithTestBinary SIGKILLs a test binary (this one, running
// TestOrphanChild) that has started a Jaeger and checks that the Jaeger
// goes too (Pdeathsig), with nobody left to run its cleanup.
func TestDiesWithTestBinary(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestOrphanChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "JAEGERTEST_ORPHAN=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	pid := 0
	var seen []string
	sc := bufio.NewScanner(out)
	for pid == 0 && sc.Scan() {
		line := sc.Text()
		seen = append(seen, line)
		if v, ok := strings.CutPrefix(line, "JAEGER_PID="); ok {
			pid, err = strconv.Atoi(v)
			require.NoError(t, err)
		}
	}
	require.NotZero(t, pid, "the child printed no JAEGER_PID; its output:\n%s", strings.Join(seen, "\n"))
	require.True(t, running(pid))

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for running(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("jaeger (pid %d) still running 10 s after its test binary was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOrphanChild is the child of TestDiesWithTestBinary: it starts a Jaeger,
// says its pid and waits to be killed.
func TestOrphanChild(t *testing.T) {
	if os.Getenv("JAEGERTEST_ORPHAN") != "1" {
		return // run by TestDiesWithTestBinary only
	}
	j := Start(t)
	fmt.Printf("JAEGER_PID=%d\n", j.PID())
	time.Sleep(time.Minute)
	t.Fatal("not killed within a minute")
}

// TestRetriesTakenPort gives Start a port that is already taken, once, and
// checks that it starts Jaeger again on other ports.
func TestRetriesTakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port

	calls := 0
	pickPorts = func(n int) ([]int, error) {
		calls++
		ports, err := freePorts(n)
		if err == nil && calls == 1 {
			ports[2] = taken // the query HTTP port
		}
		return ports, err
	}
	t.Cleanup(func() { pickPorts = freePorts })

	j := Start(t)
	require.Equal(t, 2, calls)
	require.NotEqual(t, "http://"+l.Addr().String(), j.QueryURL())
	_, err = j.Services(t.Context())
	require.NoError(t, err)
}

// TestOnlyLoopback checks, from /proc, that every socket the Jaeger process
// listens on is bound to 127.0.0.1.
func TestOnlyLoopback(t *testing.T) {
	j := Start(t)
	listening := listenAddrs(t, j.PID())
	want := []string{j.OTLPGRPCEndpoint(), strings.TrimPrefix(j.OTLPHTTPEndpoint(), "http://"), strings.TrimPrefix(j.QueryURL(), "http://")}
	for _, w := range want {
		require.Contains(t, listening, w)
	}
	for _, a := range listening {
		host, _, err := net.SplitHostPort(a)
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1", host, "jaeger listens on %s (all: %v)", a, listening)
	}
	t.Logf("jaeger listens on %v", listening)
}

// running reports whether process pid exists and is not a zombie (an
// orphan's zombie may wait for a reaper that never comes in a container).
func running(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may contain spaces, so look after the ')'.
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || !strings.HasPrefix(string(stat[i+1:]), " Z")
}

// listenAddrs returns the TCP addresses (host:port) that process pid has
// listening sockets on, from /proc.
func listenAddrs(t *testing.T, pid int) []string {
	t.Helper()
	inodes := map[string]bool{}
	fdDir := "/proc/" + strconv.Itoa(pid) + "/fd"
	fds, err := os.ReadDir(fdDir)
	require.NoError(t, err)
	for _, fd := range fds {
		link, err := os.Readlink(fdDir + "/" + fd.Name())
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var out []string
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) && file == "/proc/net/tcp6" {
			continue // no IPv6
		}
		require.NoError(t, err)
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] { // 0A: LISTEN
				continue
			}
			out = append(out, procAddr(t, f[1]))
		}
	}
	slices.Sort(out)
	return out
}

// procAddr turns a /proc/net/tcp{,6} address ("0100007F:1F90": the IP as
// 32-bit words in host byte order, little-endian here, then the port) into
// host:port.
func procAddr(t *testing.T, s string) string {
	t.Helper()
	hexIP, hexPort, ok := strings.Cut(s, ":")
	require.True(t, ok, s)
	raw, err := hex.DecodeString(hexIP)
	require.NoError(t, err, s)
	require.Zero(t, len(raw)%4, s)
	ip := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		ip[i], ip[i+1], ip[i+2], ip[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	require.NoError(t, err, s)
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10))
}
