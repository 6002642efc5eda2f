package schema

import (
	"fmt"
	"math"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Sort is a queue's claim order.
type Sort string

// The sort orders of seed 000 (on the tasks' _id), and this project's
// SortPriority (seed 001's "picking work units": the highest task priority
// first, then the oldest; Disbatch 4.103 nodes use their default
// order). The empty Sort means SortDefault.
const (
	SortFIFO     Sort = "fifo"
	SortLIFO     Sort = "lifo"
	SortDefault  Sort = "default"
	SortPriority Sort = "priority"
)

// SortNames names the orders a queue may set, for messages.
const SortNames = "fifo, lifo, priority or default"

// Valid reports whether s is one of the orders (or empty).
func (s Sort) Valid() bool {
	return s == "" || s == SortFIFO || s == SortLIFO || s == SortDefault || s == SortPriority
}

// Queue is a document of the queues collection.
//
// Field names (seed 000): name, constructor, maxthreads, sort, count_todo,
// count_total; nodes_pin and nodes_ignore (seed 004); count_running (seed
// 001's cluster-wide "pending", projected like count_todo); count_failed
// (the failed tasks, for the dashboard, projected likewise). The Disbatch
// 4.103 dialect writes plugin for constructor and threads for maxthreads;
// those are read when the seed-000 name is missing or null. Writers in this
// project set both names so that Perl nodes keep working.
type Queue struct {
	ID          bson.ObjectID
	Name        string
	Constructor string
	// MaxThreads is the per-node limit of concurrent tasks of this queue. nil
	// (null or absent) and 0 both run nothing, as in Disbatch.
	MaxThreads *int
	Sort       Sort
	// CountTodo, CountTotal, CountRunning and CountFailed are nil when null
	// or missing: the projector then creates them with a recount.
	// CountRunning is the queue's tasks in -1 (claimed) or 0 (running) on
	// any node; CountFailed its tasks in 2 (failed, for any reason).
	CountTodo    *int64
	CountTotal   *int64
	CountRunning *int64
	CountFailed  *int64
	NodesPin     []string
	NodesIgnore  []string
	// Control: timeout, retries and backoff, rerun_orphans.
	Control QueueControl
	// Sched: priority, weight, max_getwork, paused.
	Sched QueueSched

	// Warnings lists non-fatal oddities found while decoding.
	Warnings []string
	// Raw is the document as read.
	Raw bson.Raw
}

// Queue BSON field names.
const (
	QueueName        = "name"
	QueueConstructor = "constructor"
	QueuePlugin      = "plugin" // Disbatch 4.103 name of constructor
	QueueMaxThreads  = "maxthreads"
	QueueThreads     = "threads" // Disbatch 4.103 name of maxthreads
	QueueSort        = "sort"
	QueueCountTodo   = "count_todo"
	QueueCountTotal  = "count_total"
	// QueueCountRunning is the projected number of the queue's tasks in
	// -1 or 0, on any node.
	QueueCountRunning = "count_running"
	// QueueCountFailed is the projected number of the queue's tasks in 2
	// (failed, for any reason).
	QueueCountFailed = "count_failed"
	// QueueCountsApplied is how far in the counter projector's stream the
	// queue's counters go: {t: a clusterTime, token: the last change
	// event's resume token (_data), or "" for a recount's moment}.
	QueueCountsApplied = "counts_applied"
	QueueNodesPin      = "nodes_pin"
	QueueNodesIgnore   = "nodes_ignore"
)

// Counter is a queue's projected counter (count_todo, count_total,
// count_running, count_failed) as stored, when it is one: an int32 or an
// int64. Any other value (missing, null, a double, a decimal, a string)
// is not one yet: the projector adds only to integers, and a recount sets
// the rest; GET /queues counts such a queue's tasks instead.
func Counter(v bson.RawValue) (int64, bool) {
	switch v.Type {
	case bson.TypeInt32, bson.TypeInt64:
		return v.AsInt64(), true
	}
	return 0, false
}

// Count is a projected counter read as a count to show: a Counter that is
// not negative. A negative one (only an edit by hand makes one; the
// projector's recount repairs it) is no count: DecodeQueue reads it as
// unknown, and GET /queues counts the queue's tasks instead.
func Count(v bson.RawValue) (int64, bool) {
	n, ok := Counter(v)
	return n, ok && n >= 0
}

// DecodeQueue decodes a queues document.
func DecodeQueue(raw bson.Raw) (Queue, error) {
	r := newReader(CollQueues, raw)
	q := Queue{
		ID:           r.objectID(true, "_id"),
		Name:         r.str(true, QueueName),
		Constructor:  r.str(true, QueueConstructor, QueuePlugin),
		MaxThreads:   r.maxThreads(QueueMaxThreads, QueueThreads),
		Sort:         Sort(r.str(false, QueueSort)),
		CountTodo:    r.counter(QueueCountTodo),
		CountTotal:   r.counter(QueueCountTotal),
		CountRunning: r.counter(QueueCountRunning),
		CountFailed:  r.counter(QueueCountFailed),
		NodesPin:     r.strings(QueueNodesPin),
		NodesIgnore:  r.strings(QueueNodesIgnore),
		Raw:          raw,
	}
	q.Control = decodeQueueControl(r)
	q.Sched = decodeQueueSched(r)
	if r.err != nil {
		return Queue{}, r.err
	}
	if !q.Sort.Valid() {
		r.warn("unknown sort %q: using the default order", string(q.Sort))
	}
	if c, p := r.str(false, QueueConstructor), r.str(false, QueuePlugin); c != "" && p != "" && c != p {
		r.warn("constructor %q and plugin %q disagree: using constructor", c, p)
	}
	if r.err == nil {
		// On a capped queue threads is max_running's 4.103 name (a cap
		// across all nodes); otherwise maxthreads'.
		_, _, hasMax := r.lookup(QueueMaxRunning)
		if _, v, ok := r.lookup(QueueThreads); ok {
			t, err := asInt(v, true)
			switch {
			case err != nil:
			case q.Sched.Capped() && hasMax && int(t) != q.Sched.MaxRunning:
				r.warn("max_running %d and threads %d disagree (a Disbatch 4.103 tool changed threads?): these nodes cap the queue at %d, 4.103 nodes at %d (set both with `disbatch queue set %s max_running=N`)",
					q.Sched.MaxRunning, t, q.Sched.MaxRunning, t, q.Name)
			case !q.Sched.Capped() && q.MaxThreads != nil && int(t) != *q.MaxThreads:
				r.warn("maxthreads %d and threads %d disagree: using maxthreads (set both with `disbatch queue set`)", *q.MaxThreads, t)
			}
		}
	}
	r.err = nil // a warning's re-read is never fatal
	q.Warnings = r.warnings
	return q, nil
}

// MaxThreadsLimit is the largest maxthreads a queue or node document may
// hold: readers take it as a 32-bit integer.
const MaxThreadsLimit = math.MaxInt32

// Threads returns the per-node limit, with nil counted as 0.
func (q Queue) Threads() int {
	if q.MaxThreads == nil {
		return 0
	}
	return *q.MaxThreads
}

// String names the queue for logs and errors.
func (q Queue) String() string { return fmt.Sprintf("%s (%s)", q.Name, q.ID.Hex()) }
