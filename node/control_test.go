package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func (b *bundle) shellQueue(name string, maxThreads int, set func(*store.QueueUpdateParams)) bson.ObjectID {
	b.t.Helper()
	b.reg.Register(plugin.ShellConstructor, plugin.Shell())
	q := b.queue(name, plugin.ShellConstructor, maxThreads, schema.SortFIFO)
	if set != nil {
		p := store.QueueUpdateParams{ID: q}
		set(&p)
		require.NoError(b.t, b.store.QueueUpdate(context.Background(), p))
	}
	return q
}

func (b *bundle) insert(q bson.ObjectID, c *store.TaskInsertControl, params ...bson.D) []bson.ObjectID {
	b.t.Helper()
	ps := make([]bson.Raw, len(params))
	for i, p := range params {
		raw, err := bson.Marshal(p)
		require.NoError(b.t, err)
		ps[i] = raw
	}
	ids, err := b.store.TaskInsertMany(context.Background(), store.TaskInsertManyParams{Queue: q, Parameters: ps, Control: c})
	require.NoError(b.t, err)
	return ids
}

func (b *bundle) control(id bson.ObjectID) schema.TaskControl {
	b.t.Helper()
	t, err := schema.DecodeTask(b.task(id))
	require.NoError(b.t, err)
	return t.Control
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func TestKillOfARunningShellTaskLeavesNoProcessBehind(t *testing.T) {
	b := setup(t)
	q := b.shellQueue("kill", 1, nil)
	cfg := b.config("n1")
	cfg.Tick = time.Minute // the change stream, not the sweep, must deliver the kill
	b.start(cfg)
	pids := filepath.Join(t.TempDir(), "pids")
	id := b.insert(q, nil, bson.D{{Key: "command", Value: "echo $$ > " + pids + "; sleep 60 & echo $! >> " + pids + "; wait"}})[0]
	var procs []int
	require.Eventually(t, func() bool {
		data, err := os.ReadFile(pids)
		lines := strings.Fields(string(data))
		if err != nil || len(lines) < 2 {
			return false
		}
		procs = procs[:0]
		for _, l := range lines {
			pid, err := strconv.Atoi(l)
			require.NoError(t, err)
			procs = append(procs, pid)
		}
		return true
	}, 10*time.Second, 5*time.Millisecond)
	res, err := b.store.TaskKill(context.Background(), store.TaskKillParams{Target: store.TaskTarget{IDs: []bson.ObjectID{id}}, By: "tester", Reason: "wrong input"})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Requested)
	b.waitStatus(id, schema.StatusFailed, 10*time.Second)
	c := b.control(id)
	require.Equal(t, schema.ReasonKilled, c.Reason)
	require.NotNil(t, c.Kill)
	require.Equal(t, "n1", c.Kill.Node)
	require.Equal(t, "tester", c.Kill.By)
	stderr, _ := b.task(id).Lookup("stderr").StringValueOK()
	require.Contains(t, stderr, "kill requested by tester")
	require.Contains(t, stderr, "wrong input")
	require.Len(t, c.Attempts, 1)
	require.Equal(t, schema.ReasonKilled, c.Attempts[0].Reason)
	for _, pid := range procs {
		require.Eventually(t, func() bool { return !alive(pid) }, 5*time.Second, 10*time.Millisecond, "process %d of the killed task still runs", pid)
	}
	// A second kill of the finished task changes nothing.
	res, err = b.store.TaskKill(context.Background(), store.TaskKillParams{Target: store.TaskTarget{IDs: []bson.ObjectID{id}}, By: "tester"})
	require.NoError(t, err)
	require.Zero(t, res.Requested+res.Cancelled+res.Settled)
	require.Len(t, res.Skipped, 1)
	require.Contains(t, res.Skipped[0].Why, "already finished")
}

func TestKillOfAClaimedTaskEndsItUnrun(t *testing.T) {
	b := setup(t)
	q := b.queue("claimed", "test", 1, schema.SortFIFO)
	claimed, release := make(chan bson.ObjectID, 1), make(chan struct{})
	cfg := b.config("n1")
	cfg.beforeStart = func(t schema.Task) {
		claimed <- t.ID
		<-release
	}
	b.start(cfg)
	id := b.tasks(q, 1, nil)[0]
	require.Equal(t, id, recv(t, claimed))
	res, err := b.store.TaskKill(context.Background(), store.TaskKillParams{Target: store.TaskTarget{IDs: []bson.ObjectID{id}}, By: "tester"})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Requested)
	close(release)
	b.waitStatus(id, schema.StatusFailed, 10*time.Second)
	c := b.control(id)
	require.Equal(t, schema.ReasonKilled, c.Reason)
	// Its start was refused: it never was running, so no attempt ended.
	require.Zero(t, c.Attempt, "%s", b.task(id))
	stderr, _ := b.task(id).Lookup("stderr").StringValueOK()
	require.Contains(t, stderr, "not started")
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Empty(t, b.rec.runs, "a task killed while claimed must never run")
}

