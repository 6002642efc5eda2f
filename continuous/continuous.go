// Package continuous is the leader's duty for continuous queues (seed
// 001): a queue with continuous: true gets one task (empty parameters,
// named by the Unix time) whenever it has no task held, queued, claimed or
// running and its interval has passed since the last one. The store makes
// each creation one transaction guarded by the queue's next_continuous, so
// there is exactly one task per interval across the cluster, whichever
// node leads and however often it tries; the duty looks once a tick.
package continuous

import (
	"context"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/store"
)

// Store is what the duty reads and writes.
type Store interface {
	QueueList(ctx context.Context) (store.QueueListResult, error)
	ContinuousCreate(ctx context.Context, queue bson.ObjectID, interval time.Duration, now time.Time) (bson.ObjectID, bool, error)
	// ServerNow is the server's clock, which judges when a queue is due:
	// the leader's may be ahead or behind it, and the next leader's
	// differently.
	ServerNow(ctx context.Context) (time.Time, error)
}

// Config configures the duty.
type Config struct {
	Store  Store
	Tick   time.Duration // default 1 s
	Clock  clock.Clock
	Logger *slog.Logger
}

// Creator is the duty; run Lead under a leadership.Elector.
type Creator struct {
	cfg Config
	leadership.Periodic
}

// New returns the duty.
func New(cfg Config) *Creator {
	return &Creator{cfg: cfg, Periodic: leadership.NewPeriodic(cfg.Tick, cfg.Clock, cfg.Logger, "continuous")}
}

// Lead runs Pass at once, then every tick, until the term ends.
func (c *Creator) Lead(ctx context.Context, term leadership.Term) error {
	return c.Duty(c.Pass)(ctx, term)
}

// Pass creates the task of every continuous queue that is due.
func (c *Creator) Pass(ctx context.Context) {
	res, err := c.cfg.Store.QueueList(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.Log.Warn("list queues", "error", err)
		}
		return
	}
	due := res.Queues[:0:0]
	for _, q := range res.Queues {
		if sc := q.Sched; sc.Continuous && !sc.Paused {
			due = append(due, q)
		}
	}
	if len(due) == 0 {
		return
	}
	now, err := c.cfg.Store.ServerNow(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.Log.Warn("read the server's clock", "error", err)
		}
		return
	}
	for _, q := range due {
		sc := q.Sched
		if !sc.NextContinuous.IsZero() && sc.NextContinuous.After(now) {
			continue
		}
		id, created, err := c.cfg.Store.ContinuousCreate(ctx, q.ID, sc.Interval, now)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				c.Log.Warn("create the task of a continuous queue", "queue", q.Name, "error", err)
			}
		case created:
			c.Log.Info("continuous queue: task created", "queue", q.Name, "task_id", id.Hex(), "next_in", sc.Interval)
		}
	}
}
