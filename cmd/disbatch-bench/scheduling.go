package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SchedulingReport is the scheduling group (issue 16, docs/scheduling.md):
// a task graph's edge latency beside the pickup floor of the same run, the
// claimer's pass cost with many queues of mixed priorities and weights
// against one queue, and what max_running costs a drain.
type SchedulingReport struct {
	// Floor is the pickup floor of this run (bare driver loop: insert ->
	// change event -> claim -> running): the pickup group's when it ran,
	// else the control group's, else measured here the same way.
	Floor       Latency     `json:"floor"`
	FloorSource string      `json:"floor_source"`
	DAG         DAGFigures  `json:"dag"`
	Passes      PassFigures `json:"scheduler"`
	Cap         CapFigures  `json:"max_running"`
}

// DAGFigures: parent -> child edges of task graphs.
type DAGFigures struct {
	Edges int `json:"edges"`      // pairs measured (one parent, one child)
	Rate  int `json:"rate_per_s"` // pairs inserted per second
	// Edge is the parent done (its plugin ran) -> the child's plugin
	// started (after the node's status 0 write), both on this process's
	// clock: the goal's figure.
	Edge Latency `json:"edge"`
	// Released is the parent's finish event (status 1) -> the child's
	// release event (-4 -> -2), both on a change stream of the bench's
	// own: the graph duty's share. Pickup is the child's release event ->
	// its plugin start: the claim's share (the node hears its own stream,
	// so a sample may be negative).
	Released Latency `json:"released"`
	Pickup   Latency `json:"pickup"`
	// Attempts is the parent's attempt finished -> the child's attempt
	// started, as the node recorded them (its clock, ms).
	Attempts Latency `json:"attempts"`
	// Early: children started before their parent was done (either
	// clock); Missing: children not started; Twice: tasks run more than
	// once. All 0 on a good run.
	Early    int      `json:"early"`
	Missing  int      `json:"missing"`
	Twice    int      `json:"twice"`
	Failures []string `json:"failures,omitempty"`
	Ratio    Ratio    `json:"ratio"` // edge / floor
	Goal     Goal     `json:"goal"`
}

// PassRow is one node's drain and its claimer's passes.
type PassRow struct {
	What     string  `json:"what"`
	Queues   int     `json:"queues"`
	Queued   int     `json:"queued"`
	Finished int     `json:"finished"`
	Seconds  float64 `json:"seconds"` // first claim to last finish
	Rate     float64 `json:"tasks_per_s"`
	Complete bool    `json:"complete"`
	// The claimer's counters while the node ran (claimer.Stats): passes,
	// those that claimed something, tasks claimed, claims that found
	// nothing, batched claims.
	Passes         int64 `json:"passes"`
	ClaimingPasses int64 `json:"claiming_passes"`
	Claims         int64 `json:"claims"`
	EmptyClaims    int64 `json:"empty_claims"`
	Batches        int64 `json:"batches"`
	// PassMean is the mean pass (queue reads and claims included), ms;
	// PassPerTask the pass time per task claimed, ms; Busy the share of
	// the node's run (Start called to Stop returned) its claimer spent in
	// passes. A pass on a backlog spread over many queues may last the
	// whole drain.
	PassMean    float64 `json:"pass_mean_ms"`
	PassPerTask float64 `json:"pass_per_task_ms"`
	Busy        float64 `json:"claimer_busy"`
}

// PassFigures: one queue against many.
type PassFigures struct {
	Rows   []PassRow   `json:"rows"`
	Ratios []RateRatio `json:"ratios"`
}

// CapRow is one drain of a queue with or without max_running.
type CapRow struct {
	What     string  `json:"what"`
	Cap      int     `json:"max_running"` // 0: none
	Queued   int     `json:"queued"`
	Finished int     `json:"finished"`
	Seconds  float64 `json:"seconds"` // first claim to last finish
	Rate     float64 `json:"tasks_per_s"`
	Complete bool    `json:"complete"`
	// MaxHeld is the most tasks in -1/0 at once, replayed in commit order
	// from a change stream of the bench's own over every status change.
	MaxHeld     int   `json:"max_held"`
	Transitions int64 `json:"transitions"` // status changes seen
	// Seen: the stream delivered everything up to a write made after the
	// nodes stopped (else MaxHeld covers only part of the drain).
	Seen bool `json:"seen_all"`
	// CapReached is the claims the nodes' claimers saw refused by the
	// cap; Admitted the queue's admitted count once the nodes stopped.
	CapReached int64 `json:"cap_reached"`
	Admitted   int64 `json:"admitted_after"`
}

