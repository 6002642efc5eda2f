package integration

// disbatchd and disbatch as real processes against a real MongoDB.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/internal/mongod"
	"github.com/disbatch-go/disbatch/internal/mongotest"
)

const (
	demo      = "Disbatch::Plugin::Demo"
	apple     = "This is command 'a' for apple.\n"
	startWait = 30 * time.Second // a node (race-instrumented, 2 CPUs) up and claiming
)

// jsonLines encodes each item as one JSON line, for `disbatch task submit`.
func jsonLines(t *testing.T, items ...any) string {
	t.Helper()
	var b strings.Builder
	for _, it := range items {
		j, err := json.Marshal(it)
		require.NoError(t, err)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

func TestNodeRunsTasksSubmittedWithTheCLI(t *testing.T) {
	t.Parallel()
	uri, db := mongotest.URI(t), mongotest.Database(t)
	out := cli(t, uri, db.Name(), "", "queue", "create", "demo", "--constructor", demo, "--maxthreads", "2", "--sort", "fifo")
	require.Contains(t, out, "created queue demo")

	commands := func(i int) string {
		if i%4 == 3 {
			return "abc"
		}
		return "a"
	}
	submit := func(from, to int) {
		var items []any
		for i := from; i < to; i++ {
			items = append(items, map[string]string{"commands": commands(i)})
		}
		out := cli(t, uri, db.Name(), jsonLines(t, items...), "task", "submit", "demo")
		require.Contains(t, out, fmt.Sprintf("submitted %d tasks to queue demo", to-from))
	}

	submit(0, 10) // before the node starts: found by its first claim
	n := startNode(t, nodeArgs(uri, db.Name(), "n1", "--claim-batch", "16"))
	n.waitLog("node started", startWait)
	require.Contains(t, n.log.String(), `wake_ups="change streams"`)
	require.Contains(t, n.log.String(), `claim_batch=16`, "the node's start line gives the --claim-batch it was passed")
	submit(10, 20) // while it runs: found through the change stream

	ts := waitTasks(t, db, 30*time.Second, "20 tasks finished", func(ts []task) bool { return len(ts) == 20 && allFinished(ts) })
	apples, cries := 0, 0
	for _, x := range ts {
		assert.Equal(t, "n1", x.node(), "task %s", x.ID.Hex())
		assert.Equal(t, apple, x.stdout(), "task %s", x.ID.Hex())
		switch x.Parameters["commands"] {
		case "a":
			apples++
			assert.Equal(t, 1, x.Status, "task %s", x.ID.Hex())
			assert.Empty(t, x.stderr(), "task %s", x.ID.Hex())
		case "abc":
			cries++
			assert.Equal(t, 2, x.Status, "task %s", x.ID.Hex())
			assert.Equal(t, "This is command 'b' for banana.\nThis is command 'c' for cry.\n", x.stderr(), "task %s", x.ID.Hex())
		default:
			t.Errorf("task %s has parameters %v", x.ID.Hex(), x.Parameters)
		}
	}
	assert.Equal(t, 15, apples)
	assert.Equal(t, 5, cries)

	// The node announces itself in the nodes collection.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var nodeDoc bson.M
	require.NoError(t, db.Collection("nodes").FindOne(ctx, bson.D{{Key: "node", Value: "n1"}}).Decode(&nodeDoc))
	require.Contains(t, nodeDoc, "timestamp")

	// The CLI sees the results too.
	listing := cli(t, uri, db.Name(), "", "task", "list", "demo", "--json")
	require.Contains(t, listing, ts[0].ID.Hex())

	n.signal(syscall.SIGTERM)
	require.Zero(t, n.wait(15*time.Second))
	require.Contains(t, n.log.String(), "node stopped")

	// A clean stop leaves none of the node's change streams open on the
	// server (they would stay there for ten minutes).
	require.Eventually(t, func() bool { return len(mongotest.ChangeStreamCursors(t, db)) == 0 }, 30*time.Second, 20*time.Millisecond,
		"change stream cursors left open: %v", mongotest.ChangeStreamCursors(t, db))
	// Every line names the node once.
	for _, line := range strings.Split(strings.TrimSpace(n.log.String()), "\n") {
		require.Equal(t, 1, strings.Count(line, " node=n1"), "%s", line)
	}
	// Go's collector runs at disbatchd's target (internal/gctarget),
	// unless this environment set one.
	if os.Getenv("GOGC") == "" {
		require.Contains(t, n.log.String(), "gogc=200 from_environment=false")
	}
}

// sleepers creates a shell queue "sleepers" with maxthreads 2 and count
// tasks that record their pid in dir (as dir/<task id>.pid) and sleep 30 s.
func sleepers(t *testing.T, uri, db, dir string, count int) {
	t.Helper()
	cli(t, uri, db, "", "queue", "create", "sleepers", "--constructor", "shell", "--maxthreads", "2", "--sort", "fifo")
	command := fmt.Sprintf(`echo $$ > %s/$DISBATCH_TASK_ID.pid; exec sleep 30`, dir)
	var items []any
	for range count {
		items = append(items, map[string]string{"command": command})
	}
	cli(t, uri, db, jsonLines(t, items...), "task", "submit", "sleepers")
}

// twoRunning waits until two tasks run (status 0 and their command started)
// and returns them with their commands' pids. The commands are killed when
// the test ends, if still alive.
func twoRunning(t *testing.T, db *mongo.Database, dir string) (running map[bson.ObjectID]int) {
	t.Helper()
	ts := waitTasks(t, db, startWait, "two tasks running", func(ts []task) bool {
		return countStatus(ts, func(x task) bool { return x.Status == 0 }) == 2
	})
	running = map[bson.ObjectID]int{}
	deadline := time.Now().Add(15 * time.Second)
	for _, x := range ts {
		if x.Status != 0 {
			continue
		}
		for {
			b, err := os.ReadFile(filepath.Join(dir, x.ID.Hex()+".pid"))
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 0 {
				running[x.ID] = pid
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the command of running task %s did not write its pid", x.ID.Hex())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Cleanup(func() {
		for _, pid := range running {
			if alive(pid) {
				_ = syscall.Kill(-pid, syscall.SIGKILL) // its own process group
			}
		}
	})
	return running
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

func TestSIGTERMKillsRunningTasksAfterGrace(t *testing.T) {
	t.Parallel()
	uri, db := mongotest.URI(t), mongotest.Database(t)
	dir := t.TempDir()
	sleepers(t, uri, db.Name(), dir, 6)
	// In-process plugins (Demo, Go) die with the node after the grace;
	// supervised ones are left running (TestRestartKeepsSupervisedTasks):
	// here shell runs in-process.
	n := startNode(t, nodeArgs(uri, db.Name(), "n", "--enable-plugin", "shell", "--grace", "1s", "--supervise=false"))
	running := twoRunning(t, db, dir)

	begin := time.Now()
	n.signal(syscall.SIGTERM)
	code := n.wait(15 * time.Second)
	took := time.Since(begin)
	t.Logf("exited %d, %v after SIGTERM", code, took)
	require.Zero(t, code)
	require.Less(t, took, 6*time.Second, "grace is 1s")
	require.GreaterOrEqual(t, took, time.Second, "exited before the grace period ended")
	log := n.log.String()
	require.Contains(t, log, "signal received: stopping")
	require.Contains(t, log, "grace period expired: killing running tasks")
	require.Contains(t, log, "node stopped")

	ts := tasks(t, db)
	require.Len(t, ts, 6)
	for _, x := range ts {
		if _, ok := running[x.ID]; ok {
			assert.Equal(t, 2, x.Status, "running task %s", x.ID.Hex())
			assert.Equal(t, "n", x.node(), "running task %s", x.ID.Hex())
			assert.Contains(t, x.stderr(), "grace period", "running task %s", x.ID.Hex())
			continue
		}
		assert.Equal(t, -2, x.Status, "queued task %s", x.ID.Hex())
		assert.Equal(t, "-1", x.node(), "queued task %s", x.ID.Hex())
	}
	require.Zero(t, countStatus(ts, func(x task) bool { return x.node() == "n" && (x.Status == -1 || x.Status == 0) }),
		"tasks left claimed or running by the stopped node: %s", describe(ts))
	// The commands (sleep 30) were killed, not left behind.
	requireDead(t, running)
}

func TestSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	uri, db := mongotest.URI(t), mongotest.Database(t)
	dir := t.TempDir()
	sleepers(t, uri, db.Name(), dir, 4)
	n := startNode(t, nodeArgs(uri, db.Name(), "n", "--enable-plugin", "shell", "--grace", "60s"))
	running := twoRunning(t, db, dir)

	n.signal(syscall.SIGTERM)
	n.waitLog("signal received: stopping", 10*time.Second)
	// Still waiting for the grace period.
	time.Sleep(200 * time.Millisecond)
	require.False(t, n.exited(), "exited after one signal although the tasks run for 30s and grace is 60s")

	begin := time.Now()
	n.signal(syscall.SIGINT)
	code := n.wait(20 * time.Second)
	took := time.Since(begin)
	t.Logf("exited %d, %v after the second signal", code, took)
	require.NotZero(t, code)
	// Not even a graceful disconnect, which waits for operations in
	// flight: at once is well within the grace (60 s) and the 5 s a
	// disconnect may take; Kill itself waits at most 1.5 s, and a loaded
	// machine adds its scheduling.
	require.Less(t, took, 4*time.Second, "a second signal must exit at once")
	require.Contains(t, n.log.String(), "second signal: killing running tasks and exiting at once")
	// The commands die with the node: nothing it ran outlives it.
	requireDead(t, running)
}

// requireDead waits up to 3 s for each task's command to be gone.
func requireDead(t *testing.T, running map[bson.ObjectID]int) {
	t.Helper()
	for id, pid := range running {
		deadline := time.Now().Add(3 * time.Second)
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("the command of task %s (pid %d) outlived the node", id.Hex(), pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func TestExecAndShellAreOffByDefault(t *testing.T) {
	t.Parallel()
	uri, db := mongotest.URI(t), mongotest.Database(t)
	cli(t, uri, db.Name(), "", "queue", "create", "sh", "--constructor", "shell")
	cli(t, uri, db.Name(), "", "queue", "create", "ex", "--constructor", "exec")
	cli(t, uri, db.Name(), jsonLines(t, map[string]any{"command": "echo hello from shell"}), "task", "submit", "sh")
	cli(t, uri, db.Name(), jsonLines(t, map[string]any{"command": "echo", "args": []string{"hello", "from", "exec"}}), "task", "submit", "ex")

	off := startNode(t, nodeArgs(uri, db.Name(), "off", "--tick", "100ms"))
	off.waitLog("node started", startWait)
	off.waitLog("no plugin for constructor shell on this node (start it with --enable-plugin shell", 5*time.Second)
	off.waitLog("no plugin for constructor exec", 5*time.Second)
	time.Sleep(time.Second) // ten ticks
	ts := tasks(t, db)
	require.Len(t, ts, 2)
	for _, x := range ts {
		require.Equal(t, -2, x.Status, "task %s ran without the plugin enabled: %s", x.ID.Hex(), describe(ts))
		require.Equal(t, "-1", x.node(), "task %s", x.ID.Hex())
	}
	off.signal(syscall.SIGTERM)
	require.Zero(t, off.wait(15*time.Second))

	on := startNode(t, nodeArgs(uri, db.Name(), "on", "--enable-plugin", "shell,exec"))
	ts = waitTasks(t, db, startWait, "both tasks finished", allFinished)
	got := map[string]bool{}
	for _, x := range ts {
		assert.Equal(t, 1, x.Status, "task %s: %s", x.ID.Hex(), x.stderr())
		assert.Equal(t, "on", x.node())
		got[x.stdout()] = true
	}
	require.Equal(t, map[string]bool{"hello from shell\n": true, "hello from exec\n": true}, got)
	on.signal(syscall.SIGTERM)
	require.Zero(t, on.wait(15*time.Second))
}

func TestExternalPlugin(t *testing.T) {
	t.Parallel()
	uri, db := mongotest.URI(t), mongotest.Database(t)
	dir := t.TempDir()
	// The plugin keeps what it read next to itself, and answers.
	script := "#!/bin/sh\ncat > \"$0.input\"\nprintf '%s\\n' '{\"status\":1,\"stdout\":\"got it\",\"stderr\":\"\"}'\n"
	src, plugin := filepath.Join(dir, "plugin.src"), filepath.Join(dir, "my-plugin")
	require.NoError(t, os.WriteFile(src, []byte(script), 0o755))
	// Copied by a child process: a file this process wrote can still be open
	// for writing in a child forked meanwhile (ETXTBSY on exec).
	out, err := exec.Command("cp", src, plugin).CombinedOutput()
	require.NoError(t, err, "cp: %s", out)

	cli(t, uri, db.Name(), "", "queue", "create", "ext", "--constructor", "My::Plugin")
	cli(t, uri, db.Name(), jsonLines(t, map[string]any{"x": "y", "n": 7}), "task", "submit", "ext")
	n := startNode(t, nodeArgs(uri, db.Name(), "n", "--plugin", "My::Plugin="+plugin))

	ts := waitTasks(t, db, startWait, "the task finished", func(ts []task) bool { return len(ts) == 1 && allFinished(ts) })
	x := ts[0]
	require.Equal(t, 1, x.Status, "stderr: %s", x.stderr())
	require.Equal(t, "got it", x.stdout())
	require.Empty(t, x.stderr())

	b, err := os.ReadFile(plugin + ".input")
	require.NoError(t, err)
	var in struct {
		ID, Queue, Constructor, Node string
		Parameters                   map[string]any
	}
	require.NoError(t, json.Unmarshal(b, &in), "%s", b)
	require.Equal(t, x.ID.Hex(), in.ID)
	require.Equal(t, "ext", in.Queue)
	require.Equal(t, "My::Plugin", in.Constructor)
	require.Equal(t, "n", in.Node)
	require.Equal(t, "y", in.Parameters["x"])
	require.EqualValues(t, 7, in.Parameters["n"])

	n.signal(syscall.SIGTERM)
	require.Zero(t, n.wait(15*time.Second))
}

// TestStandaloneMongodPolls starts disbatchd before its (standalone) mongod:
// it retries until mongod answers, then warns that it has to poll, and still
// runs tasks within about a tick.
func TestStandaloneMongodPolls(t *testing.T) {
	t.Parallel()
	bin, err := mongod.Binary()
	require.NoError(t, err)
	dbName := mongotest.Database(t).Name()
	dbpath := t.TempDir()
	port := freePort(t)
	uri := fmt.Sprintf("mongodb://127.0.0.1:%d/", port)

	n := startNode(t, nodeArgs(uri, dbName, "solo"))
	n.waitLog("cannot connect to MongoDB; retrying", 20*time.Second)

	mongodLog := &syncBuffer{}
	m := exec.Command(bin, "--port", strconv.Itoa(port), "--bind_ip", "127.0.0.1", "--dbpath", dbpath, "--nounixsocket",
		"--wiredTigerCacheSizeGB", "0.25", "--setParameter", "diagnosticDataCollectionEnabled=false")
	m.Stdout, m.Stderr = mongodLog, mongodLog
	m.SysProcAttr = childSysProcAttr()
	require.NoError(t, m.Start())
	mongodDone := make(chan struct{})
	go func() { _ = m.Wait(); close(mongodDone) }()
	t.Cleanup(func() { // before TempDir's removal of dbpath
		_ = m.Process.Kill()
		<-mongodDone
		if t.Failed() {
			t.Logf("mongod log:\n%s", mongodLog.String())
		}
	})

	n.waitLog("connected to MongoDB", 45*time.Second)
	n.waitLog("node started", startWait)
	log := n.log.String()
	require.Contains(t, log, "not a replica set, so it has no change streams: polling every tick instead")
	require.Contains(t, log, `wake_ups="poll only"`)

	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	db := client.Database(dbName)

	cli(t, uri, dbName, "", "queue", "create", "demo", "--constructor", demo)
	n.waitLog("queue served", 5*time.Second)
	cli(t, uri, dbName, jsonLines(t, map[string]string{"commands": "a"}), "task", "submit", "demo")
	begin := time.Now()
	ts := waitTasks(t, db, 10*time.Second, "the task finished", func(ts []task) bool { return len(ts) == 1 && allFinished(ts) })
	took := time.Since(begin)
	t.Logf("task finished %v after it was submitted", took)
	require.Less(t, took, 6*time.Second, "the tick is 1 s: within a few ticks, on a loaded machine too")
	require.Equal(t, 1, ts[0].Status)
	require.Equal(t, apple, ts[0].stdout())
	require.Equal(t, "solo", ts[0].node())

	n.signal(syscall.SIGTERM)
	require.Zero(t, n.wait(15*time.Second))
}

func TestConnectionRetriesHidePassword(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	// Short timeouts in the URI (it is the operator's to set) keep attempts quick.
	uri := fmt.Sprintf("mongodb://u:secret@127.0.0.1:%d/?serverSelectionTimeoutMS=300&connectTimeoutMS=300", port)
	n := startNode(t, nodeArgs(uri, "whatever", "n"))
	n.waitLog("attempt=3", 30*time.Second)

	lines := regexp.MustCompile(`(?m)^.*cannot connect to MongoDB; retrying.*$`).FindAllString(n.log.String(), -1)
	require.GreaterOrEqual(t, len(lines), 3)
	for i, l := range lines[:3] {
		require.Contains(t, l, fmt.Sprintf("attempt=%d ", i+1))
		require.Contains(t, l, fmt.Sprintf("mongodb://u:xxxxx@127.0.0.1:%d/", port))
	}

	begin := time.Now()
	n.signal(syscall.SIGTERM)
	code := n.wait(10 * time.Second)
	took := time.Since(begin)
	t.Logf("exited %d, %v after SIGTERM", code, took)
	require.Less(t, took, 2*time.Second, "not after the retries' next wait")
	require.Zero(t, code, "stopped by SIGTERM while connecting")
	require.Contains(t, n.log.String(), "signal received before MongoDB answered")
	require.NotContains(t, n.log.String(), "secret")
	require.NotContains(t, n.stdout.String(), "secret")
}

func TestConfigFile(t *testing.T) {
	t.Parallel()
	uri, db := mongotest.URI(t), mongotest.Database(t)
	config := filepath.Join(t.TempDir(), "disbatchd.json")
	b, err := json.Marshal(map[string]any{
		"mongo_uri": uri, "database": db.Name(), "node": "from-file",
		"maxthreads": 3, "tick": "200ms", "enable_plugins": []string{"shell"},
	})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(config, b, 0o600))

	cli(t, uri, db.Name(), "", "queue", "create", "sh", "--constructor", "shell", "--maxthreads", "5")
	var items []any
	for i := range 6 {
		items = append(items, map[string]string{"command": fmt.Sprintf("echo %d", i)})
	}
	cli(t, uri, db.Name(), jsonLines(t, items...), "task", "submit", "sh")

	file := startNode(t, []string{"--config", config})
	flag := startNode(t, []string{"--config", config, "--node", "from-flag", "--tick", "300ms", "--maxthreads", "4"})
	env := startNode(t, []string{"--config", config}, "DISBATCH_NODE=from-env")
	for _, p := range []*proc{file, flag, env} {
		p.waitLog("node started", startWait)
	}
	require.Contains(t, file.log.String(), "tick=200ms")
	require.Contains(t, file.log.String(), "maxthreads=3")
	require.Contains(t, flag.log.String(), "tick=300ms")
	require.Contains(t, flag.log.String(), "maxthreads=4")
	require.Contains(t, env.log.String(), "tick=200ms")

	// enable_plugins from the file: the shell tasks run.
	ts := waitTasks(t, db, startWait, "the shell tasks finished", func(ts []task) bool { return len(ts) == 6 && allFinished(ts) })
	for _, x := range ts {
		require.Equal(t, 1, x.Status, "task %s: %s", x.ID.Hex(), x.stderr())
		require.Contains(t, []string{"from-file", "from-flag", "from-env"}, x.node())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []string
	require.NoError(t, db.Collection("nodes").Distinct(ctx, "node", bson.D{}).Decode(&got))
	require.ElementsMatch(t, []string{"from-file", "from-flag", "from-env"}, got)

	for _, p := range []*proc{file, flag, env} {
		p.signal(syscall.SIGTERM)
	}
	for _, p := range []*proc{file, flag, env} {
		require.Zero(t, p.wait(15*time.Second))
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	unknownKey := write("unknown.json", `{"node": "x", "nodename": "y"}`)
	badTick := write("badtick.json", `{"tick": "soon"}`)
	notJSON := write("bad.json", `node = x`)
	notExec := write("not-executable", "#!/bin/sh\n")
	// Should any of these get as far as connecting, it would retry for ever
	// against a port where nothing listens (and runBin fails at 30 s).
	nowhere := fmt.Sprintf("mongodb://127.0.0.1:%d/?serverSelectionTimeoutMS=200", freePort(t))

	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown config key", []string{"--config", unknownKey}, `"nodename"`},
		{"bad config duration", []string{"--config", badTick}, "soon"},
		{"config not JSON", []string{"--config", notJSON}, notJSON},
		{"config missing", []string{"--config", filepath.Join(dir, "missing.json")}, "missing.json"},
		{"log format", []string{"--log-format", "yaml"}, "yaml"},
		{"log level", []string{"--log-level", "loud"}, "loud"},
		{"negative maxthreads", []string{"--maxthreads", "-1"}, "-1"},
		{"maxthreads not a number", []string{"--maxthreads", "many"}, "many"},
		{"enable-plugin", []string{"--enable-plugin", "rm"}, "rm"},
		{"negative grace", []string{"--grace", "-1s"}, "grace"},
		{"plugin without =", []string{"--plugin", "My::Plugin"}, "NAME=PATH"},
		{"plugin missing", []string{"--plugin", "My::Plugin=" + filepath.Join(dir, "nope")}, "nope"},
		{"plugin not executable", []string{"--plugin", "My::Plugin=" + notExec}, "not an executable"},
		{"unknown flag", []string{"--no-such-flag"}, "no-such-flag"},
		{"argument", []string{"extra"}, "extra"},
		{"empty node", []string{"--node", ""}, "node"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"--mongo-uri", nowhere, "--database", "unused"}, c.args...)
			r := runBin(t, disbatchdBin, "", nil, args...)
			require.Equal(t, 2, r.code, "disbatchd %s: stderr:\n%s", strings.Join(args, " "), r.stderr)
			require.Contains(t, r.stderr, c.want)
			require.Contains(t, r.stderr, "Run 'disbatchd --help' for usage.")
			require.NotContains(t, r.stderr, "cannot connect to MongoDB")
		})
	}
}

func TestHelpMentionsEveryFlagAndNoPassword(t *testing.T) {
	t.Parallel()
	env := []string{
		"DISBATCH_MONGO_URI=mongodb://admin:hunter2@db.example.com:27017/?replicaSet=rs0&authSource=admin",
		"DISBATCH_DATABASE=jobs",
		"DISBATCH_NODE=worker7",
	}
	r := runBin(t, disbatchdBin, "", env, "--help")
	require.Zero(t, r.code, "stderr:\n%s", r.stderr)
	help := r.stdout + r.stderr
	for _, f := range []string{
		"mongo-uri", "database", "node", "maxthreads", "label", "config", "enable-plugin", "plugin",
		"plugin-timeout", "grace", "tick", "orphan-after", "poll-only", "no-projector", "output-threshold",
		"log-format", "log-level", "help",
	} {
		require.Regexp(t, `(?m)^\s+(-\w, )?--`+regexp.QuoteMeta(f)+`\b`, help, "--%s is not in --help", f)
	}
	for _, v := range []string{"DISBATCH_MONGO_URI", "DISBATCH_DATABASE", "DISBATCH_NODE", "SIGTERM", "--grace"} {
		require.Contains(t, help, v)
	}
	require.NotContains(t, help, "hunter2")
	require.Contains(t, help, "mongodb://admin:xxxxx@db.example.com:27017/")
	require.Contains(t, help, `"jobs"`)
	require.Contains(t, help, `"worker7"`)

	// The CLI's help is as careful.
	r = runBin(t, disbatchBin, "", env, "--help")
	require.Zero(t, r.code, "stderr:\n%s", r.stderr)
	require.NotContains(t, r.stdout+r.stderr, "hunter2")
	require.Contains(t, r.stdout, "mongodb://admin:xxxxx@db.example.com:27017/")
}
