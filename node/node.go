package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/events"
	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/reaper"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// Node is one execution node.
type Node struct {
	cfg     Config
	log     *slog.Logger
	slots   *claimer.Slots
	claimer *claimer.Claimer
	queues  *queueSet
	runner  *runner
	reaper  *reaper.Reaper
	beat    *heartbeat
	bus     *gochannel.GoChannel
	stream  *events.Stream
	proj    *projections.Service

	startOnce, stopOnce sync.Once
	started             bool

	drainOnce sync.Once
	drained   chan struct{} // closed when a drain request has been carried out
}

// New builds a node from a validated config.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.Name), slots: claimer.NewSlots(), drained: make(chan struct{})}
	n.queues = &queueSet{n: n}
	n.runner = newRunner(n)
	n.beat = &heartbeat{n: n}
	n.reaper = reaper.New(reaper.Config{
		Node: cfg.Name, Store: cfg.Store, OrphanAfter: cfg.OrphanAfter, DeadAfter: cfg.DeadAfter, Logger: cfg.Logger,
		MayJudge: n.beat.mayJudge,
	})
	ccfg := claimer.Config{
		Node: cfg.Name, Store: cfg.Store, Slots: n.slots, Tick: cfg.Tick, Batch: cfg.ClaimBatch, Logger: cfg.Logger,
		Refresh: n.queues.refresh, Dispatch: n.runner.dispatch, Malformed: n.runner.malformed,
	}
	if !cfg.PollOnly {
		n.bus = events.NewBus(cfg.Logger)
		ccfg.Events = n.bus
		n.stream = events.New(events.Config{DB: cfg.Store.Database(), Publisher: n.bus, Tokens: cfg.Store, Name: "node:" + cfg.Name, Logger: cfg.Logger})
	}
	n.claimer = claimer.New(ccfg)
	if !cfg.NoProjector {
		n.proj = projections.New(projections.Config{Node: cfg.Name, Store: cfg.Store, Logger: cfg.Logger})
	}
	return n, nil
}

// Start brings the node up (see the package doc for the order) and returns
// once it is claiming.
func (n *Node) Start(ctx context.Context) error {
	err := errors.New("node already started")
	n.startOnce.Do(func() { err = n.start(ctx) })
	return err
}

func (n *Node) start(ctx context.Context) error {
	if err := n.cfg.Store.IndexesEnsure(ctx); err != nil {
		return err
	}
	if err := n.reaper.Start(ctx); err != nil {
		return err
	}
	if n.stream != nil {
		if err := n.stream.Start(ctx); err != nil {
			n.reaper.Stop()
			return err
		}
	}
	if n.proj != nil {
		if err := n.proj.Start(ctx); err != nil {
			n.stopServices()
			return err
		}
	}
	if _, err := n.queues.refresh(ctx); err != nil {
		n.stopServices()
		return fmt.Errorf("read queues: %w", err)
	}
	if err := n.beat.first(ctx); err != nil {
		n.stopServices()
		return fmt.Errorf("first heartbeat: %w", err)
	}
	n.beat.start(ctx)
	if err := n.claimer.Start(ctx); err != nil {
		n.stopServices()
		return err
	}
	n.started = true
	mode := "change streams"
	if n.cfg.PollOnly {
		mode = "poll only"
	}
	n.log.Info("node started", "wake_ups", mode, "tick", n.cfg.Tick, "plugins", n.cfg.Plugins.Names(),
		"heartbeat", n.cfg.Heartbeat, "fence_after", n.cfg.FenceAfter, "dead_after", n.cfg.DeadAfter)
	return nil
}

// Stop shuts the node down (see the package doc) and returns when every
// task it held is finished, handed back or failed.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		if !n.started {
			return
		}
		start := time.Now()
		n.claimer.Stop()
		n.runner.drain(n.cfg.Grace)
		n.stopServices()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := n.beat.last(ctx); err != nil {
			n.log.Warn("last heartbeat", "error", err)
		}
		n.log.Info("node stopped", "took", time.Since(start).Round(time.Millisecond))
	})
}

func (n *Node) stopServices() {
	n.claimer.Stop()
	n.beat.stop()
	n.reaper.Stop()
	if n.proj != nil {
		n.proj.Stop()
	}
	if n.stream != nil {
		n.stream.Stop()
		_ = n.bus.Close()
	}
}

