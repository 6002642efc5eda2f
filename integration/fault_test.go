package integration

// The fault suite: real mongod processes (a three-member replica set), three
// disbatchd processes per scenario, a continuous workload, and one fault per
// scenario. Afterwards the invariants are checked (fault_check_test.go) and
// one summary line per scenario is logged. Run it alone with
//
//	go test -race -run TestFault -v ./integration/

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/mongod"
)

// TestFault runs the scenarios one after the other on one replica set: each
// injects a fault into the set or a node, so they must not overlap, and the
// suite does not run in parallel with the package's other tests either, so
// that timings hold on a small machine.
func TestFault(t *testing.T) {
	begin := time.Now()
	s := setupFaultSuite(t)
	scenarios := []struct {
		name string
		run  func(*testing.T, *faultSuite)
	}{
		{"Stepdown", faultStepdown},
		{"KillPrimary", faultKillPrimary},
		{"KillNode", faultKillNode},
		{"CutNode", faultCutNode},
		{"RestartAll", faultRestartAll},
		{"RestartNodeDuringStepdown", faultRestartNodeDuringStepdown},
	}
	for _, sc := range scenarios {
		s.waitHealthy(t, 2*time.Minute)
		t.Run(sc.name, func(t *testing.T) { sc.run(t, s) })
	}
	t.Logf("fault suite took %v", time.Since(begin).Round(time.Second))
}

// startThree starts nodes n1, n2 and n3 on the replica set and waits for
// them.
func (sc *scenario) startThree() {
	for _, name := range []string{"n1", "n2", "n3"} {
		sc.startNode(name, "")
	}
	sc.waitStarted()
}

// faultStepdown: the primary steps down mid-run.
func faultStepdown(t *testing.T, s *faultSuite) {
	sc := s.newScenario(t)
	sc.startThree()
	wait := sc.startWorkload()
	time.Sleep(faultAt)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, c := primaryClient(ctx, t, s)
	sc.fault = time.Now()
	err := stepDown(ctx, c)
	took := time.Since(sc.fault)
	require.NoError(t, err, "replSetStepDown")
	p, err := s.rs.WaitPrimary(ctx)
	require.NoError(t, err)
	sc.extra = append(sc.extra, fmt.Sprintf("stepdown_took=%v new_primary_after=%v", took.Round(time.Millisecond), time.Since(sc.fault).Round(time.Millisecond)))
	require.NotEqual(t, old.Addr(), p.Addr(), "the primary did not change")
	sc.finish(wait)
}

// faultKillPrimary: the primary is killed with SIGKILL and restarted a few
// seconds later.
func faultKillPrimary(t *testing.T, s *faultSuite) {
	sc := s.newScenario(t)
	sc.startThree()
	wait := sc.startWorkload()
	time.Sleep(faultAt)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	old, err := s.rs.WaitPrimary(ctx)
	require.NoError(t, err)
	sc.fault = time.Now()
	require.NoError(t, old.Kill())
	p, err := s.rs.WaitPrimary(ctx)
	require.NoError(t, err)
	elected := time.Since(sc.fault)
	time.Sleep(3*time.Second - elected)
	require.NoError(t, old.Restart(ctx))
	sc.extra = append(sc.extra, fmt.Sprintf("new_primary_after=%v old_primary_back_after=%v",
		elected.Round(time.Millisecond), time.Since(sc.fault).Round(time.Millisecond)))
	require.NotEqual(t, old.Addr(), p.Addr())
	sc.finish(wait)
}

