package integration

// The fault suite's harness: a three-member replica set shared by the
// scenarios, the recorder plugin, three disbatchd nodes per scenario, a
// submitter, a change-stream watcher on tasks, and a TCP proxy that cuts a
// node off from MongoDB.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/disbatch-go/disbatch/internal/mongod"
)

const (
	recorderConstructor = "Fault::Recorder"
	faultQueue          = "work"
	faultMaxThreads     = 8 // per node
	faultRetries        = 2 // the queue's retries
	faultFailOneIn      = 5 // one workload task in this many fails its first attempt

	// The workload: faultRate tasks per second for faultWorkload, each
	// sleeping 10..200 ms.
	faultRate     = 120
	faultWorkload = 15 * time.Second
	faultBatch    = 50 * time.Millisecond // one insertMany per batch
	faultAt       = 4 * time.Second       // into the workload

	// The node timings of the suite (flags of disbatchd).
	faultHeartbeat  = 250 * time.Millisecond
	faultFenceAfter = 1500 * time.Millisecond
	faultDeadAfter  = 4 * time.Second
	faultGrace      = 2 * time.Second

	drainTimeout   = 60 * time.Second // until no task is in -2, -1 or 0
	counterTimeout = 30 * time.Second // until the counters equal a recount
	nodeStartWait  = 60 * time.Second // three race-built nodes starting at once
	finalBatch     = 90               // tasks of 100 ms after the fault, for every node
	markerColl     = "fault_markers"  // the watcher's sync points
)

// faultSuite is what the scenarios share.
type faultSuite struct {
	rs       *mongod.ReplicaSet
	uri      string
	client   *mongo.Client
	recorder string          // the recorder plugin's binary
	flags    map[string]bool // fault flags disbatchd has: heartbeat, fence-after, dead-after
}

func setupFaultSuite(t *testing.T) *faultSuite {
	t.Helper()
	bin, err := mongod.Binary()
	require.NoError(t, err, "the fault suite runs real mongod processes: run `make mongod`")
	s := &faultSuite{recorder: buildRecorder(t), flags: map[string]bool{}}

	help := runBin(t, disbatchdBin, "", nil, "--help")
	for _, f := range []string{"heartbeat", "fence-after", "dead-after"} {
		s.flags[f] = strings.Contains(help.stdout+help.stderr, "--"+f+" ")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	begin := time.Now()
	s.rs, err = mongod.StartReplicaSet(ctx, mongod.Options{Members: 3, Binary: bin})
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := s.rs.Stop(); err != nil {
			t.Logf("stop the replica set: %v", err)
		}
	})
	s.uri = s.rs.URI()
	s.client, err = mongo.Connect(options.Client().ApplyURI(s.uri).SetServerSelectionTimeout(10 * time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { disconnectQuietly(s.client) })
	t.Logf("replica set of 3 up in %v: %s; disbatchd fault flags: %v", time.Since(begin).Round(time.Millisecond), s.uri, s.flags)
	return s
}

// buildRecorder builds testdata/recorder (without -race: it is a plugin,
// started hundreds of times a second).
func buildRecorder(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "recorder")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./testdata/recorder")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build ./testdata/recorder: %s", b)
	return out
}

func disconnectQuietly(c *mongo.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = c.Disconnect(ctx)
}

// directClient connects to one member alone.
func directClient(t *testing.T, m *mongod.Member) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + m.Addr() + "/?directConnection=true").
		SetServerSelectionTimeout(5 * time.Second))
	require.NoError(t, err)
	return c
}

