package integration

// The harness: TestMain builds disbatchd and disbatch once; helpers run them
// as real processes and watch their logs and the database.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/internal/syncbuf"
	"github.com/disbatch-go/disbatch/supervisor"
)

// Paths of the binaries TestMain builds.
var (
	disbatchdBin string
	disbatchBin  string
)

// raceBuild is set (race_test.go) when the test binary has the race
// detector; the binaries under test get it too.
var raceBuild bool

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	flag.Parse() // for testing.Verbose
	dir, err := os.MkdirTemp("", "disbatch-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	stateRoot = filepath.Join(dir, "st")
	begin := time.Now()
	if err := buildBinaries(dir); err != nil {
		fmt.Fprintln(os.Stderr, "integration: building the binaries:", err)
		return 1
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "integration: built disbatchd and disbatch (race=%v) in %v\n", raceBuild, time.Since(begin).Round(time.Millisecond))
	}
	return mongotest.Main(m)
}

// buildBinaries builds ./cmd/disbatchd and ./cmd/disbatch into dir.
func buildBinaries(dir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, goCmd, "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return errors.New("not inside the module (go env GOMOD is empty)")
	}
	root := filepath.Dir(gomod)
	disbatchdBin = filepath.Join(dir, "disbatchd")
	disbatchBin = filepath.Join(dir, "disbatch")
	// disbatch-supervisor beside disbatchd: the node runs it (the small
	// supervisor); a copy of disbatchd elsewhere supervises itself.
	supervisorBin := filepath.Join(dir, "disbatch-supervisor")
	for bin, pkg := range map[string]string{disbatchdBin: "./cmd/disbatchd", disbatchBin: "./cmd/disbatch", supervisorBin: "./cmd/disbatch-supervisor"} {
		args := []string{"build", "-o", bin}
		if raceBuild {
			args = append(args, "-race")
		}
		cmd := exec.CommandContext(ctx, goCmd, append(args, pkg)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %w\n%s", strings.Join(cmd.Args[1:], " "), err, out)
		}
	}
	return nil
}

// childEnv is this process's environment without the DISBATCH_ settings,
// plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DISBATCH_") {
			env = append(env, kv)
		}
	}
	// The race runtime sleeps 1 s at exit (to catch late reports); that
	// would hide how fast the binaries stop.
	if os.Getenv("GORACE") == "" {
		env = append(env, "GORACE=atexit_sleep_ms=100")
	}
	return append(env, extra...)
}

// syncBuffer is safe for a process and a test at once.
type syncBuffer = syncbuf.Buffer

// proc is a running disbatchd.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	log    *syncBuffer // stderr: the logs
	stdout *syncBuffer
	done   chan struct{} // closed when the process has exited
	err    error         // cmd.Wait's error, once done is closed
}

// startNode starts disbatchd with args and extra environment. The process
// is killed (if still running) when the test ends, and its log is printed
// if the test failed.
//
// Unless args name one, the node gets a --state-dir of its own for the
// test and its node name, the same across its restarts in the test (so
// they adopt its supervised tasks) and never another test's; the
// supervisors left in it are terminated when the test ends.
func startNode(t *testing.T, args []string, env ...string) *proc {
	t.Helper()
	return startProc(t, disbatchdBin, withStateDir(t, args), env...)
}

// stateRoot holds the nodes' state directories (made by testMain).
var stateRoot string

func withStateDir(t *testing.T, args []string) []string {
	t.Helper()
	name := "default"
	for i, a := range args {
		if a == "--state-dir" || strings.HasPrefix(a, "--state-dir=") {
			return args
		}
		if a == "--node" && i+1 < len(args) {
			name = args[i+1]
		} else if v, ok := strings.CutPrefix(a, "--node="); ok {
			name = v
		}
	}
	testDir := testStateDir(t)
	dir := filepath.Join(testDir, fmt.Sprintf("%08x", fnvString(name)))
	if _, err := os.Stat(testDir); os.IsNotExist(err) {
		require.NoError(t, os.MkdirAll(testDir, 0o700))
		t.Cleanup(func() { terminateSupervisors(testDir) })
	}
	return append(append([]string{}, args...), "--state-dir", dir)
}

// testStateDir holds the state directories of the test's nodes.
func testStateDir(t *testing.T) string {
	return filepath.Join(stateRoot, fmt.Sprintf("%08x", fnvString(t.Name())))
}

