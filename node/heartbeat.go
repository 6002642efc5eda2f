package node

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// heartbeat writes the node document every interval (seed 000), reads the
// operator's maxthreads and drain request from it in the same round trip,
// and fences the node when no heartbeat has been acknowledged for
// FenceAfter.
//
// The timing argument: the document's timestamp is the server's clock when
// the write was applied, which is after the node sent it. The node measures
// its silence on its own monotonic clock from when it sent the last
// acknowledged heartbeat, so it fences no later than FenceAfter (plus one
// watchdog period) after that timestamp, and its plugins are dead
// milliseconds later. The other nodes declare it dead only when the server's
// clock passes timestamp + DeadAfter, and DeadAfter - FenceAfter is at least
// FenceMargin. No clock of a node is compared with another's.
type heartbeat struct {
	n      *Node
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	lastOK time.Time // when the last acknowledged heartbeat was sent
	// servingSince is when the node last started serving: its first
	// heartbeat, or the one that ended a fence.
	servingSince time.Time
	badDoc       bool // the document could not be read back
}

// mayJudge reports whether the node has been serving for DeadAfter, long
// enough to call another node's old heartbeat a death rather than an
// outage everybody shared (see reaper.Config.MayJudge).
func (h *heartbeat) mayJudge() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.servingSince.IsZero() && time.Since(h.servingSince) >= h.n.cfg.DeadAfter
}

// first is the heartbeat at start-up: it clears an old drain request (it
// was for the previous run) and starts the silence clock.
func (h *heartbeat) first(ctx context.Context) error {
	return h.write(ctx, schema.NodeStateRunning, true)
}

// last is the heartbeat after the node stopped.
func (h *heartbeat) last(ctx context.Context) error {
	return h.write(ctx, schema.NodeStateStopped, false)
}

func (h *heartbeat) beat(ctx context.Context) error {
	state := schema.NodeStateRunning
	if h.n.Draining() {
		state = schema.NodeStateDraining
	}
	return h.write(ctx, state, false)
}

// write writes once and acts on what the document said: the node-wide cap
// (the smaller of the node's own --maxthreads and the document's), a drain
// request, and whether another node declared this one dead meanwhile.
func (h *heartbeat) write(ctx context.Context, state string, first bool) error {
	sent := time.Now()
	if f := h.n.cfg.beatFault; f != nil {
		if err := f(); err != nil {
			return err
		}
	}
	before, err := h.n.cfg.Store.NodeUpsert(ctx, store.NodeUpsertParams{
		Node: h.n.cfg.Name, Queues: h.n.queues.stats(h.n.slots), State: state, ClearDrain: first,
	})
	var de *schema.DecodeError
	if errors.As(err, &de) {
		// Written, but what an operator put on the document cannot be
		// read: the heartbeat counts (no fencing over a typo), its cap and
		// drain request do not.
		h.unreadable(err)
		before, err = schema.Node{Node: h.n.cfg.Name}, nil
	} else if err == nil {
		h.unreadable(nil)
	}
	if err != nil {
		return err
	}
	fenced := h.n.Fenced()
	h.mu.Lock()
	if sent.After(h.lastOK) {
		h.lastOK = sent
	}
	if first || fenced {
		h.servingSince = time.Now()
	}
	h.mu.Unlock()
	if before.Dead {
		h.n.log.Warn("this node had been declared dead (its heartbeat was too old): its claimed tasks went back to the queue and its running ones were orphaned; writes for them will fail and be logged",
			"declared_by", before.DeadBy, "declared_at", before.DeadAt)
	}
	h.n.unfence()
	limit := h.n.cfg.MaxThreads
	if before.MaxThreads != nil && (limit == nil || *before.MaxThreads < *limit) {
		limit = before.MaxThreads
	}
	if h.n.slots.SetNodeMax(limit) {
		if limit == nil {
			h.n.log.Info("node maxthreads: no cap")
		} else {
			h.n.log.Info("node maxthreads", "maxthreads", *limit)
		}
		h.n.claimer.WakeAll() // a raised cap may allow more claims now
	}
	if !first && state != schema.NodeStateStopped {
		h.n.drain(before.Drain)
	}
	return nil
}

// unreadable logs, once per change, whether the node document could be read
// back.
func (h *heartbeat) unreadable(err error) {
	h.mu.Lock()
	was := h.badDoc
	h.badDoc = err != nil
	h.mu.Unlock()
	switch {
	case err != nil && !was:
		h.n.log.Warn("heartbeat written, but the node document cannot be read back: its maxthreads and drain request are ignored until it is fixed", "error", err)
	case err == nil && was:
		h.n.log.Info("node document readable again")
	}
}

// silence is how long ago the last acknowledged heartbeat was sent.
func (h *heartbeat) silence() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Since(h.lastOK)
}

// timeout bounds one heartbeat write: long enough for a slow primary, short
// enough that the next attempt comes soon after MongoDB answers again.
func (h *heartbeat) timeout() time.Duration {
	return max(h.n.cfg.Heartbeat, min(5*time.Second, h.n.cfg.FenceAfter/2))
}

func (h *heartbeat) start(ctx context.Context) {
	ctx, h.cancel = context.WithCancel(context.WithoutCancel(ctx))
	h.wg.Add(2)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(h.n.cfg.Heartbeat)
		defer t.Stop()
		failing := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			bctx, cancel := context.WithTimeout(ctx, h.timeout())
			err := h.beat(bctx)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil && !failing:
				h.n.log.Warn("heartbeat failed", "error", err, "fence_after", h.n.cfg.FenceAfter)
				failing = true
			case err == nil && failing:
				h.n.log.Info("heartbeat written again")
				failing = false
			}
		}
	}()
	// Strays: claims the server applied but whose answer never reached
	// the node.
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(strayEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			h.n.releaseStrays(ctx)
		}
	}()
	// The watchdog runs apart from the writes, which may hang for their
	// whole timeout.
	go func() {
		defer h.wg.Done()
		period := min(100*time.Millisecond, h.n.cfg.FenceAfter/10)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if s := h.silence(); s > h.n.cfg.FenceAfter {
				h.n.fence(s)
			}
		}
	}()
}

func (h *heartbeat) stop() {
	if h.cancel != nil {
		h.cancel()
		h.wg.Wait()
	}
}
