package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/store"
)

// DrainRow is one drain of a backlog of no-op tasks.
type DrainRow struct {
	What        string  `json:"what"`
	Concurrency string  `json:"concurrency"`
	Queued      int     `json:"queued"`
	Finished    int     `json:"finished"`
	Seconds     float64 `json:"seconds"` // first claim to last finish
	Rate        float64 `json:"tasks_per_s"`
	// Complete: every queued task finished before the drain timeout.
	Complete bool `json:"complete"`
	// MongodCPU and ClientCPU are the CPU time per task finished, in
	// microseconds, that the replica set's mongods and the drain's client
	// (the bench process, or the node processes) used from the start of
	// the drain to its end (0: not measured, as with --mongo-uri).
	MongodCPU float64 `json:"mongod_cpu_us_per_task,omitempty"`
	ClientCPU float64 `json:"client_cpu_us_per_task,omitempty"`
	// Server is what the primary did per task finished over the same
	// span (serverStatus deltas; nil when they could not be read).
	Server *ServerPerTask `json:"server_per_task,omitempty"`
}

// cpuMeter measures what a drain costs: the mongods' and its client's CPU
// time, and the primary's serverStatus counters, from start to end.
type cpuMeter struct {
	e          *env
	pids       []int // the client's processes; nil: this one
	start, end cpuReading
}

// cpuReading is one reading of a cpuMeter: CPU seconds so far, and the
// primary's counters (nil: not read).
type cpuReading struct {
	mongod, client float64
	ss             map[string]int64
}

// meterCPU starts measuring; ctx bounds the serverStatus reads.
func (e *env) meterCPU(ctx context.Context, pids []int) *cpuMeter {
	m := &cpuMeter{e: e, pids: pids}
	m.start = m.read(ctx, true)
	return m
}

func (m *cpuMeter) read(ctx context.Context, counters bool) cpuReading {
	var r cpuReading
	if counters {
		r.ss = m.counters(ctx)
	}
	r.mongod, r.client = m.e.mongodCPU(), m.clientCPU()
	return r
}

func (m *cpuMeter) counters(ctx context.Context) map[string]int64 {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ss, err := serverCounters(ctx, m.e.client)
	if err != nil {
		m.e.log.Warn("serverStatus: the drain's counters per task are left out", "error", err)
		return nil
	}
	return ss
}

func (m *cpuMeter) clientCPU() float64 {
	if m.pids == nil {
		return procsCPU([]int{os.Getpid()})
	}
	return procsCPU(m.pids)
}

// stop ends the measurement; fill then puts it in a row.
func (m *cpuMeter) stop(ctx context.Context) {
	m.end = m.read(ctx, m.start.ss != nil)
}

// fill sets row's figures per task finished (after stop). Without a
// replica set of this run's the mongods' CPU is 0, left out.
func (m *cpuMeter) fill(row *DrainRow) {
	if row.Finished == 0 {
		return
	}
	per := func(s float64) float64 { return round(s * 1e6 / float64(row.Finished)) }
	row.MongodCPU, row.ClientCPU = per(m.end.mongod-m.start.mongod), per(m.end.client-m.start.client)
	if m.start.ss != nil && m.end.ss != nil {
		sp := serverPerTask(m.start.ss, m.end.ss, row.Finished)
		row.Server = &sp
	}
}

// RateRatio compares two rates.
type RateRatio struct {
	What  string  `json:"what"`
	Value float64 `json:"value"`
	Goal  string  `json:"goal,omitempty"`
}

// ThroughputReport is the throughput group.
type ThroughputReport struct {
	Rows   []DrainRow  `json:"rows"`
	Ratios []RateRatio `json:"ratios"`
	// Pairs are --pairs drains back to back, and their ratios' median.
	Pairs *PairsReport `json:"pairs,omitempty"`
}

// PairsReport is --pairs pairs of drains, 3 node processes and the
// batched raw loop with 3 claimers, each pair run back to back.
type PairsReport struct {
	Rows   []PairRow `json:"rows"`
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	// LagMedian is the median of the pairs' LagP99.
	LagMedian float64 `json:"node_lag_p99_median_ms"`
}

