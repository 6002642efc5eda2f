package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// NodeUpsertParams are what a node writes about itself every heartbeat.
type NodeUpsertParams struct {
	Node   string
	Queues []schema.NodeQueue
	// State is schema.NodeStateRunning, NodeStateDraining or
	// NodeStateStopped ("" leaves it as it is).
	State string
	// ClearDrain removes an operator's drain request: a node starting up
	// is a new run, which the request was not for.
	ClearDrain bool
	// Serves and Full (queue ids) and WakeupStream: schema.NodeServes.
	// Always written, with serves_at, the lists as [] when nil.
	Serves, Full []string
	WakeupStream bool
	// LeftTasks, with State stopped, is schema.NodeLeftTasks (0: none, and
	// the field is removed).
	LeftTasks int
	// OwnMaxThreads is schema.NodeOwnMaxThreads (nil: removed).
	OwnMaxThreads *int
	// FenceAfter is schema.NodeFenceAfter, written in whole milliseconds
	// (0: removed).
	FenceAfter time.Duration
}

// NodeUpsert writes node, timestamp, queues, serves, full, wakeup_stream,
// serves_at, state, own_maxthreads and fence_after_ms of this node's
// document, creating it if needed, and returns the document as it was
// before (zero for a new node), so one round trip also reads the
// operator's maxthreads and drain request and tells the node whether
// another node declared it dead. The timestamp is
// the server's clock ($$NOW), the only clock dead-node detection compares
// it with. The write clears dead, dead_at and dead_by: the node is alive
// again. Only those fields are set: maxthreads and anything else an
// operator or another tool put there is never overwritten.
func (s *Store) NodeUpsert(ctx context.Context, p NodeUpsertParams) (schema.Node, error) {
	if p.Node == "" {
		return schema.Node{}, errors.New("node upsert: empty node name")
	}
	queues := p.Queues
	if queues == nil {
		queues = []schema.NodeQueue{}
	}
	for i := range queues {
		queues[i].Preemptive, queues[i].TasksBackfill = 1, 0
	}
	serves, full := p.Serves, p.Full
	if serves == nil {
		serves = []string{}
	}
	if full == nil {
		full = []string{}
	}
	set := bson.D{
		{Key: schema.NodeNode, Value: literal(p.Node)},
		{Key: schema.NodeTimestamp, Value: "$$NOW"},
		{Key: schema.NodeQueues, Value: literal(queues)},
		{Key: schema.NodeServes, Value: literal(serves)},
		{Key: schema.NodeFull, Value: literal(full)},
		{Key: schema.NodeWakeupStream, Value: p.WakeupStream},
		{Key: schema.NodeServesAt, Value: "$$NOW"}, // = timestamp
	}
	if p.State != "" {
		set = append(set, bson.E{Key: schema.NodeState, Value: literal(p.State)})
	}
	unset := bson.A{schema.NodeDead, schema.NodeDeadAt, schema.NodeDeadBy}
	if p.LeftTasks > 0 && p.State == schema.NodeStateStopped {
		set = append(set, bson.E{Key: schema.NodeLeftTasks, Value: p.LeftTasks})
	} else {
		unset = append(unset, schema.NodeLeftTasks)
	}
	if p.ClearDrain {
		unset = append(unset, schema.NodeDrain)
	}
	if p.OwnMaxThreads != nil {
		set = append(set, bson.E{Key: schema.NodeOwnMaxThreads, Value: *p.OwnMaxThreads})
	} else {
		unset = append(unset, schema.NodeOwnMaxThreads)
	}
	if ms := p.FenceAfter.Milliseconds(); ms > 0 {
		set = append(set, bson.E{Key: schema.NodeFenceAfter, Value: ms})
	} else {
		unset = append(unset, schema.NodeFenceAfter)
	}
	raw, err := s.nodes.FindOneAndUpdate(ctx,
		bson.D{{Key: schema.NodeNode, Value: p.Node}},
		mongo.Pipeline{{{Key: "$set", Value: set}}, {{Key: "$unset", Value: unset}}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.Before)).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return schema.Node{Node: p.Node}, nil // created
	}
	if err != nil {
		return schema.Node{}, fmt.Errorf("heartbeat of node %s: %w", p.Node, err)
	}
	return schema.DecodeNode(raw)
}

