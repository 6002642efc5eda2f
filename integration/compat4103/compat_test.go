//go:build compat4103

// Package compat4103 runs our node beside the real Disbatch 4.103 Perl node
// (its bin/disbatchd, forking bin/task_runner per task) on one database, in
// either start order, and checks that each runs the other's tasks. It needs
// code this repository never holds (fetched 4.103 sources, Debian's Perl
// packages), so it is behind the build tag compat4103 and `make
// compat-4103-nodes`, never in `make test`; without that code it fails,
// saying how to get it. What it teaches is kept as Go tests elsewhere
// (store/storetest: the indexes 4.103 requires; schema: threads and
// maxthreads; plugin: Demo).
package compat4103

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/client"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/internal/syncbuf"
)

var bins string // where TestMain built disbatchd and disbatch

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "compat4103-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins = dir
	for _, pkg := range []string{"./cmd/disbatchd", "./cmd/disbatch", "./cmd/disbatch-web"} {
		cmd := exec.Command("go", "build", "-o", dir+"/", pkg)
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", pkg, err, out)
			os.Exit(1)
		}
	}
	code := mongotest.Main(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// perlShared is the folder of start-den and its shims.
func perlShared(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("PERL_DISBATCH_SHARED")
	if dir == "" {
		dir = "/work/shared/perl-disbatch"
	}
	src := os.Getenv("PERL_DISBATCH_SRC")
	if src == "" {
		src = "/tmp/perl-disbatch-4.103"
	}
	_, haveSrc := os.Stat(filepath.Join(src, "bin", "disbatchd"))
	if _, err := os.Stat(filepath.Join(dir, "start-den")); err != nil || (haveSrc != nil && os.Getenv("DISBATCH_MIRROR") == "") {
		require.FailNow(t, "the Disbatch 4.103 programs are missing",
			"fetch github:manwar/disbatch with the search tool's fetch, run %s/install-deps, and set DISBATCH_MIRROR to the folder fetch fills "+
				"(or PERL_DISBATCH_SRC to an extracted 4.103 source); PERL_DISBATCH_SHARED names the folder of start-den (now %s)", dir, dir)
	}
	if _, err := exec.LookPath("perl"); err != nil {
		require.FailNow(t, "no perl", "install Perl and 4.103's modules: %s/install-deps", dir)
	}
	return dir
}

// perlNode is a running 4.103 disbatchd.
type perlNode struct {
	pid    int
	logdir string
}

// startPerl starts the real 4.103 node on db: its node name is this host's.
// env is more environment for it (and its task_runners).
func startPerl(t *testing.T, uri, db string, env ...string) *perlNode {
	t.Helper()
	dir := perlShared(t)
	logdir := t.TempDir()
	cmd := exec.Command(filepath.Join(dir, "start-den"), uri, db, logdir)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "start-den: %s", out)
	pid, err := strconv.Atoi(strings.TrimSpace(lastLine(string(out))))
	require.NoError(t, err, "start-den printed no PID: %s", out)
	p := &perlNode{pid: pid, logdir: logdir}
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		time.Sleep(200 * time.Millisecond)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		if t.Failed() {
			for _, f := range []string{"den.out", "disbatchd.log"} {
				b, _ := os.ReadFile(filepath.Join(logdir, f))
				t.Logf("4.103 %s:\n%s", f, tail(string(b), 40))
			}
		}
	})
	return p
}

func (p *perlNode) alive() bool { return syscall.Kill(p.pid, 0) == nil }

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// goNode is one of our disbatchd processes.
type goNode struct {
	cmd *exec.Cmd
	log *syncbuf.Buffer
}

func startGo(t *testing.T, uri, db, name string, more ...string) *goNode {
	t.Helper()
	return startGoArgs(t, name, append([]string{"--mongo-uri", uri, "--database", db}, more...)...)
}

