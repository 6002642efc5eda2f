// Package chain is the leader's safety net for then chaining: a task that
// succeeds with an output on a queue with then is marked then_pending by
// its finish, and the node that ran it turns the output into tasks of the
// then queue at once (store.ThenCreate, exactly once by derived _ids).
// What a crash between the two left marked, the leader's sweep finishes,
// once a tick.
package chain

import (
	"context"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/store"
)

// Store is what the sweep reads and writes.
type Store interface {
	ThenPending(ctx context.Context, limit int) ([]bson.ObjectID, error)
	ThenCreate(ctx context.Context, id bson.ObjectID) (store.ThenResult, error)
}

// Config configures the sweep.
type Config struct {
	Store  Store
	Tick   time.Duration // default 1 s
	Clock  clock.Clock
	Logger *slog.Logger
}

// Sweeper is the duty; run Lead under a leadership.Elector.
type Sweeper struct {
	cfg Config
	leadership.Periodic
}

// New returns the duty.
func New(cfg Config) *Sweeper {
	return &Sweeper{cfg: cfg, Periodic: leadership.NewPeriodic(cfg.Tick, cfg.Clock, cfg.Logger, "chain")}
}

// batch bounds the tasks one sweep reads at a time.
const batch = 100

// Lead runs Sweep at once, then every tick, until the term ends.
func (c *Sweeper) Lead(ctx context.Context, term leadership.Term) error {
	return c.Duty(c.Sweep)(ctx, term)
}

// Sweep turns every pending output into tasks.
func (c *Sweeper) Sweep(ctx context.Context) {
	for ctx.Err() == nil {
		ids, err := c.cfg.Store.ThenPending(ctx, batch)
		if err != nil {
			if ctx.Err() == nil {
				c.Log.Warn("read tasks with then pending", "error", err)
			}
			return
		}
		for _, id := range ids {
			r, err := c.cfg.Store.ThenCreate(ctx, id)
			switch {
			case err != nil:
				if ctx.Err() == nil {
					c.Log.Warn("then: create tasks from an output", "task_id", id.Hex(), "error", err)
				}
				return
			case r.Problem != "":
				c.Log.Warn("then: an output could not become tasks", "task_id", id.Hex(), "problem", r.Problem)
			default:
				c.Log.Info("then: the sweep turned an output into tasks (its node had not yet, or could not)", "task_id", id.Hex(), "created", r.Created, "existed", r.Existed)
			}
		}
		if len(ids) < batch {
			return
		}
	}
}
