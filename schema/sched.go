package schema

import (
	"fmt"
	"math"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
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
	// BalanceHold: QueueBalance's cap for the queue is 0 for now (the
	// leader's queuebalance duty sets and clears it); like Paused.
	BalanceHold bool
	// MaxRunning is the cluster-wide cap on the queue's claimed and
	// running tasks (0: none): max_running, else the threads of a queue
	// Disbatch 4.103 made (threads without maxthreads), which 4.103 nodes
	// compare with the running count of all nodes. See docs/scheduling.md.
	MaxRunning int
	// Continuous queues get one task (empty parameters, named by the Unix
	// time) whenever they have none queued or running and Interval has
	// passed since the last one; NextContinuous is when that is.
	Continuous     bool
	Interval       time.Duration
	NextContinuous time.Time
	// Then names the queue that a task's output, when it succeeds with
	// one, becomes tasks of ("" for none).
	Then string
	// Config is the queue's config object, for its plugin (nil: none).
	Config bson.Raw
	// Admitted is the number of the queue's tasks holding an admission
	// under MaxRunning (the admitted field; see store's TaskClaimCapped).
	Admitted int64
}

// Capped reports whether the queue has a cluster-wide cap.
func (s QueueSched) Capped() bool { return s.MaxRunning > 0 }

// Queue scheduling field names.
const (
	QueuePriority    = "priority"
	QueueWeight      = "weight"
	QueueNice        = "nice" // seed 001: weight = 20 - nice when weight is absent
	QueueMaxGetwork  = "max_getwork"
	QueuePaused      = "paused"
	QueueBalanceHold = "balance_hold"
	QueueDisabled    = "disabled" // seed 001's name for paused at creation
	QueueMaxRunning  = "max_running"
	QueueContinuous  = "continuous"
	QueueThen        = "then"
	// TaskOutput is what a task's plugin answered as output (an object
	// or a list of objects), written when it succeeds.
	TaskOutput = "output"
	// TaskThenPending names the queue a succeeded task's output still has
	// to become tasks of; it is removed once they exist.
	TaskThenPending = "then_pending"
	// MaxOutputBytes is the most a task's output may take (BSON): it is
	// kept in the task's document, which MongoDB caps at 16 MiB with the
	// parameters, stdout and stderr beside it.
	MaxOutputBytes = 8 << 20
	// TaskThenError says why a task's output could not become tasks of
	// its queue's then queue.
	TaskThenError = "then_error"
	// TaskChainedFrom is the task whose output a task was made from.
	TaskChainedFrom = "chained_from"
	// TaskName names a continuous queue's task: the Unix time it was
	// created at, in seconds.
	TaskName      = "name"
	QueueInterval = "interval" // seconds
	// QueueNextContinuous is when a continuous queue's next task is due
	// (written by the leader with each task it creates).
	QueueNextContinuous = "next_continuous"
	// QueueConfig is an object handed to the plugin with each task of the
	// queue.
	QueueConfig = "config"
	// QueueAdmitted counts the queue's tasks that hold an admission
	// (TaskAdmitted); only transactions that add or remove admissions
	// change it.
	QueueAdmitted = "admitted"
	// TaskAdmitted is true on a task that holds one of its queue's
	// max_running admissions.
	TaskAdmitted = "admitted"
)

// MaxRunningLimit bounds max_running.
const MaxRunningLimit = math.MaxInt32

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
	if n := r.count(QueueMaxRunning); n != nil {
		if *n > MaxRunningLimit {
			r.fail(QueueMaxRunning, fmt.Errorf("%d is out of range: want 0 to %d", *n, MaxRunningLimit))
		}
		s.MaxRunning = int(*n)
	} else if _, _, hasMax := r.lookup(QueueMaxThreads); !hasMax {
		// A queue 4.103 made: its threads is a cap across all nodes.
		if t := r.maxThreads(QueueThreads); t != nil {
			s.MaxRunning = *t
		}
	}
	if n := r.count(QueueAdmitted); n != nil {
		s.Admitted = *n
	}
	if _, v, ok := r.lookup(QueueConfig); ok {
		if d, isDoc := v.DocumentOK(); isDoc {
			s.Config = d
		} else {
			r.fail(QueueConfig, wantGot("an object", v))
		}
	}
	s.Then = r.str(false, QueueThen)
	s.Continuous = r.flag(QueueContinuous)
	if n := r.number(QueueInterval); n != nil {
		if *n < 0 || *n > MaxSeconds {
			r.fail(QueueInterval, fmt.Errorf("%v is out of range: want 0 to %d seconds", *n, MaxSeconds))
		}
		s.Interval = time.Duration(*n * float64(time.Second))
	}
	if _, v, ok := r.lookup(QueueNextContinuous); ok {
		if at, isTime := v.TimeOK(); isTime {
			s.NextContinuous = at
		}
	}
	s.Paused = r.flag(QueuePaused)
	if _, _, ok := r.lookup(QueuePaused); !ok {
		s.Paused = r.flag(QueueDisabled)
	}
	s.BalanceHold = r.flag(QueueBalanceHold)
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

// OutputParams reads a task's output (TaskOutput) as the parameters of the
// tasks it becomes: an object is one, a list of objects one each;
// anything else is an error.
func OutputParams(v bson.RawValue) ([]bson.Raw, error) {
	if d, ok := v.DocumentOK(); ok {
		return []bson.Raw{d}, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, fmt.Errorf("output must be an object or a list of objects, got %s", v.Type)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, fmt.Errorf("output: %w", err)
	}
	ps := make([]bson.Raw, 0, len(vals))
	for i, e := range vals {
		d, ok := e.DocumentOK()
		if !ok {
			return nil, fmt.Errorf("output must be an object or a list of objects: item %d is %s", i, e.Type)
		}
		ps = append(ps, d)
	}
	return ps, nil
}