func startGoArgs(t *testing.T, name string, more ...string) *goNode {
	t.Helper()
	n := &goNode{log: &syncbuf.Buffer{}}
	args := append([]string{"--node", name, "--grace", "2s"}, more...)
	n.cmd = exec.Command(filepath.Join(bins, "disbatchd"), args...)
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	require.NoError(t, n.cmd.Start())
	t.Cleanup(func() {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = n.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = n.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("disbatchd %s:\n%s", name, tail(n.log.String(), 40))
		}
	})
	return n
}

func cli(t *testing.T, uri, db, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(bins, "disbatch"), append([]string{"--mongo-uri", uri, "--database", db}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "disbatch %s:\n%s", strings.Join(args, " "), out.String())
	return out.String()
}

// waitHeartbeat waits until node's document has a timestamp in the last
// few seconds.
func waitHeartbeat(t *testing.T, db *mongo.Database, node string, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		var doc struct {
			Timestamp time.Time `bson:"timestamp"`
		}
		if err := db.Collection("nodes").FindOne(context.Background(), bson.D{{Key: "node", Value: node}}).Decode(&doc); err != nil {
			return false
		}
		return time.Since(doc.Timestamp) < 5*time.Second
	}, timeout, 100*time.Millisecond, "node %s writes its heartbeat", node)
}

func hostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	require.NoError(t, err)
	return h
}

// requireQueueNameIndex checks the index both kinds of node need on
// queues: {name: 1}, named name_1, unique (4.103's ensure_indexes dies on
// anything else).
func requireQueueNameIndex(t *testing.T, db *mongo.Database) {
	t.Helper()
	cur, err := db.Collection("queues").Indexes().List(context.Background())
	require.NoError(t, err)
	var specs []bson.M
	require.NoError(t, cur.All(context.Background(), &specs))
	for _, s := range specs {
		if s["name"] == "name_1" {
			require.Equal(t, true, s["unique"], "name_1 is unique: %v", s)
			return
		}
	}
	require.Fail(t, "no name_1 index on queues", "%v", specs)
}

func TestOursFirstThen4103(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	uri := mongotest.URI(t)
	startGo(t, uri, db.Name(), "go-1")
	waitHeartbeat(t, db, "go-1", 30*time.Second)
	requireQueueNameIndex(t, db)
	p := startPerl(t, uri, db.Name())
	waitHeartbeat(t, db, hostname(t), 60*time.Second)
	time.Sleep(3 * time.Second) // past its ensure_indexes and first passes
	require.True(t, p.alive(), "the 4.103 node runs beside ours (its ensure_indexes accepted our indexes)")
	requireQueueNameIndex(t, db)
	runBothWays(t, uri, db)
}

func Test4103FirstThenOurs(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	uri := mongotest.URI(t)
	p := startPerl(t, uri, db.Name())
	waitHeartbeat(t, db, hostname(t), 60*time.Second)
	requireQueueNameIndex(t, db)
	startGo(t, uri, db.Name(), "go-1")
	waitHeartbeat(t, db, "go-1", 30*time.Second)
	time.Sleep(3 * time.Second)
	require.True(t, p.alive(), "the 4.103 node still runs")
	runBothWays(t, uri, db)
}