// Kill kills the running tasks' plugins (whole process groups) at once,
// without waiting for the grace period, and stops the projector, whose
// cancelled transaction is then aborted instead of holding its locks on the
// server until the transaction lifetime limit. It waits at most half a
// second. It is for a second signal: the caller exits next.
func (n *Node) Kill() {
	n.runner.killRunning(errors.New("node killed by a second signal"), false)
	done := make(chan struct{})
	go func() {
		if n.proj != nil {
			n.proj.Stop()
		}
		n.runner.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(500 * time.Millisecond):
	}
}

// Drained is closed when the node has carried out an operator's drain
// request (disbatch node drain): it stopped claiming and every task it held
// has finished. The caller should Stop the node and exit.
func (n *Node) Drained() <-chan struct{} { return n.drained }

// Fenced reports whether the node has fenced itself (no heartbeat
// acknowledged for FenceAfter).
func (n *Node) Fenced() bool { return n.slots.Paused(pauseFenced) }

// Draining reports whether the node is carrying out a drain request.
func (n *Node) Draining() bool { return n.slots.Paused(pauseDraining) }

// Reasons the node stops taking slots.
const (
	pauseFenced   = "fenced"
	pauseDraining = "draining"
)

// fence stops claiming and kills the running tasks: nothing this node runs
// may overlap a re-run elsewhere once the others declare it dead.
func (n *Node) fence(silence time.Duration) {
	if !n.slots.Pause(pauseFenced) {
		return
	}
	n.log.Error("fenced: no heartbeat acknowledged; stopped claiming and killing running tasks so that none can overlap a re-run elsewhere (the node rejoins when MongoDB answers)",
		"silent_for", silence.Round(time.Millisecond), "fence_after", n.cfg.FenceAfter, "dead_after", n.cfg.DeadAfter, "running", n.slots.Total())
	n.runner.killRunning(fmt.Errorf("node fenced: no heartbeat acknowledged for %s", silence.Round(time.Millisecond)), true)
}

// unfence rejoins after a heartbeat was acknowledged again.
func (n *Node) unfence() {
	if !n.runner.unfence() {
		return
	}
	n.slots.Resume(pauseFenced)
	n.log.Info("heartbeat acknowledged again: rejoining and claiming")
	n.claimer.WakeAll()
}

// drain carries out an operator's drain request, once.
func (n *Node) drain(requested bool) {
	if !requested {
		return
	}
	n.drainOnce.Do(func() {
		n.slots.Pause(pauseDraining)
		n.log.Info("drain requested: no more claims; exiting when the running tasks finish", "running", n.slots.Total())
		go func() {
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			for n.slots.Total() > 0 {
				<-t.C
			}
			n.log.Info("drained: every task this node held has finished")
			close(n.drained)
		}()
	})
}

// strayAge is how old a claim must be before the node may decide it never
// received it: older than any claim whose answer could still arrive.
const (
	strayAge   = claimer.ClaimTimeout + 5*time.Second
	strayEvery = 5 * time.Second
)

// releaseStrays hands back tasks claimed (-1) by this node that it never
// received: the server applied the claim, but its answer was lost (a
// failover interrupted it, the connection broke), so the claimer counted
// it as failed. Without this they would wait for the 5-minute orphan rule
// and then never run. They never started, so the queue gets them back.
func (n *Node) releaseStrays(ctx context.Context) {
	if n.Fenced() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ids, err := n.cfg.Store.TaskListClaimed(ctx, store.TaskListClaimedParams{Node: n.cfg.Name, ClaimedBefore: n.cfg.Now().Add(-strayAge), Limit: 1000})
	if err != nil {
		if ctx.Err() == nil {
			n.log.Debug("look for stray claims", "error", err)
		}
		return
	}
	for _, id := range ids {
		if n.runner.holds(id) {
			continue
		}
		err := n.cfg.Store.TaskRelease(ctx, store.TaskTransitionParams{ID: id, Node: n.cfg.Name})
		switch {
		case err == nil:
			n.log.Warn("handed back a task this node had claimed without knowing (the claim's answer was lost, e.g. in a failover)", "task_id", id.Hex())
		case errors.Is(err, store.ErrLostTask):
		default:
			n.log.Debug("hand back a stray claim", "task_id", id.Hex(), "error", err)
		}
	}
}

// Running returns how many tasks the node holds in queue q (claimed or
// running), or in all queues for the zero id.
func (n *Node) Running(q bson.ObjectID) int {
	if q.IsZero() {
		return n.slots.Total()
	}
	return n.slots.Running(q)
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