func TestKillOfAQueuedTaskCancelsIt(t *testing.T) {
	b := setup(t)
	q := b.queue("paused", "test", 0, schema.SortFIFO)
	ids := b.tasks(q, 2, nil)
	res, err := b.store.TaskKill(context.Background(), store.TaskKillParams{Target: store.TaskTarget{Filter: &store.TaskFilter{Queue: q}}, By: "tester"})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Cancelled)
	for _, id := range ids {
		require.Equal(t, int64(schema.StatusFailed), b.task(id).Lookup("status").AsInt64())
		require.Equal(t, schema.ReasonCancelled, b.control(id).Reason)
	}
}

func TestTimeoutKillsTheTaskAtItsDeadline(t *testing.T) {
	b := setup(t)
	q := b.shellQueue("timeout", 2, func(p *store.QueueUpdateParams) { p.Timeout = ptr(30 * time.Second) })
	b.start(b.config("n1"))
	// The task's own timeout overrides the queue's.
	start := time.Now()
	id := b.insert(q, &store.TaskInsertControl{Timeout: time.Second}, bson.D{{Key: "command", Value: "sleep 30"}})[0]
	b.waitStatus(id, schema.StatusFailed, 20*time.Second)
	require.Less(t, time.Since(start), 20*time.Second)
	require.Equal(t, schema.ReasonTimeout, b.control(id).Reason)
	stderr, _ := b.task(id).Lookup("stderr").StringValueOK()
	require.Contains(t, stderr, "timeout of 1s (the task's timeout)")
}

func TestRetriesReachExactlyRetriesAttempts(t *testing.T) {
	b := setup(t)
	q := b.shellQueue("retries", 2, func(p *store.QueueUpdateParams) {
		p.Retries = ptr(2)
		p.RetryBackoff = &schema.Backoff{Base: 100 * time.Millisecond, Max: 100 * time.Millisecond}
	})
	b.start(b.config("n1"))
	failing := b.insert(q, nil, bson.D{{Key: "command", Value: `echo "try $DISBATCH_ATTEMPT"; exit 3`}})[0]
	ok := b.insert(q, nil, bson.D{{Key: "command", Value: "true"}})[0]
	b.waitStatus(ok, schema.StatusSucceeded, 10*time.Second)
	require.Eventually(t, func() bool {
		c := b.control(failing)
		return c.Attempt == 3 && b.task(failing).Lookup("status").AsInt64() == int64(schema.StatusFailed)
	}, 20*time.Second, 10*time.Millisecond, "%s", b.task(failing))
	c := b.control(failing)
	require.Equal(t, 3, c.Attempt, "1 run + 2 retries")
	require.Len(t, c.Attempts, 3)
	require.Equal(t, 2, c.Tries)
	require.Empty(t, c.Reason, "the last attempt failed as its plugin said")
	for i := 1; i < 3; i++ {
		gap := c.Attempts[i].Started.Sub(c.Attempts[i-1].Finished)
		require.GreaterOrEqual(t, gap, 90*time.Millisecond, "retry %d came %s after the failure, before its backoff", i, gap)
	}
	require.Equal(t, "try 3\n", b.task(failing).Lookup("stdout").StringValue(), "the plugin is told its attempt")
	require.Equal(t, 1, b.control(ok).Attempt)
	// No fourth attempt comes.
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, 3, b.control(failing).Attempt)
}

func TestDelayedTaskStartsAtNotBefore(t *testing.T) {
	b := setup(t)
	q := b.queue("delayed", "test", 1, schema.SortFIFO)
	cfg := b.config("n1")
	cfg.Tick = time.Minute // the leader's timer, not the tick, must queue it
	b.start(cfg)
	time.Sleep(200 * time.Millisecond)    // let the node become leader
	at := time.Now().Add(2 * time.Second) // still ahead once the insert is read back on a loaded machine
	id := b.insert(q, &store.TaskInsertControl{NotBefore: at}, bson.D{{Key: "i", Value: 1}})[0]
	require.Equal(t, int64(schema.StatusBlocked), b.task(id).Lookup("status").AsInt64())
	b.waitStatus(id, schema.StatusSucceeded, 10*time.Second)
	b.rec.mu.Lock()
	started := b.rec.runs[id][0].start
	b.rec.mu.Unlock()
	require.False(t, started.Before(at.Truncate(time.Millisecond)), "started %s before its not_before", at.Sub(started))
	require.Less(t, started.Sub(at), 5*time.Second)
}

