package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/internal/cmdline"
	"github.com/disbatch-go/disbatch/internal/gctarget"
	"github.com/disbatch-go/disbatch/metrics"
	"github.com/disbatch-go/disbatch/node"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/reaper"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/supervisor"
	"github.com/disbatch-go/disbatch/tracing"
)

// EnvNode names the node when --node is not given.
const EnvNode = "DISBATCH_NODE"

// EnvMetricsAddr is the metrics address when --metrics-addr is not given.
const EnvMetricsAddr = "DISBATCH_METRICS_ADDR"

type env struct {
	getenv  func(string) string
	stdout  io.Writer
	stderr  io.Writer
	signals <-chan os.Signal
}

// settings are everything a node can be told, from flags, the environment
// and the config file.
type settings struct {
	MongoURI      string            `json:"mongo_uri"`
	Database      string            `json:"database"`
	Node          string            `json:"node"`
	MaxThreads    *int              `json:"maxthreads"`
	Label         string            `json:"label"`
	EnablePlugins []string          `json:"enable_plugins"`
	Plugins       map[string]string `json:"plugins"` // constructor -> executable
	PluginTimeout duration          `json:"plugin_timeout"`
	Grace         duration          `json:"grace"`
	Tick          duration          `json:"tick"`
	OrphanAfter   duration          `json:"orphan_after"`
	Heartbeat     duration          `json:"heartbeat"`
	FenceAfter    duration          `json:"fence_after"`
	DeadAfter     duration          `json:"dead_after"`
	PreImagesIdle duration          `json:"pre_images_idle"`
	PollOnly      bool              `json:"poll_only"`
	// ClaimRunning is --claim-running (default on); the file turns it off
	// with claim_running: false.
	ClaimRunning *bool `json:"claim_running"`
	// ClaimLinger is --claim-linger (nil: node.DefaultClaimLinger); a
	// pointer, so that the file's "0s" turns it off.
	ClaimLinger *duration `json:"claim_linger"`
	// ClaimBatch is --claim-batch (default claimer.DefaultBatch).
	ClaimBatch int `json:"claim_batch"`
	// WakeupListeners is --wakeup-listeners (0: every node; default
	// claimer.SuggestedListeners).
	WakeupListeners int    `json:"wakeup_listeners"`
	NoProjector     bool   `json:"no_projector"`
	OutputThreshold int    `json:"output_threshold"`
	LogFormat       string `json:"log_format"`
	LogLevel        string `json:"log_level"`
	MetricsAddr     string `json:"metrics_addr"`
	QueueBalance    bool   `json:"queue_balance"`
	// Supervise is --supervise (default on); the file turns it off with
	// no_supervise: true.
	Supervise   bool   `json:"-"`
	NoSupervise bool   `json:"no_supervise"`
	StateDir    string `json:"state_dir"`
	// SupervisorPool is how many idle supervisors wait ready (0: none).
	SupervisorPool *int `json:"supervisor_pool"`
	// ActiveQueues and IgnoreQueues (queue ids or names) select this
	// node's queues over the config collection's (--perl-config: 4.103's
	// activequeues and ignorequeues).
	ActiveQueues []string `json:"-"`
	IgnoreQueues []string `json:"-"`
	// QueueBalancePretend: 4.103's balance.pretend (--perl-config).
	QueueBalancePretend bool `json:"-"`
	// PerlPlugins are constructors run through 4.103's task_runner
	// (TaskRunner, with the --perl-config file and its gfs mode).
	PerlPlugins    []string `json:"-"`
	TaskRunner     string   `json:"-"`
	TaskRunnerGFS  string   `json:"-"`
	PerlConfigPath string   `json:"-"`
}

// duration reads "30s"-style strings in the config file.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration such as \"30s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	*d = duration(v)
	return err
}

