package live

import (
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/store"
)

// params are the change stream parameters of a replay from req.
func (h *Hub) params(req request) store.StreamParams {
	return store.StreamParams{
		Profile: store.StreamTransitions, Name: "live-replay", MaxAwait: h.opts.MaxAwait, MaxBatch: h.maxBatch, Logger: h.log,
		From: store.Position{Token: req.from}, NoPreImages: !h.preImages.Load(),
	}
}

// cut is a point in the change history between two events: after every
// event of a cluster time before t, and after the first k events of
// cluster time t (a transaction's events share one).
type cut struct {
	t bson.Timestamp
	k int
}

// after reports whether it (an item the hub published) comes after the
// cut. Control items have no time: they always do.
func (c *cut) after(it *item) bool {
	return it.kind == kindControl || it.at.After(c.t) || (it.at.Equal(c.t) && it.idx >= c.k)
}

// replay feeds s from a change stream of its own, from the position it
// resumed from (the server replays exactly the events after it), until it
// can hand s over to the hub.
//
// Why the hand-over is exact. The replay and the hub follow the same
// profile, so they see the same events in the same order, each with its
// cluster time; the events of one cluster time (a transaction's) come
// together. After each batch the replay knows a cut of what it has
// queued: when its position's time T is later than its last event's, it
// has every event before T and none at or after it (the position is the
// server's high-water mark: nothing else matched up to there), cut (T, 0);
// when the position is its last event, at time T, and it saw where the
// events of time T began, it has the first k of them, cut (T, k). The hub
// counts the events of each cluster time likewise, and remembers (in its
// ring) every event it published since a floor. If the cut is at or after
// that floor, the hub, under its lock, queues what it published after the
// cut and feeds s from then on, skipping whatever it publishes later
// that is still before the cut (when it is behind the replay). Otherwise
// the replay goes on. Either way no event is queued twice or skipped.
func (h *Hub) replay(s *sub, rd *store.StreamReader, req request) {
	defer h.readers.Done()
	defer rd.Close()
	var (
		prev  = tokenTime(req.from, bson.Timestamp{}) // the position before the events of last
		last  bson.Timestamp                          // the cluster time of the last event read
		k     int                                     // how many events of time last were read
		clean bool                                    // all of them: their first came after prev
	)
	for {
		b, err := rd.Next(s.ctx)
		if err != nil {
			return // the client went, or the hub stops
		}
		var items []*item
		if b.Lost != "" {
			h.log.Info("live events: a client resumed from a position that is gone; it is told to re-read (event reset)", "reason", b.Lost)
			items = append(items, resetItem(encodeID(b.Token), "change history lost: "+b.Lost))
			h.resets.Add(1)
			prev, last, k, clean = tokenTime(b.Token, bson.Timestamp{}), bson.Timestamp{}, 0, false
		}
		for _, ev := range b.Events {
			if !last.IsZero() && ev.ClusterTime.Equal(last) {
				k++
			} else {
				before := prev
				if !last.IsZero() {
					before = last
				}
				clean = !before.IsZero() && before.Before(ev.ClusterTime)
				last, k = ev.ClusterTime, 1
			}
			if it := convert(ev, h.names, false); it != nil && s.filter.match(it) {
				items = append(items, it)
			}
		}
		if !s.offerWait(items, encodeID(b.Token)) {
			return
		}
		ref := last
		if ref.IsZero() {
			ref = prev
		}
		t, ok := store.TokenTime(b.Token)
		switch {
		case !ok || ref.IsZero():
		case t.After(ref):
			if h.handover(s, &cut{t: t}) {
				return
			}
		case t.Equal(last) && clean:
			if h.handover(s, &cut{t: t, k: k}) {
				return
			}
		}
	}
}

// handover hands s over to the hub at c, if the hub remembers every event
// it published after c and the client is not busy (the hub would drop
// it). It reports whether the hub feeds s now.
func (h *Hub) handover(s *sub, c *cut) bool {
	if s.queued() > s.max/4 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.all[s]; !ok || !h.running || !h.ring.ready || c.t.Before(h.ring.floor) {
		return false
	}
	backlog, fits := h.ring.afterCut(c, &s.filter, s.max/2)
	if !fits {
		return false
	}
	pos := h.pos
	if !h.posTime.After(c.t) {
		// The hub is behind the replay: its position too, until it
		// passes the cut; and what it publishes before the cut the
		// client has.
		pos, s.cut = "", c
	}
	if !s.offer(backlog, pos) {
		s.cut = nil
		return false
	}
	h.attach(s)
	return true
}