func TestExpiredTaskFinishesUnrunAndIsNeverClaimed(t *testing.T) {
	b := setup(t)
	q := b.queue("expiring", "test", 0, schema.SortFIFO) // paused: nothing claims
	b.start(b.config("n1"))
	id := b.insert(q, &store.TaskInsertControl{ExpiresAt: time.Now().Add(300 * time.Millisecond)}, bson.D{{Key: "i", Value: 1}})[0]
	b.waitStatus(id, schema.StatusFailed, 10*time.Second)
	require.Equal(t, schema.ReasonExpired, b.control(id).Reason)
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: q, SetMaxThreads: true, MaxThreads: ptr(1)}))
	time.Sleep(500 * time.Millisecond)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Empty(t, b.rec.runs)
}

func TestExpiryAndDelayHoldAcrossANodeRestart(t *testing.T) {
	b := setup(t)
	paused := b.queue("paused", "test", 0, schema.SortFIFO)
	q := b.queue("run", "test", 1, schema.SortFIFO)
	n, err := New(b.config("n1"))
	require.NoError(t, err)
	require.NoError(t, n.Start(context.Background()))
	// Due 3 s from now: the inserts and the node's stop take less on a
	// loaded machine (800 ms could be too short for them), then the wait
	// passes it.
	due := time.Now().Add(3 * time.Second)
	expiring := b.insert(paused, &store.TaskInsertControl{ExpiresAt: due}, bson.D{{Key: "i", Value: 1}})[0]
	delayed := b.insert(q, &store.TaskInsertControl{NotBefore: due}, bson.D{{Key: "i", Value: 2}})[0]
	n.Stop()
	require.True(t, time.Now().Before(due), "the inserts and the stop took past the moment they were due")
	time.Sleep(time.Until(due) + 200*time.Millisecond)
	// Nobody ran while the node was down.
	require.Equal(t, int64(schema.StatusQueued), b.task(expiring).Lookup("status").AsInt64())
	require.Equal(t, int64(schema.StatusBlocked), b.task(delayed).Lookup("status").AsInt64())
	require.NoError(t, n.Start(context.Background()))
	defer n.Stop()
	b.waitStatus(expiring, schema.StatusFailed, 10*time.Second)
	require.Equal(t, schema.ReasonExpired, b.control(expiring).Reason)
	b.waitStatus(delayed, schema.StatusSucceeded, 10*time.Second)
}

func TestRestartSettlesKillsAndRerunsOrphansOfRerunQueues(t *testing.T) {
	b := setup(t)
	rerun := b.queue("rerun", "test", 1, schema.SortFIFO)
	require.NoError(t, b.store.QueueUpdate(context.Background(), store.QueueUpdateParams{ID: rerun, RerunOrphans: ptr(true)}))
	plain := b.queue("plain", "test", 1, schema.SortFIFO)
	ids := b.tasks(rerun, 1, nil)
	ids = append(ids, b.tasks(plain, 2, nil)...)
	// A previous run of n1 left them running; an operator asked to kill the last.
	tasks := b.db.Collection("tasks")
	_, err := tasks.UpdateMany(context.Background(), bson.D{}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 0}, {Key: "node", Value: "n1"}}}})
	require.NoError(t, err)
	res, err := b.store.TaskKill(context.Background(), store.TaskKillParams{Target: store.TaskTarget{IDs: ids[2:]}, By: "tester"})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Requested)
	b.start(b.config("n1"))
	b.waitStatus(ids[0], schema.StatusSucceeded, 10*time.Second)
	c := b.control(ids[0])
	require.Len(t, c.Attempts, 2, "the orphaned attempt and the rerun")
	require.Equal(t, schema.StatusOrphaned, c.Attempts[0].Status)
	require.Equal(t, int64(schema.StatusOrphaned), b.task(ids[1]).Lookup("status").AsInt64())
	require.Equal(t, int64(schema.StatusFailed), b.task(ids[2]).Lookup("status").AsInt64())
	require.Equal(t, schema.ReasonKilled, b.control(ids[2]).Reason)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Len(t, b.rec.runs, 1)
}

