package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/node"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web/apiv1"
)

// The figure groups, in the order they run.
const (
	groupPickup     = "pickup"
	groupThroughput = "throughput"
	groupScale      = "scale"
	groupLag        = "lag"
	groupWebQueues  = "web-queues"
	groupWebEvents  = "web-events"
	groupWebSubmit  = "web-submit"
	groupControl    = "control"
	groupScheduling = "scheduling"
	groupDashboard  = "dashboard"
	groupSupervise  = "supervise"
	groupScaleout   = "scaleout"
	// groupWeb selects the three web groups.
	groupWeb = "web"
)

var (
	allGroups = []string{groupPickup, groupThroughput, groupScale, groupLag, groupWebQueues, groupWebEvents, groupWebSubmit, groupControl, groupScheduling, groupDashboard, groupSupervise, groupScaleout}
	webGroups = []string{groupWebQueues, groupWebEvents, groupWebSubmit}
)

// config is what a run measures and how much. Zero values are filled from
// defaults or, with Quick, from quickDefaults.
type config struct {
	MongoURI string
	JSONFile string
	Quick    bool
	Only     []string
	Verbose  bool
	CPUProf  string
	// gc says which collector target the process runs under (set by run,
	// not a flag; Conditions.GC).
	gc string

	MaxThreads int
	// ClaimBatch is the nodes' batched-claim size (1: one findOneAndUpdate
	// per task, the way before batching).
	ClaimBatch int
	// ClaimLinger is how long the nodes' batched claims on a backlog may
	// wait for a whole batch of free slots (node Config.ClaimLinger; 0:
	// never).
	ClaimLinger time.Duration
	// ClaimRunning: the nodes claim straight into running (node
	// Config.ClaimRunning).
	ClaimRunning bool
	// PreImagesIdle: the nodes' node.Config.PreImagesIdle.
	PreImagesIdle time.Duration

	PickupRate     int
	PickupDuration time.Duration

	Tasks        int
	CeilingTasks int
	DrainTimeout time.Duration
	// Pairs: throughput's extra alternating pairs of drains (3 node
	// processes, the batched raw loop with 3 claimers).
	Pairs int

	Backlogs    []int
	Claims      int
	ScaleDrain  int
	RSSDuration time.Duration
	// ScaleTaskBytes pads each backlog task's parameters with as many
	// random bytes (0: none, the no-op task's 150-byte document).
	ScaleTaskBytes int

	// Scale-out: node processes of ScaleoutThreads each, one row per
	// count, each draining ScaleoutTasks, then timing ScaleoutPickups.
	ScaleoutNodes   []int
	ScaleoutThreads int
	ScaleoutTasks   int
	ScaleoutPickups int
	// ScaleoutPollOnly runs the processes without wake-up streams, to
	// tell what the streams cost.
	ScaleoutPollOnly bool
	// ScaleoutListeners is each process's WakeupListeners (0: every node).
	ScaleoutListeners int
	// NodeMemProf: the RSS node process writes a heap profile there.
	NodeMemProf string
	// NodeCPUProf: the drains' node processes each write a CPU profile
	// to NodeCPUProf-<name>.
	NodeCPUProf string

	WebQueues int
	WebTasks  int
	// The dashboard group: queues and tasks of the overview, how long
	// the drain runs.
	DashQueues  int
	DashTasks   int
	DashDrain   time.Duration
	WebRate     int
	WebDuration time.Duration
	WebSlow     int

	SSESubscribers int
	SSERate        int
	SSEDuration    time.Duration

	SubmitTasks   int
	SubmitRepeats int

	KillSamples int
	// SuperviseSamples: starts timed each way; SuperviseSleeping:
	// supervised tasks sleeping at once for the memory figure.
	SuperviseSamples  int
	SuperviseSleeping int
	DelayHeld         int
	DelayProbes       int
	WaitRounds        int

	DAGEdges    int
	SchedQueues int
	SchedTasks  int

	CacheGB  float64
	OplogMiB int
	// River runs the River peer (disbatch-bench-river, at RiverDir) after
	// the pickup group.
	River    bool
	RiverDir string
	// Members is the size of the replica set the bench starts (1, or 3
	// for production's shape); every write is majority either way.
	Members int
}