// PairRow is one pair: the two drains' rates and their ratio.
type PairRow struct {
	Pair      int     `json:"pair"`
	NodeFirst bool    `json:"node_first"`
	Node      float64 `json:"node_tasks_per_s"`
	Raw       float64 `json:"raw_tasks_per_s"`
	Complete  bool    `json:"complete"` // both drained everything
	Ratio     float64 `json:"ratio"`
	// LagP99 is the projector's lag p99 during the node processes' drain,
	// and CommitAge the majority commit point's age in that drain
	// (LagRow.CommitAge).
	LagP99    float64 `json:"node_lag_p99_ms"`
	CommitAge Latency `json:"commit_point_age"`
}

// pairsSummary sets the median and range of rows' ratios, and the median
// of their lags.
func pairsSummary(rows []PairRow) *PairsReport {
	r := &PairsReport{Rows: rows}
	if len(rows) == 0 {
		return r
	}
	ratios, lags := make([]float64, len(rows)), make([]float64, len(rows))
	for i, x := range rows {
		ratios[i], lags[i] = x.Ratio, x.LagP99
	}
	r.Median, r.Min, r.Max = median(ratios), slices.Min(ratios), slices.Max(ratios)
	r.LagMedian = median(lags)
	return r
}

// LagRow is the counter projector's lag during one node drain.
type LagRow struct {
	Run     string  `json:"run"`
	Leader  string  `json:"leader"`
	Events  int64   `json:"events"`
	Batches int64   `json:"batches"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	// CommitAge is how old the majority commit point was in the same
	// drain, sampled every commitAgeEvery: twice it is a rough floor for
	// MongoDB's part of the lag (see commitAge). N is 0 when it could not
	// be read, or nothing was claimed.
	CommitAge Latency `json:"commit_point_age"`
}

const (
	whatNode    = "node"
	whatPerTask = "ceiling: raw per-task loop"
	whatBatched = "ceiling: raw batched loop"
	// whatNodeProcs: nodes in processes of their own.
	whatNodeProcs = "node processes"
	ceilingBatch  = 64
)

// throughput drains with 1 and 3 nodes and with 3 node processes
// (recording the projector's lag in each) and, when ceilings is set, runs
// the raw loops.
func (e *env) throughput(ctx context.Context, ceilings bool) (*ThroughputReport, []LagRow, error) {
	rep := &ThroughputReport{}
	var lags []LagRow
	for _, k := range []int{1, 3} {
		e.log.Info("throughput: node drain", "nodes", k, "tasks", e.cfg.Tasks, "maxthreads", e.cfg.MaxThreads, "timeout", e.cfg.DrainTimeout)
		row, lag, err := e.nodeDrain(ctx, k)
		if err != nil {
			return rep, lags, fmt.Errorf("drain with %s: %w", nodesConcurrency(k), err)
		}
		e.log.Info("throughput: node drain done", "nodes", k, "finished", row.Finished, "tasks_per_s", round(row.Rate))
		rep.Rows, lags = append(rep.Rows, row), append(lags, lag)
	}
	// The goal's lag is at the three processes' rate, each node alone in
	// its runtime as in production; the in-process drains share one.
	e.log.Info("throughput: node processes drain", "processes", 3, "tasks", e.cfg.Tasks)
	prow, plag, err := e.nodeProcDrain(ctx, 3)
	if err != nil {
		return rep, lags, fmt.Errorf("drain with 3 node processes: %w", err)
	}
	e.log.Info("throughput: node processes drain done", "finished", prow.Finished, "tasks_per_s", round(prow.Rate), "lag_p99_ms", plag.P99)
	rep.Rows, lags = append(rep.Rows, prow), append(lags, plag)
	if ceilings {
		e.log.Info("throughput: raw per-task loop", "tasks", e.cfg.CeilingTasks, "goroutines", e.cfg.MaxThreads)
		row, err := e.ceiling(ctx, whatPerTask, e.cfg.MaxThreads, e.perTaskLoop)
		if err != nil {
			return rep, lags, fmt.Errorf("raw per-task loop: %w", err)
		}
		rep.Rows = append(rep.Rows, row)
		for _, k := range []int{1, 3} {
			e.log.Info("throughput: raw batched loop", "tasks", e.cfg.CeilingTasks, "claimers", k, "batch", ceilingBatch)
			row, err := e.ceiling(ctx, whatBatched, k, e.batchedLoop)
			if err != nil {
				return rep, lags, fmt.Errorf("raw batched loop: %w", err)
			}
			rep.Rows = append(rep.Rows, row)
		}
	}
	rep.Ratios = throughputRatios(rep.Rows)
	if ceilings && e.cfg.Pairs > 0 {
		rows, err := e.pairs(ctx)
		rep.Pairs = pairsSummary(rows)
		if err != nil {
			return rep, lags, err
		}
	}
	return rep, lags, nil
}

// pairs runs --pairs pairs of drains back to back: 3 node processes and
// the batched raw loop with 3 claimers, the first of each pair
// alternating, so that a trend in the machine's load falls on both.
func (e *env) pairs(ctx context.Context) ([]PairRow, error) {
	var rows []PairRow
	for i := range e.cfg.Pairs {
		p := PairRow{Pair: i + 1, NodeFirst: i%2 == 0}
		var node, raw DrainRow
		var lag LagRow
		runNode := func() (err error) { node, lag, err = e.nodeProcDrain(ctx, 3); return err }
		runRaw := func() (err error) { raw, err = e.ceiling(ctx, whatBatched, 3, e.batchedLoop); return err }
		steps := []func() error{runNode, runRaw}
		if !p.NodeFirst {
			steps[0], steps[1] = runRaw, runNode
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return rows, fmt.Errorf("pair %d: %w", p.Pair, err)
			}
		}
		p.Node, p.Raw, p.Complete = node.Rate, raw.Rate, node.Complete && raw.Complete
		p.Ratio, p.LagP99, p.CommitAge = ratio(p.Node, p.Raw), lag.P99, lag.CommitAge
		e.log.Info("throughput: pair done", "pair", p.Pair, "node_first", p.NodeFirst, "node_processes_tasks_per_s", round(p.Node),
			"raw_tasks_per_s", round(p.Raw), "ratio", p.Ratio, "node_lag_p99_ms", p.LagP99, "commit_point_age_p99_ms", p.CommitAge.P99)
		rows = append(rows, p)
	}
	return rows, nil
}

// throughputRatios compares each node run with each ceiling of matching
// concurrency.
func throughputRatios(rows []DrainRow) []RateRatio {
	find := func(what, conc string) *DrainRow {
		for i := range rows {
			if rows[i].What == what && rows[i].Concurrency == conc {
				return &rows[i]
			}
		}
		return nil
	}
	var out []RateRatio
	if p, r := find(whatNodeProcs, procsConcurrency(3)), find(whatBatched, batchedConcurrency(3)); p != nil && r != nil {
		out = append(out, RateRatio{What: fmt.Sprintf("3 node processes / %s, %s", whatBatched, r.Concurrency), Value: ratio(p.Rate, r.Rate), Goal: ">= 1.0 (issue 20)"})
	}
	for _, k := range []int{1, 3} {
		n := find(whatNode, nodesConcurrency(k))
		if n == nil {
			continue
		}
		for i := range rows {
			r := &rows[i]
			switch {
			case r.What == whatPerTask:
				out = append(out, RateRatio{What: fmt.Sprintf("%s / %s", n.Concurrency, whatPerTask), Value: ratio(n.Rate, r.Rate)})
			case r.What == whatBatched && r.Concurrency == batchedConcurrency(k):
				out = append(out, RateRatio{What: fmt.Sprintf("%s / %s, %s", n.Concurrency, whatBatched, r.Concurrency), Value: ratio(n.Rate, r.Rate), Goal: ">= 0.8 (PERFORMANCE.md)"})
			}
		}
	}
	return out
}

func nodesConcurrency(k int) string {
	if k == 1 {
		return "1 node"
	}
	return fmt.Sprintf("%d nodes", k)
}

func batchedConcurrency(k int) string {
	s := "s"
	if k == 1 {
		s = ""
	}
	return fmt.Sprintf("%d claimer%s x %d", k, s, ceilingBatch)
}

// nodeDrain queues --tasks tasks and drains them with k in-process nodes.
func (e *env) nodeDrain(ctx context.Context, k int) (DrainRow, LagRow, error) {
	start := time.Now()
	db, q, drop, err := e.backlog(ctx, "drain", e.cfg.Tasks)
	defer drop()
	if err != nil {
		return DrainRow{}, LagRow{}, err
	}
	e.log.Info("throughput: queued", "tasks", e.cfg.Tasks, "took", time.Since(start).Round(time.Millisecond))
	obs := newDrainObserver(e.cfg.Tasks)
	// As the node processes' drain: the queue paused until the nodes are
	// up and one's projector is steady, the meters started then.
	resume, err := pauseQueue(ctx, db, q, e.cfg.MaxThreads)
	if err != nil {
		return DrainRow{}, LagRow{}, err
	}
	ns, err := e.startNodes(ctx, nodeSpec{DB: db.Name(), Count: k, Name: "bench-drain", MaxThreads: e.cfg.MaxThreads, Plugins: noopRegistry(nil), Observer: obs, LagWindow: lagWindow(e.cfg.Tasks)})
	if err != nil {
		return DrainRow{}, LagRow{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, e.steadyWait())
	steady := untilSteady(wctx, nil, ns.projectorStats()...)
	cancel()
	if ctx.Err() != nil {
		ns.stop()
		return DrainRow{}, LagRow{}, ctx.Err()
	}
	if !steady {
		e.log.Warn("drain: no node's projector was steady in time; draining anyway", "waited", e.steadyWait())
	}
	cpu := e.meterCPU(ctx, nil)
	age := sampleCommitAge(ctx, e.client)
	defer age.stop(0, 0) // after commitAgeOf's, a no-op
	if err := resume(); err != nil {
		ns.stop()
		return DrainRow{}, LagRow{}, err
	}
	complete, err := obs.wait(ctx, e.cfg.DrainTimeout)
	cpu.stop(ctx)
	finished, span := obs.result()
	first, last := obs.times()
	commitAge := e.commitAgeOf(age, first, last)
	if err == nil && complete {
		e.waitProjected(ctx, db, q, ns.projectorStats()...)
	}
	proj, leader := ns.projector()
	ns.stop()
	if err != nil {
		return DrainRow{}, LagRow{}, err
	}
	conc := nodesConcurrency(k)
	e.leftover(ctx, db, "drain, "+conc)
	row := DrainRow{What: whatNode, Concurrency: conc, Queued: e.cfg.Tasks, Finished: finished, Seconds: span.Seconds(), Rate: rate(finished, span), Complete: complete}
	cpu.fill(&row)
	lag := lagOf(proj)
	lag.Run, lag.Leader, lag.CommitAge = "drain, "+conc, leader, commitAge
	return row, lag, nil
}

// commitAgeOf stops a drain's commit point sampler and summarises it over
// the drain, from first to last (Unix ns). Failed asks are logged: a
// drain with no sample is a problem for the sanity check, as a replica
// set whose members cannot be read is.
func (e *env) commitAgeOf(s *commitAge, first, last int64) Latency {
	l, failed, err := s.stop(first, last)
	if failed > 0 {
		e.log.Warn("replSetGetStatus failed during a drain: its commit point age counts only the samples read", "failed", failed, "read", l.N, "first_error", err)
	}
	return l
}

// waitProjected waits, for up to 10 s, until the queue's counters say
// that nothing is left to do or running (the projector has committed the
// drain's last finishes), then until none of nodes (in-process; a node
// process waits by itself when asked to stop) is still committing, so that
// the last batch is in the projector's lag figures too. It warns when
// they are not by then.
func (e *env) waitProjected(ctx context.Context, db *mongo.Database, queue bson.ObjectID, nodes ...projectorStats) {
	s := store.New(db, store.Options{})
	deadline := time.Now().Add(10 * time.Second)
	for {
		all, err := s.QueueCounters(ctx)
		c := all[queue]
		switch {
		case err == nil && c.Todo != nil && *c.Todo == 0 && c.Running != nil && *c.Running == 0:
			if !untilCommitted(5*time.Second, nodes...) {
				e.log.Warn("drain: the projector was still committing 5 s after its counters showed the drain done; its lag figures leave that batch out")
			}
			return
		case ctx.Err() != nil:
			return
		case time.Now().After(deadline):
			e.log.Warn("drain: the projector had not applied its last finishes 10 s after it; its lag figures leave them out", "counters_error", err)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lagWindow is the projector's lag window for a drain of tasks: every
// event's lag, not only the latest projections.DefaultLagWindow (a task
// makes two or three events: its claim, its start unless claimed straight
// into running, its finish).
func lagWindow(tasks int) int { return 4*tasks + 1024 }

// lagOf is a projector's lag figures (Run and Leader left to the caller).
func lagOf(st projections.Stats) LagRow {
	return LagRow{Events: st.Events, Batches: st.Batches, P50: ms(st.LagP50), P99: ms(st.LagP99)}
}

func round(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }
