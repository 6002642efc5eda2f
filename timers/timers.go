// Package timers is the leader's duty that keeps task time: it queues
// delayed tasks (held at -4 with a not_before) at their time, and finishes
// unrun the waiting tasks whose expires_at has passed. It sleeps until the
// earliest such time, read from two partial indexes (never a scan of all
// tasks), and the leader's change stream (store.StreamLeader: tasks given
// a not_before or an expires_at, among others) moves that time earlier
// when one comes sooner; a once-a-second pass is the safety net.
package timers

import (
	"context"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// Store is what the timers read and write.
type Store interface {
	TaskTimerNext(ctx context.Context) (time.Time, bool, error)
	TaskReleaseDue(ctx context.Context, p store.TaskTimersParams) (int64, error)
	TaskExpireDue(ctx context.Context, p store.TaskTimersParams) (map[bson.ObjectID]int64, error)
	// ServerNow is the server's clock: what is due is judged by it, as
	// dead nodes are, not by the leader's host.
	ServerNow(ctx context.Context) (time.Time, error)
}

// Config configures the timers.
type Config struct {
	Store Store
	Tick  time.Duration // the safety net's period; default 1 s
	// Released and Expired, when set, are told what each pass did: n
	// delayed tasks queued; n tasks of queue expired.
	Released func(n int64)
	Expired  func(queue bson.ObjectID, n int64)
	Clock    clock.Clock
	Logger   *slog.Logger
}

// Source is the leader's change stream (store.StreamLeader), opened
// before Lead is called; the timers read it from one goroutine.
type Source interface {
	Next(ctx context.Context) (store.StreamBatch, error)
}

// Timers is the duty; run Lead under a leadership.Elector.
type Timers struct {
	cfg   Config
	clock clock.Clock
	log   *slog.Logger
	// ahead is how far the server's clock was ahead of the leader's at
	// the last pass: the times in tasks are the server's, the waits the
	// leader's.
	ahead time.Duration
}

// New returns the timers.
func New(cfg Config) *Timers {
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Timers{cfg: cfg, clock: clock.Or(cfg.Clock), log: cfg.Logger.With("component", "timers")}
}

// Lead keeps task time until the term ends, hearing of new times on src
// (opened before, so that no time set after the first pass is missed).
func (t *Timers) Lead(ctx context.Context, _ leadership.Term, src Source) error {
	hints := make(chan time.Time, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.listen(ctx, src, hints)
	}()
	defer func() { <-done }()
	t.log.Info("leading: queueing delayed tasks and expiring waiting ones on time")
	next := t.pass(ctx)
	// The safety net's pass comes a Tick after the last, whatever the
	// hints: they only bring a pass sooner (a stream of hints, each
	// restarting a Tick's wait, would put it off for as long as they
	// come, and a hint an hour out after a failed pass by an hour).
	safety := t.clock.Now().Add(t.cfg.Tick)
	for {
		wake := safety
		if !next.IsZero() && next.Add(-t.ahead).Before(wake) {
			wake = next.Add(-t.ahead) // on the leader's clock
		}
		timer := t.clock.NewTimer(max(wake.Sub(t.clock.Now()), 0))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case h := <-hints:
			timer.Stop()
			if next.IsZero() || h.Before(next) {
				next = h
			}
			continue
		case <-timer.C():
		}
		next = t.pass(ctx)
		safety = t.clock.Now().Add(t.cfg.Tick)
	}
}

// listen turns the stream's events into hints: the earliest time a batch
// named (a graph's events name none).
func (t *Timers) listen(ctx context.Context, src Source, hints chan time.Time) {
	for {
		b, err := src.Next(ctx)
		if err != nil {
			return
		}
		var earliest time.Time
		if b.Lost != "" {
			earliest = time.Unix(0, 0) // unknown changes: look now (a time long past is now, whichever clock)
		}
		for _, ev := range b.Events {
			for _, doc := range []bson.Raw{ev.Doc, ev.Updated} {
				for _, f := range []string{schema.TaskNotBefore, schema.TaskExpiresAt} {
					if at, ok := doc.Lookup(f).TimeOK(); ok && (earliest.IsZero() || at.Before(earliest)) {
						earliest = at
					}
				}
			}
		}
		if earliest.IsZero() {
			continue
		}
		// Merge with a hint not yet taken: keep the earlier.
		select {
		case old := <-hints:
			if old.Before(earliest) {
				earliest = old
			}
		default:
		}
		select {
		case hints <- earliest:
		case <-ctx.Done():
			return
		}
	}
}

// pass expires and queues what is due, and returns the next time anything
// is (zero: nothing waits on a time).
func (t *Timers) pass(ctx context.Context) time.Time {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	now, err := t.cfg.Store.ServerNow(ctx)
	if err != nil {
		if ctx.Err() == nil {
			t.log.Warn("read the server's clock", "error", err)
		}
		return time.Time{} // the tick tries again
	}
	t.ahead = now.Sub(t.clock.Now())
	// After a failed write, wait for the tick rather than retry at once.
	failed := false
	expired, err := t.cfg.Store.TaskExpireDue(ctx, store.TaskTimersParams{Now: now})
	if err != nil && ctx.Err() == nil {
		t.log.Warn("expire tasks", "error", err)
		failed = true
	}
	for q, n := range expired {
		t.log.Info("expired waiting tasks: not started by their expires_at", "queue_id", q.Hex(), "tasks", n)
		if t.cfg.Expired != nil {
			t.cfg.Expired(q, n)
		}
	}
	released, err := t.cfg.Store.TaskReleaseDue(ctx, store.TaskTimersParams{Now: now})
	if err != nil && ctx.Err() == nil {
		t.log.Warn("queue delayed tasks", "error", err)
		failed = true
	}
	if released > 0 {
		t.log.Debug("queued delayed tasks", "tasks", released)
		if t.cfg.Released != nil {
			t.cfg.Released(released)
		}
	}
	next, ok, err := t.cfg.Store.TaskTimerNext(ctx)
	if err != nil {
		if ctx.Err() == nil {
			t.log.Warn("read the next task timer", "error", err)
		}
		return time.Time{}
	}
	if !ok || failed {
		return time.Time{}
	}
	return next
}
