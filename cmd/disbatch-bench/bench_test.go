package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"

	"github.com/disbatch-go/disbatch/schema"
)

func TestPercentileNearestRank(t *testing.T) {
	t.Parallel()
	var d []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	l := summarize(d)
	require.Equal(t, Latency{N: 100, P50: 50, P95: 95, P99: 99, Max: 100}, l)
	require.Equal(t, 100*time.Millisecond, d[0], "summarize must not sort its input")

	require.Equal(t, Latency{N: 1, P50: 7, P95: 7, P99: 7, Max: 7}, summarize([]time.Duration{7 * time.Millisecond}))
	require.Equal(t, Latency{}, summarize(nil))

	three := []time.Duration{1, 2, 3}
	require.Equal(t, time.Duration(2), percentile(three, 50))
	require.Equal(t, time.Duration(3), percentile(three, 99))
	require.Equal(t, time.Duration(1), percentile(three, 0))
}

func TestRatioAndRate(t *testing.T) {
	t.Parallel()
	require.Equal(t, 2.0, ratio(4, 2))
	require.Equal(t, 0.0, ratio(1, 0))
	require.Equal(t, 0.0, ratio(0, 0))
	require.Equal(t, 0.0, ratio(math.NaN(), 1))
	require.Equal(t, 50.0, rate(100, 2*time.Second))
	require.Equal(t, 0.0, rate(100, 0))
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	c, _, err := parseFlags(nil)
	require.NoError(t, err)
	require.Equal(t, defaults.Tasks, c.Tasks)
	require.Equal(t, defaults.Backlogs, c.Backlogs)
	require.Equal(t, allGroups, c.Only)

	c, _, err = parseFlags([]string{"--quick", "--tasks", "777", "--only", "scale, pickup,scale"})
	require.NoError(t, err)
	require.Equal(t, 777, c.Tasks, "an explicit flag wins over --quick")
	require.Equal(t, quickDefaults.PickupDuration, c.PickupDuration)
	require.Equal(t, quickDefaults.Backlogs, c.Backlogs)
	require.Equal(t, []string{groupScale, groupPickup}, c.Only)
	require.True(t, c.runs(groupScale))
	require.False(t, c.runs(groupLag))

	c, _, err = parseFlags([]string{"--quick", "--only", "pickup,web,web-events"})
	require.NoError(t, err)
	require.Equal(t, []string{groupPickup, groupWebQueues, groupWebEvents, groupWebSubmit}, c.Only, "web is the three web groups")
	require.Equal(t, quickDefaults.WebTasks, c.WebTasks)
	require.Equal(t, quickDefaults.SSESubscribers, c.SSESubscribers)
	require.Equal(t, defaults.WebQueues, c.WebQueues)

	c, _, err = parseFlags([]string{"--backlogs", "1_000_000,1000,1000"})
	require.NoError(t, err)
	require.Equal(t, []int{1000, 1_000_000}, c.Backlogs)

	c, _, err = parseFlags([]string{"--scale-task-bytes", "2000", "--only", "scale"})
	require.NoError(t, err)
	require.Equal(t, 2000, c.ScaleTaskBytes)

	c, _, err = parseFlags([]string{"--node-cpuprofile", "/tmp/cpu", "--only", "lag"})
	require.NoError(t, err, "the lag group drains with node processes too")
	require.Equal(t, "/tmp/cpu", c.NodeCPUProf)

	for _, bad := range [][]string{
		{"--only", "pickup,speed"}, {"--tasks", "0"}, {"--backlogs", "10,x"}, {"--nope"}, {"extra"}, {"--pickup-rate", "5000"},
		{"--submit-tasks", "10001"}, {"--kill-samples", "0"}, {"--dag-edges", "0"}, {"--sched-queues", "1"}, {"--sched-tasks", "10", "--sched-queues", "20"}, {"--delay-probes", "-1"}, {"--web-tasks", "10", "--web-queue-count", "20"}, {"--sse-subscribers", "0"}, {"--web-duration", "0s"},
		{"--members", "2"}, {"--members", "3", "--mongo-uri", "mongodb://x"}, {"--river", "--only", "throughput"},
		{"--pairs", "-1"}, {"--pairs", "3", "--only", "lag"}, {"--node-cpuprofile", "/tmp/x", "--only", "pickup"},
		{"--scale-task-bytes", "-1"}, {"--scale-task-bytes", "2000000"},
	} {
		_, _, err := parseFlags(bad)
		require.Error(t, err, "%v", bad)
	}

	_, help, err := parseFlags([]string{"--help"})
	require.True(t, errors.Is(err, flag.ErrHelp))
	for _, name := range []string{"mongo-uri", "json", "quick", "only", "maxthreads", "pickup-rate", "pickup-duration", "tasks",
		"ceiling-tasks", "drain-timeout", "backlogs", "claims", "scale-drain", "scale-task-bytes", "rss-duration", "cache-gb", "oplog-mib", "members", "river", "river-dir", "scaleout-nodes", "scaleout-maxthreads", "scaleout-tasks", "scaleout-pickups", "verbose", "cpuprofile", "node-cpuprofile",
		"web-queue-count", "web-tasks", "web-rate", "web-duration", "web-slow", "sse-subscribers", "sse-rate", "sse-duration", "submit-tasks", "submit-repeats",
		"kill-samples", "delay-held", "delay-probes", "wait-rounds", "dag-edges", "sched-queues", "sched-tasks", "pairs"} {
		require.Regexp(t, `\n  -`+name+`[ \n]`, help, "help explains --%s", name)
	}
}