// runBothWays: a queue made by our CLI and pinned to the 4.103 node runs
// our CLI's tasks on the 4.103 node (its Demo reads params); a queue 4.103
// nodes leave alone (threads 0) runs tasks inserted the way 4.103's
// clients insert them (params, node: null) on ours; the counters end
// exact.
func runBothWays(t *testing.T, uri string, db *mongo.Database) {
	t.Helper()
	ctx := context.Background()
	host := hostname(t)
	cli(t, uri, db.Name(), "", "queue", "create", "to-perl", "--constructor", "Disbatch::Plugin::Demo", "--maxthreads", "2")
	cli(t, uri, db.Name(), "", "queue", "create", "to-go", "--constructor", "Disbatch::Plugin::Demo", "--maxthreads", "2")
	queues := db.Collection("queues")
	// Our nodes honour nodes_pin (4.103 ignores it); 4.103 nodes read
	// threads as a cap across all nodes (ours read maxthreads per node).
	_, err := queues.UpdateOne(ctx, bson.D{{Key: "name", Value: "to-perl"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "nodes_pin", Value: bson.A{host}}}}})
	require.NoError(t, err)
	_, err = queues.UpdateOne(ctx, bson.D{{Key: "name", Value: "to-go"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "threads", Value: 0}}}})
	require.NoError(t, err)
	var toGo struct {
		ID bson.ObjectID `bson:"_id"`
	}
	require.NoError(t, queues.FindOne(ctx, bson.D{{Key: "name", Value: "to-go"}}).Decode(&toGo))

	cli(t, uri, db.Name(), `{"commands":"a"}`+"\n"+`{"commands":"ab"}`+"\n"+`{"commands":"c"}`+"\n"+`{"counter":5}`+"\n", "task", "submit", "to-perl")
	now := time.Now()
	var docs []any
	for _, p := range []bson.D{{{Key: "commands", Value: "a"}}, {{Key: "commands", Value: "ab"}}, {{Key: "commands", Value: "c"}}, {{Key: "counter", Value: 5}}} {
		docs = append(docs, bson.D{{Key: "queue", Value: toGo.ID}, {Key: "status", Value: -2}, {Key: "node", Value: nil},
			{Key: "params", Value: p}, {Key: "ctime", Value: now}, {Key: "mtime", Value: now}})
	}
	_, err = db.Collection("tasks").InsertMany(ctx, docs)
	require.NoError(t, err)

	type task struct {
		Queue  bson.ObjectID `bson:"queue"`
		Status int           `bson:"status"`
		Node   any           `bson:"node"`
		Stdout any           `bson:"stdout"`
		Stderr any           `bson:"stderr"`
		Params bson.M        `bson:"params"`
		Param3 bson.M        `bson:"parameters"`
	}
	var tasks []task
	require.Eventually(t, func() bool {
		cur, err := db.Collection("tasks").Find(ctx, bson.D{})
		if err != nil {
			return false
		}
		tasks = nil
		if cur.All(ctx, &tasks) != nil || len(tasks) != 8 {
			return false
		}
		for _, x := range tasks {
			if x.Status <= 0 {
				return false
			}
		}
		return true
	}, 90*time.Second, 200*time.Millisecond, "every task finished: %+v", tasks)
	for _, x := range tasks {
		params := x.Params
		if params == nil {
			params = x.Param3
		}
		cmds, _ := params["commands"].(string)
		wantNode := "go-1"
		if x.Queue != toGo.ID {
			wantNode = host
		}
		require.Equal(t, wantNode, x.Node, "task %v ran on the node its queue allows", params)
		switch cmds {
		case "a":
			require.Equal(t, 1, x.Status)
			require.Equal(t, "This is command 'a' for apple.\n", x.Stdout, "on %s", wantNode)
		case "ab":
			require.Equal(t, 1, x.Status)
			require.Equal(t, "This is command 'b' for banana.\n", x.Stderr, "on %s", wantNode)
		case "c":
			require.Equal(t, 2, x.Status, "c fails, on %s", wantNode)
		case "":
			// No commands: 4.103's Demo does nothing and succeeds.
			require.Equal(t, 1, x.Status, "no commands, on %s", wantNode)
			require.Contains(t, []any{nil, ""}, x.Stdout, "on %s", wantNode)
		default:
			require.Failf(t, "unexpected task", "%+v", x)
		}
	}
	// The counters follow both kinds of node and the raw inserts.
	require.Eventually(t, func() bool {
		var qs []struct {
			Name    string `bson:"name"`
			Todo    *int64 `bson:"count_todo"`
			Total   *int64 `bson:"count_total"`
			Running *int64 `bson:"count_running"`
			Failed  *int64 `bson:"count_failed"`
		}
		cur, err := queues.Find(ctx, bson.D{})
		if err != nil || cur.All(ctx, &qs) != nil {
			return false
		}
		for _, q := range qs {
			if q.Todo == nil || q.Total == nil || q.Running == nil || q.Failed == nil || *q.Todo != 0 || *q.Total != 4 || *q.Running != 0 || *q.Failed != 1 {
				return false
			}
		}
		return len(qs) == 2
	}, 30*time.Second, 200*time.Millisecond, "count_todo 0, count_total 4, count_running 0, count_failed 1 on both queues")

	// Demo's reports, one per task, alike from both kinds of node.
	var reports []bson.M
	cur, err := db.Collection("reports").Find(ctx, bson.D{})
	require.NoError(t, err)
	require.NoError(t, cur.All(ctx, &reports))
	require.Len(t, reports, 8)
	byQueue := map[bson.ObjectID]map[string]bson.M{}
	for _, r := range reports {
		q := r["queue_id"].(bson.ObjectID)
		if byQueue[q] == nil {
			byQueue[q] = map[string]bson.M{}
		}
		c, _ := r["commands"].(string)
		byQueue[q][c] = r
	}
	require.Len(t, byQueue, 2)
	var sides []map[string]bson.M
	for _, m := range byQueue {
		sides = append(sides, m)
	}
	for _, c := range []string{"a", "ab", "c", ""} {
		a, b := sides[0][c], sides[1][c]
		require.NotNil(t, a, "report of %q", c)
		require.NotNil(t, b, "report of %q", c)
		for _, k := range []string{"status", "errors", "error", "counter"} {
			require.EqualValues(t, a[k], b[k], "report field %s of commands %q: %v against %v", k, c, a, b)
		}
	}
}