// faultKillNode: a node is killed with SIGKILL while it runs tasks (the one
// holding the counter projector's lease, so that the projection fails over
// too). A live node must find it dead: its claimed tasks go back to the
// queue, its running ones become -6, within seconds.
func faultKillNode(t *testing.T, s *faultSuite) {
	sc := s.newScenario(t)
	sc.requireFlags("heartbeat", "dead-after", "fence-after")
	sc.startThree()
	wait := sc.startWorkload()
	time.Sleep(faultAt)

	victim := sc.projectorOwner()
	if victim == "" {
		victim = "n2"
	}
	n := sc.node(victim)
	sc.waitRunningOn(victim) // kill it while it runs tasks
	sc.fault = time.Now()
	sc.kill(n)
	time.Sleep(300 * time.Millisecond) // writes in flight land
	claimed, running := sc.heldBy(victim)
	recovered := sc.waitReleased(victim, faultDeadAfter+20*time.Second)
	// Its supervisors may have finished every task it held before the
	// recovery (tasks claimed straight into running leave none claimed):
	// the recovery is when its document says dead.
	var doc nodeDoc
	require.Eventually(t, func() bool {
		var err error
		doc, err = sc.nodeDoc(victim)
		return err == nil && doc.Dead
	}, faultDeadAfter+20*time.Second, 50*time.Millisecond, "the killed node's document does not say dead: %+v", &doc)
	recovered = max(recovered, time.Since(sc.fault))
	sc.extra = append(sc.extra, fmt.Sprintf("killed=%s held_claimed=%d held_running=%d dead_node_recovered_after=%v",
		victim, len(claimed), len(running), recovered.Round(time.Millisecond)))
	require.NotEqual(t, victim, doc.DeadBy)
	require.LessOrEqual(t, recovered, faultDeadAfter+5*time.Second, "dead-node recovery took too long")
	sc.finish(wait)

	// What it held: running tasks orphaned (or, when the killer had asked
	// to kill them, finished as killed by the recovery), unless their
	// supervisors finished them first, on the dead node's name (the
	// recorder is an external plugin, so supervised: docs/restarts.md);
	// claimed ones run elsewhere.
	final := map[string]finalTask{}
	for _, x := range sc.finalTasks() {
		final[x.ID] = x
	}
	bySupervisor, retried := 0, 0
	for _, id := range running {
		x := final[id.Hex()]
		if (x.Status == 1 || x.Status == 2 && x.Reason != "killed") && x.Node == victim {
			bySupervisor++
			continue
		}
		if (x.Status == 1 || x.Status == 2) && x.Node != victim && x.FailUntil >= 1 && x.Attempt >= 2 {
			// Its supervisor finished the victim's attempt as the failure
			// the recorder was told to make (a write landing after the
			// snapshot above), and a retry ran elsewhere.
			retried++
			continue
		}
		if sc.killer.wasAsked(id) {
			require.Equal(t, 2, x.Status, "task %s was running on the killed node and asked to be killed", id.Hex())
			continue
		}
		require.Equal(t, -6, x.Status, "task %s was running on the killed node: %+v", id.Hex(), x)
	}
	t.Logf("of the %d tasks running on the killed node, %d were finished by their supervisors, %d of them failed and retried elsewhere",
		len(running), bySupervisor+retried, retried)
	for _, id := range claimed {
		x := final[id.Hex()]
		require.Contains(t, []int{1, 2}, x.Status, "task %s was claimed by the killed node: want it run elsewhere", id.Hex())
		require.NotEqual(t, victim, x.Node, "task %s was claimed by the killed node", id.Hex())
	}
}

