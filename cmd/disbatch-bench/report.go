package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Report is everything a run measured, as printed and as written to --json.
type Report struct {
	Conditions Conditions        `json:"conditions"`
	Pickup     *PickupReport     `json:"pickup,omitempty"`
	Throughput *ThroughputReport `json:"throughput,omitempty"`
	Lag        []LagRow          `json:"lag,omitempty"`
	Scale      *ScaleReport      `json:"scale,omitempty"`
	WebQueues  *WebQueuesReport  `json:"web_queues,omitempty"`
	WebEvents  *WebEventsReport  `json:"web_events,omitempty"`
	WebSubmit  *WebSubmitReport  `json:"web_submit,omitempty"`
	Control    *ControlReport    `json:"control,omitempty"`
	Scheduling *SchedulingReport `json:"scheduling,omitempty"`
	Dashboard  *DashboardReport  `json:"dashboard,omitempty"`
	Supervise  *SuperviseReport  `json:"supervise,omitempty"`
	Scaleout   *ScaleoutReport   `json:"scaleout,omitempty"`
	River      *RiverReport      `json:"river,omitempty"`
	// Problems are the sanity check's findings (none on a good run).
	Problems []string `json:"problems"`
}

// Conditions are what the figures were measured under.
type Conditions struct {
	Started        time.Time `json:"started"`
	Seconds        float64   `json:"seconds"`
	Mode           string    `json:"mode"`
	Groups         []string  `json:"groups"`
	MongoDBVersion string    `json:"mongodb_version"`
	Members        int       `json:"replica_set_members"`
	Deployment     string    `json:"deployment"`
	GoVersion      string    `json:"go_version"`
	Driver         string    `json:"mongo_driver"`
	OSArch         string    `json:"os_arch"`
	NumCPU         int       `json:"num_cpu"`
	GOMAXPROCS     int       `json:"gomaxprocs"`
	GC             string    `json:"gc"`
	MaxThreads     int       `json:"maxthreads"`
	ClaimBatch     int       `json:"claim_batch"`
	ClaimLinger    string    `json:"claim_linger"`
	ClaimRunning   bool      `json:"claim_running"`
	PreImagesIdle  string    `json:"pre_images_idle"`
	WriteConcerns  string    `json:"write_concerns"`
	Counts         []Count   `json:"counts"`
	// Load is the machine's 1-minute load average at the start and after
	// each phase (other load on the machine is not controlled).
	Load []PhaseLoad `json:"load_average,omitempty"`
}

// PhaseLoad is the 1-minute load average after a phase.
type PhaseLoad struct {
	Phase string  `json:"phase"`
	Load1 float64 `json:"load1"`
}

// Count is one task count or duration a group used.
type Count struct {
	Group string `json:"group"`
	What  string `json:"what"`
	Value any    `json:"value"`
}

// writeJSON writes r, indented, to file.
func writeJSON(file string, r *Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o644)
}

