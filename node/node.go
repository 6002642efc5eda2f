package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/admissions"
	"github.com/disbatch-go/disbatch/chain"
	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/continuous"
	"github.com/disbatch-go/disbatch/events"
	"github.com/disbatch-go/disbatch/graph"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/queuebalance"
	"github.com/disbatch-go/disbatch/reaper"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/supervisor"
	"github.com/disbatch-go/disbatch/timers"
)

// LeaderLease is the lease of the node's cluster-wide duties.
const LeaderLease = "leader"

// Node is one execution node: the parts below, started and stopped in
// order (see the package doc).
type Node struct {
	lifecycle.Base
	cfg   Config
	log   *slog.Logger
	clock clock.Clock

	claimer *claimer.Claimer     // claims, and counts what the node holds
	queues  *queueSet            // which queues the node serves
	runner  *runner              // runs claimed tasks
	live    *liveness            // heartbeat, fencing, drain, node maxthreads
	strays  *strays              // hands back claims whose answer was lost
	kills   *killRequests        // operators' kill requests
	reaper  *reaper.Reaper       // own leftovers; the leader's sweeps
	timers  *timers.Timers       // the leader's delayed and expiring tasks
	admits  *admissions.Sweeper  // the leader's max_running admissions
	contin  *continuous.Creator  // the leader's continuous queues
	chain   *chain.Sweeper       // the leader's then chaining left by crashes
	graph   *graph.Graph         // the leader's task graphs
	leader  *leadership.Elector  // the cluster-wide duties
	bus     *bus                 // change events to the claimer
	stream  *events.Stream       // nil when polling only
	proj    *projections.Service // nil without the projector
}