// faultCutNode: one node's connection to MongoDB (through a proxy) becomes
// a blackhole for longer than --dead-after. The node must fence itself
// (stop claiming, kill its running plugins), the others recover its tasks,
// and once the connection is back it rejoins and runs tasks again.
func faultCutNode(t *testing.T, s *faultSuite) {
	sc := s.newScenario(t)
	sc.requireFlags("heartbeat", "dead-after", "fence-after")
	primary := s.waitHealthy(t, time.Minute)
	// Through a replica-set URI the driver would find the members' real
	// addresses and go around the proxy: the cut node talks to the primary
	// alone (no failover in this scenario).
	px := startProxy(t, primary.Addr())
	const cutName = "n3"
	// A queue pinned to the cut node, with two tasks that run for 20 s: they
	// run when the cut comes, and the fence must kill them.
	cli(t, s.uri, sc.dbName, "", "queue", "create", "long", "--constructor", recorderConstructor, "--maxthreads", "2")
	long := sc.queueID("long")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := sc.db.Collection("queues").UpdateOne(ctx, bson.D{{Key: "_id", Value: long}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "nodes_pin", Value: bson.A{cutName}}}}})
	require.NoError(t, err)
	longIDs, longDocs := batch(long, 2, 20000)
	require.NoError(t, sc.sub.insert(longIDs, longDocs, time.Now().Add(30*time.Second)))

	// The cut node first, so that it likely holds the projector lease too.
	sc.startNode(cutName, "mongodb://"+px.addr()+"/?directConnection=true")
	sc.waitStarted()
	sc.startNode("n1", "")
	sc.startNode("n2", "")
	sc.waitStarted()
	workStart := time.Now()
	wait := sc.startWorkload()

	// Both long tasks run on the cut node: their plugins' pids.
	pids := map[string]int{}
	deadline := time.Now().Add(30 * time.Second)
	for len(pids) < 2 {
		recs, err := readRecords(sc.records)
		require.NoError(t, err)
		for _, r := range recs {
			if r.Ev == "start" && (r.Task == longIDs[0].Hex() || r.Task == longIDs[1].Hex()) {
				require.Equal(t, cutName, r.Node)
				pids[r.Task] = r.PID
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the long tasks did not start on %s within 30s", cutName)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Until(workStart.Add(faultAt)))

	projector := sc.projectorOwner()
	sc.fault = time.Now()
	px.cut(t)
	cutFor := faultDeadAfter + 5*time.Second
	restoreAt := sc.fault.Add(cutFor)

	// While it is cut off: the fence kills the long plugins, and a live
	// node finds it dead and recovers its tasks.
	var fenced time.Duration
	for fenced == 0 {
		gone := 0
		for _, pid := range pids {
			if !alive(pid) {
				gone++
			}
		}
		if gone == len(pids) {
			fenced = time.Since(sc.fault)
			break
		}
		if time.Since(sc.fault) > faultFenceAfter+5*time.Second {
			t.Fatalf("the cut node's plugins (pids %v) still run %v after the cut: it did not fence itself", pids, time.Since(sc.fault).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
	recovered := sc.waitReleased(cutName, cutFor-500*time.Millisecond)
	var deadSeen bool
	for time.Now().Before(restoreAt) {
		if d, err := sc.nodeDoc(cutName); err == nil && d.Dead {
			deadSeen = true
		}
		time.Sleep(100 * time.Millisecond)
	}
	px.restore()
	restored := time.Now()
	sc.extra = append(sc.extra, fmt.Sprintf("cut=%s projector=%s cut_for=%v fenced_after=%v dead_node_recovered_after=%v",
		cutName, projector, cutFor, fenced.Round(time.Millisecond), recovered.Round(time.Millisecond)))
	require.True(t, deadSeen, "the cut node's document never said dead while it was cut off")
	require.LessOrEqual(t, fenced, faultFenceAfter+3*time.Second, "fencing took too long")

	// While cut off it ran nothing: no start after the fence (its own
	// guarded writes cannot reach MongoDB), no end after the kill.
	recs, err := readRecords(sc.records)
	require.NoError(t, err)
	for _, r := range recs {
		at := time.Unix(0, r.T)
		if r.Node == cutName && at.After(sc.fault.Add(fenced+time.Second)) && at.Before(restored) {
			t.Errorf("the cut node ran while cut off and fenced: %+v", r)
		}
	}
	// It rejoins: its first run after the restore.
	var rejoined time.Duration
	deadline = time.Now().Add(30 * time.Second)
	for rejoined == 0 && time.Now().Before(deadline) {
		recs, err := readRecords(sc.records)
		require.NoError(t, err)
		for _, r := range starts(recs) {
			if r.Node == cutName && r.T > restored.UnixNano() {
				rejoined = time.Duration(r.T - restored.UnixNano())
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rejoined > 0 {
		sc.extra = append(sc.extra, fmt.Sprintf("rejoined_after_restore=%v", rejoined.Round(time.Millisecond)))
	} else {
		sc.extra = append(sc.extra, "rejoined_after_restore=not-during-the-workload")
	}
	sc.finish(wait) // the final batch checks that it serves again
	final := map[string]finalTask{}
	for _, x := range sc.finalTasks() {
		final[x.ID] = x
	}
	for _, id := range longIDs {
		require.Equal(t, -6, final[id.Hex()].Status, "long task %s was running on the cut node", id.Hex())
	}
}

// faultRestartAll: every mongod is killed with SIGKILL and restarted while
// the nodes run.
func faultRestartAll(t *testing.T, s *faultSuite) {
	sc := s.newScenario(t)
	sc.startThree()
	wait := sc.startWorkload()
	time.Sleep(faultAt)

	sc.fault = time.Now()
	eachMember(t, s.rs, func(m *mongod.Member) error { return m.Kill() })
	time.Sleep(3 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	eachMember(t, s.rs, func(m *mongod.Member) error { return m.Restart(ctx) })
	restarted := time.Since(sc.fault)
	_, err := s.rs.WaitPrimary(ctx)
	require.NoError(t, err)
	sc.extra = append(sc.extra, fmt.Sprintf("mongods_back_after=%v primary_after=%v",
		restarted.Round(time.Millisecond), time.Since(sc.fault).Round(time.Millisecond)))
	sc.finish(wait)
}

// faultRestartNodeDuringStepdown: a node is killed with SIGKILL while it
// runs tasks and started again at once, while the primary steps down: its
// supervisors keep its running tasks (recorder tasks are external plugins,
// supervised) and the new run adopts them, or finish them themselves if
// the node is not back, or fence them if it is away longer than
// fence-after; nothing is lost or run twice either way.
func faultRestartNodeDuringStepdown(t *testing.T, s *faultSuite) {
	sc := s.newScenario(t)
	sc.startThree()
	wait := sc.startWorkload()
	time.Sleep(faultAt)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, c := primaryClient(ctx, t, s)
	n := sc.node("n1")
	sc.waitRunningOn("n1")
	sc.fault = time.Now()
	stepped := make(chan error, 1)
	go func() { stepped <- stepDown(ctx, c) }()
	sc.kill(n)
	again := sc.startNode("n1", "")
	again.p.waitLog("node started", nodeStartWait)
	back := time.Since(sc.fault)
	require.NoError(t, <-stepped, "replSetStepDown")
	p, err := s.rs.WaitPrimary(ctx)
	require.NoError(t, err)
	require.NotEqual(t, old.Addr(), p.Addr(), "the primary did not change")
	sc.extra = append(sc.extra, fmt.Sprintf("n1_back_after=%v %s", back.Round(time.Millisecond),
		strings.TrimSpace(lastMatch(again.p.log.String(), "adopted the previous run's running tasks"))))
	sc.finish(wait)
}

// primaryClient returns the primary and a direct client to it, closed
// when the test ends.
func primaryClient(ctx context.Context, t *testing.T, s *faultSuite) (*mongod.Member, *mongo.Client) {
	t.Helper()
	old, err := s.rs.WaitPrimary(ctx)
	require.NoError(t, err)
	c := directClient(t, old)
	t.Cleanup(func() { disconnectQuietly(c) })
	return old, c
}

// stepDown asks the primary c is connected to to step down for 10 s.
func stepDown(ctx context.Context, c *mongo.Client) error {
	return c.Database("admin").RunCommand(ctx, bson.D{{Key: "replSetStepDown", Value: 10}, {Key: "secondaryCatchUpPeriodSecs", Value: 5}}).Err()
}

// waitRunningOn waits until node name runs a task (at most 10 s).
func (sc *scenario) waitRunningOn(name string) {
	sc.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, running := sc.heldBy(name); len(running) > 0 {
			return
		}
		if time.Now().After(deadline) {
			sc.t.Fatalf("node %s ran no task for 10s", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// eachMember runs fn on every member at once.
func eachMember(t *testing.T, rs *mongod.ReplicaSet, fn func(*mongod.Member) error) {
	t.Helper()
	ms := rs.Members()
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = fn(m) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}