// renderTable renders r as plain-text tables.
func renderTable(r *Report) string {
	var b strings.Builder
	c := r.Conditions
	fmt.Fprintf(&b, "disbatch-bench (%s run, %s, took %.0f s)\n\n", c.Mode, c.Started.Format(time.RFC3339), c.Seconds)

	cond := table{title: "CONDITIONS", header: []string{"", ""}}
	cond.add("MongoDB", fmt.Sprintf("%s, replica set of %d member(s)", c.MongoDBVersion, c.Members))
	cond.add("deployment", c.Deployment)
	cond.add("Go", fmt.Sprintf("%s %s, mongo driver %s", c.GoVersion, c.OSArch, c.Driver))
	cond.add("machine", fmt.Sprintf("%d cores (runtime.NumCPU), GOMAXPROCS %d; other load on the machine is not controlled", c.NumCPU, c.GOMAXPROCS))
	if c.GC != "" {
		cond.add("garbage collector", c.GC+"; node processes likewise")
	}
	if len(c.Load) > 0 {
		loads := make([]string, len(c.Load))
		for i, l := range c.Load {
			loads[i] = fmt.Sprintf("%s %.1f", l.Phase, l.Load1)
		}
		cond.add("machine load", "1-minute load average (/proc/loadavg) at "+strings.Join(loads, ", after "))
	}
	cond.add("write concerns", c.WriteConcerns)
	if c.PreImagesIdle != "" {
		cond.add("task pre-images", "off after "+c.PreImagesIdle+" with no other program's change (--pre-images-idle; disbatchd: 10m)")
	}
	cond.add("concurrency", fmt.Sprintf("queue and node maxthreads %d, node claim batch %d (%s)%s; raw per-task loop %d goroutines; raw batched loop 1 and 3 claimers x %d", c.MaxThreads, c.ClaimBatch, lingerText(c.ClaimLinger), claimsInto(c.ClaimRunning), c.MaxThreads, ceilingBatch))
	cond.add("tasks", "fifo queues of a no-op plugin; in-process nodes with their own client each; fresh database per measurement")
	for _, n := range c.Counts {
		cond.add(n.Group+": "+n.What, fmt.Sprint(n.Value))
	}
	cond.noHeader = true
	cond.render(&b)

	if p := r.Pickup; p != nil {
		t := table{title: "PICKUP LATENCY, ms: insert start -> plugin start (floor: -> status 0 acknowledged)",
			header: []string{"mode", "submit wc", "rate/s", "tasks", "insert ack p50", "p50", "p95", "p99", "max"}}
		for _, row := range p.Rows {
			t.add(row.Mode, row.SubmitWC, strconv.Itoa(row.Rate), strconv.Itoa(row.Pickup.N), fms(row.InsertAckP50),
				fms(row.Pickup.P50), fms(row.Pickup.P95), fms(row.Pickup.P99), fms(row.Pickup.Max))
		}
		t.render(&b)
		t = table{title: "PICKUP FLOOR, steps, ms", header: []string{"step", "p50", "p99"}}
		for _, s := range p.FloorSteps {
			t.add(s.Step, fms(s.P50), fms(s.P99))
		}
		t.render(&b)
		t = table{title: "PICKUP RATIOS", header: []string{"ratio", "p50", "p99", "goal"}}
		for _, x := range p.Ratios {
			t.add(x.What, fx(x.P50), fx(x.P99), x.Goal)
		}
		t.render(&b)
	}

	if tp := r.Throughput; tp != nil {
		t := table{title: "THROUGHPUT, no-op tasks, first claim to last finish (ceilings: bare collection, no pre-images, no projector; fewer tasks: rates compare)",
			header: []string{"what", "concurrency", "queued", "finished", "seconds", "tasks/s", "all drained", "mongod CPU µs/task", "client CPU µs/task"}}
		for _, row := range tp.Rows {
			all := "yes"
			if !row.Complete {
				all = "no: drain timeout"
			}
			t.add(row.What, row.Concurrency, strconv.Itoa(row.Queued), strconv.Itoa(row.Finished), fmt.Sprintf("%.1f", row.Seconds), frate(row.Rate), all,
				fcpu(row.MongodCPU), fcpu(row.ClientCPU))
		}
		t.render(&b)
		t = table{title: "THROUGHPUT: what the primary did per task finished (serverStatus deltas over each drain)",
			header: append([]string{"what", "concurrency"}, serverHeader...)}
		for _, row := range tp.Rows {
			if x := row.Server; x != nil {
				t.add(append([]string{row.What, row.Concurrency}, x.cells()...)...)
			}
		}
		if len(t.rows) > 0 { // serverStatus could not be read
			t.render(&b)
		}
		t = table{title: "THROUGHPUT RATIOS", header: []string{"ratio", "value", "goal"}}
		for _, x := range tp.Ratios {
			t.add(x.What, fx(x.Value), x.Goal)
		}
		t.render(&b)
		if p := tp.Pairs; p != nil && len(p.Rows) > 0 {
			t = table{title: fmt.Sprintf("THROUGHPUT PAIRS: 3 node processes (--tasks) and %s, %s (--ceiling-tasks), back to back, the order alternating", whatBatched, batchedConcurrency(3)),
				header: []string{"pair", "first", "node processes tasks/s", "raw loop tasks/s", "all drained", "ratio", "their lag p99, ms", "commit point age p99, ms", "p99 / 2x age"}}
			var overs []float64
			for _, x := range p.Rows {
				first, all := "raw loop", "yes"
				if x.NodeFirst {
					first = "node processes"
				}
				if !x.Complete {
					all = "no: drain timeout"
				}
				f, ok := overAge(x.LagP99, x.CommitAge)
				if ok {
					overs = append(overs, f)
				}
				t.add(strconv.Itoa(x.Pair), first, frate(x.Node), frate(x.Raw), all, fx(x.Ratio), fms(x.LagP99), fage(x.CommitAge, x.CommitAge.P99), fover(f, ok))
			}
			t.add(fmt.Sprintf("median of %d", len(p.Rows)), "", "", "", "", fmt.Sprintf("%s (%s-%s), goal >= 1.0 (issue 20)", fx(p.Median), fx(p.Min), fx(p.Max)),
				fmt.Sprintf("%s, goal <= 100", fms(p.LagMedian)), "", fover(median(overs), len(overs) > 0))
			t.render(&b)
		}
	}

	if len(r.Lag) > 0 {
		t := table{title: fmt.Sprintf("PROJECTION LAG, ms: change event to the commit of its batch, every event of the node drains (each started once a projector was steady); beside it the majority commit point's age, sampled every %d ms (no event reaches a change stream younger, and a batch's majority commit waits about as long again: twice it is a rough measure of MongoDB's part, not a bound, and the last column is the lag p99 over twice the age's p99)", commitAgeEvery.Milliseconds()),
			header: []string{"run", "projector", "events", "batches", "p50", "p99", "commit point age p50", "commit point age p99", "p99 / 2x age"}}
		for _, l := range r.Lag {
			t.add(l.Run, l.Leader, strconv.FormatInt(l.Events, 10), strconv.FormatInt(l.Batches, 10), fms(l.P50), fms(l.P99), fage(l.CommitAge, l.CommitAge.P50), fage(l.CommitAge, l.CommitAge.P99),
				fover(overAge(l.P99, l.CommitAge)))
		}
		t.render(&b)
	}

	if s := r.Scale; s != nil {
		t := table{title: fmt.Sprintf("SCALE: claim latency, ms, one call at a time with the backlog kept, and one node's drain (backlog inserted at %s tasks/s)", frate(s.InsertRate)),
			header: []string{"backlog", "TaskClaim n", "p50", "p95", "p99", "max", fmt.Sprintf("TaskClaimMany(%d) n", scaleBatch), "p50", "p99",
				"projector catch-up, s", "node drained", "seconds", "tasks/s", "raw loop tasks/s", "node / raw", "tasks stored", "whole recount, ms"}}
		for _, row := range s.Rows {
			t.add(strconv.Itoa(row.Backlog), strconv.Itoa(row.Claim.N), fms(row.Claim.P50), fms(row.Claim.P95), fms(row.Claim.P99), fms(row.Claim.Max),
				strconv.Itoa(row.ClaimMany.N), fms(row.ClaimMany.P50), fms(row.ClaimMany.P99),
				fmt.Sprintf("%.1f", row.CatchUp), strconv.Itoa(row.DrainTasks), fmt.Sprintf("%.1f", row.DrainSeconds), frate(row.DrainRate),
				frate(row.RawRate), fx(row.DrainRate/row.RawRate), strconv.FormatInt(row.RecountTasks, 10), fms(row.Recount))
		}
		t.render(&b)
		b.WriteString("whole recount: the projector's recount of every queue, one $group over every stored task's {queue, status} index entry, the documents unread (at a term's catch-up and every 10 minutes, read while the batches go on; after a change the projector could not place, between two batches)\n\n")
		if n := len(s.Rows); n > 1 {
			first, last := s.Rows[0], s.Rows[n-1]
			fmt.Fprintf(&b, "drain rate at %d queued / at %d: node %s, raw loop %s (goal for the node: within 20%%, 0.80x or more)\n\n",
				last.Backlog, first.Backlog, fx(last.DrainRate/first.DrainRate), fx(last.RawRate/first.RawRate))
		}
		if x := s.RSS; x != nil {
			t = table{title: "NODE PROCESS MEMORY (a separate process, maxthreads as above)",
				header: []string{"backlog", "seconds", "samples", "RSS when ready, MiB", "max RSS, MiB", "tasks finished"}}
			t.add(strconv.Itoa(x.Backlog), fmt.Sprintf("%.1f", x.Seconds), strconv.Itoa(x.Samples), fmt.Sprintf("%.1f", x.ReadyMiB), fmt.Sprintf("%.1f", x.MaxMiB), strconv.Itoa(x.Finished))
			t.render(&b)
		}
	}

	renderWeb(&b, r)
	renderControl(&b, r)
	renderScheduling(&b, r)
	renderDashboard(&b, r)
	renderSupervise(&b, r)
	renderScaleout(&b, r)
	renderRiver(&b, r)

	if len(r.Problems) == 0 {
		b.WriteString("SANITY: every figure present, finite and consistent\n")
	} else {
		b.WriteString("SANITY: PROBLEMS\n")
		for _, p := range r.Problems {
			b.WriteString("  - " + p + "\n")
		}
	}
	return b.String()
}