const longHelp = `disbatchd is a Disbatch 4 execution node (DEN). It claims queued tasks from
the queues in MongoDB, runs each through the plugin named by its queue's
constructor, and records status, stdout and stderr in the task. Any number of
nodes (and Disbatch 4 Perl nodes) can share a database.

It follows MongoDB change streams, so a new task starts within milliseconds;
a 1 s tick is the fallback (and the only mechanism with --poll-only, or on a
standalone mongod, which has no change streams). Submitters should insert
tasks with write concern majority: change streams only see majority-committed
writes.

Settings come from flags, then the environment, then --config FILE (JSON with
the keys mongo_uri, database, node, maxthreads, label, enable_plugins,
plugins, plugin_timeout, grace, tick, orphan_after, heartbeat, fence_after,
dead_after, pre_images_idle, poll_only, no_projector, output_threshold, log_format, log_level,
metrics_addr, queue_balance, no_supervise, state_dir, supervisor_pool,
claim_running, claim_linger, claim_batch, wakeup_listeners), then
the defaults.

--metrics-addr ADDR (env DISBATCH_METRICS_ADDR; off unless given) serves
Prometheus metrics at /metrics, /healthz (200 while the process runs) and
/readyz (200 once the node has started). A bare port (9464 or :9464) listens
on 127.0.0.1 only: give 0.0.0.0:9464 to expose it.

Every node stands for election as the counter projector, which keeps the
queues' count_todo, count_total, count_running and count_failed exact from the
change stream; one wins (a lease in the disbatch_leases collection) and another
takes over within about 10 s if it dies. A poll-only node does not stand.

From the database's config collection the node reads the document with its
--label (or, without one, the one marked active: true): activequeues (run only
these queues, by id or name) and ignorequeues (run all but these). Queues may
also carry nodes_pin / nodes_ignore lists of node names (pin wins). The
operator may set maxthreads on the node's document in the nodes collection;
the node honours it within a second and never overwrites it.

Plugins: Disbatch::Plugin::Demo is always available. exec (parameters.command
and parameters.args, no shell) and shell (bash -c parameters.command) run
arbitrary commands, so they are off unless --enable-plugin names them.
--plugin NAME=PATH maps a constructor to an executable that reads the task as
JSON on stdin and answers {"status": N, "stdout": "...", "stderr": "..."}.

Dead nodes and fencing: the node writes its heartbeat (--heartbeat, 1 s) with
the server's clock. A node whose heartbeat is older than --dead-after (30 s)
is declared dead by one live node: its claimed tasks go back to the queue,
its running tasks become orphaned (-6), and its document shows dead: true. A
node that cannot get a heartbeat acknowledged for --fence-after (10 s) fences
itself: it stops claiming and kills its running tasks (they fail), so that
nothing it runs can overlap a re-run elsewhere; it rejoins when MongoDB
answers. --dead-after must exceed --fence-after by at least 2 s.

"disbatch node drain NAME" asks a node to stop claiming and exit (status 0)
once its running tasks finish; "disbatch node list" shows every node.

Writes that change a task's owner or status use write concern majority, so
a failover cannot roll a claim back and let a second node run the task.
TLS and authentication are set in the URI (e.g. ?tls=true&authSource=admin);
the password is never printed.

Go's garbage collector runs at GOGC=200 unless GOGC is set: a node's live
heap is small (about 1.5 MB), so Go's minimum heap decides when it collects
(4 MB at GOGC=100, 8 MB at 200); collecting about 2.5 times less often cut
the node's own CPU per task by 14-28%, for about 4 MiB more memory.

SIGTERM or SIGINT stops claiming at once, hands back claimed tasks, lets
running tasks finish within --grace, then leaves supervised tasks (exec,
shell, --plugin; see --supervise) running for the next start and kills the
others (Demo, Perl plugins), marking them failed. A second signal kills
every task, releases the leader's and projector's leases and exits at once
(within about 1.5 s). Supervised tasks survive the node: their
supervisors finish them if it stays away, and kill them (fence) when no
heartbeat of the node was acknowledged for --fence-after, before other nodes
may recover them (docs/restarts.md).`