// goodReport is a complete, consistent report of every group.
func goodReport() *Report {
	lat := func(base float64) Latency {
		return Latency{N: 100, P50: base, P95: base * 2, P99: base * 3, Max: base * 4}
	}
	rows := []PickupRow{
		{Mode: modeFloor, SubmitWC: wcMajority, Rate: 50, InsertAckP50: 1.5, Pickup: lat(5)},
		{Mode: modeChangeStream, SubmitWC: wcMajority, Rate: 50, InsertAckP50: 1.5, Pickup: lat(6)},
		{Mode: modeChangeStream, SubmitWC: wcW1, Rate: 50, InsertAckP50: 0.5, Pickup: lat(70)},
		{Mode: modePollOnly, SubmitWC: wcMajority, Rate: 50, InsertAckP50: 1.5, Pickup: lat(500)},
		{Mode: modePollOnly, SubmitWC: wcW1, Rate: 50, InsertAckP50: 0.5, Pickup: lat(480)},
	}
	steps := make([]FloorStep, 5)
	for i := range steps {
		steps[i] = FloorStep{Step: "step", P50: 1, P99: 2}
	}
	drains := []DrainRow{
		{What: whatNode, Concurrency: nodesConcurrency(1), Queued: 1000, Finished: 1000, Seconds: 2, Rate: 500, Complete: true,
			MongodCPU: 391, ClientCPU: 119, Server: &ServerPerTask{Queries: 0.07, GetMores: 0.06, Updates: 1.04, Commands: 0.04, KeysExamined: 4.01, DocsExamined: 13.98,
				ReadMicros: 219, WriteMicros: 403, CommandMicros: 15}},
		{What: whatNode, Concurrency: nodesConcurrency(3), Queued: 1000, Finished: 900, Seconds: 1, Rate: 900},
		{What: whatPerTask, Concurrency: "64 goroutines", Queued: 500, Finished: 500, Seconds: 1, Rate: 500, Complete: true},
		{What: whatBatched, Concurrency: batchedConcurrency(1), Queued: 500, Finished: 500, Seconds: 0.2, Rate: 2500, Complete: true},
		{What: whatBatched, Concurrency: batchedConcurrency(3), Queued: 500, Finished: 500, Seconds: 0.1, Rate: 5000, Complete: true},
		{What: whatNodeProcs, Concurrency: "3 processes", Queued: 1000, Finished: 1000, Seconds: 1.0, Rate: 1000, Complete: true},
	}
	ctl := &ControlReport{Floor: lat(5), FloorSource: "the pickup group of this run",
		Kill: KillFigures{Kills: quickDefaults.KillSamples, Running: 10, Dead: lat(3), Finished: lat(8), DeadFromReturn: lat(1),
			FinishedFromReturn: lat(6), Call: lat(2)},
		Delay: DelayFigures{Held: quickDefaults.DelayHeld, HeldInsertRate: 40_000, Probes: quickDefaults.DelayProbes,
			Late: Latency{N: quickDefaults.DelayProbes, P50: 6, P95: 9, P99: 60, Max: 70}, LateAttempt: Latency{N: quickDefaults.DelayProbes, P50: 5, P95: 8, P99: 59, Max: 69},
			LateQueued:    Latency{N: quickDefaults.DelayProbes, P50: 2, P95: 3, P99: 30, Max: 31},
			DeleteSeconds: 1.5},
		Wait: WaitFigures{Rounds: quickDefaults.WaitRounds, Tasks: 10, Latency: Latency{N: quickDefaults.WaitRounds, P50: 4, P95: 5, P99: 6, Max: 7}},
	}
	ctl.ratios()
	return &Report{
		Control:    ctl,
		Scheduling: goodScheduling(lat(5)),
		Conditions: Conditions{Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Seconds: 42, Mode: "quick", MongoDBVersion: "6.0.5", Members: 1,
			GoVersion: "go1.26", NumCPU: 2, GOMAXPROCS: 2, GC: describeGC(200, false), MaxThreads: 64, Counts: []Count{{Group: groupPickup, What: "rate", Value: 50}},
			Load: []PhaseLoad{{Phase: "start", Load1: 1.25}, {Phase: groupPickup, Load1: 2}}},
		Pickup:     &PickupReport{Rows: rows, FloorSteps: steps, Ratios: pickupRatios(rows)},
		Throughput: &ThroughputReport{Rows: drains, Ratios: throughputRatios(drains)},
		Lag: []LagRow{{Run: "drain, 1 node", Events: 3000, Batches: 10, P50: 20, P99: 80, CommitAge: Latency{N: 40, P50: 0, P95: 3, P99: 4, Max: 6}},
			{Run: "drain, 3 nodes", Events: 2700, Batches: 9, P50: 25, P99: 90, CommitAge: Latency{N: 30, P50: 2, P95: 5, P99: 7.5, Max: 7.5}},
			{Run: "drain, 3 processes", Leader: "process 2 of 3", Events: 2900, Batches: 11, P50: 22, P99: 85, CommitAge: Latency{N: 35, P50: 3, P95: 9, P99: 12, Max: 20}}},
		Scale: &ScaleReport{
			Rows: []ScaleRow{
				{Backlog: 1000, Claim: lat(1), ClaimMany: lat(4), DrainTasks: 200, DrainSeconds: 0.5, DrainRate: 400, RawRate: 800, CatchUp: 0.3, Recount: 2.5, RecountTasks: 30000},
				{Backlog: 20000, Claim: lat(1.2), ClaimMany: lat(4.5), DrainTasks: 200, DrainSeconds: 0.5, DrainRate: 400, RawRate: 800, CatchUp: 0.3, Recount: 2.5, RecountTasks: 30000},
			},
			RSS:        &RSSRow{Backlog: 20000, Seconds: 2, Samples: 40, ReadyMiB: 20, MaxMiB: 36, Finished: 1000},
			InsertRate: 20000,
		},
		WebQueues: &WebQueuesReport{Queues: 200, Tasks: 100_000, Mix: "mix", InsertRate: 90_000, Load: "200/s open-loop for 3s",
			Projected: lat(2), ProjectedSerial: lat(1.5), CountQueries: lat(300), Ratio: Ratio{What: "one at a time", P50: 200, P99: 200},
			RatioLoaded: Ratio{What: "loaded", P50: 150, P99: 50}, Goal: Goal{Goal: "p99 <= 10 ms"}},
		WebEvents: &WebEventsReport{Subscribers: 20, Tasks: 2000, Chunk: 10, Transitions: 6000, TargetRate: 2000, Rate: 1990, Seconds: 3,
			Lag: Latency{N: 120_000, P50: 1, P95: 2, P99: 3, Max: 9}, CommitLag: lat(2), Goal: Goal{Goal: "p99 <= 50 ms", Met: true}},
		Dashboard: &DashboardReport{Queues: 1000, Nodes: 50, Tasks: 50_000,
			Server: []DashRoute{{Route: "/", Bytes: 1500, Latency: lat(0.5)}, {Route: "/api/v1/queues", Bytes: 500_000, Latency: lat(20)}},
			Browser: &DashBrowser{Chromium: "chromium", FirstPaintMS: 120, FilledMS: 300, Transitions: 1990, Events: 1980, Renders: 3,
				MainThreadBusy: 0.2, ScriptBusy: 0.1, Answer: lat(1), DrainSeconds: 3},
			Goals: []Goal{{Goal: "server", Met: true}}},
		Supervise: &SuperviseReport{Floor: lat(5), FloorSource: "the pickup group of this run", InProcess: Latency{N: 40, P50: 6, P95: 7, P99: 8, Max: 9},
			Supervised:      Latency{N: 40, P50: 7, P95: 8, P99: 9, Max: 10},
			InProcessPickup: Latency{N: 40, P50: 4, P95: 5, P99: 6, Max: 7}, SupervisedPickup: Latency{N: 40, P50: 4, P95: 5, P99: 6, Max: 7},
			PickupRatio: Ratio{What: "supervised pickup (insert -> running seen) / pickup floor", P50: 0.8, P99: 0.4}, Ratio: Ratio{What: "supervised / in-process: insert -> shell process running", P50: 1.17, P99: 1.1},
			FloorRatio: Ratio{What: "supervised start / pickup floor", P50: 1.4, P99: 1.2}, Sleeping: 100, RSSKiB: Summary{Mean: 9000, Max: 9500},
			PSSKiB: Summary{Mean: 3000, Max: 3500}, StartSecs: 4, Goals: []Goal{{Goal: "supervised start p50 <= 1.3x in-process", Met: true}, {Goal: "RSS per supervisor <= 5 MiB (mean 8.8 MiB)"}, {Goal: "supervised pickup p50 <= 1.3x the floor", Met: true}}},
		WebSubmit: &WebSubmitReport{Tasks: 10_000, Repeats: 3, Ratio: 1.5, Inserted: 80_000, Expected: 80_000, Rows: []SubmitRow{
			{How: howPOST, Seconds: 0.2, Rate: 50_000, Rates: []float64{50_000, 40_000, 60_000}},
			{How: howCLI, Seconds: 0.3, Rate: 33_333, Rates: []float64{33_333, 30_000, 35_000}},
		}},
		Scaleout: &ScaleoutReport{Rows: []ScaleoutRow{
			{Nodes: 1, Threads: 8, Tasks: 1000, StartSeconds: 0.3, Seconds: 1, Rate: 1000, Claims: 1020, Batches: 40, Heartbeats: 1, LeaderCPU: 0.3,
				MongodCPU: 1.1, MachineBusy: 1.6, Pickup: lat(4), Leader: "bench-out-1"},
			{Nodes: 3, Threads: 8, Tasks: 1000, StartSeconds: 0.6, Seconds: 0.5, Rate: 2000, Claims: 1020, Batches: 50, Contended: 300, LostBatches: 2, Heartbeats: 3,
				LeaderCPU: 0.2, NodeCPUMedian: 0.1, NodesCPU: 0.4, MongodCPU: 1.3, MachineBusy: 1.9, Pickup: lat(4.5), Leader: "bench-out-2"},
		}},
	}
}