// CapFigures: max_running's cost.
type CapFigures struct {
	Nodes  int         `json:"nodes"`
	Rows   []CapRow    `json:"rows"`
	Ratios []RateRatio `json:"ratios"`
}

const dagGoalRatio = 1.5

// scheduling measures the scheduling group. pickup and ctl are this run's
// groups (nil when they did not run), whose floor is reused.
func (e *env) scheduling(ctx context.Context, pickup *PickupReport, ctl *ControlReport) (*SchedulingReport, error) {
	rep := &SchedulingReport{}
	if pickup == nil && ctl != nil && ctl.Floor.N > 0 {
		rep.Floor, rep.FloorSource = ctl.Floor, "the control group's of this run: "+ctl.FloorSource
	} else {
		var err error
		if rep.Floor, rep.FloorSource, err = e.controlFloor(ctx, pickup); err != nil {
			return rep, fmt.Errorf("scheduling, pickup floor: %w", err)
		}
	}
	e.log.Info("scheduling: task graph edges", "edges", e.cfg.DAGEdges, "rate", e.cfg.PickupRate)
	if err := e.schedDAG(ctx, &rep.DAG); err != nil {
		return rep, fmt.Errorf("scheduling, task graph edges: %w", err)
	}
	for _, n := range []int{1, e.cfg.SchedQueues} {
		e.log.Info("scheduling: claimer passes", "queues", n, "tasks", e.cfg.SchedTasks, "timeout", e.cfg.DrainTimeout)
		row, err := e.schedPasses(ctx, n)
		if err != nil {
			return rep, fmt.Errorf("scheduling, claimer passes with %d queues: %w", n, err)
		}
		e.log.Info("scheduling: drained", "queues", n, "finished", row.Finished, "tasks_per_s", round(row.Rate), "pass_mean_ms", round(row.PassMean))
		rep.Passes.Rows = append(rep.Passes.Rows, row)
	}
	if err := e.schedCaps(ctx, &rep.Cap); err != nil {
		return rep, fmt.Errorf("scheduling, max_running: %w", err)
	}
	rep.ratios()
	return rep, nil
}

// ratios compares the edge with the floor, many queues with one and the
// capped drains with the uncapped one, and judges the goal.
func (r *SchedulingReport) ratios() {
	d, f := &r.DAG, r.Floor
	d.Ratio = Ratio{What: "task graph edge: parent done -> child running / pickup floor", P50: ratio(d.Edge.P50, f.P50), P99: ratio(d.Edge.P99, f.P99)}
	d.Goal = Goal{Goal: fmt.Sprintf("edge p50 <= %gx the pickup floor p50 (%s <= %s ms)", dagGoalRatio, fms(d.Edge.P50), fms(dagGoalRatio*f.P50)),
		Met: d.Edge.N > 0 && f.N > 0 && d.Edge.P50 <= dagGoalRatio*f.P50}
	r.Passes.Ratios = passRatios(r.Passes.Rows)
	r.Cap.Ratios = capRatios(r.Cap.Rows)
}

// passRatios compares the drain with the most queues with the one with a
// single queue: mean pass, pass time per task, throughput.
func passRatios(rows []PassRow) []RateRatio {
	var one, many *PassRow
	for i := range rows {
		switch {
		case rows[i].Queues == 1:
			one = &rows[i]
		case many == nil || rows[i].Queues > many.Queues:
			many = &rows[i]
		}
	}
	if one == nil || many == nil {
		return nil
	}
	what := func(figure string) string {
		return fmt.Sprintf("%s, %d queues / 1 queue", figure, many.Queues)
	}
	return []RateRatio{
		{What: what("mean pass"), Value: ratio(many.PassMean, one.PassMean)},
		{What: what("pass time per task claimed"), Value: ratio(many.PassPerTask, one.PassPerTask)},
		{What: what("throughput"), Value: ratio(many.Rate, one.Rate)},
	}
}

// capRatios compares each capped drain's rate with the uncapped one's.
func capRatios(rows []CapRow) []RateRatio {
	var none *CapRow
	for i := range rows {
		if rows[i].Cap == 0 {
			none = &rows[i]
		}
	}
	if none == nil {
		return nil
	}
	var out []RateRatio
	for _, row := range rows {
		if row.Cap > 0 {
			out = append(out, RateRatio{What: fmt.Sprintf("throughput, %s / no max_running", row.What), Value: ratio(row.Rate, none.Rate)})
		}
	}
	return out
}

// capWhat names a max_running drain of nodes nodes of maxThreads each.
func capWhat(limit, nodes, maxThreads int) string {
	switch {
	case limit == 0:
		return "no max_running"
	case limit >= nodes*maxThreads:
		return fmt.Sprintf("max_running %d (does not bind: %d nodes x maxthreads %d)", limit, nodes, maxThreads)
	}
	return fmt.Sprintf("max_running %d (binds: %d nodes x maxthreads %d)", limit, nodes, maxThreads)
}

