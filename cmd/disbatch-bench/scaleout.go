package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/node"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// ScaleoutRow is k node processes on one replica set: a drain of one
// backlog, then pickups with every process idle.
type ScaleoutRow struct {
	Nodes   int `json:"nodes"`
	Threads int `json:"maxthreads"` // of each process
	Tasks   int `json:"tasks"`
	// StartSeconds: from the first process started to the last one ready.
	StartSeconds float64 `json:"start_seconds"`
	// The drain: from unpausing the queue (every process ready) until
	// every task had succeeded, by this program's polls (every 25 ms).
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"tasks_per_s"`
	// RunTwice and NotRun come from the ids the processes' plugins ran
	// (drain and pickups): tasks run more than once, and tasks not run.
	RunTwice int `json:"run_twice"`
	NotRun   int `json:"not_run"`
	// Claim counters summed over the processes (claimer.Stats).
	Claims      int64 `json:"claims"`
	Batches     int64 `json:"batches"`
	Contended   int64 `json:"contended"`    // tasks read that another node took first
	LostBatches int64 `json:"lost_batches"` // batched claims that won none, round after round
	// Heartbeats is the writes to the nodes collection per second (the
	// oplog's entries for it) from every process ready until the pickups
	// are done: 2 s idle, the drain, the pickups.
	Heartbeats float64 `json:"heartbeats_per_s"`
	// CPU during the drain, in cores (CPU seconds / drain seconds): the
	// leader process, the other processes (median and sum), the replica
	// set's mongods, and the whole machine busy (of NumCPU).
	LeaderCPU     float64 `json:"leader_cpu"`
	NodeCPUMedian float64 `json:"node_cpu_median"`
	NodesCPU      float64 `json:"nodes_cpu"`
	MongodCPU     float64 `json:"mongod_cpu"`
	MachineBusy   float64 `json:"machine_busy"`
	// Pickup: insert (one task, majority) to its status 0 seen by a change
	// stream, one every scaleoutPickupGap, every process idle.
	Pickup Latency `json:"pickup"`
	Leader string  `json:"leader"`
	// Server is what the primary did per task drained (serverStatus
	// deltas over the drain).
	Server ServerPerTask `json:"server_per_task"`
}

// ServerPerTask is serverStatus counters' growth over a drain, per task.
type ServerPerTask struct {
	Queries        float64 `json:"queries"`
	GetMores       float64 `json:"getmores"`
	Updates        float64 `json:"updates"`
	Commands       float64 `json:"commands"`
	WriteConflicts float64 `json:"write_conflicts"` // metrics.operation.writeConflicts
	KeysExamined   float64 `json:"keys_examined"`   // metrics.queryExecutor.scanned
	DocsExamined   float64 `json:"docs_examined"`   // metrics.queryExecutor.scannedObjects
	// ReadMicros, WriteMicros and CommandMicros are the time the server
	// spent in reads (finds, getMores: a held getMore's wait included),
	// writes and other commands (opLatencies), µs per task.
	ReadMicros    float64 `json:"read_us"`
	WriteMicros   float64 `json:"write_us"`
	CommandMicros float64 `json:"command_us"`
}

// serverHeader names the columns of ServerPerTask.cells.
var serverHeader = []string{"queries", "getMores", "updates", "commands", "write conflicts", "keys examined", "docs examined",
	"reads µs", "writes µs", "commands µs"}

// cells are x's columns of a table, in serverHeader's order.
func (x ServerPerTask) cells() []string {
	f := func(v float64) string { return fmt.Sprintf("%.2f", v) }
	return []string{f(x.Queries), f(x.GetMores), f(x.Updates), f(x.Commands), f(x.WriteConflicts), f(x.KeysExamined), f(x.DocsExamined),
		frate(x.ReadMicros), frate(x.WriteMicros), frate(x.CommandMicros)}
}

// ScaleoutReport is the scaleout group.
type ScaleoutReport struct {
	Rows []ScaleoutRow `json:"rows"`
}

// scaleoutPickupGap spaces the pickups.
const scaleoutPickupGap = 20 * time.Millisecond

// scaleout runs one row per --scaleout-nodes count.
func (e *env) scaleout(ctx context.Context) (*ScaleoutReport, error) {
	rep := &ScaleoutReport{}
	for _, k := range e.cfg.ScaleoutNodes {
		row, err := e.scaleoutRow(ctx, k)
		if err != nil {
			return rep, fmt.Errorf("%d node processes: %w", k, err)
		}
		e.log.Info("scaleout: row", "nodes", k, "tasks_per_s", round(row.Rate), "contended", row.Contended,
			"lost_batches", row.LostBatches, "pickup_p50_ms", row.Pickup.P50, "pickup_p99_ms", row.Pickup.P99,
			"mongod_cpu", round(row.MongodCPU), "machine_busy", round(row.MachineBusy))
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}

func (e *env) scaleoutRow(ctx context.Context, k int) (ScaleoutRow, error) {
	row := ScaleoutRow{Nodes: k, Threads: e.cfg.ScaleoutThreads, Tasks: e.cfg.ScaleoutTasks}
	db, q, drop, err := e.backlog(ctx, fmt.Sprintf("scaleout%d", k), e.cfg.ScaleoutTasks)
	defer drop()
	if err != nil {
		return row, err
	}
	s := store.New(db, store.Options{})
	dir, err := os.MkdirTemp("", "dsb-scaleout-")
	if err != nil {
		return row, err
	}
	defer os.RemoveAll(dir)
	started := time.Now()
	g, err := e.startProcs(ctx, db, q, k, "bench-out", e.cfg.ScaleoutThreads, func(i int) []string {
		return []string{"--runs", filepath.Join(dir, strconv.Itoa(i)), "--poll-only=" + strconv.FormatBool(e.cfg.ScaleoutPollOnly),
			"--wakeup-listeners", strconv.Itoa(e.cfg.ScaleoutListeners)}
	})
	defer g.stop()
	if err != nil {
		return row, err
	}
	procs := g.procs
	row.StartSeconds = time.Since(started).Seconds()
	oplogFrom, err := clusterTime(ctx, e.client)
	if err != nil {
		return row, err
	}
	beatsFrom := time.Now()
	time.Sleep(2 * time.Second) // every node has heartbeaten and a leader stands

	// The drain.
	cpu0 := e.cpuSnapshot(procs)
	ss0, err := serverCounters(ctx, e.client)
	if err != nil {
		return row, err
	}
	t0 := time.Now()
	if err := g.resume(); err != nil {
		return row, err
	}
	deadline := t0.Add(e.cfg.DrainTimeout)
	if err := waitDrained(ctx, db, q, deadline); err != nil {
		return row, err
	}
	span := time.Since(t0)
	cpu1 := e.cpuSnapshot(procs)
	ss1, err := serverCounters(ctx, e.client)
	if err != nil {
		return row, err
	}
	row.Server = serverPerTask(ss0, ss1, e.cfg.ScaleoutTasks)
	row.Seconds, row.Rate = span.Seconds(), rate(e.cfg.ScaleoutTasks, span)
	if n, err := countStatus(ctx, db, q, schema.StatusSucceeded); err != nil {
		return row, err
	} else if n != int64(e.cfg.ScaleoutTasks) {
		return row, fmt.Errorf("%d of %d tasks succeeded", n, e.cfg.ScaleoutTasks)
	}
	if l, err := s.LeaseGet(ctx, node.LeaderLease); err == nil {
		row.Leader = l.Owner
	}
	cores := func(a, b float64) float64 { return (b - a) / span.Seconds() }
	var others []float64
	for i := range procs {
		c := cores(cpu0.procs[i], cpu1.procs[i])
		row.NodesCPU += c
		if procs[i].name == row.Leader {
			row.LeaderCPU = c
		} else {
			others = append(others, c)
		}
	}
	if len(others) > 0 {
		slices.Sort(others)
		row.NodeCPUMedian = others[len(others)/2]
	}
	row.MongodCPU = cores(cpu0.mongod, cpu1.mongod)
	if d := cpu1.machineTotal - cpu0.machineTotal; d > 0 {
		row.MachineBusy = (cpu1.machineBusy - cpu0.machineBusy) / d * float64(cpu1.cpus)
	}

	// Pickups, every process idle.
	w, err := e.watchStatus(ctx, db.Name(), int32(schema.StatusRunning))
	if err != nil {
		return row, err
	}
	defer w.close()
	ids := make([]bson.ObjectID, 0, e.cfg.ScaleoutPickups)
	inserted := map[bson.ObjectID]time.Time{}
	for range e.cfg.ScaleoutPickups {
		t := time.Now()
		got, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q, Parameters: []bson.Raw{nil}})
		if err != nil {
			return row, err
		}
		ids, inserted[got[0]] = append(ids, got[0]), t
		time.Sleep(scaleoutPickupGap)
	}
	if left, err := e.waitFinished(ctx, db, ids, time.Minute); err != nil {
		return row, err
	} else if left > 0 {
		return row, fmt.Errorf("%d of %d pickups did not finish within a minute", left, len(ids))
	}
	var lat []time.Duration
	expired := time.After(10 * time.Second) // the changes of finished tasks
	for _, id := range ids {
		if at, ok := w.arrived(ctx, id, expired); ok {
			lat = append(lat, at.Sub(inserted[id]))
		}
	}
	row.Pickup = summarize(lat)
	beatsFor := time.Since(beatsFrom) // before counting: the count scans the oplog
	beats, err := oplogCount(ctx, e.client, db.Name()+"."+schema.CollNodes, oplogFrom)
	if err != nil {
		return row, err
	}
	row.Heartbeats = float64(beats) / beatsFor.Seconds()

	// Stop every process; count what each ran.
	last, err := g.finish(ctx)
	if err != nil {
		return row, err
	}
	for _, m := range last {
		if c := m.Claimer; c != nil {
			row.Claims += c.Claims
			row.Batches += c.Batches
			row.Contended += c.Contended
			row.LostBatches += c.LostBatches
		}
	}
	runs := map[string]int{}
	for i := range k {
		b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(i)))
		if err != nil {
			return row, fmt.Errorf("node process %d's runs: %w", i+1, err)
		}
		for id := range strings.FieldsSeq(string(b)) {
			runs[id]++
		}
	}
	all, err := findIDs(ctx, db.Collection(schema.CollTasks), bson.D{{Key: schema.TaskQueue, Value: q}}, options.Find().SetProjection(byID))
	if err != nil {
		return row, err
	}
	for _, id := range all {
		switch n := runs[id.Hex()]; {
		case n == 0:
			row.NotRun++
		case n > 1:
			row.RunTwice++
		}
	}
	e.leftover(ctx, db, fmt.Sprintf("scaleout, %d processes", k))
	return row, nil
}

// cpuSnapshot is CPU time used so far, in seconds: by each node process,
// by the replica set's mongods (when this run started them), and by the
// machine (busy and in all, from /proc/stat).
type cpuSnap struct {
	procs                     []float64
	mongod                    float64
	machineBusy, machineTotal float64
	cpus                      int
}

func (e *env) cpuSnapshot(procs []*nodeProc) cpuSnap {
	var c cpuSnap
	for _, p := range procs {
		s, _ := procCPUSeconds(p.cmd.Process.Pid)
		c.procs = append(c.procs, s)
	}
	c.mongod = e.mongodCPU()
	c.machineBusy, c.machineTotal, c.cpus, _ = machineCPU()
	return c
}

// mongodCPU is the CPU time the replica set's mongods used so far, in
// seconds (0 when this run did not start them).
func (e *env) mongodCPU() float64 {
	if e.rs == nil {
		return 0
	}
	var pids []int
	for _, m := range e.rs.Members() {
		pids = append(pids, m.PID())
	}
	return procsCPU(pids)
}

// procsCPU is the CPU time processes used so far, in seconds (those
// gone count 0).
func procsCPU(pids []int) float64 {
	var sum float64
	for _, pid := range pids {
		s, _ := procCPUSeconds(pid)
		sum += s
	}
	return sum
}

// clockTicks is Linux's USER_HZ, the unit of /proc's CPU times (100 on
// every architecture Go builds for).
const clockTicks = 100

// procCPUSeconds is a process's user + system CPU time, from
// /proc/PID/stat (fields 14 and 15).
func procCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	s, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (u + s) / clockTicks, nil
}

// machineCPU reads /proc/stat's cpu line: busy and total time in seconds
// summed over the CPUs, and how many CPUs.
func machineCPU() (busy, total float64, cpus int, err error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		switch {
		case len(fields) > 4 && fields[0] == "cpu":
			for i, v := range fields[1:] {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, 0, 0, err
				}
				if i >= 7 { // guest times are already in user and nice
					break
				}
				total += x
				if i != 3 && i != 4 { // idle, iowait
					busy += x
				}
			}
		case strings.HasPrefix(fields[0], "cpu"):
			cpus++
		}
	}
	return busy / clockTicks, total / clockTicks, cpus, sc.Err()
}

// clusterTime is the deployment's latest cluster time (hello's
// operationTime).
func clusterTime(ctx context.Context, c *mongo.Client) (bson.Timestamp, error) {
	var res struct {
		OperationTime bson.Timestamp `bson:"operationTime"`
	}
	if err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&res); err != nil {
		return bson.Timestamp{}, fmt.Errorf("hello: %w", err)
	}
	return res.OperationTime, nil
}

// oplogCount counts the oplog's entries for namespace ns after from.
func oplogCount(ctx context.Context, c *mongo.Client, ns string, from bson.Timestamp) (int64, error) {
	n, err := c.Database("local").Collection("oplog.rs").CountDocuments(ctx, bson.D{
		{Key: "ts", Value: bson.D{{Key: "$gt", Value: from}}}, {Key: "ns", Value: ns}})
	if err != nil {
		return 0, fmt.Errorf("count the oplog's entries for %s: %w", ns, err)
	}
	return n, nil
}

func renderScaleout(b *strings.Builder, r *Report) {
	v := r.Scaleout
	if v == nil || len(v.Rows) == 0 {
		return
	}
	t := table{title: fmt.Sprintf("SCALE-OUT: node processes (maxthreads %d each) on one replica set, each row draining %d tasks, then pickups with every process idle; CPU in cores during the drain",
		v.Rows[0].Threads, v.Rows[0].Tasks),
		header: []string{"nodes", "ready, s", "tasks/s", "x 1 node", "conflicts", "lost batches", "batches", "heartbeats/s", "leader CPU", "node CPU p50", "nodes CPU", "mongod CPU", "machine busy",
			"pickup p50", "p99", "run twice", "not run"}}
	base := v.Rows[0].Rate
	for _, x := range v.Rows {
		t.add(strconv.Itoa(x.Nodes), fmt.Sprintf("%.2f", x.StartSeconds), frate(x.Rate), fx(x.Rate/base), strconv.FormatInt(x.Contended, 10),
			strconv.FormatInt(x.LostBatches, 10), strconv.FormatInt(x.Batches, 10), fmt.Sprintf("%.1f", x.Heartbeats),
			fmt.Sprintf("%.2f", x.LeaderCPU), fmt.Sprintf("%.2f", x.NodeCPUMedian), fmt.Sprintf("%.2f", x.NodesCPU), fmt.Sprintf("%.2f", x.MongodCPU), fmt.Sprintf("%.2f", x.MachineBusy),
			fms(x.Pickup.P50), fms(x.Pickup.P99), strconv.Itoa(x.RunTwice), strconv.Itoa(x.NotRun))
	}
	t.render(b)
	t = table{title: "SCALE-OUT: what the primary did per task drained (serverStatus deltas over the drain)",
		header: append([]string{"nodes"}, serverHeader...)}
	for _, x := range v.Rows {
		t.add(append([]string{strconv.Itoa(x.Nodes)}, x.Server.cells()...)...)
	}
	t.render(b)
}

// scaleout checks the scaleout group's figures.
func (k *checker) scaleout(v *ScaleoutReport, nodes []int) {
	if v == nil {
		k.bad("scaleout: missing")
		return
	}
	if len(v.Rows) != len(nodes) {
		k.bad("scaleout: %d rows, want %d", len(v.Rows), len(nodes))
	}
	for _, x := range v.Rows {
		what := fmt.Sprintf("scaleout, %d nodes", x.Nodes)
		k.positive(what+", tasks/s", x.Rate)
		k.positive(what+", heartbeats/s", x.Heartbeats)
		k.latency(what+", pickup", x.Pickup)
		if x.RunTwice > 0 || x.NotRun > 0 {
			k.bad("%s: %d tasks run twice, %d not run", what, x.RunTwice, x.NotRun)
		}
		if x.Claims < int64(x.Tasks) {
			k.bad("%s: %d claims for %d tasks", what, x.Claims, x.Tasks)
		}
		if x.Leader == "" {
			k.bad("%s: no leader", what)
		}
	}
}

// serverPerTask is the growth of serverCounters from ss0 to ss1, per task.
func serverPerTask(ss0, ss1 map[string]int64, tasks int) ServerPerTask {
	per := func(k string) float64 { return float64(ss1[k]-ss0[k]) / float64(tasks) }
	return ServerPerTask{Queries: per("query"), GetMores: per("getmore"), Updates: per("update"), Commands: per("command"),
		WriteConflicts: per("writeConflicts"), KeysExamined: per("scanned"), DocsExamined: per("scannedObjects"),
		ReadMicros: per("readLatency"), WriteMicros: per("writeLatency"), CommandMicros: per("commandLatency")}
}

// serverCounters reads the primary's serverStatus counters the scale-out
// and throughput rows report: opcounters, write conflicts, keys and
// documents examined, and the time spent in reads, writes and commands
// (opLatencies).
func serverCounters(ctx context.Context, c *mongo.Client) (map[string]int64, error) {
	raw, err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "serverStatus", Value: 1}}).Raw()
	if err != nil {
		return nil, fmt.Errorf("serverStatus: %w", err)
	}
	out := map[string]int64{}
	for k, path := range map[string][]string{
		"query": {"opcounters", "query"}, "getmore": {"opcounters", "getmore"}, "update": {"opcounters", "update"}, "command": {"opcounters", "command"},
		"writeConflicts": {"metrics", "operation", "writeConflicts"},
		"scanned":        {"metrics", "queryExecutor", "scanned"}, "scannedObjects": {"metrics", "queryExecutor", "scannedObjects"},
		"readLatency": {"opLatencies", "reads", "latency"}, "writeLatency": {"opLatencies", "writes", "latency"},
		"commandLatency": {"opLatencies", "commands", "latency"},
	} {
		v, err := raw.LookupErr(path...)
		if err != nil {
			return nil, fmt.Errorf("serverStatus has no %s: %w", strings.Join(path, "."), err)
		}
		n, ok := v.AsInt64OK()
		if !ok {
			return nil, fmt.Errorf("serverStatus %s is a %s", strings.Join(path, "."), v.Type)
		}
		out[k] = n
	}
	return out, nil
}

// waitDrained polls (every 25 ms) until no task of queue is left queued,
// claimed or running, or deadline. Each poll looks at one index key, where
// counting the succeeded tasks would examine them all, many times a
// second, and weigh on the very drain it watches (it did: 443 index keys
// examined per task drained, 4.3 without).
func waitDrained(ctx context.Context, db *mongo.Database, queue bson.ObjectID, deadline time.Time) error {
	unfinished := bson.D{{Key: schema.TaskQueue, Value: queue}, {Key: schema.TaskStatus, Value: bson.D{{Key: "$lte", Value: int32(schema.StatusRunning)}}}}
	tasks := db.Collection(schema.CollTasks)
	for {
		err := tasks.FindOne(ctx, unfinished, options.FindOne().SetProjection(byID)).Err()
		if errors.Is(err, mongo.ErrNoDocuments) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("look for unfinished tasks: %w", err)
		}
		if time.Now().After(deadline) {
			return errors.New("tasks left unfinished at the drain's deadline")
		}
		time.Sleep(25 * time.Millisecond)
	}
}