// TestDuplicateQueueNames: a database whose queues already repeat a name
// (seed 000 allows it) cannot have 4.103's unique name_1. Our node starts
// anyway, without that index, and says why; 4.103's node refuses to start
// on it, as it would without ours (its ensure_indexes dies on the
// duplicate).
func TestDuplicateQueueNames(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	uri := mongotest.URI(t)
	_, err := db.Collection("queues").InsertMany(context.Background(), []any{
		bson.D{{Key: "name", Value: "twice"}, {Key: "plugin", Value: "Disbatch::Plugin::Demo"}, {Key: "threads", Value: 1}},
		bson.D{{Key: "name", Value: "twice"}, {Key: "plugin", Value: "Disbatch::Plugin::Demo"}, {Key: "threads", Value: 1}},
	})
	require.NoError(t, err)
	g := startGo(t, uri, db.Name(), "go-1")
	waitHeartbeat(t, db, "go-1", 30*time.Second)
	cur, err := db.Collection("queues").Indexes().List(context.Background())
	require.NoError(t, err)
	var specs []bson.M
	require.NoError(t, cur.All(context.Background(), &specs))
	for _, s := range specs {
		require.NotEqual(t, "name_1", s["name"], "no name_1 that 4.103 would refuse: %v", s)
	}
	require.Contains(t, g.log.String(), "duplicate queue names")
	p := startPerl(t, uri, db.Name())
	require.Eventually(t, func() bool { return !p.alive() }, 30*time.Second, 100*time.Millisecond,
		"4.103's node refuses a database with duplicate queue names (as without ours)")
	b, _ := os.ReadFile(filepath.Join(p.logdir, "den.out"))
	require.Contains(t, string(b), "duplicate key", "it says why")
}