func run(ctx context.Context, args []string, e env) int {
	var s settings
	var configFile, perlConfig, maxThreads string
	var external []string
	cmd := &cobra.Command{
		Use:   "disbatchd",
		Short: "A Disbatch 4 execution node",
		Long:  longHelp,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &cmdline.UsageError{Err: fmt.Errorf("disbatchd takes no arguments, got %q", args)}
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.SetOut(e.stdout)
	cmd.SetErr(e.stderr)
	cmd.SetArgs(args)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &cmdline.UsageError{Err: err} })
	cmdline.AddConnectionFlags(cmd, &s.MongoURI, &s.Database, e.getenv)
	f := cmd.Flags()
	host, _ := os.Hostname()
	defNode := host
	if v := e.getenv(EnvNode); v != "" {
		defNode = v
	}
	f.StringVar(&s.Node, "node", defNode, "this node's name in tasks and in the nodes collection (env "+EnvNode+"; default the hostname)")
	f.StringVar(&maxThreads, "maxthreads", "", "cap on this node's concurrent tasks across all queues (default: no cap of its own; the node document's maxthreads also applies)")
	f.StringVar(&s.Label, "label", "", "which config document to read from the config collection (default: the one marked active: true)")
	f.StringVar(&configFile, "config", "", "JSON file with settings (flags and environment win over it)")
	f.StringVar(&perlConfig, "perl-config", "", "Disbatch 4.103's config.json (e.g. /etc/disbatch/config.json): mongohost, database, auth.disbatchd, attributes.ssl, activequeues, ignorequeues, gfs; flags, the environment and --config win over it; unknown keys are reported")
	f.StringSliceVar(&s.EnablePlugins, "enable-plugin", nil, "enable a built-in plugin that runs commands: exec, shell (repeatable or comma-separated)")
	f.StringArrayVar(&external, "plugin", nil, "NAME=PATH: run tasks of constructor NAME with the executable PATH (JSON on stdin and stdout; repeatable)")
	f.Var((*durationFlag)(&s.PluginTimeout), "plugin-timeout", "fail a task whose plugin runs longer than this (0: no limit)")
	s.Grace = duration(node.DefaultGrace)
	f.Var((*durationFlag)(&s.Grace), "grace", "at shutdown, how long running tasks may finish before they are killed")
	s.Tick = duration(node.DefaultTick)
	f.Var((*durationFlag)(&s.Tick), "tick", "fallback interval at which every queue is tried")
	s.OrphanAfter = duration(reaper.DefaultOrphanAfter)
	f.Var((*durationFlag)(&s.OrphanAfter), "orphan-after", "a task claimed (status -1) longer than this is orphaned (-6)")
	s.Heartbeat = duration(node.DefaultHeartbeat)
	f.Var((*durationFlag)(&s.Heartbeat), "heartbeat", "how often the node document is written")
	s.FenceAfter = duration(node.DefaultFenceAfter)
	f.Var((*durationFlag)(&s.FenceAfter), "fence-after", "with no heartbeat acknowledged this long, stop claiming and kill running tasks until MongoDB answers")
	s.DeadAfter = duration(node.DefaultDeadAfter)
	f.Var((*durationFlag)(&s.DeadAfter), "dead-after", "declare a node dead whose heartbeat is this old (server clock): requeue its claimed tasks, orphan its running ones")
	s.PreImagesIdle = duration(projections.DefaultPreImagesIdle)
	f.Var((*durationFlag)(&s.PreImagesIdle), "pre-images-idle", "while this node's projector leads, task change-stream pre-images stay on this long after the last change another program made (Disbatch 4.103, a shell): every write of ours says itself where its task stood; a change with neither costs a recount of every queue")
	f.BoolVar(&s.PollOnly, "poll-only", false, "do not use change streams; find work by the tick alone")
	f.Func("claim-running", "claim tasks straight into running (status 0, seed 004's \"or 0 if immediately processed\"), saving each task's start write; a task so claimed whose node dies before its plugin starts (milliseconds) is orphaned, not requeued (default true; false: claim into -1, then start)", func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", v)
		}
		s.ClaimRunning = &b
		return nil
	})
	f.Lookup("claim-running").NoOptDefVal = "true"
	f.Func("claim-linger", "while the one queue this node serves has a backlog, a batched claim waits up to this long for a whole batch of free slots (or all the queue's slots, when fewer) (fewer, larger claims: more tasks a second from the same server); a freed slot idles at most this long a claim, and after a wait in vain claims stop waiting for a while; 0: claims never wait; at most "+claimer.MaxLinger.String()+" (default "+node.DefaultClaimLinger.String()+")", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("want a duration such as %q, got %q", node.DefaultClaimLinger.String(), v)
		}
		if d < 0 || d > claimer.MaxLinger {
			return fmt.Errorf("want 0 to %v, got %v", claimer.MaxLinger, d)
		}
		s.ClaimLinger = (*duration)(&d)
		return nil
	})
	f.IntVar(&s.ClaimBatch, "claim-batch", claimer.DefaultBatch, fmt.Sprintf("the most tasks one batched claim takes (1 to %d): a pass over a queue claims one task, then, while slots are free, the rest in batches of up to this many (and the queue's max_getwork), never more than the free slots; --claim-linger waits for this many free slots at most. Larger batches drain a backlog faster from the same server, at some cost in the counters' lag (docs/scaling.md); 1: one task per claim, no linger", store.MaxClaimBatch))
	f.IntVar(&s.WakeupListeners, "wakeup-listeners", claimer.SuggestedListeners, "how many of a queue's nodes follow a change stream for its new tasks (0: every node): a queue served by more keeps the streams of the ones ranked first by a hash of their names, passing over nodes whose last heartbeat says they have no stream (--poll-only) and ranking last those with no free slot for it, and the others find its tasks by their tick (of fifty nodes, one of the 47 others ticks about every 20 ms; of four, the one other every second) and as their own tasks end, and kill requests for their tasks by a sweep every 250 ms. Every stream reads every write the server makes, and every listener tries to claim every new task: fifty listening nodes cost the server fifty reads of each write and fifty claims a task")
	f.BoolVar(&s.Supervise, "supervise", true, "run exec, shell and --plugin tasks each under a supervisor process of its own, so that stopping, killing or upgrading disbatchd leaves them running and its next start (same --node, same --state-dir) adopts them; false: they run inside the node and die with it")
	f.StringVar(&s.StateDir, "state-dir", "", "where supervisors keep their sockets and results (default $STATE_DIRECTORY/NODE under systemd, else $TMPDIR/disbatchd-UID/NODE); must survive the node's restarts, and be this user's and writable by no one else (it is refused otherwise: its sockets carry each task's spec, connection string included)")
	f.Func("supervisor-pool", fmt.Sprintf("how many idle supervisors wait ready, forked ahead of need, so that a supervised task's start costs no fork (default %d, about 4 MiB each; 0: each is forked for its task)", supervisor.DefaultPool), func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a count of 0 or more, got %q", v)
		}
		s.SupervisorPool = &n
		return nil
	})
	f.StringSliceVar(&s.PerlPlugins, "perl-plugin", nil, "run the tasks of this constructor (a Disbatch::Plugin::* Perl plugin) through Disbatch 4.103's task_runner, which marks them running and writes their result as 4.103 does (repeatable or comma-separated; needs --perl-config, whose file task_runner reads, and --node equal to this host's name, which task_runner claims by)")
	f.StringVar(&s.TaskRunner, "task-runner", "", "4.103's task_runner for --perl-plugin (default: the --perl-config file's task_runner, else /usr/bin/task_runner)")
	f.BoolVar(&s.QueueBalance, "queue-balance", false, "when this node leads, apply Disbatch 4.103's QueueBalance document (collection balance: caps on groups of queues by day and time) through max_running, every 30 s (4.103's balance.enabled with --perl-config)")
	f.BoolVar(&s.NoProjector, "no-projector", false, "do not stand for election as the counter projector (count_todo/count_total/count_running/count_failed); another node must stand, or the counters stop")
	f.IntVar(&s.OutputThreshold, "output-threshold", store.DefaultOutputThreshold, "stdout+stderr bytes above which output goes to GridFS")
	f.StringVar(&s.LogFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&s.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.StringVar(&s.MetricsAddr, "metrics-addr", e.getenv(EnvMetricsAddr), "serve /metrics, /healthz and /readyz on HOST:PORT (env "+EnvMetricsAddr+"; off unless given; a bare port binds 127.0.0.1 only, give 0.0.0.0:9464 to expose it)")

	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		defaults := s
		if configFile != "" {
			if err := applyConfigFile(cmd, configFile, &s, &maxThreads, &external, e.getenv); err != nil {
				return &cmdline.UsageError{Err: err}
			}
		}
		var perlNotes []string
		if perlConfig != "" {
			var err error
			if perlNotes, err = applyPerlConfig(cmd, perlConfig, &s, defaults, e.getenv); err != nil {
				return &cmdline.UsageError{Err: err}
			}
		}
		if maxThreads != "" {
			n, err := parseMaxThreads(maxThreads)
			if err != nil {
				return &cmdline.UsageError{Err: err}
			}
			s.MaxThreads = n
		}
		for _, kv := range external {
			name, path, ok := strings.Cut(kv, "=")
			if !ok || name == "" || path == "" {
				return &cmdline.UsageError{Err: fmt.Errorf("--plugin %q: want NAME=PATH", kv)}
			}
			if s.Plugins == nil {
				s.Plugins = map[string]string{}
			}
			s.Plugins[name] = path
		}
		log, err := cmdline.NewLogger(e.stderr, s.LogFormat, s.LogLevel)
		if err != nil {
			return &cmdline.UsageError{Err: err}
		}
		for _, note := range perlNotes {
			log.Warn("--perl-config: "+note, "file", perlConfig)
		}
		reg, err := plugins(s)
		if err != nil {
			return &cmdline.UsageError{Err: err}
		}
		if s.Node == "" {
			return &cmdline.UsageError{Err: errors.New("no node name: give --node or " + EnvNode)}
		}
		if err := checkSettings(s); err != nil {
			return &cmdline.UsageError{Err: err}
		}
		if len(s.PerlPlugins) > 0 {
			if s.PerlConfigPath == "" {
				return &cmdline.UsageError{Err: errors.New("--perl-plugin needs --perl-config: task_runner reads that file")}
			}
			if host, _ := os.Hostname(); host != s.Node {
				return &cmdline.UsageError{Err: fmt.Errorf("--perl-plugin needs --node to be this host's name (%s): task_runner runs only tasks claimed by it", host)}
			}
		}
		if err := node.CheckTiming(time.Duration(s.Heartbeat), time.Duration(s.FenceAfter), time.Duration(s.DeadAfter)); err != nil {
			return &cmdline.UsageError{Err: fmt.Errorf("--heartbeat, --fence-after, --dead-after: %w", err)}
		}
		if _, err := metrics.ListenAddr(s.MetricsAddr); err != nil {
			return &cmdline.UsageError{Err: err}
		}
		gogc, fromEnv := gctarget.Apply(e.getenv)
		log.Info("garbage collector target", "node", s.Node, "gogc", gogc, "from_environment", fromEnv)
		return serve(ctx, s, reg, log, e.signals)
	}
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(e.stderr, "disbatchd:", err)
	code := cmdline.ExitCode(err)
	if code == cmdline.ExitUsage {
		fmt.Fprintln(e.stderr, "Run 'disbatchd --help' for usage.")
	}
	return code
}