// waitHealthy waits until every member runs and the set has a primary and
// two secondaries, so that a scenario starts from a whole set.
func (s *faultSuite) waitHealthy(t *testing.T, timeout time.Duration) *mongod.Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	for {
		p, err := s.rs.WaitPrimary(ctx)
		if err != nil {
			t.Fatalf("replica set not healthy within %v: %v (last status: %s)", timeout, err, last)
		}
		c := directClient(t, p)
		var st struct {
			Members []struct {
				Name     string `bson:"name"`
				StateStr string `bson:"stateStr"`
				Health   float64
			} `bson:"members"`
		}
		err = c.Database("admin").RunCommand(ctx, bson.D{{Key: "replSetGetStatus", Value: 1}}).Decode(&st)
		disconnectQuietly(c)
		if err == nil {
			states := map[string]int{}
			var desc []string
			for _, m := range st.Members {
				states[m.StateStr]++
				desc = append(desc, m.Name+"="+m.StateStr)
			}
			last = strings.Join(desc, " ")
			if states["PRIMARY"] == 1 && states["SECONDARY"] == 2 {
				return p
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("replica set not healthy within %v; last status: %s", timeout, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// scenario is one fault scenario: its own database, queue, nodes,
// submitter, watcher and records.
type scenario struct {
	t       *testing.T
	s       *faultSuite
	dbName  string
	db      *mongo.Database
	queue   bson.ObjectID
	records string // the recorder's file
	nodes   []*faultNode
	watch   *taskWatcher
	sub     *submitter

	fault      time.Time // when the fault was injected
	submitDone time.Time // when the submitter stopped
	extra      []string  // scenario facts for the summary line
	killer     *killer   // kill requests during the workload
}

// faultNode is a disbatchd of a scenario.
type faultNode struct {
	name   string
	uri    string
	p      *proc
	killed bool
}

func (s *faultSuite) newScenario(t *testing.T) *scenario {
	t.Helper()
	name := fmt.Sprintf("fault_%s_%d", strings.ReplaceAll(filepath.Base(t.Name()), "/", "_"), time.Now().UnixNano()%1_000_000)
	sc := &scenario{t: t, s: s, dbName: name, db: s.client.Database(name), records: filepath.Join(t.TempDir(), "records.jsonl")}
	cli(t, s.uri, name, "", "queue", "create", faultQueue, "--constructor", recorderConstructor,
		"--maxthreads", fmt.Sprint(faultMaxThreads), "--sort", "fifo")
	cli(t, s.uri, name, "", "queue", "set", faultQueue, "--retries", fmt.Sprint(faultRetries), "--retry-backoff", "20ms,200ms,0.2")
	sc.queue = sc.queueID(faultQueue)
	sc.watch = startWatcher(t, sc.db)
	sc.sub = &submitter{coll: sc.db.Collection("tasks", options.Collection().SetWriteConcern(writeconcern.Majority()))}
	return sc
}

func (sc *scenario) queueID(name string) bson.ObjectID {
	sc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var q struct {
		ID bson.ObjectID `bson:"_id"`
	}
	require.NoError(sc.t, sc.db.Collection("queues").FindOne(ctx, bson.D{{Key: "name", Value: name}}).Decode(&q))
	return q.ID
}

// requireFlags fails the scenario at once if disbatchd lacks a flag it needs.
func (sc *scenario) requireFlags(flags ...string) {
	sc.t.Helper()
	var missing []string
	for _, f := range flags {
		if !sc.s.flags[f] {
			missing = append(missing, "--"+f)
		}
	}
	if len(missing) > 0 {
		sc.t.Fatalf("disbatchd has no %s (dead-node detection and fencing): this scenario cannot run without them", strings.Join(missing, ", "))
	}
}

// startNode starts a node named name connecting to uri ("" for the
// replica set's), running the recorder for the queue's constructor.
func (sc *scenario) startNode(name, uri string) *faultNode {
	sc.t.Helper()
	if uri == "" {
		uri = sc.s.uri
	}
	args := nodeArgs(uri, sc.dbName, name, "--plugin", recorderConstructor+"="+sc.s.recorder, "--grace", faultGrace.String())
	for f, v := range map[string]time.Duration{"heartbeat": faultHeartbeat, "fence-after": faultFenceAfter, "dead-after": faultDeadAfter} {
		if sc.s.flags[f] {
			args = append(args, "--"+f, v.String())
		}
	}
	n := &faultNode{name: name, uri: uri, p: startNode(sc.t, args, "FAULT_RECORDER_FILE="+sc.records)}
	sc.nodes = append(sc.nodes, n)
	return n
}

// waitStarted waits until every node has started.
func (sc *scenario) waitStarted() {
	sc.t.Helper()
	for _, n := range sc.nodes {
		n.p.waitLog("node started", nodeStartWait)
	}
}

func (sc *scenario) node(name string) *faultNode {
	for _, n := range sc.nodes {
		if n.name == name {
			return n
		}
	}
	sc.t.Fatalf("no node %s", name)
	return nil
}

// kill SIGKILLs a node's disbatchd (its plugins, in process groups of
// their own, live on until they end).
func (sc *scenario) kill(n *faultNode) {
	sc.t.Helper()
	require.NoError(sc.t, n.p.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case <-n.p.done:
	case <-time.After(10 * time.Second):
		sc.t.Fatalf("node %s still running 10s after SIGKILL", n.name)
	}
	n.killed = true
}

// stopNodes stops the live nodes with SIGTERM; each must exit 0.
func (sc *scenario) stopNodes() {
	sc.t.Helper()
	for _, n := range sc.nodes {
		if !n.killed && !n.p.exited() {
			_ = n.p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, n := range sc.nodes {
		if n.killed {
			continue
		}
		select {
		case <-n.p.done:
			if n.p.err != nil {
				sc.t.Errorf("node %s exited after SIGTERM with %v", n.name, n.p.err)
			}
		case <-time.After(30 * time.Second):
			sc.t.Errorf("node %s still running 30s after SIGTERM", n.name)
		}
	}
}

// newTask is a task document of seed 000: queued, unclaimed.
func newTask(queue bson.ObjectID, ms int, params ...bson.E) (bson.ObjectID, bson.D) {
	id := bson.NewObjectID()
	now := time.Now().UTC().Truncate(time.Millisecond)
	return id, bson.D{
		{Key: "_id", Value: id},
		{Key: "queue", Value: queue},
		{Key: "ctime", Value: now},
		{Key: "mtime", Value: now},
		{Key: "node", Value: int32(-1)},
		{Key: "status", Value: int32(-2)},
		{Key: "parameters", Value: append(bson.D{{Key: "ms", Value: int32(ms)}}, params...)},
		{Key: "stdout", Value: nil},
		{Key: "stderr", Value: nil},
	}
}

// submitter inserts tasks with write concern majority, retrying each
// batch until it is in (an id already present counts as inserted: an
// earlier attempt that was not acknowledged got through).
type submitter struct {
	coll *mongo.Collection

	mu          sync.Mutex
	ids         []bson.ObjectID // inserted, acknowledged
	unconfirmed []bson.ObjectID // given up on: may or may not be in
	retries     int
}

// insert inserts docs (with ids), retrying until they are in or until
// deadline.
func (s *submitter) insert(ids []bson.ObjectID, docs []any, deadline time.Time) error {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := s.coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
		cancel()
		if err == nil || onlyDuplicates(err) {
			s.mu.Lock()
			s.ids = append(s.ids, ids...)
			s.mu.Unlock()
			return nil
		}
		s.mu.Lock()
		s.retries++
		s.mu.Unlock()
		if time.Now().After(deadline) {
			s.mu.Lock()
			s.unconfirmed = append(s.unconfirmed, ids...)
			s.mu.Unlock()
			return fmt.Errorf("insert %d tasks: %w", len(ids), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// onlyDuplicates reports whether err is a bulk write whose only errors are
// duplicate keys.
func onlyDuplicates(err error) bool {
	var bwe mongo.BulkWriteException
	if !errors.As(err, &bwe) || bwe.WriteConcernError != nil || len(bwe.WriteErrors) == 0 {
		return false
	}
	for _, we := range bwe.WriteErrors {
		if we.Code != 11000 {
			return false
		}
	}
	return true
}

// batch makes n tasks of queue; ms < 0 picks 10..200 at random.
func batch(queue bson.ObjectID, n, ms int) ([]bson.ObjectID, []any) {
	ids := make([]bson.ObjectID, 0, n)
	docs := make([]any, 0, n)
	for range n {
		m := ms
		if m < 0 {
			m = 10 + rand.IntN(191)
		}
		var params []bson.E
		if ms < 0 && rand.IntN(faultFailOneIn) == 0 {
			// Fails its first attempt: the queue's retries run it again.
			params = append(params, bson.E{Key: "fail_until", Value: int32(1)})
		}
		id, doc := newTask(queue, m, params...)
		ids = append(ids, id)
		docs = append(docs, doc)
	}
	return ids, docs
}

// run submits rate tasks a second into queue for d, in batches; a batch
// that cannot be inserted (MongoDB down) holds up the next ones, which are
// not made up for later. It returns when done.
func (s *submitter) run(queue bson.ObjectID, rate int, d time.Duration) error {
	per := rate * int(faultBatch) / int(time.Second)
	tick := time.NewTicker(faultBatch)
	defer tick.Stop()
	end := time.Now().Add(d)
	var errs []error
	for now := time.Now(); now.Before(end); now = <-tick.C {
		ids, docs := batch(queue, per, -1)
		if err := s.insert(ids, docs, end.Add(drainTimeout)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *submitter) submitted() []bson.ObjectID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ids)
}

// startWorkload starts the submitter in the background; waitWorkload
// waits for it.
func (sc *scenario) startWorkload() (wait func()) {
	done := make(chan error, 1)
	go func() { done <- sc.sub.run(sc.queue, faultRate, faultWorkload) }()
	sc.killer = sc.startKiller()
	return func() {
		sc.t.Helper()
		defer sc.killer.halt()
		select {
		case err := <-done:
			sc.submitDone = time.Now()
			if err != nil {
				sc.t.Errorf("submitter: %v", err)
			}
		case <-time.After(faultWorkload + drainTimeout + 30*time.Second):
			sc.t.Fatal("the submitter did not stop")
		}
	}
}

// unfinished counts the tasks in -2, -1 or 0.
func (sc *scenario) unfinished(ctx context.Context, filter bson.D) (int64, error) {
	f := append(bson.D{{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{-2, -1, 0}}}}}, filter...)
	return sc.db.Collection("tasks").CountDocuments(ctx, f)
}

// waitQuiet waits until no task (of those filter selects) is in -2, -1 or
// 0; it reports whether that happened within timeout (the checker then
// says which tasks are stuck).
func (sc *scenario) waitQuiet(what string, filter bson.D, timeout time.Duration) (bool, time.Duration) {
	begin := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := sc.unfinished(ctx, filter)
		cancel()
		if err == nil && n == 0 {
			return true, time.Since(begin)
		}
		if time.Since(begin) > timeout {
			sc.t.Errorf("%s: %d tasks still in -2, -1 or 0 after %v (err %v)", what, n, timeout, err)
			return false, time.Since(begin)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// heldBy returns the tasks node holds in -1 and in 0.
func (sc *scenario) heldBy(node string) (claimed, running []bson.ObjectID) {
	sc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cur, err := sc.db.Collection("tasks").Find(ctx, bson.D{
		{Key: "node", Value: node},
		{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{-1, 0}}}},
	})
	require.NoError(sc.t, err)
	var ts []task
	require.NoError(sc.t, cur.All(ctx, &ts))
	for _, x := range ts {
		if x.Status == -1 {
			claimed = append(claimed, x.ID)
		} else {
			running = append(running, x.ID)
		}
	}
	return claimed, running
}

// waitReleased waits until node holds no task in -1 or 0 and returns how
// long after the fault that was, or fails after timeout.
func (sc *scenario) waitReleased(node string, timeout time.Duration) time.Duration {
	sc.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n, err := sc.unfinished(ctx, bson.D{{Key: "node", Value: node}})
		cancel()
		if err == nil && n == 0 {
			return time.Since(sc.fault)
		}
		if time.Now().After(deadline) {
			claimed, running := sc.heldBy(node)
			sc.t.Fatalf("node %s still holds %d claimed and %d running tasks %v after the fault (err %v): claimed %v, running %v",
				node, len(claimed), len(running), time.Since(sc.fault).Round(time.Millisecond), err, hexes(claimed), hexes(running))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func hexes(ids []bson.ObjectID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id.Hex()
	}
	return out
}

// nodeDoc is the part of a nodes document the suite reads.
type nodeDoc struct {
	Node      string    `bson:"node"`
	Timestamp time.Time `bson:"timestamp"`
	Dead      bool      `bson:"dead"`
	DeadBy    string    `bson:"dead_by"`
}

func (sc *scenario) nodeDoc(name string) (nodeDoc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var d nodeDoc
	err := sc.db.Collection("nodes").FindOne(ctx, bson.D{{Key: "node", Value: name}}).Decode(&d)
	return d, err
}

// projectorOwner is the node holding the counter projector's lease.
func (sc *scenario) projectorOwner() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var l struct {
		Owner string `bson:"owner"`
	}
	_ = sc.db.Collection("disbatch_leases").FindOne(ctx, bson.D{{Key: "_id", Value: "projector"}}).Decode(&l)
	return l.Owner
}

// counters reads every queue's counters and recounts its tasks (todo:
// status <= 0, as {$lte: ["$status", 0]}), waiting up to counterTimeout
// for them to agree. It returns the last reading and how long it waited.
func (sc *scenario) counters() ([]queueCounts, time.Duration) {
	begin := time.Now()
	for {
		cs, err := sc.readCounters()
		agree := err == nil
		for _, c := range cs {
			agree = agree && c.Todo == c.RecountTodo && c.Total == c.RecountTotal
		}
		if agree || time.Since(begin) > counterTimeout {
			if err != nil {
				sc.t.Errorf("read the counters: %v", err)
			}
			return cs, time.Since(begin)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (sc *scenario) readCounters() ([]queueCounts, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cur, err := sc.db.Collection("queues").Find(ctx, bson.D{})
	if err != nil {
		return nil, err
	}
	var qs []struct {
		ID    bson.ObjectID `bson:"_id"`
		Name  string        `bson:"name"`
		Todo  int64         `bson:"count_todo"`
		Total int64         `bson:"count_total"`
	}
	if err := cur.All(ctx, &qs); err != nil {
		return nil, err
	}
	tasks := sc.db.Collection("tasks")
	var out []queueCounts
	for _, q := range qs {
		c := queueCounts{Queue: q.Name, Todo: q.Todo, Total: q.Total}
		if c.RecountTotal, err = tasks.CountDocuments(ctx, bson.D{{Key: "queue", Value: q.ID}}); err != nil {
			return nil, err
		}
		if c.RecountTodo, err = tasks.CountDocuments(ctx, bson.D{{Key: "queue", Value: q.ID}, {Key: "status", Value: bson.D{{Key: "$lte", Value: 0}}}}); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// finalTasks reads every task of the scenario.
func (sc *scenario) finalTasks() []finalTask {
	sc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cur, err := sc.db.Collection("tasks").Find(ctx, bson.D{})
	require.NoError(sc.t, err)
	var docs []struct {
		ID       bson.ObjectID `bson:"_id"`
		Status   int           `bson:"status"`
		Node     bson.RawValue `bson:"node"`
		Stdout   bson.RawValue `bson:"stdout"`
		Stderr   bson.RawValue `bson:"stderr"`
		MTime    time.Time     `bson:"mtime"`
		ClaimTok bson.RawValue `bson:"claim_token"`
		Attempt  int           `bson:"attempt"`
		Reason   string        `bson:"reason"`
		Params   struct {
			FailUntil int `bson:"fail_until"`
		} `bson:"parameters"`
	}
	require.NoError(sc.t, cur.All(ctx, &docs))
	out := make([]finalTask, 0, len(docs))
	for _, x := range docs {
		t := task{ID: x.ID, Status: x.Status, Node: x.Node, Stdout: x.Stdout, Stderr: x.Stderr}
		detail := "mtime=" + x.MTime.Format("15:04:05.000")
		if tok, ok := x.ClaimTok.ObjectIDOK(); ok {
			detail += " claim_token=" + tok.Hex()
		}
		out = append(out, finalTask{ID: t.ID.Hex(), Status: t.Status, Node: t.node(), Stdout: t.stdout(), Stderr: t.stderr(), Detail: detail,
			Attempt: x.Attempt, Reason: x.Reason, FailUntil: x.Params.FailUntil})
	}
	return out
}

// starts returns the start records, sorted by time.
func starts(recs []execRecord) []execRecord {
	var out []execRecord
	for _, r := range recs {
		if r.Ev == "start" {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].T < out[j].T })
	return out
}

// pauseMin is the shortest pause in run starts that counts as an outage.
const pauseMin = 500 * time.Millisecond

// recovery measures how tasks flowed after the fault at from, until
// until: first is when the first run started after it; outage is the
// longest pause in run starts that ended after it (from the last start
// before the pause); recovered is when tasks flowed again: the end of that
// pause, or first when no pause reached pauseMin (they never stopped).
func recovery(recs []execRecord, from, until time.Time) (first, outage, recovered time.Duration) {
	first, recovered = -1, -1
	prev := int64(0)
	for _, r := range starts(recs) {
		if r.T > until.UnixNano() {
			break
		}
		if r.T >= from.UnixNano() {
			if first < 0 {
				first = time.Duration(r.T - from.UnixNano())
			}
			if gap := time.Duration(r.T - prev); prev != 0 && gap > outage {
				outage, recovered = gap, time.Duration(r.T-from.UnixNano())
			}
		}
		prev = r.T
	}
	if outage < pauseMin {
		recovered = first
	}
	return first, outage, recovered
}

// busy is the mean number of plugins running from the first start to the
// last end.
func busy(recs []execRecord) float64 {
	starts := map[string]int64{}
	var sum, first, last int64
	for _, r := range recs {
		switch r.Ev {
		case "start":
			starts[r.Run] = r.T
			if first == 0 || r.T < first {
				first = r.T
			}
		case "end":
			if s, ok := starts[r.Run]; ok {
				sum += r.T - s
			}
			last = max(last, r.T)
		}
	}
	if last <= first {
		return 0
	}
	return float64(sum) / float64(last-first)
}

// finish ends a scenario: it waits for the submitter and for the queue to
// drain, submits a final batch that every live node must serve, checks the
// invariants and logs the summary line.
func (sc *scenario) finish(waitWorkload func()) {
	t := sc.t
	t.Helper()
	waitWorkload()
	_, drained := sc.waitQuiet("after the workload", nil, drainTimeout)
	if sc.killer != nil {
		sc.killer.check(sc)
	}

	// Every live node serves again.
	finalAt := time.Now()
	ids, docs := batch(sc.queue, finalBatch, 100)
	require.NoError(t, sc.sub.insert(ids, docs, time.Now().Add(30*time.Second)), "the final batch")
	sc.waitQuiet("the final batch", bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, 30*time.Second)
	recs, err := readRecords(sc.records)
	require.NoError(t, err)
	for _, n := range sc.nodes {
		if n.killed {
			continue
		}
		served := 0
		for _, r := range recs {
			if r.Ev == "start" && r.Node == n.name && r.T > finalAt.UnixNano() {
				served++
			}
		}
		if served == 0 {
			t.Errorf("node %s ran none of the %d tasks of the final batch", n.name, finalBatch)
		}
		d, err := sc.nodeDoc(n.name)
		switch {
		case err != nil:
			t.Errorf("node %s: read its document: %v", n.name, err)
		case time.Since(d.Timestamp) > 3*time.Second:
			t.Errorf("node %s: heartbeat is %v old", n.name, time.Since(d.Timestamp).Round(time.Millisecond))
		case d.Dead:
			t.Errorf("node %s runs but its document says dead (by %s)", n.name, d.DeadBy)
		}
	}

	// The invariants.
	sc.watch.sync(t)
	counts, converge := sc.counters()
	var submitted []string
	for _, id := range sc.sub.submitted() {
		submitted = append(submitted, id.Hex())
	}
	sc.sub.mu.Lock()
	if len(sc.sub.unconfirmed) > 0 {
		t.Errorf("%d tasks whose insert was never acknowledged: %v", len(sc.sub.unconfirmed), hexes(sc.sub.unconfirmed))
	}
	retries := sc.sub.retries
	sc.sub.mu.Unlock()
	final := sc.finalTasks()
	r := checkInvariants(checkInput{
		Submitted:  submitted,
		Tasks:      final,
		Records:    recs,
		Overwrites: sc.watch.overwritten(),
		Counters:   counts,
		Retries:    faultRetries,
	})
	first, outage, recovered := recovery(recs, sc.fault, sc.submitDone)
	resumes, watchProblems := sc.watch.stats()
	line := fmt.Sprintf("%s: %s; recovery=%v (first_start=%v, longest_pause=%v) drain=%v counters_converged=%v insert_retries=%d stream_resumes=%d busy=%.1f",
		filepath.Base(t.Name()), r.Summary(), recovered.Round(time.Millisecond), first.Round(time.Millisecond), outage.Round(time.Millisecond),
		drained.Round(time.Millisecond), converge.Round(time.Millisecond), retries, resumes, busy(recs))
	if len(sc.extra) > 0 {
		line += " " + strings.Join(sc.extra, " ")
	}
	t.Log(line)
	for _, p := range r.Problems() {
		t.Error(p)
	}
	for _, p := range watchProblems {
		t.Error("watcher: " + p)
	}
	if reasons := failureReasons(final); len(reasons) > 0 {
		t.Logf("failed tasks by reason: %v", reasons)
	}
	if len(r.RunTwice) > len(r.RunTwiceSucceeded) {
		t.Logf("tasks run to the end twice (not succeeded, allowed): %s", strings.Join(r.RunTwice, "\n  "))
	}
	if first < 0 {
		t.Errorf("no task started after the fault")
	}
	if r.Retried == 0 {
		t.Errorf("no task was retried: one in %d fails its first attempt, so the scenario tested no retry", faultFailOneIn)
	}
	sc.stopNodes()
}

// taskWatcher follows a change stream over the scenario's tasks from
// before the workload, resuming after errors with its resume token, and
// notes every change to a task that had already finished (1, 2 or -6).
type taskWatcher struct {
	db     *mongo.Database
	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	status     map[bson.ObjectID]int64
	overwrites []overwrite
	problems   []string
	markers    map[bson.ObjectID]bool
	resumes    int
}

var watchPipeline = mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "ns.coll", Value: bson.D{{Key: "$in", Value: bson.A{"tasks", markerColl}}}}}}}}

func startWatcher(t *testing.T, db *mongo.Database) *taskWatcher {
	t.Helper()
	w := &taskWatcher{db: db, done: make(chan struct{}), status: map[bson.ObjectID]int64{}, markers: map[bson.ObjectID]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	opts := options.ChangeStream().SetFullDocumentBeforeChange(options.WhenAvailable)
	octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
	cs, err := db.Watch(octx, watchPipeline, opts)
	ocancel()
	require.NoError(t, err, "open the change stream on tasks")
	go w.loop(ctx, cs)
	t.Cleanup(func() {
		w.cancel()
		<-w.done
	})
	return w
}

func (w *taskWatcher) loop(ctx context.Context, cs *mongo.ChangeStream) {
	defer close(w.done)
	token := cs.ResumeToken()
	for {
		for cs.Next(ctx) {
			w.handle(cs.Current)
			token = cs.ResumeToken()
		}
		err := cs.Err()
		if tok := cs.ResumeToken(); tok != nil {
			token = tok
		}
		_ = cs.Close(context.Background())
		if ctx.Err() != nil {
			return
		}
		for {
			if fatalStreamError(err) {
				w.problem(fmt.Sprintf("change stream cannot resume: %v", err))
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			w.mu.Lock()
			w.resumes++
			w.mu.Unlock()
			octx, cancel := context.WithTimeout(ctx, 10*time.Second)
			cs, err = w.db.Watch(octx, watchPipeline, options.ChangeStream().
				SetFullDocumentBeforeChange(options.WhenAvailable).SetResumeAfter(token))
			cancel()
			if err == nil {
				break
			}
		}
	}
}

// fatalStreamError: the stream's history is gone, so changes may have
// been missed.
func fatalStreamError(err error) bool {
	var se mongo.ServerError
	return errors.As(err, &se) && (se.HasErrorCode(286) || se.HasErrorCode(280))
}

func (w *taskWatcher) problem(p string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.problems = append(w.problems, p)
}

func finalStatus(s int64) bool { return s == 1 || s == 2 || s == -6 }

func (w *taskWatcher) handle(ev bson.Raw) {
	op, _ := ev.Lookup("operationType").StringValueOK()
	coll, _ := ev.Lookup("ns", "coll").StringValueOK()
	id, ok := ev.Lookup("documentKey", "_id").ObjectIDOK()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !ok {
		w.problems = append(w.problems, fmt.Sprintf("%s event on %s without an ObjectId key: %v", op, coll, ev))
		return
	}
	if coll == markerColl {
		w.markers[id] = true
		return
	}
	before, known := w.status[id]
	if pre, ok := ev.Lookup("fullDocumentBeforeChange").DocumentOK(); ok {
		before, known = pre.Lookup("status").AsInt64OK()
	}
	changed := func(change string) {
		// An operator's kill finishes an orphaned task as killed (task
		// control: "killed while orphaned"): -6 is final for nodes, not
		// for operators.
		if known && before == -6 && strings.Contains(change, " status=2") && strings.Contains(change, " kill") {
			return
		}
		if known && finalStatus(before) {
			w.overwrites = append(w.overwrites, overwrite{Task: id.Hex(), Before: int(before), Change: change})
		}
	}
	switch op {
	case "insert":
		changed("inserted again")
		full, _ := ev.Lookup("fullDocument").DocumentOK()
		if s, ok := full.Lookup("status").AsInt64OK(); ok {
			w.status[id] = s
		}
	case "update", "replace":
		desc := op
		if op == "update" {
			fields, _ := ev.Lookup("updateDescription", "updatedFields").DocumentOK()
			elems, _ := fields.Elements()
			for _, e := range elems {
				desc += " " + e.Key()
				if e.Key() == "status" {
					if s, ok := e.Value().AsInt64OK(); ok {
						w.status[id] = s
						desc += fmt.Sprintf("=%d", s)
					} else {
						desc += "=" + e.Value().String()
					}
				}
			}
		} else {
			full, _ := ev.Lookup("fullDocument").DocumentOK()
			if s, ok := full.Lookup("status").AsInt64OK(); ok {
				w.status[id] = s
			}
		}
		changed(desc)
	case "delete":
		changed("deleted")
		delete(w.status, id)
	default:
		w.problems = append(w.problems, fmt.Sprintf("unexpected %s event on %s", op, coll))
	}
}

// sync waits until the watcher has seen everything written so far: it
// inserts a marker and waits for its event.
func (w *taskWatcher) sync(t *testing.T) {
	t.Helper()
	id := bson.NewObjectID()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := w.db.Collection(markerColl, options.Collection().SetWriteConcern(writeconcern.Majority())).
		InsertOne(ctx, bson.D{{Key: "_id", Value: id}})
	require.NoError(t, err, "insert the watcher's marker")
	for {
		w.mu.Lock()
		seen := w.markers[id]
		w.mu.Unlock()
		if seen {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the change stream watcher did not see its marker within 30s")
		case <-w.done:
			t.Fatalf("the change stream watcher stopped: %v", w.problems)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (w *taskWatcher) overwritten() []overwrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.overwrites)
}

func (w *taskWatcher) stats() (resumes int, problems []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.resumes, slices.Clone(w.problems)
}

// cutProxy is a TCP proxy (toxiproxy, in process) between one node and
// MongoDB, which can turn into a blackhole: connections stay open, and
// nothing passes either way.
type cutProxy struct {
	p *toxiproxy.Proxy
}

func startProxy(t *testing.T, upstream string) *cutProxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "mongodb", "127.0.0.1:0", upstream)
	require.NoError(t, p.Start())
	t.Cleanup(p.Stop)
	return &cutProxy{p: p}
}

// addr is where the proxy listens.
func (c *cutProxy) addr() string { return c.p.Listen }

// cut drops everything in both directions, holding connections open.
func (c *cutProxy) cut(t *testing.T) {
	t.Helper()
	for _, dir := range []string{"upstream", "downstream"} {
		_, err := c.p.Toxics.AddToxicJson(strings.NewReader(
			fmt.Sprintf(`{"name": "blackhole_%s", "type": "timeout", "stream": %q, "attributes": {"timeout": 0}}`, dir, dir)))
		require.NoError(t, err)
	}
}

// restore lets everything pass again.
func (c *cutProxy) restore() { c.p.Toxics.ResetToxics(context.Background()) }
