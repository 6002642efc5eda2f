package node

import (
	"sync"

	"github.com/disbatch-go/disbatch/store"
)

// rideSlack is how many of the projector's batches wait for the leader's
// duties before the ride drops them and tells the leader it missed some.
const rideSlack = 64

// ride is the projector's stream as this node's leader duties follow it
// (projections.Rider): while the node's projector leads, its stream
// carries the leader's events too (store.StreamParams.Leader), and the
// leader's source reads them here instead of opening a stream of its
// own. Every stream makes the server filter every oplog entry again: one
// fewer cut mongod's CPU a task by a tenth in a drain (docs/scaling.md).
// The projector hands batches over without waiting; what the leader
// cannot take in time, or what a reopened stream may not continue, it
// hears as a Lost batch, on which its duties re-read the database.
type ride struct {
	mu      sync.Mutex
	on      bool // the projector's stream is up
	reading bool // a leader source takes the batches
	gap     string
	ch      chan store.StreamBatch
	off     chan struct{} // closed when the stream that is up ends
}

func newRide() *ride {
	return &ride{ch: make(chan store.StreamBatch, rideSlack), off: make(chan struct{})}
}

// Board: the projector's stream (re)starts.
func (r *ride) Board() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on {
		r.gap = "the projector's stream was reopened"
	} else {
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

// Ride offers a batch to the reader, if there is one, without waiting.
func (r *ride) Ride(b store.StreamBatch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.reading {
		return
	}
	if r.gap != "" {
		select {
		case r.ch <- store.StreamBatch{Lost: r.gap}:
			r.gap = ""
		default:
			return // still full: the gap grows
		}
	}
	select {
	case r.ch <- b:
	default:
		r.gap = "the leader's duties fell behind the projector's stream"
	}
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
	r.drainLocked()
	r.reading, r.gap = true, ""
	return r.off, true
}

// leave ends the reader's turn: batches are dropped again.
func (r *ride) leave() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drainLocked()
	r.reading, r.gap = false, ""
}

func (r *ride) drainLocked() {
	for {
		select {
		case <-r.ch:
		default:
			return
		}
	}
}
