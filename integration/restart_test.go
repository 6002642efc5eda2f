package integration

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/supervisor"
)

// restartTask is a shell task that prints one line a second for secs
// seconds and records each run's start and end in runs (a file of lines
// "start ID ATTEMPT" / "end ID ATTEMPT"). A second run of a task while
// another holds its lock says OVERLAP and fails.
func restartTask(runs, locks string, secs int) string {
	return fmt.Sprintf(`exec 9>%s/$DISBATCH_TASK_ID.lock; flock -n 9 || { echo OVERLAP; exit 3; }
echo "start $DISBATCH_TASK_ID $DISBATCH_ATTEMPT" >> %s
for i in $(seq %d); do echo "line $i"; sleep 1; done
echo "end $DISBATCH_TASK_ID $DISBATCH_ATTEMPT" >> %s`, locks, runs, secs, runs)
}

// restartSetup gives a restart test its database, a work directory, and
// in it the file of runs and the directory of locks restartTask uses.
func restartSetup(t *testing.T) (db *mongo.Database, uri, work, runs, locks string) {
	t.Helper()
	db, uri, work = mongotest.Database(t), mongotest.URI(t), t.TempDir()
	runs, locks = filepath.Join(work, "runs"), filepath.Join(work, "locks")
	require.NoError(t, os.Mkdir(locks, 0o700))
	return db, uri, work, runs, locks
}

// waitRunning waits until n tasks of db are running (status 0).
func waitRunning(t *testing.T, db *mongo.Database, n int64, timeout time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		k, err := db.Collection("tasks").CountDocuments(context.Background(), bson.D{{Key: "status", Value: 0}})
		return err == nil && k == n
	}, timeout, 50*time.Millisecond, "%d tasks running", n)
}

// TestRestartKeepsSupervisedTasks: a node running 20 shell tasks of 5-20
// s is stopped with SIGTERM and --grace 0, killed with SIGKILL, and
// upgraded (started from another binary) while they run; each time it is
// back within 3 s and adopts them, and every task finishes once, with its
// whole output, and the counters end exact.
func TestRestartKeepsSupervisedTasks(t *testing.T) {
	t.Parallel()
	db, uri, work, runs, locks := restartSetup(t)
	cli(t, uri, db.Name(), "", "queue", "create", "sh", "--constructor", "shell", "--maxthreads", "20")
	secs := map[string]int{}
	var lines []string
	for i := range 20 {
		lines = append(lines, fmt.Sprintf(`{"command": %q}`, restartTask(runs, locks, 5+i*15/19)))
	}
	cli(t, uri, db.Name(), strings.Join(lines, "\n")+"\n", "task", "submit", "sh")
	var ids []string
	for _, x := range findTasks(t, db) {
		secs[x.ID.Hex()] = 5 + len(ids)*15/19 // inserted in order
		ids = append(ids, x.ID.Hex())
	}
	require.Len(t, ids, 20)
	// A copy of the binary is the upgrade: another executable file.
	next := filepath.Join(work, "disbatchd-next")
	copyFile(t, disbatchdBin, next)
	args := []string{"--mongo-uri", uri, "--database", db.Name(), "--node", "n1", "--enable-plugin", "shell", "--grace", "0s"}
	p := startNode(t, args)
	p.waitLog("node started", 30*time.Second)
	waitRunning(t, db, 20, 30*time.Second)
	var rss []int
	require.Eventually(t, func() bool { rss = supervisorsRSS(t, testStateDir(t)); return len(rss) == 20 },
		30*time.Second, 50*time.Millisecond, "one supervisor per running task")
	total := 0
	for _, kb := range rss {
		total += kb
	}
	t.Logf("supervisors' RSS: mean %d KiB over %d (VmRSS, shared pages of the binary included)", total/len(rss), len(rss))

	restart := func(how string, bin string) {
		time.Sleep(1500 * time.Millisecond)
		begin := time.Now()
		if how == "SIGKILL" {
			require.NoError(t, p.cmd.Process.Kill())
		} else {
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		}
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Signal(syscall.SIGQUIT) // its goroutines, in the log
			<-p.done
			t.Fatalf("%s: the node did not exit", how)
		}
		if how != "SIGKILL" {
			require.Contains(t, p.log.String(), "leaving supervised tasks running")
		}
		p = startProc(t, bin, withStateDir(t, args))
		p.waitLog("node started", 30*time.Second)
		back := time.Since(begin)
		require.Less(t, back, 3*time.Second, "%s: the node is back within 3 s", how)
		require.Contains(t, p.log.String(), "adopted a running task")
		t.Logf("%s: back in %s; %s", how, back.Round(time.Millisecond), lastMatch(p.log.String(), "adopted the previous run's running tasks"))
	}
	restart("SIGTERM", disbatchdBin)
	restart("SIGKILL", disbatchdBin)
	restart("upgrade", next)

	ctx := context.Background()
	require.Eventually(t, func() bool {
		k, err := db.Collection("tasks").CountDocuments(ctx, bson.D{{Key: "status", Value: bson.D{{Key: "$lte", Value: 0}}}})
		return err == nil && k == 0
	}, 60*time.Second, 200*time.Millisecond, "every task finished")
	for _, id := range ids {
		oid, err := bson.ObjectIDFromHex(id)
		require.NoError(t, err)
		var doc bson.M
		require.NoError(t, db.Collection("tasks").FindOne(ctx, bson.D{{Key: "_id", Value: oid}}).Decode(&doc))
		require.EqualValues(t, 1, doc["status"], "task %s: %v", id, doc["stderr"])
		var want strings.Builder
		for i := 1; i <= secs[id]; i++ {
			fmt.Fprintf(&want, "line %d\n", i)
		}
		require.Equal(t, want.String(), doc["stdout"], "task %s: its whole output", id)
	}
	b, err := os.ReadFile(runs)
	require.NoError(t, err)
	for _, id := range ids {
		require.Equal(t, 1, strings.Count(string(b), "start "+id+" "), "task %s ran once:\n%s", id, b)
		require.Equal(t, 1, strings.Count(string(b), "end "+id+" 1"), "task %s ended once, in its first attempt", id)
	}
	requireCountersExact(t, db, "sh", 20)
	// The supervisors handed their results over and exited.
	require.Eventually(t, func() bool { return supervisorsRunning(t, testStateDir(t)) == 0 }, 10*time.Second, 100*time.Millisecond, "no supervisor left")
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}