func quickConfig(t *testing.T) config {
	c, _, err := parseFlags([]string{"--quick"})
	require.NoError(t, err)
	return c
}

func TestSanityAcceptsAGoodReport(t *testing.T) {
	t.Parallel()
	r := goodReport()
	require.Len(t, r.Pickup.Ratios, 4)
	require.Len(t, r.Throughput.Ratios, 5)
	require.Empty(t, sanity(r, quickConfig(t)))
}

func TestSanityFindsProblems(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		spoil func(r *Report)
		want  string
	}{
		"p50 over p99":         {func(r *Report) { r.Pickup.Rows[1].Pickup.P50 = 1000 }, "percentiles out of order"},
		"NaN latency":          {func(r *Report) { r.Scale.Rows[0].Claim.P95 = math.NaN() }, "positive finite"},
		"zero throughput":      {func(r *Report) { r.Throughput.Rows[0].Rate = 0 }, "tasks/s is 0"},
		"nothing finished":     {func(r *Report) { r.Throughput.Rows[2].Finished = 0 }, "nothing finished"},
		"missing poll-only w1": {func(r *Report) { r.Pickup.Rows = r.Pickup.Rows[:4] }, "no row for node, poll only, w:1"},
		"missing group":        {func(r *Report) { r.Throughput = nil }, "throughput: missing"},
		"no lag events":        {func(r *Report) { r.Lag[1].Events = 0 }, "applied no events"},
		"lag p50 over p99":     {func(r *Report) { r.Lag[0].P50 = 100 }, "p50 100 > p99 80"},
		"no commit point age":  {func(r *Report) { r.Lag[2].CommitAge = Latency{} }, "drain, 3 processes: the commit point's age was not sampled"},
		"commit age disorder":  {func(r *Report) { r.Lag[1].CommitAge.P99 = 9 }, "drain, 3 nodes: commit point age p50 2, p95 5, p99 9, max 7.5"},
		"commit age p95 order": {func(r *Report) { r.Lag[2].CommitAge.P95 = 2 }, "drain, 3 processes: commit point age p50 3, p95 2"},
		"negative commit age":  {func(r *Report) { r.Lag[0].CommitAge.P50 = -1 }, "drain, 1 node: commit point age p50 -1"},
		"no process lag":       {func(r *Report) { r.Lag = r.Lag[:2] }, "lag: 2 runs, want 3"},
		"missing backlog":      {func(r *Report) { r.Scale.Rows = r.Scale.Rows[:1] }, "1 backlogs measured, want 2"},
		"missing RSS":          {func(r *Report) { r.Scale.RSS = nil }, "RSS missing"},
		"no scale raw loop":    {func(r *Report) { r.Scale.Rows[1].RawRate = 0 }, "backlog 20000, raw loop tasks/s"},
		"no recount":           {func(r *Report) { r.Scale.Rows[0].Recount = 0 }, "backlog 1000, whole recount ms"},
		"recount of too few":   {func(r *Report) { r.Scale.Rows[1].RecountTasks = 10 }, "backlog 20000: 10 tasks stored at the recount"},
		"run twice":            {func(r *Report) { r.Scaleout.Rows[1].RunTwice = 1 }, "scaleout, 3 nodes: 1 tasks run twice"},
		"no leader":            {func(r *Report) { r.Scaleout.Rows[0].Leader = "" }, "scaleout, 1 nodes: no leader"},
		"missing scaleout row": {func(r *Report) { r.Scaleout.Rows = r.Scaleout.Rows[:1] }, "scaleout: 1 rows, want 2"},
		"no MongoDB version":   {func(r *Report) { r.Conditions.MongoDBVersion = "" }, "MongoDB version"},
		"zero ratio":           {func(r *Report) { r.Throughput.Ratios[0].Value = 0 }, "throughput ratio"},
		"no samples":           {func(r *Report) { r.Pickup.Rows[0].Pickup = Latency{} }, "no samples"},
		"kill not delivered":   {func(r *Report) { r.Control.Kill.Failures = []string{"task x: the process is still alive"} }, "control, kill: task x"},
		"kills missing":        {func(r *Report) { r.Control.Kill.Kills = 3 }, "3 kills measured, want 15"},
		"early start":          {func(r *Report) { r.Control.Delay.Failures = []string{"probe p started early"} }, "probe p started early"},
		"held left":            {func(r *Report) { r.Control.Delay.HeldLeft = 7 }, "7 held tasks left"},
		"wait rounds":          {func(r *Report) { r.Control.Wait.Latency.N = 14 }, "14 rounds timed, want 15"},
		"missing control":      {func(r *Report) { r.Control = nil }, "control: missing"},
		"missing supervise":    {func(r *Report) { r.Supervise = nil }, "supervise: missing"},
		"supervise starts":     {func(r *Report) { r.Supervise.Supervised.N = 3 }, "supervise: 40 and 3 starts timed, want 40 each"},
		"wrong queue counts":   {func(r *Report) { r.WebQueues.WrongProjected = 3 }, "wrong counts for 3 queues"},
		"failed requests":      {func(r *Report) { r.WebQueues.Errors = 2 }, "2 of 102 requests failed"},
		"lost events":          {func(r *Report) { r.WebEvents.Lost = 5; r.WebEvents.Lag.N -= 5 }, "5 transitions lost"},
		"duplicated events":    {func(r *Report) { r.WebEvents.Duplicated = 1 }, "1 duplicated"},
		"lag samples":          {func(r *Report) { r.WebEvents.Lag.N = 7 }, "7 lag samples, want 120000"},
		"submit count":         {func(r *Report) { r.WebSubmit.Inserted = 79_999 }, "79999 tasks in the queue"},
		"missing web group":    {func(r *Report) { r.WebEvents = nil }, "web-events: missing"},
		"child before parent":  {func(r *Report) { r.Scheduling.DAG.Failures = []string{"child c started before its parent p was done"} }, "task graphs: child c started"},
		"edges missing":        {func(r *Report) { r.Scheduling.DAG.Edge.N = 99 }, "99 edges timed, want 100"},
		"no release seen":      {func(r *Report) { r.Scheduling.DAG.Released = Latency{} }, "no release seen"},
		"no pass row":          {func(r *Report) { r.Scheduling.Passes.Rows = r.Scheduling.Passes.Rows[:1] }, "no row for 1000 queue(s)"},
		"no passes":            {func(r *Report) { r.Scheduling.Passes.Rows[0].PassMean = 0 }, "mean pass is 0"},
		"claimed too few":      {func(r *Report) { r.Scheduling.Passes.Rows[1].Claims = 10 }, "10 tasks claimed, fewer than"},
		"cap exceeded":         {func(r *Report) { r.Scheduling.Cap.Rows[2].MaxHeld = 17 }, "17 tasks in -1/0 at once, over max_running 16"},
		"stream incomplete":    {func(r *Report) { r.Scheduling.Cap.Rows[1].Seen = false }, "did not deliver every status change"},
		"missing scheduling":   {func(r *Report) { r.Scheduling = nil }, "scheduling: missing"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := goodReport()
			tc.spoil(r)
			problems := sanity(r, quickConfig(t))
			require.NotEmpty(t, problems)
			require.Contains(t, strings.Join(problems, "\n"), tc.want)
		})
	}
}