// overAge is a lag p99 over twice the commit point age's p99 in the same
// drain, a rough measure of MongoDB's part of the lag (a change event
// reaches the stream only once the majority commit point passes it, and
// the batch's majority write waits about as long again; the ages are
// sampled, not the events' own waits, so a lag can come in under it);
// not ok without samples or a lag.
func overAge(lagP99 float64, age Latency) (float64, bool) {
	if age.N == 0 || !(age.P99 > 0) || !(lagP99 > 0) { // NaN too
		return 0, false
	}
	return lagP99 / (2 * age.P99), true
}

// fover formats overAge's ratio, "-" when there is none.
func fover(v float64, ok bool) string {
	if !ok {
		return "-"
	}
	return fx(v)
}

// fage is a commit point age's percentile v, or "-" when l has no
// samples.
func fage(l Latency, v float64) string {
	if l.N == 0 {
		return "-"
	}
	return fms(v)
}

// fms formats milliseconds.
func fms(v float64) string {
	switch {
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 1000:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// frate formats a rate.
func frate(v float64) string { return fmt.Sprintf("%.0f", v) }

// fx formats a ratio.
func fx(v float64) string { return fmt.Sprintf("%.2fx", v) }

// table is a titled text table: first column left-aligned, the others
// right-aligned.
type table struct {
	title    string
	header   []string
	rows     [][]string
	noHeader bool
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) render(b *strings.Builder) {
	b.WriteString(t.title + "\n")
	all := t.rows
	if !t.noHeader {
		all = append([][]string{t.header}, t.rows...)
	}
	var width []int
	for _, row := range all {
		for i, cell := range row {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(cell))
		}
	}
	// A column whose cells (but the header) are all numbers is right-aligned.
	right := make([]bool, len(width))
	for i := range right {
		right[i] = i > 0 && !t.noHeader && len(t.rows) > 0
		for _, row := range t.rows {
			if i < len(row) && !numeric(row[i]) {
				right[i] = false
			}
		}
	}
	for _, row := range all {
		line := ""
		for i, cell := range row {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(cell))
			if right[i] {
				line += "  " + pad + cell
			} else {
				line += "  " + cell + pad
			}
		}
		b.WriteString(strings.TrimRight(line, " ") + "\n")
	}
	b.WriteString("\n")
}

// numeric reports whether a cell is a number (a ratio may end in x).
func numeric(cell string) bool {
	_, err := strconv.ParseFloat(strings.TrimSuffix(cell, "x"), 64)
	return err == nil
}

// claimsInto says where the nodes' claims put tasks.
func claimsInto(running bool) string {
	if running {
		return ", claims straight into running (--claim-running)"
	}
	return ""
}

// fcpu renders a CPU time per task (0: not measured).
func fcpu(us float64) string {
	if us == 0 {
		return "-"
	}
	return frate(us)
}

// lingerText says how the nodes' claims waited (--claim-linger).
func lingerText(linger string) string {
	if d, err := time.ParseDuration(linger); err == nil && d > 0 {
		return "a claim on a backlog waiting up to " + linger + " for a whole batch"
	}
	return "claims never waiting for free slots"
}
