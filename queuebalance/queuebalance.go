// Package queuebalance is the leader's QueueBalance duty: Disbatch 4.103's
// queuebalanced, which caps the running tasks of groups of queues by day of
// the week and time of day, enforced through the cluster-wide cap. It reads
// 4.103's balance document (max_tasks, queues, disabled; edited by GET and
// POST /balance and the dashboard), and every pass:
//
//   - with disabled in the future: writes status OK "QueueBalance disabled
//     until ..." and changes nothing; a disabled time that has passed is
//     cleared;
//   - a document it cannot use (no max_tasks, queues not a list of lists of
//     names, a bad key): writes status CRITICAL with why;
//   - else gives each listed queue its cap for now (Plan, from MaxTasks),
//     as max_running (and threads, which 4.103 nodes read; a cap of 0
//     holds the queue, since max_running 0 means no cap), and writes
//     status OK "QueueBalance is running".
//
// The status and its timestamp (Unix seconds) are what GET /monitoring
// reports, as for 4.103's queuebalanced (CRITICAL when the timestamp is
// over 60 s old). 4.103's own queuebalanced cannot run (its module does
// not load); it also wrote maxthreads, which 4.103 nodes do not read.
// Queued and running counts come from the projected counters.
package queuebalance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// DefaultPeriod is how often the duty runs: queuebalanced's 30 s.
const DefaultPeriod = 30 * time.Second

// Store is what the duty reads and writes.
type Store interface {
	BalanceGet(ctx context.Context) (bson.Raw, error)
	// BalanceCreate makes the balance document with fields unless there
	// is one.
	BalanceCreate(ctx context.Context, fields bson.D) error
	QueueList(ctx context.Context) (store.QueueListResult, error)
	QueueBalanceSet(ctx context.Context, id bson.ObjectID, cap int) error
	// TaskQueuedCount counts a queue's tasks that may run now (status
	// -2), up to limit.
	TaskQueuedCount(ctx context.Context, queue bson.ObjectID, limit int64) (int64, error)
	BalanceStatusSet(ctx context.Context, status, message string, now time.Time, clearDisabled bool) error
}

// Config configures the duty.
type Config struct {
	Store  Store
	Period time.Duration // default DefaultPeriod
	// Pretend computes and logs the caps without writing them (4.103's
	// balance.pretend).
	Pretend bool
	Clock   clock.Clock
	Logger  *slog.Logger
}

// Balancer is the duty; run Lead under a leadership.Elector.
type Balancer struct {
	cfg Config
	leadership.Periodic
	last map[string]int // the caps last applied, to log changes only
}

// New returns the duty.
func New(cfg Config) *Balancer {
	if cfg.Period <= 0 {
		cfg.Period = DefaultPeriod
	}
	return &Balancer{cfg: cfg, Periodic: leadership.NewPeriodic(cfg.Period, cfg.Clock, cfg.Logger, "queuebalance"), last: map[string]int{}}
}

// Lead runs Pass at once, then every period, until the term ends.
func (b *Balancer) Lead(ctx context.Context, term leadership.Term) error {
	return b.Duty(b.Pass)(ctx, term)
}

// doc is the balance document as the duty reads it.
type doc struct {
	MaxTasks map[string]any `bson:"max_tasks"`
	Queues   any            `bson:"queues"`
	Disabled any            `bson:"disabled"`
}

// queueState is what a pass knows of a queue.
type queueState struct {
	id      bson.ObjectID
	queued  int // status -2, counted (TaskQueuedCount)
	running int // projected: count_running
	cap     int // max_running now
	held    bool
	threads int64 // threads now; -1 when absent or not a number
}

