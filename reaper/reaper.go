package reaper

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/disbatch-go/disbatch/store"
)

// Store is what the reaper needs.
type Store interface {
	TaskOrphanNode(ctx context.Context, p store.TaskOrphanNodeParams) (int64, error)
	TaskOrphanStale(ctx context.Context, p store.TaskOrphanStaleParams) (int64, error)
}

// DefaultOrphanAfter is seed 000's recommendation.
const DefaultOrphanAfter = 5 * time.Minute

// Config configures a Reaper.
type Config struct {
	Node        string
	Store       Store
	OrphanAfter time.Duration // default DefaultOrphanAfter
	Every       time.Duration // default 1 s
	Now         func() time.Time
	Logger      *slog.Logger
	// Reaped, when set, is called after every sweep (a test signal).
	Reaped func(n int64)
}

// Reaper is the orphan service. Start it, Stop it.
type Reaper struct {
	cfg    Config
	log    *slog.Logger
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// New returns a reaper; nothing runs until Start.
func New(cfg Config) *Reaper {
	if cfg.OrphanAfter <= 0 {
		cfg.OrphanAfter = DefaultOrphanAfter
	}
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Reaper{cfg: cfg, log: cfg.Logger.With("component", "reaper", "node", cfg.Node)}
}

// Start orphans this node's leftovers from a previous run (synchronously:
// the node must not claim before), then sweeps stale claims periodically.
func (r *Reaper) Start(ctx context.Context) error {
	if r.cancel != nil {
		return nil
	}
	n, err := r.cfg.Store.TaskOrphanNode(ctx, store.TaskOrphanNodeParams{Node: r.cfg.Node})
	if err != nil {
		return fmt.Errorf("orphan this node's unfinished tasks from a previous run: %w", err)
	}
	if n > 0 {
		r.log.Warn("orphaned this node's unfinished tasks from a previous run", "tasks", n)
	}
	ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	r.wg.Add(1)
	go r.loop(ctx)
	return nil
}

// Stop ends the sweeps.
func (r *Reaper) Stop() {
	if r.cancel == nil {
		return
	}
	r.once.Do(func() {
		r.cancel()
		r.wg.Wait()
	})
}

func (r *Reaper) loop(ctx context.Context) {
	defer r.wg.Done()
	t := time.NewTicker(r.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.Sweep(ctx)
	}
}

// Sweep orphans stale claims once.
func (r *Reaper) Sweep(ctx context.Context) int64 {
	before := r.cfg.Now().Add(-r.cfg.OrphanAfter)
	n, err := r.cfg.Store.TaskOrphanStale(ctx, store.TaskOrphanStaleParams{ClaimedBefore: before})
	switch {
	case err != nil && ctx.Err() == nil:
		r.log.Warn("sweep stale claims", "error", err)
	case n > 0:
		r.log.Warn("orphaned stale claimed tasks", "tasks", n, "claimed_before", before)
	}
	if r.cfg.Reaped != nil {
		r.cfg.Reaped(n)
	}
	return n
}
