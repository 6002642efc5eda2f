package schema

import (
	"fmt"
	"math"
)

// QueueSched is what a queue says about its scheduling across queues (seed
// 001; docs/scheduling.md).
type QueueSched struct {
	// Priority: among the queues a node could claim from, only the highest
	// priority is tried (default 0).
	Priority float64
	// Weight: among equal priorities, the queue furthest below its share of
	// the running tasks goes first (default DefaultWeight; from nice when
	// weight is absent; negative: never scheduled).
	Weight float64
	// MaxGetwork bounds the tasks one claim takes (0: no bound).
	MaxGetwork int
	// Paused queues are not scheduled; their running tasks finish.
	Paused bool
}

// Queue scheduling field names.
const (
	QueuePriority   = "priority"
	QueueWeight     = "weight"
	QueueNice       = "nice" // seed 001: weight = 20 - nice when weight is absent
	QueueMaxGetwork = "max_getwork"
	QueuePaused     = "paused"
	QueueDisabled   = "disabled" // seed 001's name for paused at creation
)

// DefaultWeight is a queue's weight without weight or nice (seed 001).
const DefaultWeight = 20

// MaxGetworkLimit bounds max_getwork.
const MaxGetworkLimit = math.MaxInt32

func decodeQueueSched(r *reader) QueueSched {
	s := QueueSched{Weight: DefaultWeight}
	if p := r.number(QueuePriority); p != nil {
		s.Priority = *p
	}
	if w := r.number(QueueWeight); w != nil {
		s.Weight = *w
	} else if n := r.number(QueueNice); n != nil {
		s.Weight = DefaultWeight - *n
	}
	if n := r.count(QueueMaxGetwork); n != nil {
		if *n > MaxGetworkLimit {
			r.fail(QueueMaxGetwork, fmt.Errorf("%d is out of range: want 0 to %d", *n, MaxGetworkLimit))
		}
		s.MaxGetwork = int(*n)
	}
	s.Paused = r.flag(QueuePaused)
	if _, _, ok := r.lookup(QueuePaused); !ok {
		s.Paused = r.flag(QueueDisabled)
	}
	return s
}

// number reads a finite number (integer or double) or null.
func (r *reader) number(name string) *float64 {
	_, v, ok := r.lookup(name)
	if !ok {
		return nil
	}
	f, isNum := v.AsFloat64OK()
	if !isNum || math.IsNaN(f) || math.IsInf(f, 0) {
		r.fail(name, wantGot("a number", v))
		return nil
	}
	return &f
}
