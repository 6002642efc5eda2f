package main

import (
	"fmt"
	"math"
)

// sanity lists what is missing, zero, not finite or inconsistent in r for
// the groups cfg selected, and wrong answers of the web groups. It never
// judges speed.
func sanity(r *Report, cfg config) []string {
	var k checker
	c := r.Conditions
	if c.MongoDBVersion == "" {
		k.bad("conditions: MongoDB version missing")
	}
	if c.Members <= 0 {
		k.bad("conditions: replica set members missing")
	}
	if c.NumCPU <= 0 || c.GoVersion == "" {
		k.bad("conditions: machine cores or Go version missing")
	}
	if cfg.runs(groupPickup) {
		k.pickup(r.Pickup)
	}
	if cfg.runs(groupThroughput) {
		k.throughput(r.Throughput, cfg.Pairs)
	}
	if cfg.runs(groupLag) {
		k.lag(r.Lag)
	}
	if cfg.runs(groupScale) {
		k.scale(r.Scale, cfg.Backlogs)
	}
	k.web(r, cfg)
	if cfg.runs(groupControl) {
		k.control(r.Control, cfg)
	}
	if cfg.runs(groupScheduling) {
		k.scheduling(r.Scheduling, cfg)
	}
	if cfg.runs(groupDashboard) {
		k.dashboard(r.Dashboard)
	}
	if cfg.runs(groupSupervise) {
		k.supervise(r.Supervise, cfg)
	}
	if cfg.River {
		k.river(r.River)
	}
	if cfg.runs(groupScaleout) {
		k.scaleout(r.Scaleout, cfg.ScaleoutNodes)
	}
	return k.problems
}

// checker collects problems.
type checker struct{ problems []string }

func (k *checker) bad(format string, args ...any) {
	k.problems = append(k.problems, fmt.Sprintf(format, args...))
}

func (k *checker) positive(what string, v float64) {
	if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		k.bad("%s is %v, want a positive finite number", what, v)
	}
}

func (k *checker) latency(what string, l Latency) {
	if l.N == 0 {
		k.bad("%s: no samples", what)
		return
	}
	k.positive(what+" p50", l.P50)
	k.positive(what+" p95", l.P95)
	k.positive(what+" p99", l.P99)
	k.positive(what+" max", l.Max)
	if !(l.P50 <= l.P95 && l.P95 <= l.P99 && l.P99 <= l.Max) {
		k.bad("%s: percentiles out of order (p50 %v, p95 %v, p99 %v, max %v)", what, l.P50, l.P95, l.P99, l.Max)
	}
}

func (k *checker) pickup(p *PickupReport) {
	if p == nil {
		k.bad("pickup: missing")
		return
	}
	for _, want := range []struct{ mode, wc string }{
		{modeFloor, wcMajority}, {modeChangeStream, wcMajority}, {modeChangeStream, wcW1}, {modePollOnly, wcMajority}, {modePollOnly, wcW1},
	} {
		if row := pickupRow(p.Rows, want.mode, want.wc); row != nil {
			what := fmt.Sprintf("pickup, %s, %s", row.Mode, row.SubmitWC)
			k.latency(what, row.Pickup)
			k.positive(what+", insert ack p50", row.InsertAckP50)
		} else {
			k.bad("pickup: no row for %s, %s", want.mode, want.wc)
		}
	}
	if len(p.FloorSteps) != 5 {
		k.bad("pickup: %d floor steps, want 5", len(p.FloorSteps))
	}
	for _, s := range p.FloorSteps {
		k.positive("pickup floor step "+s.Step+" p50", s.P50)
		k.positive("pickup floor step "+s.Step+" p99", s.P99)
		if s.P50 > s.P99 {
			k.bad("pickup floor step %s: p50 %v > p99 %v", s.Step, s.P50, s.P99)
		}
	}
	if len(p.Ratios) != 4 {
		k.bad("pickup: %d ratios, want 4", len(p.Ratios))
	}
	for _, x := range p.Ratios {
		k.positive("pickup ratio "+x.What+" p50", x.P50)
		k.positive("pickup ratio "+x.What+" p99", x.P99)
	}
}

func (k *checker) throughput(t *ThroughputReport, pairs int) {
	if t == nil {
		k.bad("throughput: missing")
		return
	}
	want := []string{whatNode + ", " + nodesConcurrency(1), whatNode + ", " + nodesConcurrency(3), whatNodeProcs + ", " + procsConcurrency(3), whatPerTask,
		whatBatched + ", " + batchedConcurrency(1), whatBatched + ", " + batchedConcurrency(3)}
	seen := map[string]bool{}
	for _, row := range t.Rows {
		what := row.What + ", " + row.Concurrency
		seen[what], seen[row.What] = true, true
		if row.Finished <= 0 {
			k.bad("throughput, %s: nothing finished", what)
		}
		if row.Finished > row.Queued {
			k.bad("throughput, %s: %d finished of %d queued", what, row.Finished, row.Queued)
		}
		k.positive("throughput, "+what+", seconds", row.Seconds)
		k.positive("throughput, "+what+", tasks/s", row.Rate)
	}
	for _, w := range want {
		if !seen[w] {
			k.bad("throughput: no row for %s", w)
		}
	}
	if len(t.Ratios) != 5 {
		k.bad("throughput: %d ratios, want 5", len(t.Ratios))
	}
	for _, x := range t.Ratios {
		k.positive("throughput ratio "+x.What, x.Value)
	}
	switch {
	case pairs == 0 && t.Pairs != nil:
		k.bad("throughput: pairs reported, none asked for")
	case pairs > 0 && (t.Pairs == nil || len(t.Pairs.Rows) != pairs):
		n := 0
		if t.Pairs != nil {
			n = len(t.Pairs.Rows)
		}
		k.bad("throughput: %d pairs, want %d (--pairs)", n, pairs)
	}
	if p := t.Pairs; p != nil {
		for _, x := range p.Rows {
			what := fmt.Sprintf("throughput, pair %d", x.Pair)
			k.positive(what+", node processes tasks/s", x.Node)
			k.positive(what+", raw loop tasks/s", x.Raw)
			k.positive(what+", ratio", x.Ratio)
			k.positive(what+", node processes' lag p99", x.LagP99)
			k.commitAge(what, x.CommitAge)
		}
		if len(p.Rows) > 0 && !(p.Min <= p.Median && p.Median <= p.Max) {
			k.bad("throughput, pairs: median %g outside %g-%g", p.Median, p.Min, p.Max)
		}
	}
}

