package node

import (
	"context"
	"sync"
	"time"

	"github.com/disbatch-go/disbatch/store"
)

// heartbeat writes the node document every interval (seed 000) and reads
// the operator's maxthreads from it in the same round trip.
type heartbeat struct {
	n      *Node
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// beat writes once and applies the node-wide cap: the smaller of the
// node's own --maxthreads and the document's maxthreads.
func (h *heartbeat) beat(ctx context.Context) error {
	doc, err := h.n.cfg.Store.NodeUpsert(ctx, store.NodeUpsertParams{Node: h.n.cfg.Name, Queues: h.n.queues.stats(h.n.slots)})
	if err != nil {
		return err
	}
	limit := h.n.cfg.MaxThreads
	if doc.MaxThreads != nil && (limit == nil || *doc.MaxThreads < *limit) {
		limit = doc.MaxThreads
	}
	if h.n.slots.SetNodeMax(limit) {
		if limit == nil {
			h.n.log.Info("node maxthreads: no cap")
		} else {
			h.n.log.Info("node maxthreads", "maxthreads", *limit)
		}
		h.n.claimer.WakeAll() // a raised cap may allow more claims now
	}
	return nil
}

func (h *heartbeat) start(ctx context.Context) {
	ctx, h.cancel = context.WithCancel(context.WithoutCancel(ctx))
	h.wg.Add(1)
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
			bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := h.beat(bctx)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil && !failing:
				h.n.log.Warn("heartbeat failed", "error", err)
				failing = true
			case err == nil && failing:
				h.n.log.Info("heartbeat written again")
				failing = false
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