func lastMatch(log, s string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return ""
}

// requireCountersExact waits until queue's projected counters match its
// tasks: total, nothing to do, nothing running.
func requireCountersExact(t *testing.T, db *mongo.Database, queue string, total int) {
	t.Helper()
	var q bson.M
	require.Eventually(t, func() bool {
		q = nil
		if db.Collection("queues").FindOne(context.Background(), bson.D{{Key: "name", Value: queue}}).Decode(&q) != nil {
			return false
		}
		return fmt.Sprint(q["count_total"]) == fmt.Sprint(total) && fmt.Sprint(q["count_todo"]) == "0" && fmt.Sprint(q["count_running"]) == "0"
	}, 20*time.Second, 100*time.Millisecond, "counters exact: %v", q)
}

// supervisorsRunning counts the supervisors in dir (and under it) that
// run a task: not the nodes' pools of idle ones.
func supervisorsRunning(t *testing.T, dir string) int {
	t.Helper()
	busy, _ := supervisor.Processes(dir)
	return len(busy)
}

// findTasks reads every task of db in _id order.
func findTasks(t *testing.T, db *mongo.Database) []task {
	t.Helper()
	cur, err := db.Collection("tasks").Find(context.Background(), bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	require.NoError(t, err)
	var out []task
	require.NoError(t, cur.All(context.Background(), &out))
	return out
}

// TestSupervisorsFenceWhenTheNodeNeverReturns: a node killed for good,
// or stopped (SIGTERM, --grace 0) leaving its tasks running under their
// supervisors and never started again, leaves its tasks to them, which
// kill them once no heartbeat was acknowledged for --fence-after, before
// the other node declares it dead (--dead-after) and reruns them
// (rerun_orphans): no run overlaps another, every task ends once, on the
// live node. The stopped node's last heartbeat says it left five tasks
// (left_tasks), which is why it is judged at all.
func TestSupervisorsFenceWhenTheNodeNeverReturns(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"killed", "stopped"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			supervisorsFenceWhenTheNodeNeverReturns(t, how)
		})
	}
}