// checkSettings rejects values that flags refuse but a config file could
// carry, before anything connects.
func checkSettings(s settings) error {
	for _, d := range []struct {
		name     string
		v        duration
		positive bool
	}{
		{"heartbeat", s.Heartbeat, true}, {"fence-after", s.FenceAfter, true}, {"dead-after", s.DeadAfter, true},
		{"tick", s.Tick, true}, {"grace", s.Grace, false}, {"orphan-after", s.OrphanAfter, true},
		{"plugin-timeout", s.PluginTimeout, false}, {"pre-images-idle", s.PreImagesIdle, false},
	} {
		if d.v < 0 || (d.positive && d.v == 0) {
			want := "must not be negative"
			if d.positive {
				want = "must be positive"
			}
			return fmt.Errorf("--%s (config key %s) %s, got %s", d.name, strings.ReplaceAll(d.name, "-", "_"), want, time.Duration(d.v))
		}
	}
	if s.ClaimLinger != nil && (*s.ClaimLinger < 0 || time.Duration(*s.ClaimLinger) > claimer.MaxLinger) {
		return fmt.Errorf("--claim-linger (config key claim_linger) must be 0 to %v, got %s", claimer.MaxLinger, time.Duration(*s.ClaimLinger))
	}
	if s.ClaimBatch < 1 || s.ClaimBatch > store.MaxClaimBatch {
		return fmt.Errorf("--claim-batch (config key claim_batch) must be 1 to %d, got %d", store.MaxClaimBatch, s.ClaimBatch)
	}
	if s.WakeupListeners < 0 {
		return fmt.Errorf("--wakeup-listeners (config key wakeup_listeners) must be 0 (every node) or more, got %d", s.WakeupListeners)
	}
	if s.OutputThreshold <= 0 && s.OutputThreshold != store.OutputAlways {
		return fmt.Errorf("--output-threshold (config key output_threshold) must be a positive number of bytes, got %d", s.OutputThreshold)
	}
	return nil
}