func TestSanityOnlyChecksSelectedGroups(t *testing.T) {
	t.Parallel()
	c, _, err := parseFlags([]string{"--quick", "--only", "pickup"})
	require.NoError(t, err)
	r := goodReport()
	r.Throughput, r.Scale, r.Lag, r.WebQueues, r.WebEvents, r.WebSubmit, r.Control, r.Scheduling = nil, nil, nil, nil, nil, nil, nil, nil
	require.Empty(t, sanity(r, c))
}

func TestThroughputPairsAreSummedUpRenderedAndChecked(t *testing.T) {
	t.Parallel()
	c, _, err := parseFlags([]string{"--quick", "--pairs", "3"})
	require.NoError(t, err)
	require.Equal(t, 3, c.Pairs)

	r := goodReport()
	r.Throughput.Pairs = pairsSummary([]PairRow{
		{Pair: 1, NodeFirst: true, Node: 2000, Raw: 2500, Complete: true, Ratio: 0.8, LagP99: 140, CommitAge: Latency{N: 30, P50: 3, P95: 9, P99: 12, Max: 12}},
		{Pair: 2, Node: 2600, Raw: 2000, Complete: true, Ratio: 1.3, LagP99: 95.5, CommitAge: Latency{N: 25}}, // every age 0 ms
		{Pair: 3, NodeFirst: true, Node: 1800, Raw: 2000, Ratio: 0.9, LagP99: 120.25, CommitAge: Latency{N: 20, P50: 2, P95: 5, P99: 8.25, Max: 9}},
	})
	require.InDelta(t, 0.9, r.Throughput.Pairs.Median, 1e-9)
	require.InDelta(t, 120.25, r.Throughput.Pairs.LagMedian, 1e-9)
	require.InDelta(t, 0.8, r.Throughput.Pairs.Min, 1e-9)
	require.InDelta(t, 1.3, r.Throughput.Pairs.Max, 1e-9)
	require.Empty(t, sanity(r, c))

	out := renderTable(r)
	require.Contains(t, out, "THROUGHPUT PAIRS: 3 node processes (--tasks) and ceiling: raw batched loop, 3 claimers x 64 (--ceiling-tasks), back to back, the order alternating")
	require.Regexp(t, `\n  1 +node processes +2000 +2500 +yes +0\.80x +140\.0 +12\.0 +5\.83x\n`, out)
	require.Regexp(t, `\n  2 +raw loop +2600 +2000 +yes +1\.30x +95\.5 +0\.00 +-\n`, out)
	require.Regexp(t, `\n  3 +node processes +1800 +2000 +no: drain timeout +0\.90x +120\.2 +8\.25 +7\.29x\n`, out)
	require.Contains(t, out, "median of 3")
	require.Regexp(t, `0\.90x \(0\.80x-1\.30x\), goal >= 1\.0 \(issue 20\) +120\.2, goal <= 100 +6\.56x\n`, out)

	require.Contains(t, strings.Join(sanity(r, quickConfig(t)), "\n"), "pairs reported, none asked for")
	r.Throughput.Pairs.Rows[1].Raw = 0
	require.Contains(t, strings.Join(sanity(r, c), "\n"), "pair 2, raw loop tasks/s")
	r.Throughput.Pairs.Rows[2].LagP99 = 0
	require.Contains(t, strings.Join(sanity(r, c), "\n"), "pair 3, node processes' lag p99")
	r.Throughput.Pairs.Rows[0].CommitAge.P99 = math.NaN()
	require.Contains(t, strings.Join(sanity(r, c), "\n"), "pair 1: commit point age p50 3, p95 9, p99 NaN")
	r.Throughput.Pairs.Rows[1].CommitAge = Latency{}
	require.Contains(t, strings.Join(sanity(r, c), "\n"), "pair 2: the commit point's age was not sampled")
	require.Regexp(t, `\n  2 +raw loop +2600 +0 +yes +1\.30x +95\.5 +- +-\n`, renderTable(r), "an unsampled pair shows dashes")
	require.Regexp(t, `\n  1 +node processes +2000 +2500 +yes +0\.80x +140\.0 +NaN +-\n`, renderTable(r), "no ratio to a NaN age")
	r.Throughput.Pairs.Rows[2].LagP99 = math.NaN()
	require.Regexp(t, `\n  3 +node processes +1800 +2000 +no: drain timeout +0\.90x +NaN +8\.25 +-\n`, renderTable(r), "no ratio of a NaN lag")
	require.Regexp(t, `goal <= 100 +-\n`, renderTable(r), "no median without a ratio")
	r.Throughput.Pairs = nil
	require.Contains(t, strings.Join(sanity(r, c), "\n"), "0 pairs, want 3 (--pairs)")
	require.NotContains(t, renderTable(r), "THROUGHPUT PAIRS")
}