// literal keeps a value from being read as an expression inside an update
// pipeline (a string starting with "$" would be a field path).
func literal(v any) bson.D { return bson.D{{Key: "$literal", Value: v}} }

// NodeDrainParams name the node an operator asks to drain.
type NodeDrainParams struct {
	Node string
}

// NodeDrain sets drain: true on the node's document: the node stops
// claiming and exits once its running tasks finish. ErrNotFound when no
// node of that name ever wrote a heartbeat.
func (s *Store) NodeDrain(ctx context.Context, p NodeDrainParams) (schema.Node, error) {
	raw, err := s.nodes.FindOneAndUpdate(ctx,
		bson.D{{Key: schema.NodeNode, Value: p.Node}},
		bson.D{{Key: "$set", Value: bson.D{{Key: schema.NodeDrain, Value: true}}}},
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return schema.Node{}, fmt.Errorf("node %q: %w", p.Node, ErrNotFound)
	}
	if err != nil {
		return schema.Node{}, fmt.Errorf("drain node %q: %w", p.Node, err)
	}
	return schema.DecodeNode(raw)
}

// NodeListResult holds every node document that decodes, one error per
// one that does not, and the server's clock when they were read (to judge
// heartbeat ages without trusting the reader's clock).
type NodeListResult struct {
	Nodes     []schema.Node
	Malformed []error
	Now       time.Time
}

// NodeList reads every node document, sorted by name.
func (s *Store) NodeList(ctx context.Context) (NodeListResult, error) {
	cur, err := s.nodes.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$sort", Value: bson.D{{Key: schema.NodeNode, Value: 1}}}},
		{{Key: "$addFields", Value: bson.D{{Key: "_now", Value: "$$NOW"}}}},
	})
	if err != nil {
		return NodeListResult{}, fmt.Errorf("list nodes: %w", err)
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	var res NodeListResult
	for r.Next() {
		raw := append(bson.Raw(nil), cur.Current...)
		if now, ok := raw.Lookup("_now").TimeOK(); ok {
			res.Now = now.UTC()
		}
		n, err := schema.DecodeNode(raw)
		if err != nil {
			res.Malformed = append(res.Malformed, err)
			continue
		}
		res.Nodes = append(res.Nodes, n)
	}
	if err := r.Err(); err != nil {
		return NodeListResult{}, fmt.Errorf("list nodes: %w", err)
	}
	return res, nil
}

// NodesDeadRecoverParams say when a node is dead and who is asking.
type NodesDeadRecoverParams struct {
	// DeadAfter: a node whose heartbeat timestamp is older than this, by
	// the server's clock, is dead.
	DeadAfter time.Duration
	// By is the live node doing the recovery (written as dead_by).
	By string
	// Session, when set, is the recovering leader's term session
	// (LeaseSessionStart) the transactions run in, so that a successor can
	// end one it left open; otherwise each runs in a session of its own.
	Session *LeaseSession
}

// DeadNode is one node declared dead, and what was done with its tasks.
type DeadNode struct {
	Node     string
	Since    time.Time // its last heartbeat
	Requeued int64     // claimed, not started (-1), and running ones of queues with rerun_orphans: back to the queue
	Orphaned int64     // running (0): orphaned (-6)
	Killed   int64     // asked to be killed: finished as killed
	// Foreign: a Disbatch 4.103 node (its document has neither state nor
	// queues). It is
	// not marked dead (it rewrites its whole document, which would keep
	// the mark), only its claimed tasks are requeued, and LeftRunning
	// running tasks are left to its task_runners.
	Foreign     bool
	LeftRunning int64
	// Sessions is how many of its transaction sessions were killed (see
	// CollSessions); SessionsErr why that failed, if it did.
	Sessions    int
	SessionsErr error
}