// forEach runs fn(i) for i in [0, n) on up to workers goroutines and
// returns the first error (the others stop taking work).
func forEach(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := range next {
				if ctx.Err() != nil {
					continue
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
send:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break send
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// ---- report ----

// renderScheduling renders the scheduling group's tables.
func renderScheduling(b *strings.Builder, r *Report) {
	s := r.Scheduling
	if s == nil {
		return
	}
	d := s.DAG
	row := func(t *table, what string, l Latency) {
		t.add(what, strconv.Itoa(l.N), fms(l.P50), fms(l.P95), fms(l.P99), fms(l.Max))
	}
	t := table{title: fmt.Sprintf("TASK GRAPHS: EDGE LATENCY, ms: %d parent -> child pairs (store.TaskInsertGraph, one pair every %s), one node with change streams, the leader's graph duty",
		d.Edges, secondFraction(d.Rate)), header: []string{"what", "n", "p50", "p95", "p99", "max"}}
	row(&t, "parent done (its plugin ran) -> child's plugin started (after the status 0 write)", d.Edge)
	row(&t, "parent's finish event (status 1) -> child's release event (-4 -> -2), a change stream of the bench's: the graph duty", d.Released)
	row(&t, "child's release event -> child's plugin started: the pickup", d.Pickup)
	row(&t, "parent's attempt finished -> child's attempt started (node clock, ms)", d.Attempts)
	row(&t, "pickup floor of this run: insert -> running, bare driver loop ("+s.FloorSource+")", s.Floor)
	t.render(b)
	fmt.Fprintf(b, "  children started before their parent was done %d, not started %d, tasks run twice %d\n\n", d.Early, d.Missing, d.Twice)

	t = table{title: "TASK GRAPHS RATIO AND GOAL", header: []string{"ratio", "p50", "p99", "goal"}}
	t.add(d.Ratio.What, fx(d.Ratio.P50), fx(d.Ratio.P99), d.Goal.String())
	t.render(b)

	t = table{title: "SCHEDULER: CLAIMER PASSES, one node draining no-op tasks queued beforehand (pass: queue reads and claims included; first claim to last finish)",
		header: []string{"queues", "queued", "finished", "seconds", "tasks/s", "passes", "claiming", "claimed", "empty claims", "batches", "pass mean, ms", "pass ms/task", "claimer busy", "all drained"}}
	for _, p := range s.Passes.Rows {
		t.add(p.What, strconv.Itoa(p.Queued), strconv.Itoa(p.Finished), fmt.Sprintf("%.1f", p.Seconds), frate(p.Rate),
			strconv.FormatInt(p.Passes, 10), strconv.FormatInt(p.ClaimingPasses, 10), strconv.FormatInt(p.Claims, 10), strconv.FormatInt(p.EmptyClaims, 10),
			strconv.FormatInt(p.Batches, 10), fms(p.PassMean), fmt.Sprintf("%.3f", p.PassPerTask), fmt.Sprintf("%.0f%%", 100*p.Busy), drained(p.Complete))
	}
	t.render(b)
	ratioTable(b, "SCHEDULER RATIOS", s.Passes.Ratios)

	t = table{title: fmt.Sprintf("MAX_RUNNING: %d nodes draining one queue of no-op tasks queued beforehand (capped claims and releases are transactions); first claim to last finish", s.Cap.Nodes),
		header: []string{"cap", "queued", "finished", "seconds", "tasks/s", "most in -1/0 seen", "transitions seen", "claims refused by the cap", "admitted after", "all drained"}}
	for _, c := range s.Cap.Rows {
		most := strconv.Itoa(c.MaxHeld)
		if !c.Seen {
			most += " (stream incomplete)"
		}
		t.add(c.What, strconv.Itoa(c.Queued), strconv.Itoa(c.Finished), fmt.Sprintf("%.1f", c.Seconds), frate(c.Rate), most,
			strconv.FormatInt(c.Transitions, 10), strconv.FormatInt(c.CapReached, 10), strconv.FormatInt(c.Admitted, 10), drained(c.Complete))
	}
	t.render(b)
	ratioTable(b, "MAX_RUNNING RATIOS", s.Cap.Ratios)

	if len(d.Failures) > 0 {
		b.WriteString("  TASK GRAPH FAILURES (what the node or the graph duty did wrong):\n")
		for _, f := range d.Failures {
			b.WriteString("  - " + f + "\n")
		}
		b.WriteString("\n")
	}
}

func ratioTable(b *strings.Builder, title string, rs []RateRatio) {
	t := table{title: title, header: []string{"ratio", "value"}}
	for _, x := range rs {
		t.add(x.What, fx(x.Value))
	}
	t.render(b)
}

func drained(complete bool) string {
	if complete {
		return "yes"
	}
	return "no: drain timeout"
}

// secondFraction is a second divided by rate, e.g. "20ms" for 50/s.
func secondFraction(rate int) string {
	if rate <= 0 {
		return "?"
	}
	return (time.Second / time.Duration(rate)).String()
}

// ---- sanity ----

// scheduling checks the scheduling group's figures and answers.
func (k *checker) scheduling(s *SchedulingReport, cfg config) {
	if s == nil {
		k.bad("scheduling: missing")
		return
	}
	k.latency("scheduling, pickup floor", s.Floor)
	d := s.DAG
	for _, f := range d.Failures {
		k.bad("scheduling, task graphs: %s", f)
	}
	if d.Edge.N != cfg.DAGEdges {
		k.bad("scheduling, task graphs: %d edges timed, want %d", d.Edge.N, cfg.DAGEdges)
	}
	k.latency("scheduling, task graph edge", d.Edge)
	// The node records ms, and the parts are differences of two clocks:
	// they may be 0 or (Pickup) negative; only their order is checked.
	if d.Attempts.N != d.Edge.N {
		k.bad("scheduling, task graphs: %d attempts recorded, want %d", d.Attempts.N, d.Edge.N)
	}
	if d.Released.N == 0 {
		k.bad("scheduling, task graphs: no release seen on the change stream")
	}
	for what, l := range map[string]Latency{"released": d.Released, "pickup": d.Pickup, "attempts": d.Attempts} {
		if l.N > 0 && !(l.P50 <= l.P95 && l.P95 <= l.P99 && l.P99 <= l.Max) {
			k.bad("scheduling, task graphs, %s: percentiles out of order (%+v)", what, l)
		}
	}
	k.positive("scheduling ratio "+d.Ratio.What+" p50", d.Ratio.P50)
	k.positive("scheduling ratio "+d.Ratio.What+" p99", d.Ratio.P99)

	p := s.Passes
	for _, want := range []int{1, cfg.SchedQueues} {
		found := false
		for _, row := range p.Rows {
			if row.Queues != want {
				continue
			}
			found = true
			what := "scheduling, passes, " + row.What
			switch {
			case row.Finished <= 0:
				k.bad("%s: nothing finished", what)
			case row.Finished > row.Queued:
				k.bad("%s: %d finished of %d queued", what, row.Finished, row.Queued)
			case row.Claims < int64(row.Finished):
				k.bad("%s: %d tasks claimed, fewer than the %d finished", what, row.Claims, row.Finished)
			}
			k.positive(what+", tasks/s", row.Rate)
			k.positive(what+", passes", float64(row.Passes))
			k.positive(what+", mean pass", row.PassMean)
			k.positive(what+", pass time per task", row.PassPerTask)
			if row.Busy > 1 {
				k.bad("%s: the claimer was busy %.0f %% of the time", what, 100*row.Busy)
			}
		}
		if !found {
			k.bad("scheduling, passes: no row for %d queue(s)", want)
		}
	}
	if len(p.Ratios) != 3 {
		k.bad("scheduling, passes: %d ratios, want 3", len(p.Ratios))
	}
	for _, x := range p.Ratios {
		k.positive("scheduling ratio "+x.What, x.Value)
	}

	c := s.Cap
	if len(c.Rows) != 3 {
		k.bad("scheduling, max_running: %d drains, want 3", len(c.Rows))
	}
	for _, row := range c.Rows {
		what := "scheduling, " + row.What
		if row.Finished <= 0 {
			k.bad("%s: nothing finished", what)
		}
		if row.Finished > row.Queued {
			k.bad("%s: %d finished of %d queued", what, row.Finished, row.Queued)
		}
		k.positive(what+", tasks/s", row.Rate)
		if !row.Seen {
			k.bad("%s: the change stream did not deliver every status change (%d seen)", what, row.Transitions)
		}
		if row.MaxHeld <= 0 {
			k.bad("%s: no task seen in -1/0", what)
		}
		if row.Cap > 0 && row.MaxHeld > row.Cap {
			k.bad("%s: %d tasks in -1/0 at once, over max_running %d", what, row.MaxHeld, row.Cap)
		}
	}
	if len(c.Ratios) != 2 {
		k.bad("scheduling, max_running: %d ratios, want 2", len(c.Ratios))
	}
	for _, x := range c.Ratios {
		k.positive("scheduling ratio "+x.What, x.Value)
	}
}