// New builds a node from a config; it validates it first.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	log := cfg.Logger.With("node", cfg.Name)
	// Its transactions run in sessions recorded under its name, which its
	// next run and the leader kill if it dies in one (store.ForNode).
	cfg.Store = cfg.Store.ForNode(cfg.Name)
	n := &Node{cfg: cfg, log: log, clock: cfg.Clock} // Validate set the default
	n.queues = &queueSet{node: cfg.Name, label: cfg.Label, store: cfg.Store, plugins: cfg.Plugins, log: log, live: cfg.FenceAfter,
		active: cfg.ActiveQueues, ignore: cfg.IgnoreQueues, clock: cfg.Clock}
	ccfg := claimer.Config{
		Node: cfg.Name, Store: cfg.Store, Tick: cfg.Tick, Batch: cfg.ClaimBatch, Linger: max(0, cfg.ClaimLinger), Listeners: cfg.WakeupListeners, Clock: cfg.Clock, Logger: log,
		Refresh: n.queues.refresh, Passed: cfg.passed,
	}
	if cfg.ClaimRunning {
		ccfg.StartAtClaim = func(q claimer.Queue) bool {
			p, _ := cfg.Plugins.Lookup(q.Constructor)
			_, writesItsStart := p.(plugin.ResultWriter)
			return !writesItsStart
		}
	}
	if !cfg.PollOnly {
		n.bus = newBus(log)
		ccfg.Events = n.bus
		n.stream = events.New(events.Config{Store: cfg.Store, Publisher: n.bus, Name: "node:" + cfg.Name, Clock: cfg.Clock, Logger: log})
		ccfg.Quiet = n.stream.Quiet
	}
	// The runner gives its tasks' slots back to the claimer that took them.
	n.runner = newRunner(runnerConfig{
		Name: cfg.Name, Store: cfg.Store, Plugins: cfg.Plugins, PluginTimeout: cfg.PluginTimeout, Observer: cfg.Observer, beforeStart: cfg.beforeStart,
		HasWork:   func(q bson.ObjectID) { n.claimer.HasWork(q) },
		Supervise: cfg.Supervise, SuperviseMongo: cfg.SuperviseMongo, FenceAfter: cfg.FenceAfter, DeadAfter: cfg.DeadAfter,
		aliveAt: func() time.Time { return n.live.lastAcked() },
	}, func(q bson.ObjectID) { n.claimer.Finished(q) }, cfg.Clock, log)
	ccfg.Dispatch, ccfg.Malformed = n.runner.dispatch, n.runner.malformed
	n.claimer = claimer.New(ccfg)
	n.live = newLiveness(livenessConfig{
		Name: cfg.Name, Store: cfg.Store, MaxThreads: cfg.MaxThreads, WakeupStream: !cfg.PollOnly,
		Heartbeat: cfg.Heartbeat, FenceAfter: cfg.FenceAfter, DeadAfter: cfg.DeadAfter, beatFault: cfg.beatFault, beaten: cfg.beaten,
	}, (*nodeTarget)(n), cfg.Clock, log)
	n.kills = &killRequests{node: cfg.Name, store: cfg.Store, kill: n.runner.kill, tick: cfg.Tick,
		clock: n.clock, log: log.With("component", "kills"), handled: cfg.killHandled}
	if n.bus != nil {
		n.kills.events, n.kills.quiet, n.kills.holding = n.bus, n.stream.IsQuiet, n.runner.holdsAny
	}
	n.strays = &strays{node: cfg.Name, store: cfg.Store, holds: n.runner.keeps, claimRunning: cfg.ClaimRunning, fenced: n.live.isFenced, clock: n.clock, log: log}
	n.reaper = reaper.New(reaper.Config{
		Node: cfg.Name, Store: cfg.Store, OrphanAfter: cfg.OrphanAfter, DeadAfter: cfg.DeadAfter, Clock: cfg.Clock, Logger: log,
		MayJudge: n.live.mayJudge, Reaped: cfg.reaped,
	})
	// The leader's lease lasts fence-after: a node silent that long fences
	// itself, and by then it has stepped back as leader too.
	n.timers = timers.New(timers.Config{Store: cfg.Store, Tick: cfg.Tick, Clock: cfg.Clock, Logger: log,
		Released: func(k int64) { cfg.Observer.TaskControlled("", ControlReleased, int(k)) },
		Expired: func(q bson.ObjectID, k int64) {
			cfg.Observer.TaskControlled(n.queueName(q), ControlExpiredWaiting, int(k))
		},
	})
	n.graph = graph.New(graph.Config{Store: cfg.Store, Clock: cfg.Clock, Logger: log})
	nets := cfg.Tick
	if cfg.safetyNets > 0 {
		nets = cfg.safetyNets
	}
	n.admits = admissions.New(admissions.Config{Store: cfg.Store, Tick: nets, Clock: cfg.Clock, Logger: log})
	n.contin = continuous.New(continuous.Config{Store: cfg.Store, Tick: cfg.Tick, Clock: cfg.Clock, Logger: log})
	n.chain = chain.New(chain.Config{Store: cfg.Store, Tick: nets, Clock: cfg.Clock, Logger: log})
	following := []streamDuty{func(ctx context.Context, term leadership.Term, src batchSource) error {
		return n.timers.Lead(ctx, term, src)
	}}
	if !cfg.noGraphDuty {
		following = append(following, func(ctx context.Context, term leadership.Term, src batchSource) error {
			return n.graph.Lead(ctx, term, src)
		})
	}
	var rd *ride
	if !cfg.NoProjector {
		rd = newRide()
	}
	duties := []leadership.Duty{n.reaper.Lead, sharedStream(cfg.Store, log, rd, following...), n.admits.Lead, n.contin.Lead, n.chain.Lead}
	if cfg.QueueBalance {
		duties = append(duties, queuebalance.New(queuebalance.Config{Store: cfg.Store, Pretend: cfg.QueueBalancePretend, Clock: cfg.Clock, Logger: log}).Lead)
	}
	n.leader = leadership.New(leadership.Config{Lease: LeaderLease, Owner: cfg.Name, Store: cfg.Store, TTL: cfg.FenceAfter, Clock: cfg.Clock, Logger: log},
		duties...)
	if !cfg.NoProjector {
		// The projector stands for its lease on the leader's node first
		// (Yield), whose leader duties then follow the projector's
		// stream (Rider) instead of one of their own.
		n.proj = projections.New(projections.Config{Node: cfg.Name, Store: cfg.Store, PreImagesIdle: cfg.PreImagesIdle, LagWindow: cfg.ProjectorLagWindow, Clock: cfg.Clock, Logger: log,
			Rider: rd, Yield: func() bool { return n.leader.Status().Elsewhere }, First: n.leaderTried})
	}
	return n, nil
}

// leaderTried returns once the leader's elector has made its first try
// for its lease (it starts after the projector's), or after 5 s, or when
// ctx ends: the projector's first try then knows whether to yield. (Real
// time: a bound on a start-up, not a schedule.)
func (n *Node) leaderTried(ctx context.Context) {
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-n.leader.Tried():
	case <-t.C:
	case <-ctx.Done():
	}
}