// NodesDeadRecover finds nodes whose heartbeat is older than DeadAfter by
// the server's clock ($$NOW) and, for each, in one transaction: marks its
// document dead (guarded by the same staleness, so a node that wrote a
// heartbeat meanwhile is left alone, and a node already marked is not
// marked twice), hands its claimed tasks (-1) back to the queue and
// orphans its running tasks (0). Because the transaction writes the node
// document, a heartbeat of that node racing it makes one of the two wait
// for or abort the other: either the node is alive and keeps its tasks, or
// it is dead and every task it held is recovered exactly once, by exactly
// one live node. Only nodes with a date timestamp (ours; Disbatch 4.103's)
// are judged. Nodes that stopped cleanly (state stopped) are not, unless
// they left tasks running in their name (schema.NodeLeftTasks).
func (s *Store) NodesDeadRecover(ctx context.Context, p NodesDeadRecoverParams) ([]DeadNode, error) {
	if p.DeadAfter <= 0 {
		return nil, errors.New("recover dead nodes: dead-after must be positive")
	}
	stale := bson.D{
		{Key: schema.NodeTimestamp, Value: bson.D{{Key: "$type", Value: "date"}}},
		{Key: schema.NodeDead, Value: bson.D{{Key: "$ne", Value: true}}},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: schema.NodeState, Value: bson.D{{Key: "$ne", Value: schema.NodeStateStopped}}}},
			bson.D{{Key: schema.NodeLeftTasks, Value: bson.D{{Key: "$gt", Value: 0}}}},
		}},
		{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{
			"$" + schema.NodeTimestamp,
			bson.D{{Key: "$subtract", Value: bson.A{"$$NOW", p.DeadAfter.Milliseconds()}}},
		}}}},
	}
	cur, err := s.nodes.Find(ctx, stale, options.Find().SetProjection(bson.D{{Key: schema.NodeNode, Value: 1}, {Key: schema.NodeTimestamp, Value: 1},
		{Key: schema.NodeState, Value: 1}, {Key: schema.NodeQueues, Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("find dead nodes: %w", err)
	}
	var cands []struct {
		ID        bson.ObjectID `bson:"_id"`
		Node      any           `bson:"node"`
		Timestamp time.Time     `bson:"timestamp"`
		State     bson.RawValue `bson:"state"`
		Queues    bson.RawValue `bson:"queues"`
	}
	if err := readAllInto(ctx, cur, &cands); err != nil {
		return nil, fmt.Errorf("find dead nodes: %w", err)
	}
	var dead []DeadNode
	for _, c := range cands {
		name, ok := c.Node.(string)
		if !ok || name == "" {
			continue // no name, no tasks to recover
		}
		if c.State.Type == 0 && c.Queues.Type == 0 {
			// Not ours (neither state nor queues: a Disbatch 4.103 node,
			// whose heartbeat writes only node and timestamp). Its running
			// tasks are task_runner processes that outlive their
			// disbatchd, and a task_runner whose task we changed drops
			// its result silently: leave them. Its claimed tasks are
			// not started yet (a task_runner starts only a task still
			// claimed by its host): back to the queue, as 4.103 itself
			// unclaims them when its disbatchd exits.
			d, err := s.foreignNodeRecover(ctx, name)
			if err != nil {
				return dead, err
			}
			if d.Requeued > 0 {
				d.Since = c.Timestamp.UTC()
				dead = append(dead, d)
			}
			continue
		}
		// A transaction it died in holds its locks until killed, and the
		// recovery may write what it locked: kill its sessions first. (A
		// node that beats again just now loses its open transactions,
		// which it retries; its sessions stay recorded.)
		sessions, serr := s.NodeSessionsKill(ctx, name)
		d, err := s.nodeDeadRecover(ctx, c.ID, name, stale, p.By, p.Session)
		if err != nil {
			return dead, err
		}
		if d != nil {
			d.Since = c.Timestamp.UTC()
			d.Sessions, d.SessionsErr = sessions, serr
			dead = append(dead, *d)
		}
	}
	return dead, nil
}

// foreignNodeRecover hands a silent Disbatch 4.103 node's claimed tasks
// back to the queue and counts the running ones it leaves alone.
func (s *Store) foreignNodeRecover(ctx context.Context, name string) (DeadNode, error) {
	res, err := s.tasks.UpdateMany(ctx,
		bson.D{{Key: schema.TaskNode, Value: name}, {Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)}},
		setPiped(name, bson.D{
			{Key: schema.TaskNode, Value: schema.Unclaimed},
			{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
			{Key: schema.TaskMTime, Value: s.nowMS()},
		}))
	if err != nil {
		return DeadNode{}, fmt.Errorf("requeue the claimed tasks of 4.103 node %q: %w", name, err)
	}
	running, err := s.tasks.CountDocuments(ctx, bson.D{{Key: schema.TaskNode, Value: name}, {Key: schema.TaskStatus, Value: int32(schema.StatusRunning)}})
	if err != nil {
		return DeadNode{}, fmt.Errorf("count the running tasks of 4.103 node %q: %w", name, err)
	}
	return DeadNode{Node: name, Foreign: true, Requeued: res.ModifiedCount, LeftRunning: running}, nil
}

func (s *Store) nodeDeadRecover(ctx context.Context, id bson.ObjectID, name string, stale bson.D, by string, ls *LeaseSession) (*DeadNode, error) {
	sess, end, err := s.txnSession(ctx, ls)
	if err != nil {
		return nil, fmt.Errorf("recover dead node %q: %w", name, err)
	}
	defer func() { end(err) }()
	var d *DeadNode
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		d = nil
		res, err := s.nodes.UpdateOne(ctx, append(bson.D{{Key: "_id", Value: id}}, stale...), mongo.Pipeline{{{Key: "$set", Value: bson.D{
			{Key: schema.NodeDead, Value: true},
			{Key: schema.NodeDeadAt, Value: "$$NOW"},
			{Key: schema.NodeDeadBy, Value: literal(by)},
		}}}})
		if err != nil {
			return nil, err
		}
		if res.MatchedCount == 0 {
			return nil, nil // alive again, or another node got there first
		}
		now := s.nowMS()
		requeued, err := s.tasks.UpdateMany(ctx,
			bson.D{{Key: schema.TaskNode, Value: name}, {Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)}, {Key: schema.TaskKill, Value: bson.D{{Key: "$exists", Value: false}}}},
			setPiped(name, bson.D{
				{Key: schema.TaskNode, Value: schema.Unclaimed},
				{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
				{Key: schema.TaskMTime, Value: now},
			}))
		if err != nil {
			return nil, err
		}
		gone, err := s.settleGone(ctx, bson.D{{Key: schema.TaskNode, Value: name}}, true)
		if err != nil {
			return nil, err
		}
		d = &DeadNode{Node: name, Requeued: requeued.ModifiedCount + gone.Rerun, Orphaned: gone.Orphaned, Killed: gone.Killed}
		return nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("recover dead node %q: %w", name, err)
	}
	return d, nil
}

// NodeGet returns one node's document.
func (s *Store) NodeGet(ctx context.Context, name string) (schema.Node, error) {
	raw, err := s.nodes.FindOne(ctx, bson.D{{Key: schema.NodeNode, Value: name}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return schema.Node{}, fmt.Errorf("node %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return schema.Node{}, fmt.Errorf("read node %q: %w", name, err)
	}
	return schema.DecodeNode(raw)
}