type durationFlag time.Duration

func (d *durationFlag) String() string { return time.Duration(*d).String() }
func (d *durationFlag) Type() string   { return "duration" }
func (d *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 {
		return errors.New("must not be negative")
	}
	*d = durationFlag(v)
	return nil
}

func parseMaxThreads(s string) (*int, error) {
	if s == "null" || s == "none" {
		return nil, nil
	}
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n < 0 || fmt.Sprint(n) != s {
		return nil, fmt.Errorf("--maxthreads must be a non-negative integer, got %q", s)
	}
	return &n, nil
}

// notInFile marks a count the config file does not give, where 0 is a
// setting of its own.
const notInFile = math.MinInt

// durationNotInFile marks a duration the config file does not give: "0s"
// is a setting of its own (no grace, no plugin timeout), or is refused.
const durationNotInFile = duration(math.MinInt64)

// applyConfigFile fills every setting not given by a flag or the
// environment from the JSON file.
func applyConfigFile(cmd *cobra.Command, path string, s *settings, maxThreads *string, external *[]string, getenv func(string) string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	// 0 in a file means every node (wakeup_listeners), or is refused
	// (claim_batch).
	file := settings{WakeupListeners: notInFile, ClaimBatch: notInFile}
	for _, d := range []*duration{&file.PluginTimeout, &file.Grace, &file.Tick, &file.OrphanAfter, &file.Heartbeat, &file.FenceAfter, &file.DeadAfter, &file.PreImagesIdle} {
		*d = durationNotInFile
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("--config %s: want one JSON object, found more after it", path)
	}
	unset := func(flag, envVar string) bool {
		return !cmd.Flags().Changed(flag) && (envVar == "" || getenv(envVar) == "")
	}
	if file.MongoURI != "" && unset("mongo-uri", cmdline.EnvMongoURI) {
		s.MongoURI = file.MongoURI
	}
	if file.Database != "" && unset("database", cmdline.EnvDatabase) {
		s.Database = file.Database
	}
	if file.Node != "" && unset("node", EnvNode) {
		s.Node = file.Node
	}
	if file.MaxThreads != nil && unset("maxthreads", "") {
		*maxThreads = fmt.Sprint(*file.MaxThreads)
	}
	if file.Label != "" && unset("label", "") {
		s.Label = file.Label
	}
	if len(file.EnablePlugins) > 0 && unset("enable-plugin", "") {
		s.EnablePlugins = file.EnablePlugins
	}
	for name, path := range file.Plugins {
		*external = append([]string{name + "=" + path}, *external...) // flags given later win
	}
	for flag, pair := range map[string][2]*duration{
		"plugin-timeout": {&s.PluginTimeout, &file.PluginTimeout}, "grace": {&s.Grace, &file.Grace},
		"tick": {&s.Tick, &file.Tick}, "orphan-after": {&s.OrphanAfter, &file.OrphanAfter},
		"heartbeat": {&s.Heartbeat, &file.Heartbeat}, "fence-after": {&s.FenceAfter, &file.FenceAfter},
		"dead-after": {&s.DeadAfter, &file.DeadAfter}, "pre-images-idle": {&s.PreImagesIdle, &file.PreImagesIdle},
	} {
		if *pair[1] != durationNotInFile && unset(flag, "") {
			*pair[0] = *pair[1]
		}
	}
	if file.ClaimRunning != nil && unset("claim-running", "") {
		s.ClaimRunning = file.ClaimRunning
	}
	if file.ClaimLinger != nil && unset("claim-linger", "") {
		s.ClaimLinger = file.ClaimLinger
	}
	if file.ClaimBatch != notInFile && unset("claim-batch", "") {
		s.ClaimBatch = file.ClaimBatch
	}
	if file.WakeupListeners != notInFile && unset("wakeup-listeners", "") {
		s.WakeupListeners = file.WakeupListeners
	}
	if file.PollOnly && unset("poll-only", "") {
		s.PollOnly = true
	}
	if file.NoProjector && unset("no-projector", "") {
		s.NoProjector = true
	}
	if file.OutputThreshold != 0 && unset("output-threshold", "") {
		s.OutputThreshold = file.OutputThreshold
	}
	if file.LogFormat != "" && unset("log-format", "") {
		s.LogFormat = file.LogFormat
	}
	if file.LogLevel != "" && unset("log-level", "") {
		s.LogLevel = file.LogLevel
	}
	if file.MetricsAddr != "" && unset("metrics-addr", EnvMetricsAddr) {
		s.MetricsAddr = file.MetricsAddr
	}
	if file.QueueBalance && unset("queue-balance", "") {
		s.QueueBalance = true
	}
	if file.NoSupervise && unset("supervise", "") {
		s.Supervise = false
	}
	if file.StateDir != "" && unset("state-dir", "") {
		s.StateDir = file.StateDir
	}
	if file.SupervisorPool != nil && unset("supervisor-pool", "") {
		s.SupervisorPool = file.SupervisorPool
	}
	return nil
}