// Pass balances once.
func (b *Balancer) Pass(ctx context.Context) {
	now := b.Clock.Now()
	raw, err := b.cfg.Store.BalanceGet(ctx)
	if err == nil && raw == nil && !b.cfg.Pretend {
		// None yet: 4.103's queuebalanced makes an empty one, where its
		// status goes (/monitoring reports it) and the web's editor finds
		// it; never over one an operator posts meanwhile.
		if err = b.cfg.Store.BalanceCreate(ctx, bson.D{{Key: "max_tasks", Value: bson.D{}}, {Key: "queues", Value: bson.A{}}}); err == nil {
			b.Log.Info("no balance document: made an empty one (max_tasks {}, queues [])")
			raw, err = b.cfg.Store.BalanceGet(ctx)
		}
	}
	if err != nil || raw == nil {
		if err != nil && ctx.Err() == nil {
			b.Log.Warn("read the balance document", "error", err)
		}
		return
	}
	var d doc
	if err := bson.Unmarshal(raw, &d); err != nil {
		b.critical(ctx, now, fmt.Errorf("the balance document: %w", err))
		return
	}
	clear := false
	if until, ok := number(d.Disabled); ok && until != 0 {
		if t := time.Unix(int64(until), 0); now.Before(t) {
			b.status(ctx, now, "OK", "QueueBalance disabled until "+t.Local().Format(time.ANSIC), false)
			return
		}
		clear = true
	}
	entries := map[string]int{}
	for k, v := range d.MaxTasks {
		n, ok := number(v)
		if !ok {
			b.critical(ctx, now, fmt.Errorf("max_tasks %q: %v is not a number", k, v))
			return
		}
		entries[k] = int(n)
	}
	names, err := groups(d.Queues)
	if err != nil {
		b.critical(ctx, now, err)
		return
	}
	if len(entries) == 0 && len(names) == 0 {
		// As 4.103's queuebalanced makes it: nothing to balance yet.
		b.status(ctx, now, "OK", "QueueBalance is running; the balance document lists no queues and no max_tasks", clear)
		return
	}
	max, err := MaxTasks(entries, now.Local())
	if err != nil {
		b.critical(ctx, now, err)
		return
	}
	res, err := b.cfg.Store.QueueList(ctx)
	if err != nil {
		if ctx.Err() == nil {
			b.Log.Warn("list queues", "error", err)
		}
		return
	}
	byName := map[string]queueState{}
	for _, q := range res.Queues {
		var running int64
		if q.CountRunning != nil {
			running = *q.CountRunning
		}
		threads, ok := q.Raw.Lookup(schema.QueueThreads).AsInt64OK()
		if !ok {
			threads = -1 // absent or not a number: never what a cap wrote
		}
		byName[q.Name] = queueState{id: q.ID, running: int(running), cap: q.Sched.MaxRunning, held: q.Sched.BalanceHold, threads: threads}
	}
	var gs [][]Queue
	for _, g := range names {
		var qs []Queue
		for _, n := range g {
			q, ok := byName[n]
			if !ok {
				b.Log.Warn("the balance document names a queue that does not exist", "queue", n)
				continue
			}
			// Counted up to max: the plan never gives a queue more.
			queued, err := b.cfg.Store.TaskQueuedCount(ctx, q.id, int64(max)+1)
			if err != nil {
				if ctx.Err() == nil {
					b.Log.Warn("count queued tasks", "queue", n, "error", err)
				}
				return
			}
			q.queued = int(queued)
			byName[n] = q
			qs = append(qs, Queue{Name: n, Queued: q.queued, Running: q.running})
		}
		gs = append(gs, qs)
	}
	plan := Plan(gs, max)
	for name, cap := range plan {
		q := byName[name]
		// threads is 4.103's nodes' cap: a 4.103 web or node may have
		// written it since (an update-queue, a plugin that failed to load).
		if q.threads == int64(cap) && ((cap > 0 && q.cap == cap && !q.held) || (cap == 0 && q.held)) {
			continue // already so
		}
		if b.cfg.Pretend {
			b.Log.Info("queue balance (pretend)", "queue", name, "cap", cap, "max_tasks", max)
			continue
		}
		if err := b.cfg.Store.QueueBalanceSet(ctx, q.id, cap); err != nil {
			if ctx.Err() == nil {
				b.Log.Warn("apply the balance cap", "queue", name, "cap", cap, "error", err)
			}
			return
		}
		b.Log.Info("queue balance", "queue", name, "cap", cap, "was", b.last[name], "max_tasks", max, "queued", q.queued, "running", q.running)
		b.last[name] = cap
	}
	b.status(ctx, now, "OK", "QueueBalance is running", clear)
}

func (b *Balancer) critical(ctx context.Context, now time.Time, err error) {
	b.Log.Error("QueueBalance cannot use the balance document", "error", err)
	b.status(ctx, now, "CRITICAL", "QueueBalance: "+err.Error(), false)
}

func (b *Balancer) status(ctx context.Context, now time.Time, status, message string, clear bool) {
	if b.cfg.Pretend {
		return
	}
	if err := b.cfg.Store.BalanceStatusSet(ctx, status, message, now, clear); err != nil && ctx.Err() == nil {
		b.Log.Warn("write the balance status", "error", err)
	}
}

// groups reads queues: a list of lists of queue names.
func groups(v any) ([][]string, error) {
	list, ok := v.(bson.A)
	if !ok {
		return nil, errors.New("queues: want a list of lists of queue names")
	}
	out := make([][]string, 0, len(list))
	for _, g := range list {
		names, ok := g.(bson.A)
		if !ok {
			return nil, errors.New("queues: want a list of lists of queue names")
		}
		var ns []string
		for _, n := range names {
			s, ok := n.(string)
			if !ok {
				return nil, fmt.Errorf("queues: %v is not a queue name", n)
			}
			ns = append(ns, s)
		}
		out = append(out, ns)
	}
	return out, nil
}

// number reads a number stored as any BSON number, or digits in a string.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case int32:
		return float64(x), true
	case int64:
		return float64(x), true
	case float64:
		return x, true
	case string:
		var f float64
		if _, err := fmt.Sscan(x, &f); err == nil {
			return f, true
		}
	}
	return 0, false
}