// defaults: a run that fits in 10 minutes on a 2-core machine.
var defaults = config{
	MaxThreads:        64,
	ClaimBatch:        claimer.DefaultBatch,
	ClaimLinger:       node.DefaultClaimLinger,
	ClaimRunning:      true,
	PreImagesIdle:     100 * time.Millisecond,
	PickupRate:        50,
	PickupDuration:    20 * time.Second,
	Tasks:             100_000,
	CeilingTasks:      20_000,
	DrainTimeout:      60 * time.Second,
	Backlogs:          []int{1_000, 100_000, 1_000_000},
	Claims:            300,
	ScaleDrain:        5000,
	RSSDuration:       5 * time.Second,
	ScaleoutNodes:     []int{1, 3, 10, 25, 50},
	ScaleoutThreads:   8,
	ScaleoutTasks:     10_000,
	ScaleoutPickups:   100,
	WebQueues:         200,
	WebTasks:          1_000_000,
	DashQueues:        1000,
	DashTasks:         1_000_000,
	DashDrain:         10 * time.Second,
	WebRate:           200,
	WebDuration:       10 * time.Second,
	WebSlow:           5,
	SSESubscribers:    100,
	SSERate:           2000,
	SSEDuration:       10 * time.Second,
	SubmitTasks:       apiv1.MaxSubmit,
	SubmitRepeats:     5,
	KillSamples:       50,
	SuperviseSamples:  200,
	SuperviseSleeping: 500,
	DelayHeld:         100_000,
	DelayProbes:       200,
	WaitRounds:        50,
	DAGEdges:          500,
	SchedQueues:       1000,
	SchedTasks:        10_000,
	CacheGB:           1,
	OplogMiB:          2048,
	Members:           1,
}

// quickDefaults: a run that fits in 1 minute (CI's sanity run).
var quickDefaults = config{
	MaxThreads:        64,
	PickupRate:        50,
	PickupDuration:    3 * time.Second,
	Tasks:             5_000,
	CeilingTasks:      2_000,
	DrainTimeout:      4 * time.Second,
	Backlogs:          []int{1_000, 20_000},
	Claims:            100,
	ScaleDrain:        200,
	RSSDuration:       2 * time.Second,
	ScaleoutNodes:     []int{1, 3},
	ScaleoutThreads:   8,
	ScaleoutTasks:     1000,
	ScaleoutPickups:   20,
	WebQueues:         200,
	WebTasks:          100_000,
	DashQueues:        1000,
	DashTasks:         50_000,
	DashDrain:         3 * time.Second,
	WebRate:           200,
	WebDuration:       3 * time.Second,
	WebSlow:           3,
	SSESubscribers:    20,
	SSERate:           2000,
	SSEDuration:       3 * time.Second,
	SubmitTasks:       apiv1.MaxSubmit,
	SubmitRepeats:     3,
	KillSamples:       15,
	SuperviseSamples:  40,
	SuperviseSleeping: 100,
	DelayHeld:         20_000,
	DelayProbes:       50,
	WaitRounds:        15,
	DAGEdges:          100,
	SchedQueues:       1000,
	SchedTasks:        3000,
	CacheGB:           1,
	OplogMiB:          2048,
	Members:           1,
}