// plugins builds the registry: Demo always; exec and shell only when
// enabled; external executables as configured.
func plugins(s settings) (*plugin.Registry, error) {
	reg := plugin.NewRegistry()
	reg.Register(plugin.DemoConstructor, plugin.Demo())
	for _, name := range s.PerlPlugins {
		reg.Register(strings.TrimSpace(name), plugin.TaskRunner{Path: s.TaskRunner, Config: s.PerlConfigPath, GFS: s.TaskRunnerGFS})
	}
	for _, name := range s.EnablePlugins {
		switch strings.TrimSpace(name) {
		case plugin.ExecConstructor:
			reg.Register(plugin.ExecConstructor, plugin.Exec())
		case plugin.ShellConstructor:
			reg.Register(plugin.ShellConstructor, plugin.Shell())
		default:
			return nil, fmt.Errorf("--enable-plugin %q: the built-in plugins that can be enabled are exec and shell", name)
		}
	}
	for name, path := range s.Plugins {
		st, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("plugin %s: %w", name, err)
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("plugin %s: %s is not an executable file", name, path)
		}
		reg.Register(name, plugin.External(path))
	}
	return reg, nil
}

// serve connects (retrying), runs the node until a signal, and stops it.
func serve(ctx context.Context, s settings, reg *plugin.Registry, log *slog.Logger, signals <-chan os.Signal) error {
	// The node adds its name to its own log lines; disbatchd's lines say it
	// here.
	dlog := log.With("node", s.Node)
	shutdownTracing, err := tracing.Setup(ctx, "disbatchd")
	if err != nil {
		return fmt.Errorf("tracing is configured (OTEL_* environment) but cannot start: %w", err)
	}
	if tracing.Enabled() {
		dlog.Info("tracing task lifecycles with OpenTelemetry (OTEL_* environment)")
	}
	defer func() {
		tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer tcancel()
		if err := shutdownTracing(tctx); err != nil {
			dlog.Warn("flush traces", "error", err)
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-signals:
			cancel() // a signal during start-up aborts it
		case <-ctx.Done():
		}
	}()
	obs := metrics.New() // /healthz answers while MongoDB does not; /readyz once started
	msrv, err := metrics.Serve(s.MetricsAddr, obs, dlog)
	if err != nil {
		return err
	}
	defer func() { _ = msrv.Stop() }()
	conn, err := cmdline.Connect(ctx, store.ConnectParams{
		URI: s.MongoURI, Database: s.Database, Options: store.Options{OutputThreshold: s.OutputThreshold}, Retry: true, Logger: dlog,
	})
	if err != nil {
		if ctx.Err() != nil {
			dlog.Info("signal received before MongoDB answered: exiting")
			return nil // stopped by a signal, as when it comes while starting
		}
		return err
	}
	dlog.Info("connected to MongoDB", "uri", store.RedactURI(s.MongoURI), "database", s.Database, "replica_set", conn.ReplicaSet)
	exitAtOnce := false
	defer func() {
		if !exitAtOnce {
			conn.Close()
		}
	}()
	if conn.ReplicaSet == "" && !s.PollOnly {
		dlog.Warn("this mongod is not a replica set, so it has no change streams: polling every tick instead (start mongod with --replSet for millisecond pickup)")
		s.PollOnly = true
	}
	// Demo writes its reports (collection reports) as 4.103's does.
	if p, ok := reg.Lookup(plugin.DemoConstructor); ok {
		if d, ok := p.(*plugin.DemoPlugin); ok {
			d.SetReports(conn.Store)
		}
	}
	var launcher *supervisor.Launcher
	if s.Supervise {
		if launcher, err = supervisorLauncher(s, os.Getenv); err != nil {
			return err
		}
		dlog.Info("supervised plugins: exec, shell and --plugin tasks survive this node's restarts", "state_dir", launcher.Dir, "supervisor", strings.Join(launcher.Command, " "))
	}
	n, err := node.New(node.Config{
		Name: s.Node, Store: conn.Store, Plugins: reg, MaxThreads: s.MaxThreads, Label: s.Label, PollOnly: s.PollOnly,
		ActiveQueues: s.ActiveQueues, IgnoreQueues: s.IgnoreQueues, QueueBalance: s.QueueBalance, QueueBalancePretend: s.QueueBalancePretend,
		Tick: time.Duration(s.Tick), Grace: grace(time.Duration(s.Grace)), PluginTimeout: time.Duration(s.PluginTimeout),
		OrphanAfter: time.Duration(s.OrphanAfter), NoProjector: s.NoProjector || s.PollOnly, Logger: log,
		Heartbeat: time.Duration(s.Heartbeat), FenceAfter: time.Duration(s.FenceAfter), DeadAfter: time.Duration(s.DeadAfter),
		Observer: obs, Supervise: launcher, ClaimRunning: s.ClaimRunning == nil || *s.ClaimRunning, ClaimLinger: claimLinger(s.ClaimLinger), ClaimBatch: s.ClaimBatch, WakeupListeners: s.WakeupListeners, PreImagesIdle: time.Duration(s.PreImagesIdle),
		SuperviseMongo: supervisor.Mongo{URI: s.MongoURI, Database: s.Database, OutputThreshold: s.OutputThreshold},
	})
	if err != nil {
		return err
	}
	obs.Attach(n)
	if err := n.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped by a signal while starting
		}
		return err
	}
	obs.SetReady(true)
	select {
	case <-ctx.Done():
		dlog.Info("signal received: stopping (a second signal exits at once)", "grace", time.Duration(s.Grace))
	case <-n.Drained():
		dlog.Info("drained on request: exiting")
	}
	obs.SetReady(false)
	stopped := make(chan struct{})
	go func() {
		n.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
		return nil
	case <-signals:
		dlog.Warn("second signal: killing running tasks and exiting at once")
		n.Kill()
		// No graceful disconnect: it would wait (up to 5 s) for the
		// operations still in flight; the exit closes the sockets.
		exitAtOnce = true
		return errors.New("exited on a second signal before the node had stopped")
	}
}

