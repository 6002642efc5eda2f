package schema

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Node BSON field names (seed 000).
const (
	NodeNode       = "node"
	NodeTimestamp  = "timestamp"
	NodeQueues     = "queues"
	NodeMaxThreads = "maxthreads"

	// Fields this project adds (other implementations ignore them).

	// NodeState is what the node says it is doing: NodeStateRunning,
	// NodeStateDraining or NodeStateStopped.
	NodeState = "state"
	// NodeDrain is set to true by an operator (disbatch node drain) to ask
	// the node to stop claiming and exit once its running tasks finish.
	NodeDrain = "drain"
	// NodeDead, NodeDeadAt and NodeDeadBy are set by the live node that
	// found this node's heartbeat older than its dead-after and recovered
	// its tasks; the node clears them when it writes a heartbeat again.
	NodeDead   = "dead"
	NodeDeadAt = "dead_at"
	NodeDeadBy = "dead_by"
	// NodeLeftTasks is set by the last heartbeat of a node that stops
	// leaving tasks running in its name (supervised ones it left running,
	// results it could not write): how many. Dead-node recovery judges
	// such a stopped node as it does a silent one, so that its tasks are
	// recovered should it never come back. Any other heartbeat removes it.
	NodeLeftTasks = "left_tasks"
	// NodeOwnMaxThreads is the node's own cap (its --maxthreads), which
	// its heartbeat writes beside maxthreads, the operator's (4.103's
	// field): the node runs at most the lower of the two. Absent: none.
	NodeOwnMaxThreads = "own_maxthreads"
	// NodeFenceAfter is the node's --fence-after in milliseconds, which
	// its heartbeat writes: with no heartbeat acknowledged for this long,
	// the node has stopped its tasks (fenced itself). Read only when
	// serves_at is the timestamp, as NodeServes is. Absent: the node does
	// not say (4.103's nodes never fence).
	NodeFenceAfter = "fence_after_ms"
	// NodeServes lists the ids (hex strings) of the queues the node
	// serves as of its last read of them, or would but for what stops
	// every node alike (a pause, maxthreads 0); queues lists every queue
	// it can read, served or not (seed 000). NodeFull lists those whose
	// slots it had all taken (the queue's maxthreads, or its own cap).
	// NodeWakeupStream says whether it follows a change stream for new
	// tasks (false: --poll-only). NodeServesAt is the heartbeat's
	// timestamp again: the three are read only when it equals timestamp,
	// so that a node of an earlier version, which writes timestamp and not
	// them, is not taken at what it wrote before. Other nodes choose a
	// queue's wake-up listeners among the nodes that serve it with a
	// stream, the full ones last.
	NodeServes       = "serves"
	NodeFull         = "full"
	NodeWakeupStream = "wakeup_stream"
	NodeServesAt     = "serves_at"
)

// Node states (NodeState).
const (
	NodeStateRunning  = "running"
	NodeStateDraining = "draining"
	NodeStateStopped  = "stopped"
)

// Node is a document of the nodes collection. A node writes node, timestamp
// and queues; maxthreads belongs to the operator and is only read.
type Node struct {
	ID        bson.ObjectID
	Node      string
	Timestamp time.Time
	Queues    []NodeQueue
	// MaxThreads caps the node's concurrent tasks across all queues; nil
	// means no node-wide cap. It is the operator's (4.103's field);
	// OwnMaxThreads is the node's own, as its heartbeat says.
	MaxThreads    *int
	OwnMaxThreads *int
	// FenceAfter is schema.NodeFenceAfter (0: not said with the last
	// heartbeat, as NodeServes is judged, or not a positive integer).
	FenceAfter time.Duration
	// State, Drain, Dead, DeadAt and DeadBy: see NodeState, NodeDrain and
	// NodeDead.
	State  string
	Drain  bool
	Dead   bool
	DeadAt time.Time
	DeadBy string
	// Serves is nil when the document does not say (no serves, or one
	// not written with its timestamp: a node of an earlier version, or
	// another implementation), else the ids of the queues the node
	// serves; Full and WakeupStream are then what it said with them. See
	// NodeServes. If any of the three is malformed, none is said.
	Serves       []string
	Full         []string
	WakeupStream bool

	Raw bson.Raw
}