// TestOurNodeKeepsThe4103ConfigFile: an operator swaps the binary and
// keeps /etc/disbatch/config.json: our node reads the file the 4.103 node
// runs with (start-den's) and serves the same database beside it.
func TestOurNodeKeepsThe4103ConfigFile(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	uri := mongotest.URI(t)
	p := startPerl(t, uri, db.Name())
	waitHeartbeat(t, db, hostname(t), 60*time.Second)
	g := startGoArgs(t, "go-perl-config", "--perl-config", filepath.Join(p.logdir, "config.json"))
	waitHeartbeat(t, db, "go-perl-config", 30*time.Second)
	require.True(t, p.alive())
	log := g.log.String()
	require.Contains(t, log, "--perl-config: not used: log4perl")
	require.Contains(t, log, "database="+db.Name())
}

// TestPerlPluginsUnderOurNode: a site's Disbatch::Plugin::* runs under our
// node through 4.103's own task_runner (--perl-plugin): task_runner marks
// the task running, runs the plugin and writes status, output and
// complete: true as 4.103 does; our node waits for it.
func TestPerlPluginsUnderOurNode(t *testing.T) {
	t.Parallel()
	// 4.103's gfs modes, as its task_runner applies them: auto (output in
	// the task document while it fits), true (always GridFS), false (never).
	for _, mode := range []string{`"auto"`, `true`, `false`} {
		t.Run("gfs="+strings.Trim(mode, `"`), func(t *testing.T) {
			t.Parallel()
			perlPluginsUnderOurNode(t, mode)
		})
	}
}