func TestKillRacingNodeShutdownEndsTheTaskOnce(t *testing.T) {
	b := setup(t)
	q := b.shellQueue("shutdown", 2, nil)
	cfg := b.config("n1")
	cfg.Grace = 200 * time.Millisecond
	n, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, n.Start(context.Background()))
	ids := b.insert(q, nil, bson.D{{Key: "command", Value: "sleep 60"}}, bson.D{{Key: "command", Value: "sleep 60"}})
	for _, id := range ids {
		b.waitStatus(id, schema.StatusRunning, 10*time.Second)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		n.Stop()
	}()
	_, err = b.store.TaskKill(context.Background(), store.TaskKillParams{Target: store.TaskTarget{IDs: ids}, By: "tester"})
	require.NoError(t, err)
	<-stopped
	// Whichever came first, each task ended failed, once, and a restart of
	// the node does not bring it back.
	require.NoError(t, n.Start(context.Background()))
	defer n.Stop()
	time.Sleep(300 * time.Millisecond)
	for _, id := range ids {
		require.Equal(t, int64(schema.StatusFailed), b.task(id).Lookup("status").AsInt64(), "%s", b.task(id))
		c := b.control(id)
		require.LessOrEqual(t, c.Attempt, 1)
	}
}

// controlObserver records what the node tells its Observer of task control.
type controlObserver struct {
	noObserver
	mu sync.Mutex
	n  map[string]int
}

func (o *controlObserver) TaskControlled(queue, action string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[queue+"/"+action] += n
}

func (o *controlObserver) TaskFinished(queue string, _ schema.Status, _ time.Duration, retried bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[fmt.Sprintf("%s/finished retried=%t", queue, retried)]++
}

func (o *controlObserver) count(key string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[key]
}

func TestTimeoutsAndRetriesAreCountedAndTraced(t *testing.T) {
	b := setup(t)
	rec, _ := recorded()
	q := b.shellQueue("observed", 1, func(p *store.QueueUpdateParams) {
		p.Retries = ptr(1)
		p.RetryBackoff = &schema.Backoff{}
	})
	obs := &controlObserver{}
	cfg := b.config("n1")
	cfg.Observer = obs
	b.start(cfg)
	id := b.insert(q, &store.TaskInsertControl{Timeout: 300 * time.Millisecond}, bson.D{{Key: "command", Value: "sleep 30"}})[0]
	require.Eventually(t, func() bool {
		return b.control(id).Attempt == 2 && b.task(id).Lookup("status").AsInt64() == int64(schema.StatusFailed)
	}, 20*time.Second, 10*time.Millisecond, "%s", b.task(id))
	require.Equal(t, 2, obs.count("observed/"+ControlTimeout), "both attempts timed out")
	require.Equal(t, 1, obs.count("observed/"+ControlRetry), "one retry")
	require.Eventually(t, func() bool { return obs.count("observed/finished retried=false") == 1 }, 5*time.Second, 10*time.Millisecond,
		"the task finished once")
	require.Equal(t, 1, obs.count("observed/finished retried=true"), "its first attempt was retried, not finished")
	// The two attempts are two task spans; their events say what happened.
	events := map[string]int{}
	require.Eventually(t, func() bool {
		clear(events)
		spans := 0
		for _, s := range rec.Ended() {
			if s.Name() == "disbatch.task" && attrs(s)["disbatch.task.id"].AsString() == id.Hex() {
				spans++
				for _, e := range s.Events() {
					events[e.Name]++
				}
			}
		}
		return spans == 2
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 2, events["disbatch."+ControlTimeout])
	require.Equal(t, 1, events["disbatch."+ControlRetry])
}

// TestAFailedTaskIsLogged: a task that fails says so in the node's log,
// with the end of its stderr (a plugin that cannot start failed every
// task of its queue with nothing in the log).
func TestAFailedTaskIsLogged(t *testing.T) {
	b := setup(t)
	q := b.shellQueue("failing", 1, nil)
	b.start(b.config("n1"))
	id := b.insert(q, nil, bson.D{{Key: "command", Value: "echo first >&2; echo 'the real cause' >&2; exit 3"}})[0]
	require.Eventually(t, func() bool { return b.task(id).Lookup("status").AsInt64() == int64(schema.StatusFailed) }, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return strings.Contains(b.logs.String(), `level=INFO msg="task failed"`) && strings.Contains(b.logs.String(), `stderr="first | the real cause | exit status 3"`)
	}, 5*time.Second, 10*time.Millisecond, "%s", b.logs.String())
}