// supervisorLauncher runs supervisors with this binary ("disbatchd
// supervise") in the node's state directory.
func supervisorLauncher(s settings, getenv func(string) string) (*supervisor.Launcher, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("--supervise needs this binary's path: %w", err)
	}
	dir := s.StateDir
	if dir == "" {
		base := getenv("STATE_DIRECTORY") // systemd's StateDirectory=
		if base == "" {
			base = filepath.Join(os.TempDir(), fmt.Sprintf("disbatchd-%d", os.Getuid()))
		}
		dir = filepath.Join(base, strings.NewReplacer("/", "_", "\x00", "_").Replace(s.Node))
	}
	// disbatch-supervisor beside this binary is the small one (no MongoDB
	// driver, about 5 MiB); without it, this binary supervises.
	command := []string{exe, "supervise"}
	if small := filepath.Join(filepath.Dir(exe), "disbatch-supervisor"); isExecutable(small) {
		command = []string{small}
	}
	pool := supervisor.DefaultPool
	if s.SupervisorPool != nil {
		pool = *s.SupervisorPool
	}
	if pool < 0 {
		return nil, &cmdline.UsageError{Err: fmt.Errorf("--supervisor-pool %d: want 0 or more", pool)}
	}
	l := &supervisor.Launcher{Dir: dir, Command: command, FinishCommand: []string{exe, "supervise-finish"}, Pool: pool}
	if err := l.Check(); err != nil {
		return nil, &cmdline.UsageError{Err: err}
	}
	return l, nil
}

// grace is --grace for the node: 0 means none (node.NoGrace), not the
// node's default.
func grace(d time.Duration) time.Duration {
	if d == 0 {
		return node.NoGrace
	}
	return d
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// claimLinger is the node's ClaimLinger for the setting: the default when
// not given, none for 0.
func claimLinger(d *duration) time.Duration {
	switch {
	case d == nil:
		return node.DefaultClaimLinger
	case *d == 0:
		return node.NoClaimLinger
	}
	return time.Duration(*d)
}
