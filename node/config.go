package node

import (
	"context"
	"errors"
	"fmt"
	"go.mongodb.org/mongo-driver/v2/bson"
	"log/slog"
	"time"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/reaper"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/supervisor"
)

// Defaults.
const (
	DefaultTick       = time.Second
	DefaultHeartbeat  = time.Second
	DefaultGrace      = 30 * time.Second
	DefaultFenceAfter = 10 * time.Second
	DefaultDeadAfter  = reaper.DefaultDeadAfter
	// DefaultClaimLinger is the default Config.ClaimLinger.
	DefaultClaimLinger = time.Millisecond
	// NoClaimLinger is a ClaimLinger of none: claims never wait.
	NoClaimLinger time.Duration = -1
	// FenceMargin is the least time between a silent node fencing itself
	// and the other nodes declaring it dead: killing its plugins takes
	// milliseconds, and the rest covers a failover to a primary whose
	// clock differs (dead-after is judged by the primary's clock).
	FenceMargin = 2 * time.Second
	// NoGrace is a Grace of none: running tasks are killed (or, supervised,
	// left running) at once at shutdown.
	NoGrace time.Duration = -1
)

// Config configures a Node.
type Config struct {
	// Name is the node's name in tasks and in the nodes collection (seed 000
	// uses the hostname).
	Name    string
	Store   *store.Store
	Plugins *plugin.Registry
	// MaxThreads caps this node's concurrent tasks (nil: no cap of its own).
	// An operator's maxthreads on the node document caps it further.
	MaxThreads *int
	// Label selects the config document (see schema.Config).
	Label string
	// ActiveQueues and IgnoreQueues (queue ids or names), when either is
	// set, replace the config document's lists for this node: Disbatch
	// 4.103's per-node activequeues and ignorequeues (--perl-config).
	// QueueBalance runs Disbatch 4.103's QueueBalance on the elected
	// leader (package queuebalance): the balance document's caps applied
	// to its queues; QueueBalancePretend only logs them.
	QueueBalance        bool
	QueueBalancePretend bool
	ActiveQueues        []string
	IgnoreQueues        []string
	// PollOnly turns change streams off: the tick alone finds work.
	PollOnly bool
	// Tick is the claimer's fallback interval.
	Tick time.Duration
	// ClaimBatch is the most tasks one batched claim takes on a backlog
	// (default claimer.DefaultBatch; 1 claims one task at a time).
	ClaimBatch int
	// ClaimLinger is how long a batched claim on a busy node (the one
	// queue it serves backlogged) may wait for a whole batch of free slots,
	// or all the queue's slots when fewer (claimer.Config.Linger; 0:
	// DefaultClaimLinger, NoClaimLinger: none; at most
	// claimer.MaxLinger).
	ClaimLinger time.Duration
	// WakeupListeners, when positive, is how many of a queue's nodes keep
	// a wake-up stream for it (claimer.Config.Listeners; 0: every node;
	// disbatchd's default is claimer.SuggestedListeners). The nodes
	// ranked are those whose heartbeats say they serve the queue with a
	// stream, those without a free slot for it last (schema.NodeServes).
	WakeupListeners int
	// ClaimRunning claims tasks straight into running (seed 004's "status
	// 0 if immediately processed"): one write per task fewer (the start),
	// with its change event, pre-image and projection. The cost: a task
	// claimed so whose node dies before its plugin starts (a window of
	// milliseconds) is orphaned like a running one, not requeued; and a
	// claim whose answer is lost is handed back only after strayAge.
	// Queues of capped claims (max_running) and of plugins that write
	// their own start (4.103's task_runner) are claimed as before.
	ClaimRunning bool
	// Heartbeat is how often the node document is written.
	Heartbeat time.Duration
	// Grace is how long running tasks may finish at shutdown (0:
	// DefaultGrace; NoGrace: not at all).
	Grace time.Duration
	// PluginTimeout fails a task whose plugin runs longer (0: no limit).
	PluginTimeout time.Duration
	// OrphanAfter is the age of a claim the reaper orphans.
	OrphanAfter time.Duration
	// DeadAfter: a node whose heartbeat is older (by the server's clock) is
	// declared dead by a live node, which recovers its tasks.
	DeadAfter time.Duration
	// FenceAfter: a node none of whose heartbeats was acknowledged for this
	// long stops claiming and kills its running tasks, so that nothing it
	// runs overlaps a re-run elsewhere once it is declared dead. It must be
	// at least two heartbeats and at most DeadAfter - FenceMargin.
	FenceAfter time.Duration
	// Observer, when set, is told about every task's lifecycle (metrics).
	Observer Observer
	// Supervise, when set, runs the tasks of detachable plugins (exec,
	// shell, external executables: plugin.Detachable) each under a
	// supervisor process of its own (package supervisor): a node that
	// stops, crashes or is upgraded leaves them running, and its next start
	// with the same Name and state directory adopts them. Stopping then
	// detaches such tasks at the end of Grace instead of killing them.
	// SuperviseMongo is how a supervisor reaches MongoDB to write a finish
	// while its node is away. Nil: every plugin runs inside the node.
	Supervise      *supervisor.Launcher
	SuperviseMongo supervisor.Mongo
	// NoProjector keeps this node out of the election of the counter
	// projector (package projections); some node must run it.
	NoProjector bool
	// PreImagesIdle, when this node's projector leads, is how long task
	// pre-images stay on after another program's change (0:
	// projections.DefaultPreImagesIdle).
	PreImagesIdle time.Duration
	// ProjectorLagWindow is how many of the latest events' lags the
	// projector's stats summarise (0: projections.DefaultLagWindow).
	ProjectorLagWindow int
	Logger             *slog.Logger
	// Clock is the time source of the node's time-based logic (ticks,
	// heartbeats, fencing, leases); default the real clock.
	Clock clock.Clock

	// Test signals (nil in production).
	beforeStart func(schema.Task)
	beatFault   func(ctx context.Context) error // a heartbeat fails with this error when non-nil
	beaten      func()                          // a heartbeat was acknowledged
	passed      func()                          // the claimer ended a pass
	reaped      func(int64)                     // the leader swept (tasks recovered)
	killHandled func(bson.ObjectID)             // a kill request was carried out
	// safetyNets, when set, is the period of the leader's sweeps that
	// redo what a node does itself (admissions released, then outputs
	// chained; default Tick): tests set it long to see the node's own.
	safetyNets time.Duration
	// noGraphDuty leaves the leader's graph duty out: its change stream
	// would settle children as fast as the node that finished their
	// parent, so tests of the node's own settle need it gone.
	noGraphDuty bool
}

