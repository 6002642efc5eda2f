package reaper

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/store"
)

// Store is what the reaper needs.
type Store interface {
	TaskOrphanNode(ctx context.Context, p store.TaskOrphanNodeParams) (int64, error)
	TaskOrphanStale(ctx context.Context, p store.TaskOrphanStaleParams) (int64, error)
	NodesDeadRecover(ctx context.Context, p store.NodesDeadRecoverParams) ([]store.DeadNode, error)
	LeaseSessionStart(ctx context.Context, ref store.LeaseRef) (*store.LeaseSession, error)
}

// DefaultOrphanAfter is seed 000's recommendation.
const DefaultOrphanAfter = 5 * time.Minute

// DefaultDeadAfter is how old a node's heartbeat must be for the node to be
// declared dead and its tasks recovered.
const DefaultDeadAfter = 30 * time.Second

// Config configures a Reaper.
type Config struct {
	Node        string
	Store       Store
	OrphanAfter time.Duration // default DefaultOrphanAfter
	// DeadAfter: default DefaultDeadAfter; negative turns dead-node
	// detection off.
	DeadAfter time.Duration
	Every     time.Duration // default 1 s
	// MayJudge, when set, says whether this node may declare others dead
	// now. The node answers no until its own heartbeats have been
	// acknowledged for DeadAfter without a break: right after an outage
	// that silenced everybody (a long failover, all mongods restarting),
	// the others' heartbeats are old because nobody could write, not
	// because they died, and each gets a moment to write again.
	MayJudge func() bool
	Clock    clock.Clock
	Logger   *slog.Logger
	// Reaped, when set, is called after every sweep with the tasks it
	// orphaned or requeued (a test signal).
	Reaped func(n int64)
}

// Reaper recovers tasks whose node went away: its own leftovers at
// start-up (OrphanOwn), and the cluster's stale claims and dead nodes on
// the leader (Lead, a leadership duty).
type Reaper struct {
	cfg   Config
	log   *slog.Logger
	clock clock.Clock
}

// New returns a reaper.
func New(cfg Config) *Reaper {
	if cfg.OrphanAfter <= 0 {
		cfg.OrphanAfter = DefaultOrphanAfter
	}
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.DeadAfter == 0 {
		cfg.DeadAfter = DefaultDeadAfter
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Reaper{cfg: cfg, log: cfg.Logger.With("component", "reaper"), clock: clock.Or(cfg.Clock)}
}

// OrphanOwn orphans this node's unfinished tasks from a previous run. The
// node calls it at start-up, before it claims anything.
func (r *Reaper) OrphanOwn(ctx context.Context, except ...bson.ObjectID) error {
	n, err := r.cfg.Store.TaskOrphanNode(ctx, store.TaskOrphanNodeParams{Node: r.cfg.Node, Except: except})
	if err != nil {
		return fmt.Errorf("orphan this node's unfinished tasks from a previous run: %w", err)
	}
	if n > 0 {
		r.log.Warn("orphaned this node's unfinished tasks from a previous run", "tasks", n)
	}
	return nil
}

// Lead is the reaper's leadership duty: it sweeps every Every until the
// term ends, so that one node of the cluster sweeps, not all. Its
// recoveries run in the term's session (store.LeaseSessionStart): a
// successor ends a recovery this node left open if it dies mid-way.
func (r *Reaper) Lead(ctx context.Context, term leadership.Term) error {
	sess, err := r.cfg.Store.LeaseSessionStart(ctx, term.Ref())
	if err != nil {
		return err
	}
	defer sess.End(context.Background())
	r.log.Info("leading: sweeping stale claims and dead nodes for the cluster", "every", r.cfg.Every)
	lifecycle.Every(ctx, r.clock, r.cfg.Every, func(ctx context.Context) { r.sweep(ctx, sess) })
	return nil
}

// Sweep orphans stale claims and recovers the tasks of dead nodes once; it
// returns how many tasks it orphaned or requeued. Both judge age by the
// server's clock, so the nodes' clocks do not matter.
func (r *Reaper) Sweep(ctx context.Context) int64 { return r.sweep(ctx, nil) }

func (r *Reaper) sweep(ctx context.Context, sess *store.LeaseSession) int64 {
	n, err := r.cfg.Store.TaskOrphanStale(ctx, store.TaskOrphanStaleParams{OlderThan: r.cfg.OrphanAfter})
	switch {
	case err != nil && ctx.Err() == nil:
		r.log.Warn("sweep stale claims", "error", err)
	case n > 0:
		r.log.Warn("orphaned stale claimed tasks", "tasks", n, "claimed_longer_than", r.cfg.OrphanAfter)
	}
	if r.cfg.DeadAfter > 0 && (r.cfg.MayJudge == nil || r.cfg.MayJudge()) {
		dead, err := r.cfg.Store.NodesDeadRecover(ctx, store.NodesDeadRecoverParams{DeadAfter: r.cfg.DeadAfter, By: r.cfg.Node, Session: sess})
		for _, d := range dead {
			if d.Foreign {
				r.log.Warn("a Disbatch 4.103 node's heartbeat is too old: its claimed tasks went back to the queue; its running tasks are left to its task_runners, which outlive their disbatchd",
					"perl_node", d.Node, "last_heartbeat", d.Since, "dead_after", r.cfg.DeadAfter, "requeued", d.Requeued, "left_running", d.LeftRunning)
				n += d.Requeued
				continue
			}
			r.log.Warn("declared a node dead: its heartbeat is too old; its claimed tasks went back to the queue and its running tasks were orphaned",
				"dead_node", d.Node, "last_heartbeat", d.Since, "dead_after", r.cfg.DeadAfter, "requeued", d.Requeued, "orphaned", d.Orphaned,
				"sessions_killed", d.Sessions)
			if d.SessionsErr != nil {
				r.log.Warn("killing the dead node's transaction sessions failed; a transaction it left open ends at the server's transaction lifetime",
					"dead_node", d.Node, "error", d.SessionsErr)
			}
			n += d.Requeued + d.Orphaned
		}
		if err != nil && ctx.Err() == nil {
			r.log.Warn("recover dead nodes", "error", err)
		}
	}
	if r.cfg.Reaped != nil {
		r.cfg.Reaped(n)
	}
	return n
}
