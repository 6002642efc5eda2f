// Package graph is the leader's duty that moves task graphs (seed 002):
// when a task ends, its children held awaiting their parents are queued
// (every parent succeeded), finish unrun with reason parent_failed (a
// parent ended otherwise), or, with on_parent_failure "run", are queued
// once every parent has ended. It follows the parents' finish events (on
// the leader's change stream, store.StreamLeader, told apart by
// store.EndsTask) and settles their children at once;
// a sweep of every waiting child at the start of each term, every Every
// (a minute by default) and whenever the stream lost its position catches
// what a crash or a missed event left behind. The rules themselves are
// the store's (store.TaskGraphSettle); docs/scheduling.md, "Task graphs",
// has the design.
package graph

import (
	"context"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/store"
)

// Store is what the graph duty reads and writes.
type Store interface {
	TaskGraphSettle(ctx context.Context, p store.TaskGraphSettleParams) (store.TaskGraphResult, error)
	TaskGraphSweep(ctx context.Context) (store.TaskGraphResult, error)
}

// DefaultEvery is the period of the sweep.
const DefaultEvery = time.Minute

// Config configures the graph duty.
type Config struct {
	Store Store
	// Every is the sweep's period (default DefaultEvery).
	Every time.Duration
	// Settled, when set, is told what every sweep did, and every settle
	// that changed something.
	Settled func(res store.TaskGraphResult, sweep bool)
	Clock   clock.Clock
	Logger  *slog.Logger
}

// Source is the leader's change stream (store.StreamLeader), opened
// before Lead is called; the duty reads it from one goroutine.
type Source interface {
	Next(ctx context.Context) (store.StreamBatch, error)
}

// Graph is the duty; run Lead under a leadership.Elector.
type Graph struct {
	cfg   Config
	clock clock.Clock
	log   *slog.Logger
}

// New returns the duty.
func New(cfg Config) *Graph {
	if cfg.Every <= 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Graph{cfg: cfg, clock: clock.Or(cfg.Clock), log: cfg.Logger.With("component", "graph")}
}

// Lead settles task graphs until the term ends: the children of the
// tasks src hears end, as they end, and every waiting child at once and
// every Every. src is opened before the first sweep, so a parent that
// ends after the sweep read its children is heard. Settles and sweeps may
// overlap: every write of the store's is guarded.
func (g *Graph) Lead(ctx context.Context, term leadership.Term, src Source) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.listen(ctx, src)
	}()
	defer func() { <-done }()
	g.log.Info("leading: settling task graphs as parents end", "sweep_every", g.cfg.Every)
	return leadership.Every(g.clock, g.cfg.Every, g.sweep)(ctx, term)
}

// listen settles the children of the tasks the stream hears end, and
// sweeps when the stream lost its position, until ctx ends.
func (g *Graph) listen(ctx context.Context, src Source) {
	for {
		sb, err := src.Next(ctx)
		if err != nil {
			return
		}
		why := sb.Lost
		var ended []bson.ObjectID
		for _, ev := range sb.Events {
			switch ev.Op {
			case "drop", "rename", "dropDatabase", "invalidate":
				why = "the stream saw a " + ev.Op // whatever was there is gone: look again
			default:
				if id, ok := ev.ID.ObjectIDOK(); ok && store.EndsTask(ev) {
					ended = append(ended, id)
				}
			}
		}
		switch {
		case why != "":
			g.log.Debug("the stream lost its place: sweeping every waiting child", "why", why)
			g.sweep(ctx)
		case len(ended) > 0:
			g.settle(ctx, ended)
		}
	}
}

// settle settles the waiting children of tasks that ended. A failure is
// logged and left to the sweep.
func (g *Graph) settle(ctx context.Context, ended []bson.ObjectID) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := g.cfg.Store.TaskGraphSettle(ctx, store.TaskGraphSettleParams{Parents: ended})
	if err != nil && ctx.Err() == nil {
		g.log.Warn("settle children of ended tasks; the sweep will retry", "tasks", len(ended), "error", err)
	}
	g.report(res, false)
}

// sweep settles every waiting child.
func (g *Graph) sweep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	res, err := g.cfg.Store.TaskGraphSweep(ctx)
	if err != nil && ctx.Err() == nil {
		g.log.Warn("sweep task graphs", "error", err)
	}
	g.report(res, true)
}

func (g *Graph) report(res store.TaskGraphResult, sweep bool) {
	if res.Queued == 0 && res.Held == 0 && res.Failed == 0 {
		if sweep && g.cfg.Settled != nil {
			g.cfg.Settled(res, sweep)
		}
		return
	}
	msg := "settled children of ended tasks"
	if sweep {
		msg = "sweep settled children whose parents had ended"
	}
	g.log.Info(msg, "queued", res.Queued, "held_for_not_before", res.Held, "parent_failed", res.Failed)
	if g.cfg.Settled != nil {
		g.cfg.Settled(res, sweep)
	}
}