func fnvString(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

// terminateSupervisors sends SIGTERM to every supervisor whose command
// line names dir (they kill their tasks' process groups and exit).
func terminateSupervisors(dir string) {
	for _, pid := range supervisor.PIDs(dir) {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
}

// startProc starts the binary bin (named in logs by its base name) as
// startNode describes.
func startProc(t *testing.T, bin string, args []string, env ...string) *proc {
	t.Helper()
	name := filepath.Base(bin)
	p := &proc{t: t, log: &syncBuffer{}, stdout: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = childEnv(env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.log
	p.cmd.WaitDelay = 5 * time.Second
	p.cmd.SysProcAttr = childSysProcAttr()
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s %s log:\n%s", name, strings.Join(args, " "), p.log.String())
		}
		if strings.Contains(p.log.String(), "DATA RACE") {
			t.Errorf("%s %s reported a data race:\n%s", name, strings.Join(args, " "), p.log.String())
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitLog waits until the log contains s, failing the test after timeout or
// if the process exits first.
func (p *proc) waitLog(s string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if strings.Contains(p.log.String(), s) {
			return
		}
		if p.exited() {
			// One last look: the output is complete now.
			if strings.Contains(p.log.String(), s) {
				return
			}
			p.t.Fatalf("disbatchd exited (%v) before logging %q", p.err, s)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("disbatchd did not log %q within %v", s, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *proc) signal(sig os.Signal) {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig), "signal %v", sig)
}

// wait waits up to timeout for the process to exit and returns its exit code;
// it fails the test on timeout.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("disbatchd still running %v later", timeout)
	}
	return exitCode(p.t, p.cmd, p.err)
}

func exitCode(t *testing.T, cmd *exec.Cmd, err error) int {
	t.Helper()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%s: %v", cmd.Path, err)
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ok && ws.Signaled() {
		t.Fatalf("%s was killed by %v", cmd.Path, ws.Signal())
	}
	return cmd.ProcessState.ExitCode()
}

// result is how a short-lived process ended.
type result struct {
	stdout, stderr string
	code           int
}

// runBin runs bin to completion (at most 30 s) with stdin and extra env.
func runBin(t *testing.T, bin, stdin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = childEnv(env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = childSysProcAttr()
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s did not finish within 30s; stderr:\n%s", filepath.Base(bin), strings.Join(args, " "), stderr.String())
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: exitCode(t, cmd, err)}
}

// cli runs the disbatch CLI against uri and database db and requires success.
func cli(t *testing.T, uri, db, stdin string, args ...string) string {
	t.Helper()
	// A loaded CI machine (the suite runs in parallel, under -race) once
	// kept the CLI's first round trip past its 5 s: it may wait longer.
	sep := "?"
	if strings.Contains(uri, "?") {
		sep = "&"
	}
	if !strings.Contains(uri, "serverSelectionTimeoutMS") {
		uri += sep + "serverSelectionTimeoutMS=30000"
	}
	args = append([]string{"--mongo-uri", uri, "--database", db}, args...)
	r := runBin(t, disbatchBin, stdin, nil, args...)
	require.Zero(t, r.code, "disbatch %s: stdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.stdout, r.stderr)
	return r.stdout
}

// task is the part of a tasks document the tests look at.
type task struct {
	ID         bson.ObjectID `bson:"_id"`
	Status     int           `bson:"status"`
	Node       bson.RawValue `bson:"node"`
	Stdout     bson.RawValue `bson:"stdout"`
	Stderr     bson.RawValue `bson:"stderr"`
	Parameters bson.M        `bson:"parameters"`
}

// node is the node name, or "-1" / "null" for an unclaimed task.
func (t task) node() string {
	switch t.Node.Type {
	case bson.TypeString:
		return t.Node.StringValue()
	case bson.TypeNull, 0:
		return "null"
	}
	if n, ok := t.Node.AsInt64OK(); ok {
		return fmt.Sprint(n)
	}
	if f, ok := t.Node.DoubleOK(); ok {
		return fmt.Sprint(f)
	}
	return t.Node.String()
}

func rawString(v bson.RawValue) string {
	s, _ := v.StringValueOK()
	return s
}

func (t task) stdout() string { return rawString(t.Stdout) }
func (t task) stderr() string { return rawString(t.Stderr) }

// tasks returns every task of the database, oldest first.
func tasks(t *testing.T, db *mongo.Database) []task {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cur, err := db.Collection("tasks").Find(ctx, bson.D{})
	require.NoError(t, err)
	var out []task
	require.NoError(t, cur.All(ctx, &out))
	return out
}

// waitTasks polls the tasks until done says they are as wanted, failing the
// test after timeout with what it saw last.
func waitTasks(t *testing.T, db *mongo.Database, timeout time.Duration, what string, done func([]task) bool) []task {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ts := tasks(t, db)
		if done(ts) {
			return ts
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not so within %v; tasks: %s", what, timeout, describe(ts))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func describe(ts []task) string {
	var b strings.Builder
	for _, x := range ts {
		fmt.Fprintf(&b, "\n  %s status=%d node=%s stdout=%q stderr=%q", x.ID.Hex(), x.Status, x.node(), x.stdout(), x.stderr())
	}
	return b.String()
}

func countStatus(ts []task, pred func(task) bool) int {
	n := 0
	for _, x := range ts {
		if pred(x) {
			n++
		}
	}
	return n
}

func allFinished(ts []task) bool {
	return countStatus(ts, func(x task) bool { return x.Status > 0 }) == len(ts)
}

// freePort returns a loopback TCP port that nothing listened on a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

// nodeArgs are the connection flags for the shared replica set and this
// test's own database, and a node name.
func nodeArgs(uri, db, name string, more ...string) []string {
	return append([]string{"--mongo-uri", uri, "--database", db, "--node", name}, more...)
}
