package node

import (
	"sync"

	"github.com/disbatch-go/disbatch/store"
)

// rideMost is how many events the ride keeps for a reader that is behind
// before it drops them and tells the reader it missed some.
const rideMost = 100_000

// ride is the projector's stream as this node's leader duties follow it
// (projections.Rider): while the node's projector leads, its stream
// carries the leader's events too (store.StreamParams.Leader), and the
// leader's source reads them here instead of opening a stream of its
// own. Every stream makes the server filter every oplog entry again: one
// fewer cut mongod's CPU a task by up to a tenth in a drain
// (docs/scaling.md). The projector hands batches over without waiting,
// only those with events the leader may keep (store.LeaderMatch with the
// ends); they queue for the reader, which a slow duty (a long graph
// sweep) may hold back. What a reopened stream may not continue, or what
// the reader fell too far behind to be kept, it hears as a Lost batch,
// on which its duties re-read the database.
type ride struct {
	mu      sync.Mutex
	on      bool // the projector's stream is up
	reading bool // a leader source takes the batches
	most    int  // rideMost
	queue   []store.StreamBatch
	queued  int           // events in queue
	ready   chan struct{} // a batch was queued (1 slot)
	off     chan struct{} // closed when the stream that is up ends
}

func newRide() *ride {
	return &ride{most: rideMost, ready: make(chan struct{}, 1), off: make(chan struct{})}
}

// Board: the projector's stream (re)starts; a reader hears a Lost before
// its batches.
func (r *ride) Board() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reading {
		r.pushLocked(store.StreamBatch{Lost: "the projector's stream was reopened"})
	}
	if !r.on {
		r.off = make(chan struct{})
	}
	r.on = true
}

// Alight: the projector's term ended.
func (r *ride) Alight() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on {
		close(r.off)
	}
	r.on = false
}

// Ride queues a batch for the reader, if there is one, without waiting.
func (r *ride) Ride(b store.StreamBatch) {
	if b.Lost == "" {
		b.Events = store.OnlyEvents(b.Events, func(ev store.ChangeEvent) bool { return store.LeaderMatch(ev, true) })
		if len(b.Events) == 0 {
			return
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.reading {
		return
	}
	if r.queued+len(b.Events) > r.most {
		// They re-read the database on the Lost: what was queued
		// adds nothing.
		r.queue, r.queued = nil, 0
		b = store.StreamBatch{Lost: "the leader's duties fell behind the projector's stream"}
	}
	r.pushLocked(b)
}

func (r *ride) pushLocked(b store.StreamBatch) {
	r.queue = append(r.queue, b)
	r.queued += len(b.Events)
	select {
	case r.ready <- struct{}{}:
	default:
	}
}

// take returns the batches queued, oldest first, and empties the queue.
func (r *ride) take() []store.StreamBatch {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queue
	r.queue, r.queued = nil, 0
	return q
}

// join starts a reader if the projector's stream is up: batches from now
// on are kept for it, and off is closed when that stream ends. The reader
// re-reads the database after joining (it starts with a Lost).
func (r *ride) join() (off <-chan struct{}, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on {
		return nil, false
	}
	r.clearLocked()
	r.reading = true
	return r.off, true
}

// leave ends the reader's turn: batches are dropped again.
func (r *ride) leave() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clearLocked()
	r.reading = false
}

func (r *ride) clearLocked() {
	r.queue, r.queued = nil, 0
	select {
	case <-r.ready:
	default:
	}
}