// Start brings the node up (see the package doc for the order) and returns
// once it is claiming. The ctx bounds the start-up only.
func (n *Node) Start(ctx context.Context) error {
	return n.Base.Start(ctx, func(ctx context.Context, run *lifecycle.Run) error {
		var stopping time.Time // when Stop began; the last cleanup says how long it took
		run.Cleanup(func() {
			if !stopping.IsZero() {
				n.log.Info("node stopped", "took", n.clock.Since(stopping).Round(time.Millisecond))
			}
		})
		n.cfg.Store.OpenSessions()
		run.Cleanup(func() { n.cfg.Store.EndSessions(context.WithoutCancel(ctx)) })
		// A transaction the previous run was killed in holds its locks
		// until the server's transaction lifetime ends: end it first (an
		// index build waits for it, and its tasks are among those
		// OrphanOwn writes).
		if k, err := n.cfg.Store.NodeSessionsKillForget(ctx, n.cfg.Name); err != nil {
			n.log.Warn("killing the previous run's transaction sessions failed; a transaction it left open ends at the server's transaction lifetime", "error", err)
		} else if k > 0 {
			n.log.Info("killed the previous run's transaction sessions", "sessions", k)
		}
		var uniq *store.UniquenessError
		if err := n.cfg.Store.IndexesEnsure(ctx); errors.As(err, &uniq) {
			// The node works without them (seed 000 allows duplicate
			// names); say what it means for 4.103 nodes.
			n.log.Error("indexes left out", "error", err)
		} else if err != nil {
			return err
		}
		// Tasks the previous run left under supervisors still run: they
		// are adopted, not orphaned.
		var supervised map[bson.ObjectID]*supervisor.Handle
		if n.cfg.Supervise != nil {
			if err := n.cfg.Supervise.Check(); err != nil {
				return err
			}
			n.cfg.Supervise.Warm()
			run.Cleanup(n.cfg.Supervise.Close)
			supervised = n.runner.attachSupervisors()
		}
		except := make([]bson.ObjectID, 0, len(supervised))
		for id := range supervised {
			except = append(except, id)
		}
		if err := n.reaper.OrphanOwn(ctx, except...); err != nil {
			return err
		}
		if n.stream != nil {
			n.bus.open()
			run.Cleanup(func() { _ = n.bus.close() })
			if err := n.stream.Start(ctx); err != nil {
				return err
			}
			run.Cleanup(n.stream.Stop)
		}
		if n.proj != nil {
			if err := n.proj.Start(ctx); err != nil {
				return err
			}
			run.Cleanup(n.proj.Stop)
		}
		qs, err := n.queues.refresh(ctx)
		if err != nil {
			return fmt.Errorf("read queues: %w", err)
		}
		n.runner.open()
		if err := n.live.Start(ctx); err != nil {
			return fmt.Errorf("first heartbeat: %w", err)
		}
		run.Cleanup(func() {
			n.live.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := n.live.last(ctx); err != nil {
				n.log.Warn("last heartbeat", "error", err)
			}
		})
		if err := n.runner.adopt(ctx, n.cfg.Store, supervised, qs, n.claimer.Adopt, n.cfg.Observer); err != nil {
			return err
		}
		for _, s := range []lifecycle.Service{n.kills, n.strays, n.leader} {
			if err := s.Start(ctx); err != nil {
				return err
			}
			run.Cleanup(s.Stop)
		}
		if err := n.claimer.Start(ctx); err != nil {
			return err
		}
		// Stop: no claim after this, claimed tasks handed back, running
		// ones given Grace to finish.
		run.Cleanup(func() {
			stopping = n.clock.Now()
			n.claimer.Stop()
			// No stray sweep from here on: draining, a supervised task is
			// detached (no longer held) while its supervisor runs it, and
			// a sweep would hand it back to the queue, to run twice.
			n.strays.Stop()
			n.runner.drain(n.cfg.Grace)
		})
		mode := "change streams"
		if n.cfg.PollOnly {
			mode = "poll only"
		}
		n.log.Info("node started", "wake_ups", mode, "tick", n.cfg.Tick, "claim_batch", n.claimer.Batch(), "plugins", n.cfg.Plugins.Names(),
			"heartbeat", n.cfg.Heartbeat, "fence_after", n.cfg.FenceAfter, "dead_after", n.cfg.DeadAfter)
		return nil
	})
}

