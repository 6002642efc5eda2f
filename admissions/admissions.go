// Package admissions is the leader's duty that keeps max_running's
// admissions exact (docs/scheduling.md, "max_running: exact admission").
// A node releases the admissions of the tasks it ran; everything else —
// the tasks of a dead node settled by recovery, a cancel or a requeue by
// an operator, a task deleted, a task a Disbatch 4.103 node claimed
// without an admission, a queue whose cap was lifted — is put right by a
// sweep of every queue with a cap or with admissions, once a tick
// (default 1 s) while this node leads.
package admissions

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
	QueueList(ctx context.Context) (store.QueueListResult, error)
	AdmissionsSweep(ctx context.Context, queue bson.ObjectID, capped bool) (store.AdmissionsSweepResult, error)
}

// Config configures the duty.
type Config struct {
	Store Store
	Tick  time.Duration // default 1 s
	// Swept, when set, is told what a sweep of a queue changed.
	Swept  func(queue bson.ObjectID, r store.AdmissionsSweepResult)
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
	return &Sweeper{cfg: cfg, Periodic: leadership.NewPeriodic(cfg.Tick, cfg.Clock, cfg.Logger, "admissions")}
}

// Lead runs Sweep at once, then every tick, until the term ends.
func (a *Sweeper) Lead(ctx context.Context, term leadership.Term) error {
	return a.Duty(a.Sweep)(ctx, term)
}

// Sweep sweeps every queue with a cap or with admissions once.
func (a *Sweeper) Sweep(ctx context.Context) {
	res, err := a.cfg.Store.QueueList(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.Log.Warn("list queues", "error", err)
		}
		return
	}
	for _, q := range res.Queues {
		if !q.Sched.Capped() && q.Sched.Admitted == 0 {
			continue
		}
		r, err := a.cfg.Store.AdmissionsSweep(ctx, q.ID, q.Sched.Capped())
		if err != nil {
			if ctx.Err() == nil {
				a.Log.Warn("sweep admissions", "queue", q.Name, "error", err)
			}
			continue
		}
		if r.Drift != 0 {
			a.Log.Warn("admissions counted differ from the queue's admitted; repaired (a task holding one was deleted)",
				"queue", q.Name, "drift", r.Drift, "admitted", r.Admitted)
		}
		if r.Released+r.Adopted > 0 {
			a.Log.Info("admissions swept", "queue", q.Name, "released", r.Released, "adopted", r.Adopted, "admitted", r.Admitted)
		}
		if a.cfg.Swept != nil {
			a.cfg.Swept(q.ID, r)
		}
	}
}