const usageHead = `disbatch-bench measures a disbatch node against real MongoDB and prints
every figure with the conditions it was measured under, beside the floor
and ceilings of the performance notes (PERFORMANCE.md) measured in the same
run: compare ratios, not absolute figures, across runs and machines.

Usage:
  disbatch-bench [flags]

It starts its own single-member replica set from the mongod that
'make mongod' caches (or DISBATCH_MONGOD), unless --mongo-uri is given; every
measurement uses a fresh database, dropped afterwards.

Figure groups (--only):
  pickup      insert -> plugin start, one task at a time at --pickup-rate for
              --pickup-duration, one in-process node in change-stream and in
              poll-only mode, submitter write concern majority and w:1; and
              the floor: a bare driver loop insert -> change event ->
              findOneAndUpdate claim -> guarded updateOne to running.
  throughput  --tasks no-op tasks queued beforehand, drained by 1 and by 3
              in-process nodes and by 3 node processes; beside them the
              ceilings: a raw per-task loop (--maxthreads goroutines) and the
              batched raw loop (64 per batch, 1 and 3 claimers), over
              --ceiling-tasks tasks each. Every drain stops at
              --drain-timeout; rates are from first claim to last finish.
              With --pairs N, then N pairs of drains back to back, 3 node
              processes and the batched raw loop with 3 claimers (the order
              alternating), and the median of their ratios: a shared
              machine's load moves between two runs minutes apart, less
              between two in a row.
  scale       claim latency (store TaskClaim --claims times, TaskClaimMany of
              64 a tenth as often, the backlog kept constant) and an
              in-process node's drain rate (--scale-drain tasks, timed once
              its projector caught up with the backlog's inserts, the
              catch-up timed apart) beside the batched raw loop's on the same
              queue, at each of --backlogs queued tasks; and the RSS of a
              node run as a separate process for --rss-duration against the
              largest backlog.
  lag         the counter projector's lag p50/p99 over every event of
              throughput's node drains, the 3 node processes' included
              (--only lag runs those without the ceilings), and in each
              --pairs pair's; beside it the majority commit point's age,
              sampled by replSetGetStatus every 20 ms (with --mongo-uri: the
              clusterMonitor role). Every node drain (throughput's too)
              starts once a projector leads and is steady (its pre-images
              off after --pre-images-idle), as in a cluster that has run a
              while: the queue is paused until then (at most
              --pre-images-idle + 10 s; then it drains anyway, warning).
  web-queues  disbatch-web's GET /queues (4.103's route) served in-process on
              a loopback port: --web-queue-count queues over --web-tasks tasks
              (inserted raw, a realistic status mix, counters set as the
              projector keeps them), --web-rate requests/s open-loop for
              --web-duration; then the same answer the 4.103 way (3 count
              queries per queue: the route with the counters unset),
              --web-slow requests one at a time, and the ratio.
  web-events  --sse-subscribers HTTP clients on GET /api/v1/events (one hub)
              while a raw writer moves tasks -2 -> -1 -> 0 -> 1 with guarded
              updates at --sse-rate transitions/s for --sse-duration: delivery
              lag (receipt - the writer's acknowledgement) and lost or
              duplicated transitions per subscriber.
  web-submit  POST /api/v1/tasks of --submit-tasks tasks in one request
              against 'disbatch task submit' of the same tasks (the cli
              package in-process), --submit-repeats times each, alternating.
  web         the three web groups.
  control     task control, each figure beside the pickup floor of the same
              run (the pickup group's, else measured here the same way):
              kill: --kill-samples store.TaskKill calls, one at a time, on
              running shell tasks 'exec sleep 60' (10 running per round, one
              node): the kill-request write's acknowledgement -> the process
              dead (/proc polled every 200 us) and -> the task finished
              (status 2, reason killed; change event); delayed tasks:
              --delay-probes tasks due now+300..800 ms (one every 25 ms)
              among --delay-held tasks held until +1 h in the same queue,
              not_before -> plugin start, once the node settled after the
              held tasks' insert (probes one at a time until one starts
              within the goal; reported apart); the held tasks deleted
              afterwards;
              wait: --wait-rounds control.Wait calls on 10 running tasks
              finished by direct writes, the last write's acknowledgement ->
              Wait returns.
  scheduling  issue 16's figures, beside the pickup floor of the same run (the
              pickup group's, else the control group's, else measured here):
              task graphs: --dag-edges parent -> child pairs
              (store.TaskInsertGraph, one pair every 1/--pickup-rate s) on one
              in-process node, the parent done (plugin ran) -> the child's
              plugin started, released by the leader's graph duty; goal p50 <=
              1.5x the floor; claimer passes: --sched-tasks tasks drained by
              one node from 1 queue and from --sched-queues queues of mixed
              priorities and weights, the mean pass (claimer.Stats) and the
              rate, as ratios; max_running: --sched-tasks tasks of one queue
              drained by 2 nodes without a cap, with one that cannot bind and
              one that binds, rates as ratios, the tasks in -1/0 counted from
              a change stream of every status change (never above the cap).
  supervise   issue 19's cost of supervised tasks: --supervise-samples shell
              tasks, one every 25 ms, on one in-process node with supervisors
              off and on, insert start -> the task's first command (bash's
              $EPOCHREALTIME); goal supervised p50 <= 1.3x in-process; and
              --supervise-sleeping supervised 'exec sleep 600' tasks at once:
              each supervisor's VmRSS and PSS; goal RSS <= 5 MiB.
  scaleout    issue 20's scale-out: for each of --scaleout-nodes, that many
              node processes (maxthreads --scaleout-maxthreads) drain
              --scaleout-tasks tasks of one queue (paused until all are
              ready), then --scaleout-pickups tasks are inserted one every
              20 ms with all idle: tasks/s, claim conflicts, heartbeats/s, CPU
              of the leader, the nodes, the mongods and the machine,
              serverStatus per task, pickup p50/p99, tasks run twice or not
              at all (from the ids each process's plugin ran).

With --river, River (cmd/disbatch-bench-river: River on a throwaway
PostgreSQL) is measured right after the pickup group and compared.

The run exits non-zero when a figure is missing, zero, NaN or nonsensical
(p50 > p99, throughput 0), or when an answer is wrong (GET /queues counts
differ from the tasks, an event subscriber lost or got twice a transition,
a submit inserted the wrong count, a kill not carried out, a delayed task
started early, late by 30 s or not at all, a wait that returned wrong, a
child that ran before its parent, more tasks in -1/0 than max_running); it
never judges speed: goals are reported as met or not.

Flags:
`