func TestProcessesLagIsTheLeadersOrNothing(t *testing.T) {
	t.Parallel()
	msgs := []nodeMessage{
		{Finished: 10, Projector: &LagRow{Events: 0}},
		{Finished: 12}, // an older program's message: no projector
		{Finished: 9, Projector: &LagRow{Events: 4000, Batches: 30, P50: 40, P99: 90}},
	}
	require.Equal(t, LagRow{Run: "drain, 3 processes", Leader: "process 3 of 3", Events: 4000, Batches: 30, P50: 40, P99: 90}, procsLag("drain, 3 processes", msgs))
	// No process led: nothing to report, which the sanity check names.
	none := procsLag("drain, 3 processes", msgs[:2])
	require.Equal(t, int64(0), none.Events)
	k := &checker{}
	k.lag([]LagRow{none, none, none})
	require.Contains(t, strings.Join(k.problems, "\n"), "drain, 3 processes: the projector applied no events")
}

func TestRenderTable(t *testing.T) {
	t.Parallel()
	r := goodReport()
	out := renderTable(r)
	for _, want := range []string{
		"disbatch-bench (quick run, 2026-01-02T03:04:05Z, took 42 s)",
		"6.0.5, replica set of 1 member(s)",
		"2 cores (runtime.NumCPU), GOMAXPROCS 2", "GOGC 200 (disbatchd's default, internal/gctarget); node processes likewise", "1-minute load average (/proc/loadavg) at start 1.2, after pickup 2.0",
		"PICKUP LATENCY", "PICKUP FLOOR", "PICKUP RATIOS", "node (change streams, majority) / floor",
		"THROUGHPUT", "no: drain timeout", "THROUGHPUT RATIOS", "1 node / ceiling: raw batched loop, 1 claimer x 64",
		"PROJECTION LAG", "SCALE", "NODE PROCESS MEMORY",
		"GET /queues (Disbatch 4.103 route)", "150.00x", "NOT MET: p99 <= 10 ms",
		"LIVE EVENTS", "met: p99 <= 50 ms", "SUBMIT 10000 TASKS", "POST /api/v1/tasks / disbatch task submit, tasks/s  1.50x",
		"TASK CONTROL: KILL", "TASK CONTROL: DELAYED TASKS", "TASK CONTROL: WAIT",
		"met: kill -> finished p50 <= 2x the pickup floor p50 (8.00 <= 10.0 ms)", "NOT MET: not_before -> running p99 <= 50 ms (60.0)",
		"wait: last finish -> Wait returns / pickup floor  0.80x",
		"TASK GRAPHS: EDGE LATENCY", "one pair every 20ms", "met: edge p50 <= 1.5x the pickup floor p50 (7.00 <= 7.50 ms)",
		"SCHEDULER: CLAIMER PASSES", "1000 queues (priorities 0-3, weights 1-100)", "no: drain timeout",
		"MAX_RUNNING: 2 nodes", "max_running 16 (binds: 2 nodes x maxthreads 64)",
		"SUPERVISED TASKS, ms", "NOT MET: RSS per supervisor <= 5 MiB (mean 8.8 MiB)", "supervised / in-process: insert -> shell process running   1.17x",
		"supervised pickup (insert -> running seen) / pickup floor  0.80x", "pickup, supervised: the same",
		"SCALE-OUT: node processes (maxthreads 8 each)", "lost batches", "  3          0.60     2000     2.00x        300             2       50           3.0",
		"tasks stored  whole recount, ms", "whole recount: the projector's recount of every queue",
		"SANITY: every figure present",
		"mongod CPU µs/task  client CPU µs/task", "yes                391                 119",
		"THROUGHPUT: what the primary did per task finished", "node  1 node          0.07      0.06     1.04      0.04             0.00           4.01          13.98       219        403           15",
	} {
		require.Contains(t, out, want)
	}
	for _, want := range []string{
		`mean pass, 1000 queues / 1 queue +2\.00x\n`, `throughput, 1000 queues / 1 queue +0\.50x\n`,
		`throughput, max_running 256 \(does not bind: 2 nodes x maxthreads 64\) / no max_running +0\.90x\n`,
		`commit point age p50 +commit point age p99 +p99 / 2x age\n`, `sampled every 20 ms \(no event reaches a change stream younger`,
		`\n  drain, 3 processes +process 2 of 3 +2900 +11 +22\.0 +85\.0 +3\.00 +12\.0 +3\.54x\n`,
	} {
		require.Regexp(t, want, out)
	}
	// A drain whose commit point was not sampled shows dashes, not zeros.
	r.Lag[0].CommitAge = Latency{}
	require.Regexp(t, `\n  drain, 1 node +3000 +10 +20\.0 +80\.0 +- +- +-\n`, renderTable(r))
	// Numbers are right-aligned under their header.
	lines := strings.Split(out, "\n")
	var header, floor string
	for i, l := range lines {
		if strings.Contains(l, "insert ack p50") {
			header, floor = l, lines[i+1]
		}
	}
	require.NotEmpty(t, header)
	require.Equal(t, strings.Index(header, "p95")+len("p95"), strings.Index(floor, "10.0")+len("10.0"), "%q\n%q", header, floor)

	r.Problems = []string{"pickup: missing"}
	require.Contains(t, renderTable(r), "SANITY: PROBLEMS\n  - pickup: missing\n")

	// serverStatus unread for every drain: no table of what the primary did.
	for i := range r.Throughput.Rows {
		r.Throughput.Rows[i].Server = nil
	}
	require.NotContains(t, renderTable(r), "THROUGHPUT: what the primary did")
}