// Kill kills the running tasks' plugins (whole process groups) at once,
// without waiting for the grace period, and stops the projector, whose
// cancelled transaction is then aborted instead of holding its locks on the
// server until the transaction lifetime limit, and the leader's duties:
// both release their leases, so that other nodes take them over at once
// rather than a lease's time to live later. It waits at most half a
// second longer than plugin.AbandonGrace, so that a plugin that ignores
// its context is still written failed (abandoned). It is for a second
// signal: the caller exits next.
func (n *Node) Kill() {
	n.runner.killAll(errors.New("node killed by a second signal"), false)
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		if n.proj != nil {
			wg.Go(n.proj.Stop)
		}
		wg.Go(n.leader.Stop)
		n.runner.wait(time.Hour)
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(plugin.AbandonGrace + 500*time.Millisecond):
	}
}

// KillTask kills one running task's plugin (its whole process group); the
// task finishes as failed with reason in its stderr. It reports whether the
// task's plugin was running on this node.
func (n *Node) KillTask(id bson.ObjectID, reason string) bool {
	return n.runner.kill(id, errors.New(reason))
}

// Drained is closed when the node has carried out an operator's drain
// request (disbatch node drain): it stopped claiming and every task it held
// has finished. The caller should Stop the node and exit.
func (n *Node) Drained() <-chan struct{} { return n.live.Drained() }

// Fenced reports whether the node has fenced itself (no heartbeat
// acknowledged for FenceAfter).
func (n *Node) Fenced() bool { return n.live.isFenced() }

// Draining reports whether the node is carrying out a drain request.
func (n *Node) Draining() bool { return n.live.isDraining() }

// Running returns how many tasks the node holds in queue q (claimed or
// running), or in all queues for the zero id.
func (n *Node) Running(q bson.ObjectID) int {
	if q.IsZero() {
		return n.claimer.Total()
	}
	return n.claimer.Running(q)
}

// Queues returns the queues as last read (for per-queue metrics); their
// counters are the projection's.
func (n *Node) Queues() []schema.Queue {
	n.queues.mu.Lock()
	defer n.queues.mu.Unlock()
	return slices.Clone(n.queues.all)
}

// ClaimerStats returns the claimer's counters.
func (n *Node) ClaimerStats() claimer.Stats { return n.claimer.Stats() }

// ProjectorStats returns the counter projector's statistics (zero when this
// node does not take part).
func (n *Node) ProjectorStats() projections.Stats {
	if n.proj == nil {
		return projections.Stats{}
	}
	return n.proj.Stats()
}

// StreamStats returns the change stream's counters (zero when polling).
func (n *Node) StreamStats() events.Stats {
	if n.stream == nil {
		return events.Stats{}
	}
	return n.stream.Stats()
}

// queueName is a queue's name as last read, or its id.
func (n *Node) queueName(id bson.ObjectID) string {
	n.queues.mu.Lock()
	defer n.queues.mu.Unlock()
	for _, q := range n.queues.all {
		if q.ID == id {
			return q.Name
		}
	}
	return id.Hex()
}

// LeaderStatus says whether this node leads the cluster-wide duties.
func (n *Node) LeaderStatus() leadership.Status { return n.leader.Status() }

// nodeTarget is the node as liveness sees it (livenessTarget): what
// fencing, rejoining, draining and the node-wide cap mean here.
type nodeTarget Node

func (t *nodeTarget) heartbeatQueues() ([]schema.NodeQueue, []string, []string) {
	return t.queues.stats(t.claimer.Running, t.claimer.Full)
}

func (t *nodeTarget) fence(silence time.Duration) {
	t.claimer.Pause(claimer.PauseFenced)
	t.runner.killAll(&controlKill{reason: schema.ReasonFenced, text: fmt.Sprintf("node fenced: no heartbeat acknowledged for %s", silence.Round(time.Millisecond))}, true)
}

func (t *nodeTarget) rejoin() {
	t.runner.unfence()
	t.claimer.Resume(claimer.PauseFenced)
	t.claimer.WakeAll()
}

func (t *nodeTarget) drain() { t.claimer.Pause(claimer.PauseDraining) }

func (t *nodeTarget) beatAcked(sent time.Time) { t.runner.alive(sent) }

func (t *nodeTarget) held() int { return t.claimer.Total() }

func (t *nodeTarget) leftBehind() int { return t.runner.leftBehind() }

func (t *nodeTarget) setMaxThreads(limit *int) {
	if !t.claimer.SetNodeMax(limit) {
		return
	}
	if limit == nil {
		t.log.Info("node maxthreads: no cap")
	} else {
		t.log.Info("node maxthreads", "maxthreads", *limit)
	}
	t.claimer.WakeAll() // a raised cap may allow more claims now
}