func perlPluginsUnderOurNode(t *testing.T, gfs string) {
	shared := perlShared(t)
	src := os.Getenv("PERL_DISBATCH_SRC")
	if src == "" {
		src = "/tmp/perl-disbatch-4.103"
	}
	if _, err := os.Stat(filepath.Join(src, "bin", "task_runner")); err != nil {
		require.FailNow(t, "no extracted 4.103 source", "run %s/start-den once (it extracts the fetched code to %s), or set PERL_DISBATCH_SRC", shared, src)
	}
	db := mongotest.Database(t)
	uri := mongotest.URI(t)
	host := hostname(t)
	cfg := filepath.Join(t.TempDir(), "config.json")
	hostport := strings.TrimPrefix(uri, "mongodb://")
	require.NoError(t, os.WriteFile(cfg, []byte(`{
		"mongohost": "mongodb://`+hostport+`", "database": "`+db.Name()+`",
		"plugins": ["Disbatch::Plugin::Demo"], "task_runner": "./bin/task_runner", "gfs": `+gfs+`,
	}`), 0o600))
	n := &goNode{log: &syncbuf.Buffer{}}
	n.cmd = exec.Command(filepath.Join(bins, "disbatchd"), "--perl-config", cfg, "--node", host, "--perl-plugin", "Disbatch::Plugin::Demo", "--grace", "2s")
	n.cmd.Dir = src // task_runner's path in the file is relative, as 4.103 runs it
	// PERL5OPT: the shared peer's put_gfs needs DateTime and Digest::MD5
	// loaded, as the 1.x Perl driver did (see TestOurClientsTasksAndOutputBothWays).
	n.cmd.Env = append(os.Environ(), "PERL5LIB="+filepath.Join(shared, "lib")+":"+filepath.Join(src, "lib"), "PERL5OPT=-MDateTime -MDigest::MD5")
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	require.NoError(t, n.cmd.Start())
	t.Cleanup(func() {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		_ = n.cmd.Wait()
		if t.Failed() {
			t.Logf("disbatchd:\n%s", tail(n.log.String(), 60))
		}
	})
	waitHeartbeat(t, db, host, 30*time.Second)
	cli(t, uri, db.Name(), "", "queue", "create", "perl", "--constructor", "Disbatch::Plugin::Demo", "--maxthreads", "2")
	cli(t, uri, db.Name(), `{"commands":"a","counter":3}`+"\n"+`{"commands":"c"}`+"\n", "task", "submit", "perl")
	type task struct {
		ID       bson.ObjectID `bson:"_id"`
		Status   int           `bson:"status"`
		Node     any           `bson:"node"`
		Stdout   any           `bson:"stdout"`
		Stderr   any           `bson:"stderr"`
		Complete bool          `bson:"complete"`
		Params   bson.M        `bson:"parameters"`
		Params4  bson.M        `bson:"params"`
	}
	var tasks []task
	require.Eventually(t, func() bool {
		cur, err := db.Collection("tasks").Find(context.Background(), bson.D{})
		if err != nil {
			return false
		}
		tasks = nil
		if cur.All(context.Background(), &tasks) != nil || len(tasks) != 2 {
			return false
		}
		for _, x := range tasks {
			if x.Status <= 0 || !x.Complete { // task_runner writes complete after the status
				return false
			}
		}
		return true
	}, 60*time.Second, 200*time.Millisecond, "both tasks finished through task_runner, their output written: %+v", tasks)
	for _, x := range tasks {
		require.Equal(t, host, x.Node)
		require.True(t, x.Complete, "complete: true, written by task_runner")
		p := x.Params
		if p == nil {
			p = x.Params4
		}
		want := map[string]string{"a": "This is command 'a' for apple.\n", "c": "This is command 'c' for cry.\n"}[p["commands"].(string)]
		out := x.Stdout
		if p["commands"] == "c" {
			require.Equal(t, 2, x.Status)
			out = x.Stderr
		} else {
			require.Equal(t, 1, x.Status)
		}
		if gfs == "true" {
			id, ok := out.(bson.ObjectID)
			require.True(t, ok, "gfs true: output in GridFS, not %T", out)
			var file bson.M
			require.NoError(t, db.Collection("tasks.files").FindOne(context.Background(), bson.D{{Key: "_id", Value: id}}).Decode(&file))
			require.NotEmpty(t, file["md5"], "as 4.103 writes it")
			show := cli(t, uri, db.Name(), "", "task", "show", x.ID.Hex())
			require.Contains(t, show, strings.TrimSpace(want), "our CLI reads task_runner's GridFS output")
		} else {
			require.Equal(t, want, out, "gfs %s: small output in the task document", gfs)
		}
	}
	n2, err := db.Collection("reports").CountDocuments(context.Background(), bson.D{})
	require.NoError(t, err)
	require.EqualValues(t, 2, n2, "the Perl Demo's reports")
	// Written by 4.103's programs, not ours: its Demo run from the source
	// tree writes no version, and task_runner records no attempts.
	var rep bson.M
	require.NoError(t, db.Collection("reports").FindOne(context.Background(), bson.D{}).Decode(&rep))
	require.Nil(t, rep["version"], "the Perl Demo's report: %v", rep)
	left, err := db.Collection("tasks").CountDocuments(context.Background(), bson.D{{Key: "attempts", Value: bson.D{{Key: "$exists", Value: true}}}})
	require.NoError(t, err)
	require.Zero(t, left, "task_runner wrote the results, not our finish")
	require.NotContains(t, n.log.String(), "task_runner did not start")
}