// parseFlags reads the command line into a config. On --help it returns
// flag.ErrHelp and the help text.
func parseFlags(args []string) (config, string, error) {
	fs := flag.NewFlagSet("disbatch-bench", flag.ContinueOnError)
	var c config
	var only, backlogs, scaleoutNodes string
	fs.StringVar(&c.MongoURI, "mongo-uri", "", "use this replica set (`URI`) instead of starting one; the run creates and drops databases named disbatch_bench_*")
	fs.StringVar(&c.JSONFile, "json", "", "also write every figure and condition as JSON to `FILE`")
	fs.BoolVar(&c.Quick, "quick", false, "small counts and durations (about 1 minute): the (quick: ...) values below")
	fs.StringVar(&only, "only", strings.Join(allGroups, ","), "comma-separated figure `groups` to run: "+strings.Join(allGroups, ", ")+" ("+groupWeb+": the three web groups)")
	fs.BoolVar(&c.Verbose, "verbose", false, "show the nodes' and the replica set's own info logs")
	fs.StringVar(&c.CPUProf, "cpuprofile", "", "write a CPU profile of this process (in-process nodes included) to `FILE`")
	fs.IntVar(&c.MaxThreads, "maxthreads", defaults.MaxThreads, "queue and node maxthreads in throughput and scale; goroutines of the raw per-task loop")
	fs.IntVar(&c.ClaimBatch, "claim-batch", defaults.ClaimBatch, "the nodes' batched-claim size on a backlog (1: one findOneAndUpdate per task, to compare)")
	fs.DurationVar(&c.ClaimLinger, "claim-linger", defaults.ClaimLinger, "how long the nodes' batched claims on a backlog may wait for a whole batch of free slots (0: never, to compare)")
	fs.DurationVar(&c.PreImagesIdle, "pre-images-idle", defaults.PreImagesIdle, "the nodes' projector turns task pre-images off after this long with no other program's change (disbatchd: 10m; the bench's drains last seconds, so its default stands for a cluster of our nodes that has run that long)")
	fs.BoolVar(&c.ClaimRunning, "claim-running", defaults.ClaimRunning, "the nodes claim tasks straight into running, as disbatchd does by default (false: claim into -1, then a start write, to compare)")
	fs.IntVar(&c.PickupRate, "pickup-rate", defaults.PickupRate, "pickup: tasks inserted per second, one at a time")
	fs.DurationVar(&c.PickupDuration, "pickup-duration", defaults.PickupDuration, "pickup: how long each of the five pickup runs submits (quick: "+quickDefaults.PickupDuration.String()+")")
	fs.IntVar(&c.Tasks, "tasks", defaults.Tasks, "throughput: tasks queued for each node run (quick: "+strconv.Itoa(quickDefaults.Tasks)+")")
	fs.IntVar(&c.CeilingTasks, "ceiling-tasks", defaults.CeilingTasks, "throughput: tasks queued for each raw-loop ceiling run (quick: "+strconv.Itoa(quickDefaults.CeilingTasks)+")")
	fs.IntVar(&c.Pairs, "pairs", 0, "throughput: alternating pairs of drains, 3 node processes then (or after) the batched raw loop with 3 claimers, over --tasks and --ceiling-tasks tasks, after the rows: each pair's ratio and their median, and the node processes' lag p99")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", defaults.DrainTimeout, "throughput and scale: longest a drain may run; the rate is of what finished by then (quick: "+quickDefaults.DrainTimeout.String()+")")
	fs.StringVar(&backlogs, "backlogs", joinInts(defaults.Backlogs), "scale: comma-separated `counts` of queued tasks to measure claims at (quick: "+joinInts(quickDefaults.Backlogs)+")")
	fs.IntVar(&c.Claims, "claims", defaults.Claims, "scale: timed TaskClaim calls per backlog (quick: "+strconv.Itoa(quickDefaults.Claims)+")")
	fs.IntVar(&c.ScaleDrain, "scale-drain", defaults.ScaleDrain, "scale: tasks an in-process node, then the raw batched loop, drain at each backlog (at most the backlog; quick: "+strconv.Itoa(quickDefaults.ScaleDrain)+")")
	fs.StringVar(&c.NodeMemProf, "node-memprofile", "", "scale: the node process whose RSS is sampled writes a heap profile of its live objects to `FILE` at the end")
	fs.StringVar(&c.NodeCPUProf, "node-cpuprofile", "", "throughput and lag: each node process of their drains (the rows' and the pairs') writes a CPU profile of its run to `PREFIX`-<its name>, e.g. PREFIX-bench-proc-1; a later drain's overwrites an earlier's")
	fs.IntVar(&c.ScaleTaskBytes, "scale-task-bytes", defaults.ScaleTaskBytes, "scale: random bytes padding each backlog task's parameters, as a real task's parameters and output make its document larger (0: none)")
	fs.DurationVar(&c.RSSDuration, "rss-duration", defaults.RSSDuration, "scale: how long the node process runs while its RSS is sampled (quick: "+quickDefaults.RSSDuration.String()+")")
	fs.IntVar(&c.DashQueues, "dash-queues", defaults.DashQueues, "dashboard: queues on the overview")
	fs.IntVar(&c.DashTasks, "dash-tasks", defaults.DashTasks, "dashboard: tasks in all (quick: "+strconv.Itoa(quickDefaults.DashTasks)+")")
	fs.DurationVar(&c.DashDrain, "dash-drain", defaults.DashDrain, "dashboard: how long transitions are written at 2,000/s while the overview is open in Chromium (quick: "+quickDefaults.DashDrain.String()+")")
	fs.IntVar(&c.WebQueues, "web-queue-count", defaults.WebQueues, "web-queues: queues the tasks are spread over")
	fs.IntVar(&c.WebTasks, "web-tasks", defaults.WebTasks, "web-queues: tasks in all (quick: "+strconv.Itoa(quickDefaults.WebTasks)+")")
	fs.IntVar(&c.WebRate, "web-rate", defaults.WebRate, "web-queues: GET /queues requests per second, open-loop")
	fs.DurationVar(&c.WebDuration, "web-duration", defaults.WebDuration, "web-queues: how long GET /queues is driven (quick: "+quickDefaults.WebDuration.String()+")")
	fs.IntVar(&c.WebSlow, "web-slow", defaults.WebSlow, "web-queues: GET /queues requests timed the 4.103 way, one at a time (quick: "+strconv.Itoa(quickDefaults.WebSlow)+")")
	fs.IntVar(&c.SSESubscribers, "sse-subscribers", defaults.SSESubscribers, "web-events: event stream clients (quick: "+strconv.Itoa(quickDefaults.SSESubscribers)+")")
	fs.IntVar(&c.SSERate, "sse-rate", defaults.SSERate, "web-events: task transitions written per second")
	fs.DurationVar(&c.SSEDuration, "sse-duration", defaults.SSEDuration, "web-events: how long the writer drains (quick: "+quickDefaults.SSEDuration.String()+")")
	fs.IntVar(&c.SubmitTasks, "submit-tasks", defaults.SubmitTasks, "web-submit: tasks per submit (at most "+strconv.Itoa(apiv1.MaxSubmit)+", one request)")
	fs.IntVar(&c.SubmitRepeats, "submit-repeats", defaults.SubmitRepeats, "web-submit: submits timed each way (quick: "+strconv.Itoa(quickDefaults.SubmitRepeats)+")")
	fs.IntVar(&c.SuperviseSamples, "supervise-samples", defaults.SuperviseSamples, "supervise: shell task starts timed in-process and supervised (quick: "+strconv.Itoa(quickDefaults.SuperviseSamples)+")")
	fs.IntVar(&c.SuperviseSleeping, "supervise-sleeping", defaults.SuperviseSleeping, "supervise: supervised tasks sleeping at once for the memory figure (quick: "+strconv.Itoa(quickDefaults.SuperviseSleeping)+")")
	fs.IntVar(&c.KillSamples, "kill-samples", defaults.KillSamples, "control: kills timed (quick: "+strconv.Itoa(quickDefaults.KillSamples)+")")
	fs.IntVar(&c.DelayHeld, "delay-held", defaults.DelayHeld, "control: tasks held until +1 h beside the delayed probes (quick: "+strconv.Itoa(quickDefaults.DelayHeld)+")")
	fs.IntVar(&c.DelayProbes, "delay-probes", defaults.DelayProbes, "control: delayed tasks timed (quick: "+strconv.Itoa(quickDefaults.DelayProbes)+")")
	fs.IntVar(&c.WaitRounds, "wait-rounds", defaults.WaitRounds, "control: control.Wait calls timed (quick: "+strconv.Itoa(quickDefaults.WaitRounds)+")")
	fs.IntVar(&c.DAGEdges, "dag-edges", defaults.DAGEdges, "scheduling: parent -> child pairs timed (quick: "+strconv.Itoa(quickDefaults.DAGEdges)+")")
	fs.IntVar(&c.SchedQueues, "sched-queues", defaults.SchedQueues, "scheduling: queues of mixed priorities and weights the claimer's passes are measured with, against 1")
	fs.IntVar(&c.SchedTasks, "sched-tasks", defaults.SchedTasks, "scheduling: tasks queued for each pass and max_running drain (quick: "+strconv.Itoa(quickDefaults.SchedTasks)+")")
	fs.Float64Var(&c.CacheGB, "cache-gb", defaults.CacheGB, "the started mongod's --wiredTigerCacheSizeGB")
	fs.StringVar(&scaleoutNodes, "scaleout-nodes", joinInts(defaults.ScaleoutNodes), "scaleout: comma-separated `counts` of node processes, one row each (quick: "+joinInts(quickDefaults.ScaleoutNodes)+")")
	fs.IntVar(&c.ScaleoutThreads, "scaleout-maxthreads", defaults.ScaleoutThreads, "scaleout: maxthreads of each node process")
	fs.IntVar(&c.ScaleoutTasks, "scaleout-tasks", defaults.ScaleoutTasks, "scaleout: tasks queued for each row's drain (quick: "+strconv.Itoa(quickDefaults.ScaleoutTasks)+")")
	fs.IntVar(&c.ScaleoutPickups, "scaleout-pickups", defaults.ScaleoutPickups, "scaleout: tasks inserted one at a time after each drain, with every node process idle, for the pickup (quick: "+strconv.Itoa(quickDefaults.ScaleoutPickups)+")")
	fs.IntVar(&c.ScaleoutListeners, "scaleout-listeners", claimer.SuggestedListeners, "scaleout: how many of the queue's node processes keep a wake-up stream (disbatchd's --wakeup-listeners; 0: every one)")
	fs.BoolVar(&c.ScaleoutPollOnly, "scaleout-poll-only", false, "scaleout: the node processes open no wake-up change streams (the 1 s tick and their own finishes find work), to compare")
	fs.IntVar(&c.OplogMiB, "oplog-mib", defaults.OplogMiB, "the started mongod's --oplogSize in MiB")
	fs.BoolVar(&c.River, "river", false, "also measure River on PostgreSQL (the peer group: go run in --river-dir, which needs Debian's postgresql package and the Go module proxy) right after the pickup group, and compare pickups")
	fs.StringVar(&c.RiverDir, "river-dir", riverDir, "where the River peer's module is (`DIR`)")
	fs.IntVar(&c.Members, "members", defaults.Members, "members of the started replica set, all on this machine: 1, or 3 for production's shape (majority writes then wait for a secondary)")
	fs.Usage = func() {}
	fs.SetOutput(discard{})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			var b strings.Builder
			b.WriteString(usageHead)
			fs.SetOutput(&b)
			fs.PrintDefaults()
			return config{}, b.String(), err
		}
		return config{}, "", fmt.Errorf("%w (see --help)", err)
	}
	if fs.NArg() > 0 {
		return config{}, "", fmt.Errorf("unexpected arguments %q (see --help)", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	if c.Backlogs, err = parseInts(backlogs); err != nil {
		return config{}, "", fmt.Errorf("--backlogs: %w", err)
	}
	if c.ScaleoutNodes, err = parseInts(scaleoutNodes); err != nil {
		return config{}, "", fmt.Errorf("--scaleout-nodes: %w", err)
	}
	if c.Only, err = parseGroups(only); err != nil {
		return config{}, "", fmt.Errorf("--only: %w", err)
	}
	if c.Quick {
		c.applyQuick(set)
	}
	return c, "", c.validate()
}

// applyQuick replaces the values of flags not given by the quick ones.
func (c *config) applyQuick(set map[string]bool) {
	q := quickDefaults
	for name, apply := range map[string]func(){
		"pickup-duration":    func() { c.PickupDuration = q.PickupDuration },
		"tasks":              func() { c.Tasks = q.Tasks },
		"ceiling-tasks":      func() { c.CeilingTasks = q.CeilingTasks },
		"drain-timeout":      func() { c.DrainTimeout = q.DrainTimeout },
		"backlogs":           func() { c.Backlogs = q.Backlogs },
		"claims":             func() { c.Claims = q.Claims },
		"scale-drain":        func() { c.ScaleDrain = q.ScaleDrain },
		"rss-duration":       func() { c.RSSDuration = q.RSSDuration },
		"scaleout-nodes":     func() { c.ScaleoutNodes = q.ScaleoutNodes },
		"scaleout-tasks":     func() { c.ScaleoutTasks = q.ScaleoutTasks },
		"scaleout-pickups":   func() { c.ScaleoutPickups = q.ScaleoutPickups },
		"web-tasks":          func() { c.WebTasks = q.WebTasks },
		"web-duration":       func() { c.WebDuration = q.WebDuration },
		"web-slow":           func() { c.WebSlow = q.WebSlow },
		"sse-subscribers":    func() { c.SSESubscribers = q.SSESubscribers },
		"sse-duration":       func() { c.SSEDuration = q.SSEDuration },
		"submit-repeats":     func() { c.SubmitRepeats = q.SubmitRepeats },
		"kill-samples":       func() { c.KillSamples = q.KillSamples },
		"supervise-samples":  func() { c.SuperviseSamples = q.SuperviseSamples },
		"supervise-sleeping": func() { c.SuperviseSleeping = q.SuperviseSleeping },
		"delay-held":         func() { c.DelayHeld = q.DelayHeld },
		"delay-probes":       func() { c.DelayProbes = q.DelayProbes },
		"wait-rounds":        func() { c.WaitRounds = q.WaitRounds },
		"dag-edges":          func() { c.DAGEdges = q.DAGEdges },
		"sched-tasks":        func() { c.SchedTasks = q.SchedTasks },
		"dash-tasks":         func() { c.DashTasks = q.DashTasks },
		"dash-drain":         func() { c.DashDrain = q.DashDrain },
	} {
		if !set[name] {
			apply()
		}
	}
}

func (c *config) validate() error {
	var errs []error
	positive := func(name string, v int) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("--%s must be positive, got %d", name, v))
		}
	}
	positive("maxthreads", c.MaxThreads)
	if c.ClaimBatch < 1 || c.ClaimBatch > store.MaxClaimBatch {
		errs = append(errs, fmt.Errorf("--claim-batch must be 1 to %d, got %d", store.MaxClaimBatch, c.ClaimBatch))
	}
	if c.ClaimLinger < 0 || c.ClaimLinger > claimer.MaxLinger {
		errs = append(errs, fmt.Errorf("--claim-linger must be 0 to %v, got %v", claimer.MaxLinger, c.ClaimLinger))
	}
	positive("pickup-rate", c.PickupRate)
	positive("tasks", c.Tasks)
	positive("ceiling-tasks", c.CeilingTasks)
	positive("claims", c.Claims)
	positive("scale-drain", c.ScaleDrain)
	if c.ScaleTaskBytes < 0 || c.ScaleTaskBytes > maxTaskBytes {
		errs = append(errs, fmt.Errorf("--scale-task-bytes must be 0 to %d, got %d", maxTaskBytes, c.ScaleTaskBytes))
	}
	positive("scaleout-maxthreads", c.ScaleoutThreads)
	positive("scaleout-tasks", c.ScaleoutTasks)
	positive("scaleout-pickups", c.ScaleoutPickups)
	if c.ScaleoutListeners < 0 {
		errs = append(errs, fmt.Errorf("--scaleout-listeners must be 0 (every process) or more, got %d", c.ScaleoutListeners))
	}
	positive("oplog-mib", c.OplogMiB)
	positive("web-queue-count", c.WebQueues)
	positive("dash-queues", c.DashQueues)
	positive("dash-tasks", c.DashTasks)
	if c.DashDrain <= 0 {
		errs = append(errs, fmt.Errorf("--dash-drain must be positive, got %v", c.DashDrain))
	}
	positive("web-rate", c.WebRate)
	positive("web-slow", c.WebSlow)
	positive("sse-subscribers", c.SSESubscribers)
	positive("sse-rate", c.SSERate)
	positive("submit-tasks", c.SubmitTasks)
	positive("submit-repeats", c.SubmitRepeats)
	positive("kill-samples", c.KillSamples)
	positive("supervise-samples", c.SuperviseSamples)
	positive("supervise-sleeping", c.SuperviseSleeping)
	positive("delay-held", c.DelayHeld)
	positive("delay-probes", c.DelayProbes)
	positive("wait-rounds", c.WaitRounds)
	positive("dag-edges", c.DAGEdges)
	positive("sched-tasks", c.SchedTasks)
	for name, d := range map[string]time.Duration{"pickup-duration": c.PickupDuration, "drain-timeout": c.DrainTimeout, "rss-duration": c.RSSDuration,
		"web-duration": c.WebDuration, "sse-duration": c.SSEDuration} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("--%s must be positive, got %s", name, d))
		}
	}
	if c.PickupRate > 1000 {
		errs = append(errs, fmt.Errorf("--pickup-rate %d is over 1000/s: pickup inserts one task at a time", c.PickupRate))
	}
	if c.WebTasks < c.WebQueues {
		errs = append(errs, fmt.Errorf("--web-tasks %d is fewer than --web-queue-count %d", c.WebTasks, c.WebQueues))
	}
	if c.WebRate > 5000 {
		errs = append(errs, fmt.Errorf("--web-rate %d is over 5000/s: a goroutine per request", c.WebRate))
	}
	if c.SubmitTasks > apiv1.MaxSubmit {
		errs = append(errs, fmt.Errorf("--submit-tasks %d is over %d, what POST /api/v1/tasks takes in one request", c.SubmitTasks, apiv1.MaxSubmit))
	}
	if c.SchedQueues < 2 {
		errs = append(errs, fmt.Errorf("--sched-queues must be at least 2 (it is measured against 1), got %d", c.SchedQueues))
	}
	if c.SchedTasks < c.SchedQueues {
		errs = append(errs, fmt.Errorf("--sched-tasks %d is fewer than --sched-queues %d", c.SchedTasks, c.SchedQueues))
	}
	if c.Pairs < 0 {
		errs = append(errs, fmt.Errorf("--pairs must be 0 or more, got %d", c.Pairs))
	}
	if c.Pairs > 0 && !c.runs(groupThroughput) {
		errs = append(errs, errors.New("--pairs runs in the throughput group: add throughput to --only"))
	}
	if c.NodeCPUProf != "" && !c.runs(groupThroughput) && !c.runs(groupLag) {
		errs = append(errs, errors.New("--node-cpuprofile profiles the node processes of the throughput and lag drains: add throughput or lag to --only"))
	}
	if c.River && !c.runs(groupPickup) {
		errs = append(errs, errors.New("--river compares with the pickup group: add pickup to --only"))
	}
	if c.Members != 1 && c.Members != 3 && c.Members != 5 {
		errs = append(errs, fmt.Errorf("--members must be 1, 3 or 5, got %d", c.Members))
	}
	if c.Members != 1 && c.MongoURI != "" {
		errs = append(errs, errors.New("--members sizes the replica set the bench starts; it cannot be used with --mongo-uri"))
	}
	if c.CacheGB < 0.25 {
		errs = append(errs, fmt.Errorf("--cache-gb must be at least 0.25, got %g", c.CacheGB))
	}
	if len(c.ScaleoutNodes) == 0 && c.runs(groupScaleout) {
		errs = append(errs, errors.New("--scaleout-nodes is empty"))
	}
	if len(c.Backlogs) == 0 && c.runs(groupScale) {
		errs = append(errs, errors.New("--backlogs is empty"))
	}
	return errors.Join(errs...)
}

// runs reports whether group g was selected.
func (c *config) runs(g string) bool { return slices.Contains(c.Only, g) }

func parseGroups(s string) ([]string, error) {
	var out []string
	for _, g := range strings.Split(s, ",") {
		g = strings.TrimSpace(g)
		if g == "" {
			continue
		}
		gs := []string{g}
		if g == groupWeb {
			gs = webGroups
		} else if !slices.Contains(allGroups, g) {
			return nil, fmt.Errorf("unknown group %q (want some of %s, or %s for the web groups)", g, strings.Join(allGroups, ", "), groupWeb)
		}
		for _, g := range gs {
			if !slices.Contains(out, g) {
				out = append(out, g)
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no group selected")
	}
	return out, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ReplaceAll(f, "_", ""))
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