func TestTableAlignment(t *testing.T) {
	t.Parallel()
	tb := table{title: "T", header: []string{"name", "n", "note"}}
	tb.add("a", "1", "x")
	tb.add("bbb", "22.5", "yy")
	var b strings.Builder
	tb.render(&b)
	require.Equal(t, "T\n  name     n  note\n  a        1  x\n  bbb   22.5  yy\n\n", b.String())
}

func TestWriteJSON(t *testing.T) {
	t.Parallel()
	r := goodReport()
	r.Problems = sanity(r, quickConfig(t))
	file := filepath.Join(t.TempDir(), "bench.json")
	require.NoError(t, writeJSON(file, r))
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	var back map[string]any
	require.NoError(t, json.Unmarshal(b, &back))
	for _, key := range []string{"conditions", "pickup", "throughput", "lag", "scale", "web_queues", "web_events", "web_submit", "control", "scheduling", "problems"} {
		require.Contains(t, back, key)
	}
	pickup := back["pickup"].(map[string]any)
	first := pickup["rows"].([]any)[0].(map[string]any)
	require.Equal(t, 5.0, first["pickup"].(map[string]any)["p50_ms"])
	require.Equal(t, "6.0.5", back["conditions"].(map[string]any)["mongodb_version"])
}

func TestParseStatusKB(t *testing.T) {
	t.Parallel()
	status := "Name:\tdisbatch-bench\nVmPeak:\t  900 kB\nVmHWM:\t   40000 kB\nVmRSS:\t   36000 kB\n"
	kb, err := parseStatusKB(status, "VmRSS")
	require.NoError(t, err)
	require.Equal(t, int64(36000), kb)
	kb, err = parseStatusKB(status, "VmHWM")
	require.NoError(t, err)
	require.Equal(t, int64(40000), kb)
	_, err = parseStatusKB(status, "VmSwap")
	require.Error(t, err)
	_, err = parseStatusKB("VmRSS: lots\n", "VmRSS")
	require.Error(t, err)
}

func TestRedact(t *testing.T) {
	t.Parallel()
	require.Equal(t, "mongodb://u:xxxxx@h:1/?replicaSet=rs0", redact("mongodb://u:secret@h:1/?replicaSet=rs0"))
	require.Equal(t, "mongodb://127.0.0.1:27017/?replicaSet=rs0", redact("mongodb://127.0.0.1:27017/?replicaSet=rs0"))
}

func TestParseTaskEvent(t *testing.T) {
	t.Parallel()
	index := map[string]int32{"0123456789abcdef01234567": 7}
	data := []byte(`{"type":"task","op":"update","id":"0123456789abcdef01234567","time":"2025-01-02T03:04:05.678Z",` +
		`"cluster_time":{"t":1735787045,"i":3},"queue":"aaaaaaaaaaaaaaaaaaaaaaaa","from":-2,"to":-1,"node":"n1"}`)
	i, step, commit, ok := parseTaskEvent(data, index)
	require.True(t, ok)
	require.Equal(t, int32(7), i)
	require.Equal(t, 0, step)
	require.Equal(t, time.Date(2025, 1, 2, 3, 4, 5, 678_000_000, time.UTC), commit)

	for to, want := range map[string]int{"0": 1, "1": 2} {
		_, step, _, ok := parseTaskEvent([]byte(strings.Replace(string(data), `"to":-1`, `"to":`+to, 1)), index)
		require.True(t, ok)
		require.Equal(t, want, step)
	}
	for name, bad := range map[string]string{
		"unknown task": strings.Replace(string(data), "0123456789abcdef01234567", "ffffffffffffffffffffffff", 1),
		"insert":       strings.Replace(string(data), `"to":-1`, `"to":-2`, 1),
		"delete":       strings.Replace(string(data), `"to":-1`, `"to":null`, 1),
		"no id":        `{"type":"task"}`,
	} {
		_, _, _, ok := parseTaskEvent([]byte(bad), index)
		require.False(t, ok, name)
	}
}