// TestOurClientsTasksAndOutputBothWays: tasks from our Go client package
// and our v1 API run on the real 4.103 node; output 4.103's task_runner
// writes to GridFS (string chunks, md5, filename, metadata.task_id) is read
// by our CLI and API whole. (The shared 4.103 peer's put_gfs calls
// DateTime and Digest::MD5 without loading them, which the 1.x Perl
// driver did: PERL5OPT loads them, changing nothing of 4.103's code.)
func TestOurClientsTasksAndOutputBothWays(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	uri := mongotest.URI(t)
	p := startPerl(t, uri, db.Name(), "PERL5OPT=-MDateTime -MDigest::MD5")
	waitHeartbeat(t, db, hostname(t), 60*time.Second)
	cli(t, uri, db.Name(), "", "queue", "create", "q", "--constructor", "Disbatch::Plugin::Demo", "--maxthreads", "3")
	ctx := context.Background()
	ids, err := client.New(db).Submit(ctx, "q", bson.D{{Key: "commands", Value: "a"}})
	require.NoError(t, err)
	web := exec.Command(filepath.Join(bins, "disbatch-web"), "--mongo-uri", uri, "--database", db.Name(), "--listen", "127.0.0.1:0", "--log-format", "text")
	wlog := &syncbuf.Buffer{}
	web.Stdout, web.Stderr = wlog, wlog
	require.NoError(t, web.Start())
	t.Cleanup(func() { _ = web.Process.Signal(syscall.SIGTERM); _ = web.Wait() })
	var base string
	require.Eventually(t, func() bool {
		m := regexp.MustCompile(`serving the Disbatch HTTP API" url=(http://127\.0\.0\.1:\d+)/`).FindStringSubmatch(wlog.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	}, 30*time.Second, 50*time.Millisecond, "disbatch-web serves: %s", wlog.String())
	resp, err := http.Post(base+"/api/v1/tasks", "application/json", strings.NewReader(`{"queue":"q","tasks":[{"params":{"commands":"a"}},{"params":{"commands":"1e"}}]}`))
	require.NoError(t, err)
	var sub struct {
		IDs []string `json:"ids"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&sub))
	resp.Body.Close()
	require.Len(t, sub.IDs, 2)
	all := []string{ids[0].Hex(), sub.IDs[0], sub.IDs[1]}
	host := hostname(t)
	for _, id := range all {
		oid, err := bson.ObjectIDFromHex(id)
		require.NoError(t, err)
		var doc bson.M
		require.Eventually(t, func() bool {
			doc = nil
			_ = db.Collection("tasks").FindOne(ctx, bson.D{{Key: "_id", Value: oid}}).Decode(&doc)
			st, _ := doc["status"].(int32)
			done, _ := doc["complete"].(bool)
			return st > 0 && done
		}, 90*time.Second, 200*time.Millisecond, "task %s finished on the 4.103 node, its output written (complete: true)", id)
		require.EqualValues(t, 1, doc["status"], "task %s: %v", id, doc["stderr"])
		require.Equal(t, host, doc["node"], "the 4.103 node ran it")
	}
	// 1e: 16 MiB of stdout, to GridFS as 4.103 writes it.
	big, err := bson.ObjectIDFromHex(sub.IDs[1])
	require.NoError(t, err)
	var doc bson.M
	require.NoError(t, db.Collection("tasks").FindOne(ctx, bson.D{{Key: "_id", Value: big}}).Decode(&doc))
	fileID, ok := doc["stdout"].(bson.ObjectID)
	require.True(t, ok, "stdout in GridFS: %T", doc["stdout"])
	var file bson.M
	require.NoError(t, db.Collection("tasks.files").FindOne(ctx, bson.D{{Key: "_id", Value: fileID}}).Decode(&file))
	require.Equal(t, "stdout", file["filename"])
	require.NotEmpty(t, file["md5"])
	resp, err = http.Get(base + "/api/v1/tasks/" + sub.IDs[1] + "/stdout")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, 16<<20, len(body), "our API reads 4.103's GridFS output whole")
	require.Equal(t, strings.Repeat("1", 1<<20), string(body[:1<<20]))
	show := cli(t, uri, db.Name(), "", "task", "show", sub.IDs[1])
	require.Contains(t, show, "(GridFS", "our CLI reads it too")
	require.True(t, p.alive())
}

// Test4103CLIsTasksRunOnOurNode: a queue and tasks made by 4.103's own CLI
// through 4.103's own web API (create-queue, create-task, create-tasks) run
// on our node with the params Demo reads; 4.103's CLI then reads our
// results (tasks, queues' counts).
func Test4103CLIsTasksRunOnOurNode(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	uri := mongotest.URI(t)
	dir := perlShared(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	require.NoError(t, l.Close())
	logdir := t.TempDir()
	out, err := exec.Command(filepath.Join(dir, "start-web"), uri, db.Name(), port, logdir).CombinedOutput()
	require.NoError(t, err, "start-web: %s", out)
	pid, err := strconv.Atoi(strings.TrimSpace(lastLine(string(out))))
	require.NoError(t, err, "start-web printed no PID: %s", out)
	t.Cleanup(func() {
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(logdir, "web.out"))
			t.Logf("4.103 web.out:\n%s", tail(string(b), 40))
		}
	})
	src := os.Getenv("PERL_DISBATCH_SRC")
	if src == "" {
		src = "/tmp/perl-disbatch-4.103"
	}
	perlCLI := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("perl", append([]string{filepath.Join(src, "bin/disbatch"), "--url", "http://127.0.0.1:" + port}, args...)...)
		b, err := cmd.CombinedOutput()
		require.NoError(t, err, "4.103 disbatch %s:\n%s", strings.Join(args, " "), b)
		return string(b)
	}
	created := perlCLI("create-queue", "perlq", "Disbatch::Plugin::Demo")
	m := regexp.MustCompile(`Created queue perlq: ([0-9a-f]{24})`).FindStringSubmatch(created)
	require.NotNil(t, m, "4.103 create-queue: %s", created)
	perlCLI("update-queue", m[1], "threads", "2")
	perlCLI("create-task", m[1], "commands", "a")
	perlCLI("create-tasks", m[1], `[{"commands":"ab"},{"commands":"c"},{"counter":3}]`)

	n := startGo(t, uri, db.Name(), "go-node")
	ctx := context.Background()
	var tasks []struct {
		Status int    `bson:"status"`
		Node   string `bson:"node"`
		Stdout string `bson:"stdout"`
		Stderr string `bson:"stderr"`
		Params bson.M `bson:"params"`
	}
	require.Eventually(t, func() bool {
		cur, err := db.Collection("tasks").Find(ctx, bson.D{{Key: "status", Value: bson.D{{Key: "$gt", Value: 0}}}})
		if err != nil {
			return false
		}
		// A fresh slice each time: decoding into a reused element merges
		// params into the map an earlier poll left there (a counter task
		// then read as Demo's c, which fails).
		tasks = nil
		return cur.All(ctx, &tasks) == nil && len(tasks) == 4
	}, 60*time.Second, 100*time.Millisecond, "our node runs the 4.103 CLI's four tasks: %s", n.log.String())
	// Demo, as 4.103's: a prints an apple to stdout, b a banana to
	// stderr, c cries and fails; a counter alone succeeds.
	for _, x := range tasks {
		require.Equal(t, "go-node", x.Node)
		switch x.Params["commands"] {
		case "a":
			require.Equal(t, 1, x.Status)
			require.Contains(t, x.Stdout, "This is command 'a' for apple.")
		case "ab":
			require.Equal(t, 1, x.Status)
			require.Contains(t, x.Stderr, "This is command 'b' for banana.")
		case "c":
			require.Equal(t, 2, x.Status, "Demo's c fails")
			require.Contains(t, x.Stderr, "This is command 'c' for cry.")
		default:
			require.EqualValues(t, 3, x.Params["counter"], "%v", x.Params)
			require.Equal(t, 1, x.Status)
		}
	}
	listed := perlCLI("tasks", `{"status":1}`, "--count")
	require.Equal(t, "3 tasks", strings.TrimSpace(lastLine(listed)), "4.103's CLI counts our succeeded tasks: %s", listed)
	queues := perlCLI("queues")
	require.Regexp(t, `perlq\s*\|\s*2\s*\|\s*0\s*\|\s*0\s*\|\s*4\b`, queues, "4.103's CLI shows threads 2, 0 queued, 0 running, 4 completed (3 succeeded, 1 failed): %s", queues)
}