func supervisorsFenceWhenTheNodeNeverReturns(t *testing.T, how string) {
	db, uri, _, runs, locks := restartSetup(t)
	cli(t, uri, db.Name(), "", "queue", "create", "sh", "--constructor", "shell", "--maxthreads", "5")
	cli(t, uri, db.Name(), "", "queue", "set", "sh", "--rerun-orphans=true")
	// The first attempt would run a minute; the rerun, a second.
	cmd := fmt.Sprintf(`exec 9>%s/$DISBATCH_TASK_ID.lock; flock -n 9 || { echo OVERLAP; exit 3; }
echo "start $DISBATCH_TASK_ID $DISBATCH_ATTEMPT $DISBATCH_NODE" >> %s
if [ "$DISBATCH_ATTEMPT" = 1 ]; then sleep 60; else sleep 1; fi
echo "end $DISBATCH_TASK_ID $DISBATCH_ATTEMPT" >> %s`, locks, runs, runs)
	var lines []string
	for range 5 {
		lines = append(lines, fmt.Sprintf(`{"command": %q}`, cmd))
	}
	cli(t, uri, db.Name(), strings.Join(lines, "\n")+"\n", "task", "submit", "sh")
	timing := []string{"--heartbeat", "500ms", "--fence-after", "2s", "--dead-after", "5s"}
	args := append([]string{"--mongo-uri", uri, "--database", db.Name(), "--node", "gone", "--enable-plugin", "shell", "--grace", "0s"}, timing...)
	p := startNode(t, args)
	p.waitLog("node started", 30*time.Second)
	waitRunning(t, db, 5, 30*time.Second)
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(runs)
		return strings.Count(string(b), " 1 gone\n") == 5
	}, 30*time.Second, 50*time.Millisecond, "the five first attempts run")
	killed := time.Now()
	if how == "killed" {
		require.NoError(t, p.cmd.Process.Kill())
		<-p.done
	} else {
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		<-p.done
		require.Contains(t, p.log.String(), "leaving supervised tasks running")
		var nd bson.M
		require.NoError(t, db.Collection("nodes").FindOne(context.Background(), bson.D{{Key: "node", Value: "gone"}}).Decode(&nd))
		require.Equal(t, "stopped", nd["state"])
		require.EqualValues(t, 5, nd["left_tasks"], "the last heartbeat says what the node left running: %v", nd)
	}
	live := startNode(t, append([]string{"--mongo-uri", uri, "--database", db.Name(), "--node", "live", "--enable-plugin", "shell"}, timing...))
	live.waitLog("node started", 30*time.Second)
	ctx := context.Background()
	require.Eventually(t, func() bool {
		k, err := db.Collection("tasks").CountDocuments(ctx, bson.D{{Key: "status", Value: 1}})
		return err == nil && k == 5
	}, 60*time.Second, 200*time.Millisecond, "the live node reruns and finishes the dead node's tasks")
	t.Logf("recovered and finished %s after the kill", time.Since(killed).Round(time.Millisecond))
	for _, x := range findTasks(t, db) {
		require.Equal(t, 1, x.Status)
		require.Equal(t, "live", x.Node.StringValue())
		require.NotContains(t, x.Stdout.String(), "OVERLAP")
	}
	b, err := os.ReadFile(runs)
	require.NoError(t, err)
	require.Equal(t, 5, strings.Count(string(b), " 1 gone\n"), "five first attempts on the dead node:\n%s", b)
	require.Equal(t, 5, strings.Count(string(b), " 2 live\n"), "five reruns on the live node:\n%s", b)
	require.Zero(t, strings.Count(string(b), "end ")-5, "only the reruns ended (the first attempts were fenced):\n%s", b)
	// The fenced supervisors wrote no finish and exit once dead-after
	// passes without a node adopting them.
	require.Eventually(t, func() bool { return supervisorsRunning(t, testStateDir(t)) == 0 }, 20*time.Second, 100*time.Millisecond, "the fenced supervisors exit")
	logs, _ := filepath.Glob(filepath.Join(testStateDir(t), "*", "*.log"))
	fenced := 0
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if strings.Contains(string(b), "fencing: no acknowledged heartbeat") {
			fenced++
		}
	}
	require.Equal(t, 5, fenced, "each supervisor fenced its task")
}

// supervisorsRSS is the VmRSS (KiB) of each supervisor in dir (and under
// it) that runs a task.
func supervisorsRSS(t *testing.T, dir string) []int {
	t.Helper()
	var out []int
	busy, _ := supervisor.Processes(dir)
	for _, pid := range busy {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				var kb int
				_, _ = fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
				out = append(out, kb)
			}
		}
	}
	return out
}