// NodeQueue is one entry of a node document's queues array, exactly as seed
// 000 lists it.
type NodeQueue struct {
	Name          string `bson:"name"`
	ID            string `bson:"id"` // the queue's _id as a hex string
	Constructor   string `bson:"constructor"`
	MaxThreads    *int   `bson:"maxthreads"`
	TasksTodo     int64  `bson:"tasks_todo"`
	TasksDoing    int64  `bson:"tasks_doing"`
	TasksDone     int64  `bson:"tasks_done"`
	Preemptive    int32  `bson:"preemptive"`     // always 1, for legacy readers
	TasksBackfill int32  `bson:"tasks_backfill"` // always 0, for legacy readers
}

// DecodeNode decodes a nodes document. Entries of queues are read leniently
// (other implementations write other fields there); only their shape is
// checked.
func DecodeNode(raw bson.Raw) (Node, error) {
	r := newReader(CollNodes, raw)
	n := Node{
		ID:            r.objectID(false, "_id"),
		Node:          r.str(true, NodeNode),
		Timestamp:     r.timeOf(NodeTimestamp),
		MaxThreads:    r.maxThreads(NodeMaxThreads),
		State:         r.str(false, NodeState),
		OwnMaxThreads: r.maxThreads(NodeOwnMaxThreads),
		Drain:         r.flag(NodeDrain),
		Dead:          r.flag(NodeDead),
		DeadAt:        r.timeOf(NodeDeadAt),
		DeadBy:        r.str(false, NodeDeadBy),
		Raw:           raw,
	}
	if at, ok := raw.Lookup(NodeServesAt).DateTimeOK(); ok && !n.Timestamp.IsZero() && at == n.Timestamp.UnixMilli() {
		// Written with this timestamp, as serves is: not inherited by a
		// 4.103 node started under the same name, which never fences.
		n.FenceAfter = millis(raw, NodeFenceAfter)
		serves, full := hexList(raw, NodeServes), hexList(raw, NodeFull)
		stream, isBool := raw.Lookup(NodeWakeupStream).BooleanOK()
		if serves != nil && full != nil && isBool {
			n.Serves, n.Full, n.WakeupStream = serves, full, stream
		}
	}
	if _, v, ok := r.lookup(NodeQueues); ok {
		arr, isArr := v.ArrayOK()
		if !isArr {
			r.fail(NodeQueues, wantGot("an array", v))
		} else if vals, err := arr.Values(); err != nil {
			r.fail(NodeQueues, err)
		} else {
			for _, e := range vals {
				doc, ok := e.DocumentOK()
				if !ok {
					continue
				}
				qr := newReader(CollNodes, doc)
				nq := NodeQueue{
					Name:        qr.str(false, "name"),
					ID:          qr.str(false, "id"),
					Constructor: qr.str(false, "constructor", "plugin"),
					MaxThreads:  qr.maxThreads("maxthreads", "threads"),
				}
				for _, c := range []struct {
					dst  *int64
					name string
				}{{&nq.TasksTodo, "tasks_todo"}, {&nq.TasksDoing, "tasks_doing"}, {&nq.TasksDone, "tasks_done"}} {
					if p := qr.count(c.name); p != nil {
						*c.dst = *p
					}
				}
				if qr.err == nil {
					n.Queues = append(n.Queues, nq)
				}
			}
		}
	}
	if r.err != nil {
		return Node{}, r.err
	}
	return n, nil
}

// Fenced reports whether the node, which says its --fence-after and has
// not stopped, has had no heartbeat for longer than it by now (the
// server's clock): cut off from MongoDB, it has stopped its tasks.
func (n Node) Fenced(now time.Time) bool {
	return n.FenceAfter > 0 && n.State != NodeStateStopped && !n.Timestamp.IsZero() && !now.IsZero() && now.Sub(n.Timestamp) > n.FenceAfter
}

// millis reads a positive whole number of milliseconds as a duration,
// leniently: 0 when it is missing or anything else (a node's own field,
// which nobody but its node writes).
func millis(raw bson.Raw, name string) time.Duration {
	v := raw.Lookup(name)
	ms, ok := v.Int64OK()
	if !ok {
		i, ok32 := v.Int32OK()
		ms, ok = int64(i), ok32
	}
	if !ok || ms <= 0 || ms > MaxSeconds*1000 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// hexList reads an array of ids as hex strings, leniently: nil when it is
// missing or anything else (a node's own fields, which nobody but its
// node writes).
func hexList(raw bson.Raw, name string) []string {
	arr, ok := raw.Lookup(name).ArrayOK()
	if !ok {
		return nil
	}
	vals, err := arr.Values()
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(vals))
	for _, v := range vals {
		s, ok := v.StringValueOK()
		if _, err := bson.ObjectIDFromHex(s); !ok || err != nil {
			return nil
		}
		out = append(out, s)
	}
	return out
}