// Observer receives task lifecycle events, e.g. to count them. Its methods
// are called from the node's goroutines and must return quickly.
type Observer interface {
	// TaskClaimed: a task of queue was claimed by this node.
	TaskClaimed(queue string)
	// TaskStarted: the task is running (status 0); pickup is from its
	// ctime to now.
	TaskStarted(queue string, pickup time.Duration)
	// TaskFinished: the task's attempt ended with status after running
	// for run; retried: it was sent back for another attempt (a failure
	// with retries left), so the task has not finished.
	TaskFinished(queue string, status schema.Status, run time.Duration, retried bool)
	// TaskControlled: task control acted on n tasks of queue (action:
	// one of the Control* names).
	TaskControlled(queue, action string, n int)
}

type noObserver struct{}

func (noObserver) TaskClaimed(string)                                      {}
func (noObserver) TaskStarted(string, time.Duration)                       {}
func (noObserver) TaskFinished(string, schema.Status, time.Duration, bool) {}
func (noObserver) TaskControlled(string, string, int)                      {}

// Validate checks the config and fills defaults.
func (c *Config) Validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("node name is empty"))
	}
	if c.Store == nil {
		errs = append(errs, errors.New("no store"))
	}
	if c.Plugins == nil {
		errs = append(errs, errors.New("no plugin registry"))
	}
	if c.MaxThreads != nil && *c.MaxThreads < 0 {
		errs = append(errs, fmt.Errorf("maxthreads must be >= 0, got %d", *c.MaxThreads))
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"tick", &c.Tick, DefaultTick}, {"heartbeat", &c.Heartbeat, DefaultHeartbeat}, {"grace", &c.Grace, DefaultGrace},
		{"dead-after", &c.DeadAfter, DefaultDeadAfter}, {"fence-after", &c.FenceAfter, DefaultFenceAfter},
	} {
		if *d.v < 0 && (d.v != &c.Grace || *d.v != NoGrace) {
			errs = append(errs, fmt.Errorf("%s must not be negative", d.name))
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.FenceAfter > 0 && c.DeadAfter > 0 && c.Heartbeat > 0 {
		errs = append(errs, CheckTiming(c.Heartbeat, c.FenceAfter, c.DeadAfter))
	}
	switch {
	case c.ClaimLinger == 0:
		c.ClaimLinger = DefaultClaimLinger
	case c.ClaimLinger < 0 && c.ClaimLinger != NoClaimLinger:
		errs = append(errs, errors.New("claim linger must not be negative (NoClaimLinger turns it off)"))
	case c.ClaimLinger > claimer.MaxLinger:
		errs = append(errs, fmt.Errorf("claim linger must be at most %v, got %v", claimer.MaxLinger, c.ClaimLinger))
	}
	if c.ClaimBatch < 0 || c.ClaimBatch > store.MaxClaimBatch {
		errs = append(errs, fmt.Errorf("claim batch must be 0 (the default) to %d, got %d", store.MaxClaimBatch, c.ClaimBatch))
	}
	if c.WakeupListeners < 0 {
		errs = append(errs, fmt.Errorf("wake-up listeners must be 0 (every node) or more, got %d", c.WakeupListeners))
	}
	if c.PluginTimeout < 0 || c.OrphanAfter < 0 {
		errs = append(errs, errors.New("plugin timeout and orphan-after must not be negative"))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Observer == nil {
		c.Observer = noObserver{}
	}
	c.Clock = clock.Or(c.Clock)
	return errors.Join(errs...)
}

// CheckTiming checks that heartbeat, fence-after and dead-after work
// together: fence-after is at least two heartbeats (one late heartbeat must
// not fence a node), and dead-after exceeds fence-after by FenceMargin (a
// silent node has killed its tasks before another node recovers them).
func CheckTiming(heartbeat, fenceAfter, deadAfter time.Duration) error {
	var errs []error
	if fenceAfter < 2*heartbeat {
		errs = append(errs, fmt.Errorf("fence-after (%s) must be at least two heartbeats (%s), or one late heartbeat would fence the node", fenceAfter, 2*heartbeat))
	}
	if deadAfter-fenceAfter < FenceMargin {
		errs = append(errs, fmt.Errorf("dead-after (%s) must exceed fence-after (%s) by at least %s, so that a silent node has killed its tasks before another node recovers them", deadAfter, fenceAfter, FenceMargin))
	}
	return errors.Join(errs...)
}