func (k *checker) lag(lags []LagRow) {
	if len(lags) != 3 {
		k.bad("lag: %d runs, want 3 (1 and 3 nodes, 3 node processes)", len(lags))
	}
	for _, l := range lags {
		if l.Events <= 0 {
			k.bad("lag, %s: the projector applied no events", l.Run)
		}
		k.positive("lag, "+l.Run+", p50", l.P50)
		k.positive("lag, "+l.Run+", p99", l.P99)
		if l.P50 > l.P99 {
			k.bad("lag, %s: p50 %v > p99 %v", l.Run, l.P50, l.P99)
		}
		k.commitAge("lag, "+l.Run, l.CommitAge)
	}
}

// commitAge checks a drain's commit point ages: sampled, and in order.
// An age may be 0 ms (wall times are whole milliseconds).
func (k *checker) commitAge(what string, a Latency) {
	switch {
	case a.N == 0:
		k.bad("%s: the commit point's age was not sampled (replSetGetStatus failed or was refused: the log says why; with --mongo-uri the user needs the clusterMonitor role)", what)
	case !(finite(a.P50) && finite(a.P95) && finite(a.P99) && finite(a.Max) && 0 <= a.P50 && a.P50 <= a.P95 && a.P95 <= a.P99 && a.P99 <= a.Max):
		k.bad("%s: commit point age p50 %v, p95 %v, p99 %v, max %v: want 0 <= p50 <= p95 <= p99 <= max", what, a.P50, a.P95, a.P99, a.Max)
	}
}

// finite says whether v is a number, neither NaN nor infinite.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func (k *checker) scale(s *ScaleReport, backlogs []int) {
	if s == nil {
		k.bad("scale: missing")
		return
	}
	if len(s.Rows) != len(backlogs) {
		k.bad("scale: %d backlogs measured, want %d", len(s.Rows), len(backlogs))
	}
	for _, row := range s.Rows {
		what := fmt.Sprintf("scale, backlog %d", row.Backlog)
		k.latency(what+", TaskClaim", row.Claim)
		k.latency(what+", TaskClaimMany", row.ClaimMany)
		if row.DrainTasks <= 0 {
			k.bad("%s: the node drained nothing", what)
		}
		k.positive(what+", node drain tasks/s", row.DrainRate)
		k.positive(what+", raw loop tasks/s", row.RawRate)
		k.positive(what+", projector catch-up seconds", row.CatchUp)
		k.positive(what+", whole recount ms", row.Recount)
		if row.RecountTasks < int64(row.Backlog) {
			k.bad("%s: %d tasks stored at the recount, fewer than the backlog", what, row.RecountTasks)
		}
	}
	k.positive("scale: backlog insert rate", s.InsertRate)
	if s.RSS == nil {
		k.bad("scale: node process RSS missing")
		return
	}
	k.positive("scale: node process RSS samples", float64(s.RSS.Samples))
	k.positive("scale: node process RSS when ready", s.RSS.ReadyMiB)
	k.positive("scale: node process max RSS", s.RSS.MaxMiB)
	if s.RSS.ReadyMiB > s.RSS.MaxMiB {
		k.bad("scale: node process RSS when ready %v > max %v", s.RSS.ReadyMiB, s.RSS.MaxMiB)
	}
}

func (k *checker) dashboard(d *DashboardReport) {
	if d == nil {
		k.bad("dashboard: no figures")
		return
	}
	if len(d.Server) == 0 {
		k.bad("dashboard: no server times")
	}
	for _, s := range d.Server {
		k.latency("dashboard: "+s.Route, s.Latency)
		if s.Bytes <= 0 {
			k.bad("dashboard: %s answered nothing", s.Route)
		}
	}
	if b := d.Browser; b != nil {
		k.positive("dashboard: first paint", b.FirstPaintMS)
		k.positive("dashboard: table filled", b.FilledMS)
		k.positive("dashboard: drain transitions", b.Transitions)
		k.positive("dashboard: events the page received", b.Events)
		k.positive("dashboard: renders", b.Renders)
		k.latency("dashboard: page answers", b.Answer)
	} else if d.Note == "" {
		k.bad("dashboard: no browser figures and no note saying why")
	}
}
