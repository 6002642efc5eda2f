package mongod

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// helperEnv tells a re-executed test binary which helper test should act.
const helperEnv = "DISBATCH_MONGOD_TEST_HELPER"

// helperReport is what a helper process prints about its replica set.
type helperReport struct {
	dir           string
	mongod        int
	watchdog      int
	watchdogAlive bool
}

func parseHelperReport(t *testing.T, out []byte) helperReport {
	t.Helper()
	var r helperReport
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		switch k {
		case "MONGOD_DIR":
			r.dir = v
		case "MONGOD_PID":
			r.mongod, _ = strconv.Atoi(v)
		case "MONGOD_WATCHDOG":
			r.watchdog, _ = strconv.Atoi(v)
		}
	}
	require.NotEmpty(t, r.dir, "no MONGOD_DIR in helper output:\n%s", out)
	require.NotZero(t, r.mongod, "no MONGOD_PID in helper output:\n%s", out)
	return r
}

// requireCleanedUp waits until the helper's mongod and watchdog are gone and
// its directory is removed.
func requireCleanedUp(t *testing.T, r helperReport, since time.Time) {
	t.Helper()
	require.NotZero(t, r.watchdog, "no watchdog")
	require.Eventually(t, func() bool { return !processAlive(r.mongod) }, 10*time.Second, 50*time.Millisecond,
		"mongod %d still running", r.mongod)
	require.Eventually(t, func() bool {
		_, err := os.Stat(r.dir)
		return os.IsNotExist(err)
	}, 10*time.Second, 50*time.Millisecond, "%s not removed", r.dir)
	require.Eventually(t, func() bool { return !processAlive(r.watchdog) }, 10*time.Second, 50*time.Millisecond,
		"watchdog %d still running", r.watchdog)
	t.Logf("mongod gone, dir removed, watchdog ended %v after the helper died", time.Since(since))
}

func helperCommand(t *testing.T, test, mode string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+mode), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	t.Cleanup(func() { t.Logf("helper stderr:\n%s", stderr.Bytes()) })
	return cmd
}

// The helper panics: Pdeathsig and the watchdog both clean up.
func TestCrashSafetyPanic(t *testing.T) {
	out, err := helperCommand(t, "TestHelperProcessPanics", "panic").Output()
	died := time.Now()
	require.Error(t, err, "helper did not fail; output:\n%s", out)
	require.Contains(t, string(out), "helper is about to panic", "output:\n%s", out)
	requireCleanedUp(t, parseHelperReport(t, out), died)
}

// The helper restarts its mongod, then is killed with SIGKILL, and its
// mongod has no Pdeathsig: the watchdog alone cleans up, and it knows the pid
// of the restarted mongod.
func TestCrashSafetySIGKILLWatchdogOnly(t *testing.T) {
	cmd := helperCommand(t, "TestHelperProcessWaitsForKill", "kill")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var out bytes.Buffer
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		fmt.Fprintln(&out, sc.Text())
		if sc.Text() == "MONGOD_READY" {
			break
		}
	}
	r := parseHelperReport(t, out.Bytes())
	require.True(t, processAlive(r.mongod))
	require.NoError(t, cmd.Process.Kill())
	err = cmd.Wait()
	died := time.Now()
	require.Error(t, err)
	requireCleanedUp(t, r, died)
}

func startHelperReplicaSet(t *testing.T, restart bool) *ReplicaSet {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs, err := StartReplicaSet(ctx, Options{})
	require.NoError(t, err)
	if restart {
		// The watchdog must kill the new process, not the first one.
		m := rs.Members()[0]
		require.NoError(t, m.Kill())
		require.NoError(t, m.Restart(ctx))
	}
	printHelperReport(rs)
	return rs
}

func printHelperReport(rs *ReplicaSet) {
	watchdog := 0
	if rs.watchdog != nil {
		watchdog = rs.watchdog.Process.Pid
	}
	fmt.Printf("MONGOD_DIR=%s\nMONGOD_PID=%d\nMONGOD_WATCHDOG=%d\n", rs.dir, rs.Members()[0].PID(), watchdog)
}

// TestHelperProcessPanics is run by TestCrashSafetyPanic in a child process;
// it does nothing otherwise.
func TestHelperProcessPanics(t *testing.T) {
	if os.Getenv(helperEnv) != "panic" {
		return
	}
	startHelperReplicaSet(t, false)
	fmt.Println("helper is about to panic")
	panic("helper panics with a running replica set")
}

// TestHelperProcessWaitsForKill is run by TestCrashSafetySIGKILLWatchdogOnly
// in a child process; it does nothing otherwise.
func TestHelperProcessWaitsForKill(t *testing.T) {
	if os.Getenv(helperEnv) != "kill" {
		return
	}
	// Leave the cleanup to the watchdog alone.
	noPdeathsig = true
	startHelperReplicaSet(t, true)
	fmt.Println("MONGOD_READY")
	// The parent kills this process; should it not, end the test.
	time.Sleep(time.Minute)
	syscall.Exit(3)
}

// The helper panics with a set on Options.Dir: Pdeathsig ends its mongod,
// the data is kept and a new start on it finds the helper's document (the
// unclean shutdown is recovered from).
func TestCrashWithDirKeepsData(t *testing.T) {
	dir := t.TempDir()
	port := freePortsT(t, 1)[0]
	out, err := helperCommand(t, "TestHelperProcessPanicsWithDir", "dir",
		dirEnv+"="+dir, portEnv+"="+strconv.Itoa(port)).Output()
	died := time.Now()
	require.Error(t, err, "helper did not fail; output:\n%s", out)
	require.Contains(t, string(out), "helper is about to panic", "output:\n%s", out)
	r := parseHelperReport(t, out)
	require.Equal(t, dir, r.dir)
	require.Zero(t, r.watchdog)
	require.Eventually(t, func() bool { return !processAlive(r.mongod) }, 10*time.Second, 50*time.Millisecond,
		"mongod %d still running", r.mongod)
	// A killed mongod's leader thread is a zombie (gone, for processAlive)
	// before its other threads have exited and its port is closed.
	require.Eventually(t, func() bool {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			_ = l.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "port %d still taken", port)
	t.Logf("mongod gone and its port free %v after the helper died", time.Since(died))
	require.FileExists(t, filepath.Join(dir, "m0", "WiredTiger"))

	rs, err := StartReplicaSet(testContext(t, time.Minute), Options{Dir: dir, Ports: []int{port}, Logger: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rs.Stop()) })
	requireKeptDocument(t, rs)
}

const (
	dirEnv  = "DISBATCH_MONGOD_TEST_DIR"
	portEnv = "DISBATCH_MONGOD_TEST_PORT"
)

// TestHelperProcessPanicsWithDir is run by TestCrashWithDirKeepsData in a
// child process; it does nothing otherwise.
func TestHelperProcessPanicsWithDir(t *testing.T) {
	if os.Getenv(helperEnv) != "dir" {
		return
	}
	port, err := strconv.Atoi(os.Getenv(portEnv))
	require.NoError(t, err)
	ctx := testContext(t, time.Minute)
	rs, err := StartReplicaSet(ctx, Options{Dir: os.Getenv(dirEnv), Ports: []int{port}})
	require.NoError(t, err)
	_, err = keptCollection(connect(t, rs)).InsertOne(ctx, bson.D{{Key: "_id", Value: "kept"}, {Key: "n", Value: 42}})
	require.NoError(t, err)
	printHelperReport(rs)
	fmt.Println("helper is about to panic")
	panic("helper panics with a running replica set on a Dir")
}