func TestOpenLoop(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	lat, f, err := openLoop(context.Background(), 100, 200*time.Millisecond, func(context.Context) error {
		if calls.Add(1) == 3 {
			return errors.New("boom")
		}
		time.Sleep(time.Millisecond)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(20), calls.Load())
	require.Len(t, lat, 19)
	require.Equal(t, 1, f.n)
	require.EqualError(t, f.first, "boom")
	for _, l := range lat {
		require.GreaterOrEqual(t, l, time.Millisecond)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err = openLoop(ctx, 10, time.Second, func(context.Context) error { return nil })
	require.ErrorIs(t, err, context.Canceled)
}

func TestMedian(t *testing.T) {
	t.Parallel()
	require.Equal(t, 0.0, median(nil))
	require.Equal(t, 2.0, median([]float64{3, 1, 2}))
	require.Equal(t, 2.5, median([]float64{4, 1, 3, 2}))
}

// goodScheduling is a complete, consistent scheduling group (quick counts)
// beside floor.
func goodScheduling(floor Latency) *SchedulingReport {
	edges := quickDefaults.DAGEdges
	r := &SchedulingReport{Floor: floor, FloorSource: "the pickup group of this run",
		DAG: DAGFigures{Edges: edges, Rate: 50, Edge: Latency{N: edges, P50: 7, P95: 9, P99: 12, Max: 15},
			Released: Latency{N: edges, P50: 2, P95: 3, P99: 4, Max: 5}, Pickup: Latency{N: edges, P50: -0.2, P95: 4, P99: 6, Max: 8},
			Attempts: Latency{N: edges, P50: 0, P95: 4, P99: 6, Max: 9}},
		Passes: PassFigures{Rows: []PassRow{
			{What: passesWhat(1), Queues: 1, Queued: 3000, Finished: 3000, Seconds: 2, Rate: 1500, Complete: true,
				Passes: 400, ClaimingPasses: 390, Claims: 3000, EmptyClaims: 2, Batches: 60, PassMean: 1, PassPerTask: 0.13, Busy: 0.2},
			{What: passesWhat(1000), Queues: 1000, Queued: 3000, Finished: 2900, Seconds: 3.9, Rate: 750,
				Passes: 500, ClaimingPasses: 450, Claims: 2950, EmptyClaims: 900, Batches: 10, PassMean: 2, PassPerTask: 0.34, Busy: 0.5}}},
		Cap: CapFigures{Nodes: 2, Rows: []CapRow{
			{What: capWhat(0, 2, 64), Queued: 3000, Finished: 3000, Seconds: 2, Rate: 1500, Complete: true, MaxHeld: 128, Transitions: 9000, Seen: true},
			{What: capWhat(256, 2, 64), Cap: 256, Queued: 3000, Finished: 3000, Seconds: 2.2, Rate: 1350, Complete: true, MaxHeld: 128, Transitions: 9000, Seen: true},
			{What: capWhat(16, 2, 64), Cap: 16, Queued: 3000, Finished: 1200, Seconds: 4, Rate: 300, MaxHeld: 16, Transitions: 3700, Seen: true, CapReached: 80, Admitted: 0},
		}},
	}
	r.ratios()
	return r
}

func TestSchedulingRatios(t *testing.T) {
	t.Parallel()
	r := goodScheduling(Latency{N: 100, P50: 5, P95: 6, P99: 8, Max: 9})
	require.Equal(t, Ratio{What: "task graph edge: parent done -> child running / pickup floor", P50: 1.4, P99: 1.5}, r.DAG.Ratio)
	require.Equal(t, Goal{Goal: "edge p50 <= 1.5x the pickup floor p50 (7.00 <= 7.50 ms)", Met: true}, r.DAG.Goal)
	require.Equal(t, []RateRatio{
		{What: "mean pass, 1000 queues / 1 queue", Value: 2},
		{What: "pass time per task claimed, 1000 queues / 1 queue", Value: 0.34 / 0.13},
		{What: "throughput, 1000 queues / 1 queue", Value: 0.5},
	}, r.Passes.Ratios)
	require.Equal(t, []RateRatio{
		{What: "throughput, max_running 256 (does not bind: 2 nodes x maxthreads 64) / no max_running", Value: 0.9},
		{What: "throughput, max_running 16 (binds: 2 nodes x maxthreads 64) / no max_running", Value: 0.2},
	}, r.Cap.Ratios)

	// Over the goal, and without a floor: not met.
	r.Floor.P50 = 4
	r.ratios()
	require.False(t, r.DAG.Goal.Met)
	r.Floor = Latency{}
	r.ratios()
	require.False(t, r.DAG.Goal.Met)
	require.Equal(t, 0.0, r.DAG.Ratio.P50)

	// Rows missing: no ratios, which the sanity check reports.
	require.Nil(t, passRatios(r.Passes.Rows[1:]))
	require.Nil(t, capRatios(r.Cap.Rows[1:]))
	require.Equal(t, "no max_running", capWhat(0, 2, 64))
	require.Equal(t, "max_running 128 (does not bind: 2 nodes x maxthreads 64)", capWhat(128, 2, 64))
	require.Equal(t, "max_running 127 (binds: 2 nodes x maxthreads 64)", capWhat(127, 2, 64))
	require.Equal(t, "20ms", secondFraction(50))
}

func TestForEach(t *testing.T) {
	t.Parallel()
	var seen [50]atomic.Int32
	require.NoError(t, forEach(context.Background(), len(seen), 4, func(_ context.Context, i int) error {
		seen[i].Add(1)
		return nil
	}))
	for i := range seen {
		require.Equal(t, int32(1), seen[i].Load(), "index %d", i)
	}
	require.NoError(t, forEach(context.Background(), 0, 4, func(context.Context, int) error { return errors.New("never") }))

	var calls atomic.Int32
	err := forEach(context.Background(), 1000, 3, func(_ context.Context, i int) error {
		calls.Add(1)
		if i == 5 {
			return errors.New("boom")
		}
		return nil
	})
	require.EqualError(t, err, "boom")
	require.Less(t, calls.Load(), int32(1000), "work stops after an error")
}

func TestHeldWatchCountsClaimedAndRunning(t *testing.T) {
	t.Parallel()
	w := &heldWatch{held: map[bson.ObjectID]bool{}}
	a, b, c := bson.NewObjectID(), bson.NewObjectID(), bson.NewObjectID()
	for _, step := range []struct {
		id bson.ObjectID
		st schema.Status
	}{
		{a, schema.StatusClaimed}, {b, schema.StatusClaimed}, {a, schema.StatusRunning}, {a, schema.StatusSucceeded},
		{c, schema.StatusClaimed}, {b, schema.StatusQueued}, {c, schema.StatusRunning}, {b, schema.StatusClaimed}, {c, schema.StatusFailed},
	} {
		w.apply(step.id, step.st)
	}
	most, transitions := w.result()
	require.Equal(t, 2, most)
	require.Equal(t, int64(9), transitions)
	require.Equal(t, map[bson.ObjectID]bool{b: true}, w.held)
}

func TestRunLog(t *testing.T) {
	t.Parallel()
	r := newRunLog()
	a, b := bson.NewObjectID(), bson.NewObjectID()
	r.record(a)
	left, err := r.wait(context.Background(), []bson.ObjectID{a, b}, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, 1, left)
	go r.record(b)
	left, err = r.wait(context.Background(), []bson.ObjectID{a, b}, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, 0, left)
	r.record(a)
	require.Len(t, r.runs(a), 2)
	require.False(t, r.runs(a)[1].Before(r.runs(a)[0]))
}
func TestRiverPeerIsComparedRenderedAndChecked(t *testing.T) {
	t.Parallel()
	c, _, err := parseFlags([]string{"--quick", "--only", "pickup", "--river"})
	require.NoError(t, err)
	require.True(t, c.River)
	require.Equal(t, riverDir, c.RiverDir)
	r := goodReport()
	r.Throughput, r.Scale, r.Lag, r.WebQueues, r.WebEvents, r.WebSubmit, r.Control, r.Scheduling = nil, nil, nil, nil, nil, nil, nil, nil
	require.Equal(t, []string{"river: missing"}, sanity(r, c))

	// A line as disbatch-bench-river writes it: pickups 1..100 ms.
	line := `{"river":"v0.51.1","postgres":"postgres 15","fetch_cooldown":"1ms","max_workers":64,"rate_per_s":50,"pickup_ms":[`
	for i := 1; i <= 100; i++ {
		line += strconv.Itoa(i)
		if i < 100 {
			line += ","
		}
	}
	line += `],"drain_jobs":1000,"drain_seconds":0.1,"drain_jobs_per_s":10000}`
	var run riverRun
	require.NoError(t, json.Unmarshal([]byte(line), &run))
	ours := Latency{N: 100, P50: 100, P95: 120, P99: 198, Max: 200}
	pickup := &PickupReport{Rows: []PickupRow{{Mode: modeFloor, SubmitWC: wcMajority, Pickup: lat1()},
		{Mode: modeChangeStream, SubmitWC: wcW1, Pickup: lat1()}, {Mode: modeChangeStream, SubmitWC: wcMajority, Pickup: ours}}}
	r.River = compareRiver(run, pickup)
	require.Equal(t, Latency{N: 100, P50: 50, P95: 95, P99: 99, Max: 100}, r.River.Pickup, "River's pickups, nearest rank")
	require.Equal(t, ours, r.River.Ours, "our node's row with change streams and a majority submitter")
	require.Equal(t, 2.0, r.River.Ratio.P50)
	require.Equal(t, 2.0, r.River.Ratio.P99)
	require.False(t, r.River.Goal.Met)
	require.Empty(t, sanity(r, c))
	out := renderTable(r)
	for _, want := range []string{"PEER: RIVER v0.51.1 on postgres 15", "River pickup, ms                                 100   50.0   95.0   99.0  100.0",
		"p50 2.00x, p99 2.00x; NOT MET: at or below River's", "River drained 1000 no-op jobs in 0.10 s: 10000 jobs/s"} {
		require.Contains(t, out, want)
	}
	require.True(t, compareRiver(run, &PickupReport{Rows: []PickupRow{{Mode: modeChangeStream, SubmitWC: wcMajority, Pickup: Latency{N: 100, P50: 40, P95: 60, P99: 90, Max: 95}}}}).Goal.Met)
	require.False(t, compareRiver(run, &PickupReport{}).Goal.Met, "not met without our figure")
	run.PickupMS = nil
	r.River = compareRiver(run, pickup)
	require.False(t, r.River.Goal.Met, "not met without River's")
	require.Equal(t, []string{"river: pickup: no samples"}, sanity(r, c))
}

func lat1() Latency { return Latency{N: 1, P50: 1, P95: 1, P99: 1, Max: 1} }

// TestCPUMeterFillsPerTask: a drain's CPU seconds and serverStatus
// deltas become figures per task finished.
func TestCPUMeterFillsPerTask(t *testing.T) {
	t.Parallel()
	ss0 := map[string]int64{"query": 10, "getmore": 0, "update": 100, "command": 5, "writeConflicts": 0, "scanned": 0, "scannedObjects": 0,
		"readLatency": 1000, "writeLatency": 0, "commandLatency": 0}
	ss1 := map[string]int64{"query": 30, "getmore": 40, "update": 2180, "command": 5, "writeConflicts": 2, "scanned": 8000, "scannedObjects": 28000,
		"readLatency": 439000, "writeLatency": 806000, "commandLatency": 30000}
	m := &cpuMeter{start: cpuReading{mongod: 10.5, client: 3, ss: ss0}, end: cpuReading{mongod: 11.28, client: 3.24, ss: ss1}}
	row := DrainRow{Finished: 2000}
	m.fill(&row)
	require.Equal(t, 390.0, row.MongodCPU)
	require.Equal(t, 120.0, row.ClientCPU)
	require.Equal(t, &ServerPerTask{Queries: 0.01, GetMores: 0.02, Updates: 1.04, WriteConflicts: 0.001, KeysExamined: 4, DocsExamined: 14,
		ReadMicros: 219, WriteMicros: 403, CommandMicros: 15}, row.Server)

	// Nothing finished: nothing per task.
	none := DrainRow{}
	m.fill(&none)
	require.Zero(t, none.MongodCPU)
	require.Nil(t, none.Server)
	// serverStatus not read: no table row.
	m.end.ss = nil
	row = DrainRow{Finished: 2000}
	m.fill(&row)
	require.Nil(t, row.Server)
}

// The driver refuses an operation whose deadline is less than a round trip
// away before the context itself ends (CI's stop-33 run failed on it): the
// ceiling loops must take that refusal as the drain's end, and nothing else.
func TestADeadlineRefusalEndsADrain(t *testing.T) {
	t.Parallel()
	ending, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	refusal := fmt.Errorf("claim: %w", fmt.Errorf("calculated server-side timeout (0 ms) is less than or equal to 0: %w", driver.ErrDeadlineWouldBeExceeded))
	require.True(t, drainTimedOut(ending, refusal), "a refusal wrapping context.DeadlineExceeded at the deadline ends the drain")
	require.False(t, drainTimedOut(ending, errors.New("claim: connection reset")), "any other error with time left is the loop's failure")

	live, cancelLive := context.WithTimeout(context.Background(), time.Hour)
	defer cancelLive()
	selection := fmt.Errorf("claim: %w", topology.ServerSelectionError{Wrapped: context.DeadlineExceeded})
	require.False(t, drainTimedOut(live, selection), "a server selection timeout long before the deadline is a failure")
	require.False(t, drainTimedOut(live, refusal), "so is a refusal long before it")

	done, stop := context.WithCancel(context.Background())
	stop()
	require.True(t, drainTimedOut(done, errors.New("claim: connection reset")), "once the drain context ends, its errors are its end")
}
