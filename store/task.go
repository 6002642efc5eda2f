package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// TaskInsertManyParams are new tasks for one queue: one parameters object
// each.
type TaskInsertManyParams struct {
	Queue      bson.ObjectID
	Parameters []bson.Raw
	// IDs, when set, are the tasks' _ids (one per parameters object). A
	// caller inserting concurrent batches allocates them up front so that
	// fifo order (by _id) is submission order.
	IDs []bson.ObjectID
	// TraceParent and TraceState, when set, are written to every task so
	// that the node's spans join the submitter's trace.
	TraceParent string
	TraceState  string
	// Control, when set, gives every task a time limit, an expiry or a
	// delay. A task with a NotBefore in the future is inserted held
	// (status -4) and queued by the leader at that time.
	Control *TaskInsertControl
	// Priorities, when set, are the tasks' own priorities (one per
	// parameters object, each from 0 to schema.MaxTaskPriority), in place
	// of Control's: tasks that differ only in priority share one write.
	Priorities []int64
	// Controls, when set, are the tasks' own controls (one per parameters
	// object), in place of Control and Priorities: tasks that differ in
	// their limits, expiries or delays share one write too.
	Controls []TaskInsertControl
	// Atomic inserts the tasks in one transaction: all or none, whatever
	// fails on the server partway (a failover, a validator).
	Atomic bool
	// Dialect4103 writes the tasks as Disbatch 4.103's web API does, with
	// params for parameters and node null for -1, so that Perl nodes
	// sharing the database run them too (this project's nodes read both).
	Dialect4103 bool
	// At, when set, is the tasks' ctime and mtime (to the millisecond,
	// as every time the store writes), for a caller that names the
	// tasks by that time; zero: now.
	At time.Time
	// Extra are more fields written on every inserted task, after the
	// protocol's; keys must not be protocol fields (the insert is refused).
	Extra bson.D
}

// TaskInsertControl are the control fields of new tasks.
type TaskInsertControl struct {
	Timeout   time.Duration // 0: the queue's
	ExpiresAt time.Time     // zero: never
	NotBefore time.Time     // zero: at once
	Priority  int64         // 0: none (schema.TaskPriority)
}

// Validate checks the fields: a timeout from 0 to a year; an expiry after
// the delay, if both are given.
func (c TaskInsertControl) Validate() error {
	if c.Timeout < 0 || c.Timeout > schema.MaxSeconds*time.Second {
		return fmt.Errorf("timeout must be from 0 to %d seconds, got %s", schema.MaxSeconds, c.Timeout)
	}
	if c.Priority < 0 || c.Priority > schema.MaxTaskPriority {
		return fmt.Errorf("priority must be from 0 to %d, got %d", schema.MaxTaskPriority, c.Priority)
	}
	if !c.ExpiresAt.IsZero() && !c.NotBefore.IsZero() && !c.ExpiresAt.After(c.NotBefore) {
		return fmt.Errorf("expires_at (%s) must be after not_before (%s): the task could never run", c.ExpiresAt.Format(time.RFC3339Nano), c.NotBefore.Format(time.RFC3339Nano))
	}
	return nil
}

// TaskInsertMany inserts queued tasks exactly as seed 000 describes them:
// node -1, status -2, ctime = mtime = now, stdout and stderr null.
func (s *Store) TaskInsertMany(ctx context.Context, p TaskInsertManyParams) ([]bson.ObjectID, error) {
	if len(p.Parameters) == 0 {
		return nil, nil
	}
	if p.IDs != nil && len(p.IDs) != len(p.Parameters) {
		return nil, fmt.Errorf("insert tasks: %d ids for %d parameters", len(p.IDs), len(p.Parameters))
	}
	if p.Control != nil {
		if err := p.Control.Validate(); err != nil {
			return nil, fmt.Errorf("insert tasks: %w", err)
		}
	}
	if p.Controls != nil {
		if len(p.Controls) != len(p.Parameters) || p.Control != nil || p.Priorities != nil {
			return nil, fmt.Errorf("insert tasks: %d controls for %d parameters (and no Control or Priorities beside them)", len(p.Controls), len(p.Parameters))
		}
		for i, c := range p.Controls {
			if err := c.Validate(); err != nil {
				return nil, fmt.Errorf("insert tasks: task %d: %w", i, err)
			}
		}
	}
	if p.Priorities != nil {
		if len(p.Priorities) != len(p.Parameters) {
			return nil, fmt.Errorf("insert tasks: %d priorities for %d parameters", len(p.Priorities), len(p.Parameters))
		}
		for i, pr := range p.Priorities {
			if err := (TaskInsertControl{Priority: pr}).Validate(); err != nil {
				return nil, fmt.Errorf("insert tasks: task %d: %w", i, err)
			}
		}
	}
	for _, e := range p.Extra {
		if protocolField(e.Key) {
			return nil, fmt.Errorf("insert tasks: extra field %q is a field of the task protocol; it cannot be set this way", e.Key)
		}
	}
	nt := newTask{Queue: p.Queue, Control: p.Control, TraceParent: p.TraceParent, TraceState: p.TraceState, Dialect4103: p.Dialect4103, Extra: p.Extra}
	ids := p.IDs
	if ids == nil {
		ids = make([]bson.ObjectID, len(p.Parameters))
		for i := range ids {
			ids[i] = bson.NewObjectID()
		}
	}
	now := s.nowMS()
	if !p.At.IsZero() {
		now = p.At.UTC().Truncate(time.Millisecond)
	}
	docs := make([]any, len(p.Parameters))
	var c TaskInsertControl
	if p.Control != nil {
		c = *p.Control
	}
	delays := !c.NotBefore.IsZero()
	for _, c := range p.Controls {
		delays = delays || !c.NotBefore.IsZero()
	}
	due, err := s.dueClock(ctx, delays)
	if err != nil {
		return nil, fmt.Errorf("insert tasks: %w", err)
	}
	for i, params := range p.Parameters {
		nti := nt
		switch {
		case p.Controls != nil:
			nti.Control = &p.Controls[i]
		case p.Priorities != nil:
			c.Priority = p.Priorities[i]
			nti.Control = &c // doc reads it and keeps nothing
		}
		d, err := nti.doc(ids[i], params, now, due)
		if err != nil {
			return nil, fmt.Errorf("insert tasks: task %d: %w", i, err)
		}
		docs[i] = d
	}
	insert := func(ctx context.Context) error {
		_, err := s.tasks.InsertMany(ctx, docs)
		return err
	}
	if p.Atomic && len(docs) > 1 {
		err = s.inTxn(ctx, insert)
	} else {
		err = insert(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("insert %d tasks into queue %s: %w", len(docs), p.Queue.Hex(), err)
	}
	return ids, nil
}

// newTask is what the tasks of one insert share; doc writes each one.
type newTask struct {
	Queue bson.ObjectID
	// Control was validated by the caller (TaskInsertControl.Validate).
	Control                 *TaskInsertControl
	TraceParent, TraceState string
	Dialect4103             bool
	Extra                   bson.D
}

// doc is a new task as seed 000 describes it: queued (node -1, status -2),
// or held (-4) for a not_before ahead of due (the server's clock:
// dueClock); ctime = mtime = now, stdout and stderr null; then its control
// fields, its trace context and the extra fields.
func (nt newTask) doc(id bson.ObjectID, params bson.Raw, now, due time.Time) (bson.D, error) {
	if params == nil {
		params = emptyDoc
	} else if err := params.Validate(); err != nil {
		return nil, fmt.Errorf("parameters: %w", err)
	}
	node, paramsKey := any(schema.Unclaimed), schema.TaskParameters
	if nt.Dialect4103 {
		node, paramsKey = nil, schema.TaskParams
	}
	status := schema.StatusQueued
	if c := nt.Control; c != nil && c.NotBefore.After(due) {
		status = schema.StatusBlocked
	}
	d := bson.D{
		{Key: "_id", Value: id},
		{Key: schema.TaskQueue, Value: nt.Queue},
		{Key: schema.TaskCTime, Value: now},
		{Key: schema.TaskMTime, Value: now},
		{Key: schema.TaskNode, Value: node},
		{Key: schema.TaskStatus, Value: int32(status)},
		{Key: paramsKey, Value: params},
		{Key: schema.TaskStdout, Value: nil},
		{Key: schema.TaskStderr, Value: nil},
	}
	if c := nt.Control; c != nil {
		if c.Timeout > 0 {
			d = append(d, bson.E{Key: schema.TaskTimeout, Value: c.Timeout.Seconds()})
		}
		if !c.ExpiresAt.IsZero() {
			d = append(d, bson.E{Key: schema.TaskExpiresAt, Value: c.ExpiresAt.UTC().Truncate(time.Millisecond)})
		}
		if !c.NotBefore.IsZero() {
			d = append(d, bson.E{Key: schema.TaskNotBefore, Value: c.NotBefore.UTC().Truncate(time.Millisecond)})
		}
		if c.Priority > 0 {
			d = append(d, bson.E{Key: schema.TaskPriority, Value: c.Priority})
		}
	}
	if nt.TraceParent != "" {
		d = append(d, bson.E{Key: schema.TaskTraceParent, Value: nt.TraceParent})
		if nt.TraceState != "" {
			d = append(d, bson.E{Key: schema.TaskTraceState, Value: nt.TraceState})
		}
	}
	return append(d, nt.Extra...), nil
}

// protocolField reports whether key is a field newTask.doc writes, or one
// with a meaning to nodes, the leader or Disbatch 4 (which Extra must not
// set behind their backs).
func protocolField(key string) bool {
	switch key {
	case "_id", schema.TaskQueue, schema.TaskCTime, schema.TaskMTime, schema.TaskNode, schema.TaskStatus,
		schema.TaskParameters, schema.TaskParams, schema.TaskStdout, schema.TaskStderr, schema.TaskComplete,
		schema.TaskTraceParent, schema.TaskTraceState, schema.TaskClaimToken, schema.TaskKill,
		schema.TaskReason, schema.TaskAttempts, schema.TaskAttempt, schema.TaskTries,
		schema.TaskTimeout, schema.TaskExpiresAt, schema.TaskNotBefore, schema.TaskCancel, schema.TaskRequeued,
		schema.TaskResult, schema.TaskMixedout, schema.TaskAdmitted, schema.TaskThenPending,
		schema.TaskParents, schema.TaskOnParentFailure, schema.TaskAwaitingParents, schema.TaskPriority, schema.TaskHasChildren:
		return true
	}
	return false
}

var emptyDoc = bson.Raw{5, 0, 0, 0, 0}

// TaskGet returns one task.
func (s *Store) TaskGet(ctx context.Context, id bson.ObjectID) (schema.Task, error) {
	raw, err := s.tasks.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return schema.Task{}, fmt.Errorf("task %s: %w", id.Hex(), ErrNotFound)
	}
	if err != nil {
		return schema.Task{}, fmt.Errorf("read task %s: %w", id.Hex(), err)
	}
	return schema.DecodeTask(raw)
}

// TaskListParams select tasks of one queue, in _id order.
type TaskListParams struct {
	Queue  bson.ObjectID
	Status *schema.Status
	Limit  int64 // 0: no limit
	// WithoutOutput leaves stdout, stderr and mixedout out of the documents
	// read.
	WithoutOutput bool
}

// TaskListResult holds decoded tasks and one error per malformed document.
type TaskListResult struct {
	Tasks     []schema.Task
	Malformed []error
}

// TaskList lists tasks of a queue.
func (s *Store) TaskList(ctx context.Context, p TaskListParams) (TaskListResult, error) {
	filter := bson.D{{Key: schema.TaskQueue, Value: p.Queue}}
	if p.Status != nil {
		filter = append(filter, bson.E{Key: schema.TaskStatus, Value: int32(*p.Status)})
	}
	o := options.Find().SetSort(bson.D{{Key: "_id", Value: 1}})
	if p.Limit > 0 {
		o.SetLimit(p.Limit)
	}
	if p.WithoutOutput {
		o.SetProjection(bson.D{{Key: schema.TaskStdout, Value: 0}, {Key: schema.TaskStderr, Value: 0}, {Key: schema.TaskMixedout, Value: 0}})
	}
	cur, err := s.tasks.Find(ctx, filter, o)
	if err != nil {
		return TaskListResult{}, fmt.Errorf("list tasks of queue %s: %w", p.Queue.Hex(), err)
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	var res TaskListResult
	for r.Next() {
		t, err := schema.DecodeTask(append(bson.Raw(nil), cur.Current...))
		if err != nil {
			res.Malformed = append(res.Malformed, err)
			continue
		}
		res.Tasks = append(res.Tasks, t)
	}
	if err := r.Err(); err != nil {
		return TaskListResult{}, fmt.Errorf("list tasks of queue %s: %w", p.Queue.Hex(), err)
	}
	return res, nil
}

// TaskClaimParams say which queue to claim from and as which node.
type TaskClaimParams struct {
	Queue bson.ObjectID
	Node  string
	Sort  schema.Sort
	// Start claims straight into running (status 0): seed 004's "or 0 if
	// immediately processed", for a caller that starts what it gets at
	// once. The claim then clears the reason, as TaskStart does, and
	// saves the start's write; it does not check the start's guard: a
	// task whose kill was requested before it was requeued comes with its
	// Control.Kill, for the caller to start killed. A task claimed so
	// that never starts must be handed back with TaskUnstart; one whose
	// node dies is orphaned, not requeued.
	Start bool
	// SkipNullNode claims only tasks with node -1 (seed 000's unclaimed),
	// not those with node null (Disbatch 4.103's), for a caller that
	// believes the queue holds none: see claimFilter for why that is
	// cheaper. The zero value claims both.
	SkipNullNode bool
	// From, with SortFIFO, claims only tasks whose _id is at least From,
	// for a caller that knows no claimable task lies below it: the index
	// scan then starts past the entries of the tasks claimed before it,
	// which it would otherwise walk (see claimFilter). Zero, or another
	// sort: no bound.
	From bson.ObjectID
}

// claimTo is the status a claim sets, and claimUpdate its update.
func claimTo(start bool) schema.Status {
	if start {
		return schema.StatusRunning
	}
	return schema.StatusClaimed
}

func claimUpdate(set bson.D, start bool) bson.D {
	u := bson.D{{Key: "$set", Value: set}}
	if start {
		u = append(u, startClears)
	}
	return u
}

// unclaimed matches node -1 (seed 000) and node null (Disbatch 4.103).
var unclaimed = bson.D{{Key: "$in", Value: bson.A{schema.Unclaimed, nil}}}

// TaskClaim is seed 000's claim: one findOneAndUpdate from {node: -1,
// status: -2, queue} to {node: Node, status: -1, mtime: now}, in the
// queue's claim order (claimPhases: by _id for fifo and lifo, by task
// priority then _id for priority). It returns ErrNoTask when the queue has nothing queued.
// A claimed document that does not decode gives a *schema.DecodeError and a
// Task with only ID, Queue, Node, Status and Raw set: it is claimed by this
// node and the caller must deal with it (TaskFail).
func (s *Store) TaskClaim(ctx context.Context, p TaskClaimParams) (schema.Task, error) {
	update := claimUpdate(bson.D{
		{Key: schema.TaskNode, Value: p.Node},
		{Key: schema.TaskStatus, Value: int32(claimTo(p.Start))},
		{Key: schema.TaskMTime, Value: s.nowMS()},
		{Key: schema.TaskPrior, Value: schema.Prior{Queue: p.Queue, Status: schema.StatusQueued}.String()},
	}, p.Start)
	var raw bson.Raw
	err := mongo.ErrNoDocuments
	for _, ph := range claimPhases(from(claimFilter(p.Queue, s.nowMS(), p.SkipNullNode), p.Sort, p.From), p.Sort) {
		o := options.FindOneAndUpdate().SetReturnDocument(options.After)
		if ph.order != nil {
			o.SetSort(ph.order)
		}
		if raw, err = s.tasks.FindOneAndUpdate(ctx, ph.filter, update, o).Raw(); !errors.Is(err, mongo.ErrNoDocuments) {
			break
		}
	}
	if errors.Is(err, mongo.ErrNoDocuments) {
		return schema.Task{}, ErrNoTask
	}
	if err != nil {
		return schema.Task{}, fmt.Errorf("claim task in queue %s: %w", p.Queue.Hex(), err)
	}
	t, err := schema.DecodeTask(raw)
	if err != nil {
		id, _ := raw.Lookup("_id").ObjectIDOK()
		return schema.Task{ID: id, Queue: p.Queue, Node: p.Node, Status: claimTo(p.Start), Raw: raw}, err
	}
	return t, nil
}

// TaskClaimManyParams ask for up to Limit tasks of one queue.
type TaskClaimManyParams struct {
	Queue bson.ObjectID
	Node  string
	Sort  schema.Sort
	Limit int // 1..MaxClaimBatch
	// Start claims straight into running, as TaskClaimParams.Start.
	Start bool
	// Spread, above 1, reads up to Limit x Spread candidates (at most
	// MaxClaimBatch) and claims Limit of them picked at random, in claim
	// order: nodes that contend for one queue then mostly take different
	// tasks, for an order loosened within that window. 0 or 1: the first
	// Limit, in order. A priority queue is never spread: its order is
	// the point (higher first, then older).
	Spread int
	// Prefer, when set and the spread read more candidates than Limit,
	// takes the candidates it prefers first (the first Limit of them, in
	// claim order) and only as many others, at random, as it lacks: nodes
	// that share a queue's tasks out among themselves by it (the
	// claimer's rendezvous hashing) then seldom try for the same ones.
	Prefer func(id bson.ObjectID) bool
	// SkipNullNode and From: as TaskClaimParams'.
	SkipNullNode bool
	From         bson.ObjectID
}

// MaxClaimBatch bounds one batched claim.
const MaxClaimBatch = 256

// TaskClaimManyResult are the tasks one batched claim won, in claim order,
// and the won documents that did not decode: each such Task has only ID,
// Queue, Node, Status and Raw set, it is claimed by this node and the
// caller must deal with it (TaskFail), as with TaskClaim.
type TaskClaimManyResult struct {
	Tasks     []schema.Task
	Malformed []schema.Task
	Errors    []error // one per Malformed
	// Lost: no tasks because other claimers won every task read, round
	// after round; the queue may still hold some.
	Lost bool
	// Short: the claim's last round read fewer candidates than Limit,
	// so the queue held fewer tasks to claim than were asked for (tasks
	// lost to other claimers are not short of that).
	Short bool
	// Contended counts the tasks read as candidates that other claimers
	// took between the read and the update, over every round: the
	// claim's conflicts.
	Contended int
	// NullNode counts the candidates read (in the first round) that had
	// node null or none (Disbatch 4.103's unclaimed): 0 says the queue
	// held none before the last candidate in claim order.
	NullNode int
	// First, with SortFIFO, is the first candidate read (in the first
	// round): no task it could claim lay below it then. Zero otherwise.
	First bson.ObjectID
}

// TaskClaimMany is seed 004's update-then-find claim, for a backlog: it
// reads up to Limit queued ids in claim order, claims them with one
// updateMany guarded like TaskClaim's filter ({_id in ids, node -1 or null,
// status -2}, so a task another node took meanwhile is skipped) that also
// sets a fresh claim token, and reads back the tasks carrying that token.
// Three round trips for up to Limit tasks instead of one per task, and no
// two claimers fight over a single head-of-queue document. It returns no
// tasks and no error when nothing was queued, or others won every id
// (Lost).
func (s *Store) TaskClaimMany(ctx context.Context, p TaskClaimManyParams) (TaskClaimManyResult, error) {
	if p.Limit < 1 || p.Limit > MaxClaimBatch {
		return TaskClaimManyResult{}, fmt.Errorf("claim tasks: limit %d is not within 1..%d", p.Limit, MaxClaimBatch)
	}
	filter := claimFilter(p.Queue, s.nowMS(), p.SkipNullNode)
	bounded := from(filter, p.Sort, p.From)
	// The first round reads its candidates from the claim index alone
	// (claimKeys): the update's filter still leaves out an expired task.
	// A round that won nothing reads with the whole filter, so that a
	// head of expired tasks the leader has not ended yet cannot hold the
	// queue's claims back.
	covered := from(claimKeys(p.Queue, p.SkipNullNode), p.Sort, p.From)
	var ids bson.A
	token := bson.NewObjectID()
	var nullNode int
	var first bson.ObjectID
	var won int64
	contended := 0
	short := false
	window := p.Limit
	if p.Spread > 1 && p.Sort != schema.SortPriority {
		window = min(p.Limit*p.Spread, MaxClaimBatch)
	}
	var prefer func(bson.Raw) bool
	if p.Prefer != nil {
		prefer = func(c bson.Raw) bool {
			id, ok := c.Lookup("_id").ObjectIDOK()
			return ok && p.Prefer(id)
		}
	}
	// Other claimers may win every candidate between the find and the
	// update; then the queue may still hold tasks, so look again.
	for attempt := 0; won == 0; attempt++ {
		if attempt == 3 {
			return TaskClaimManyResult{Lost: true, Contended: contended, NullNode: nullNode, First: first}, nil
		}
		read := bounded
		if attempt == 0 {
			read = covered
		}
		cands, err := claimCandidates(ctx, s.tasks, read, p.Sort, window, bson.D{{Key: "_id", Value: 1}, {Key: schema.TaskNode, Value: 1}})
		if err != nil {
			return TaskClaimManyResult{}, fmt.Errorf("claim tasks in queue %s: %w", p.Queue.Hex(), err)
		}
		if attempt == 0 {
			if len(cands) > 0 && p.Sort == schema.SortFIFO {
				first, _ = cands[0].Lookup("_id").ObjectIDOK()
			}
			for _, c := range cands {
				if v, err := c.LookupErr(schema.TaskNode); err != nil || v.Type == bson.TypeNull {
					nullNode++
				}
			}
		}
		if len(cands) == 0 {
			return TaskClaimManyResult{NullNode: nullNode, First: first, Short: true}, nil
		}
		short = len(cands) < p.Limit
		cands = pickInOrder(cands, p.Limit, prefer)
		ids = make(bson.A, len(cands))
		for i, c := range cands {
			ids[i] = c.Lookup("_id")
		}
		res, err := s.tasks.UpdateMany(ctx,
			append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, filter...),
			claimUpdate(bson.D{
				{Key: schema.TaskNode, Value: p.Node},
				{Key: schema.TaskStatus, Value: int32(claimTo(p.Start))},
				{Key: schema.TaskMTime, Value: s.nowMS()},
				{Key: schema.TaskClaimToken, Value: token},
				{Key: schema.TaskPrior, Value: schema.Prior{Queue: p.Queue, Status: schema.StatusQueued}.String()},
			}, p.Start))
		if err != nil {
			return TaskClaimManyResult{}, fmt.Errorf("claim tasks in queue %s: %w", p.Queue.Hex(), err)
		}
		won = res.ModifiedCount
		contended += len(cands) - int(won)
	}
	out, err := s.readBackClaimed(ctx, p.Queue, p.Node, ids, token, p.Sort, claimTo(p.Start))
	out.Contended, out.NullNode, out.First, out.Short = contended, nullNode, first, short
	return out, err
}

// pickInOrder returns n of cands, in their order (all of them when there
// are no more than n): with prefer, the first n it prefers, and as many
// others as it lacks picked at random; without, n picked at random.
func pickInOrder[T any](cands []T, n int, prefer func(T) bool) []T {
	if len(cands) <= n {
		return cands
	}
	var keep []int
	if prefer != nil {
		var rest []int
		for i, c := range cands {
			if !prefer(c) {
				rest = append(rest, i)
			} else if keep = append(keep, i); len(keep) == n {
				break // the others are not needed
			}
		}
		if lack := n - len(keep); lack > 0 {
			for _, j := range rand.Perm(len(rest))[:lack] {
				keep = append(keep, rest[j])
			}
		}
	} else {
		keep = rand.Perm(len(cands))[:n]
	}
	slices.Sort(keep)
	out := make([]T, n)
	for i, j := range keep {
		out[i] = cands[j]
	}
	return out
}

// readBackClaimed reads the tasks a claim with token won among ids, into
// status to.
func (s *Store) readBackClaimed(ctx context.Context, queue bson.ObjectID, node string, ids bson.A, token bson.ObjectID, sort schema.Sort, to schema.Status) (TaskClaimManyResult, error) {
	// Read back what was won. The token, not node and status, says which:
	// one of these ids could have been requeued and claimed by this node
	// through another path in between.
	// One reply, as claimCandidates': the limit (no more can match) lets
	// the server close the cursor once it has them all, where a batch
	// size alone left it open for an empty getMore.
	ro := options.Find().SetLimit(int64(len(ids))).SetBatchSize(int32(len(ids)))
	if order := claimOrder(sort); order != nil {
		ro.SetSort(order)
	}
	cur, err := s.tasks.Find(ctx, bson.D{
		{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}},
		{Key: schema.TaskClaimToken, Value: token},
		{Key: schema.TaskNode, Value: node},
		{Key: schema.TaskStatus, Value: int32(to)},
	}, ro)
	if err != nil {
		return TaskClaimManyResult{}, fmt.Errorf("read back the tasks claimed in queue %s: %w", queue.Hex(), err)
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	// Room for every id, as most claims win them all: grown from nothing,
	// the slice of 416-byte tasks was copied six times for a batch of 64.
	out := TaskClaimManyResult{Tasks: make([]schema.Task, 0, len(ids))}
	for r.Next() {
		raw := append(bson.Raw(nil), cur.Current...)
		t, err := schema.DecodeTask(raw)
		if err != nil {
			id, _ := raw.Lookup("_id").ObjectIDOK()
			out.Malformed = append(out.Malformed, schema.Task{ID: id, Queue: queue, Node: node, Status: to, Raw: raw})
			out.Errors = append(out.Errors, err)
			continue
		}
		out.Tasks = append(out.Tasks, t)
	}
	if err := r.Err(); err != nil {
		// Won but not all read: hand every one back (the caller dispatches
		// none of them), or, if even that fails, the reaper orphans them.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, rerr := s.tasks.UpdateMany(cctx,
			bson.D{{Key: schema.TaskClaimToken, Value: token}, {Key: schema.TaskNode, Value: node}, {Key: schema.TaskStatus, Value: int32(to)}},
			setPiped(node, bson.D{
				{Key: schema.TaskNode, Value: schema.Unclaimed},
				{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
				{Key: schema.TaskMTime, Value: s.nowMS()},
			}))
		if rerr != nil {
			err = fmt.Errorf("%w; handing them back failed too, so they stay claimed until orphaned: %v", err, rerr)
		}
		return TaskClaimManyResult{}, fmt.Errorf("read back the tasks claimed in queue %s: %w", queue.Hex(), err)
	}
	return out, nil
}

// TaskTransitionParams name a task held by Node.
type TaskTransitionParams struct {
	ID   bson.ObjectID
	Node string
}

// TaskStart marks a claimed task running: {_id, node, status: -1} to
// status 0, unless an operator asked to kill it (ErrKillRequested) or it
// expired (ErrExpired) meanwhile. ErrLostTask when the guard fails
// otherwise.
func (s *Store) TaskStart(ctx context.Context, p TaskTransitionParams) error {
	return s.TaskStartMany(ctx, []TaskTransitionParams{p})[0]
}

// claimFilter is the claim's guard (seed 000): the queue's tasks queued
// and unclaimed, and not expired; with skipNull, only those with node -1.
//
// Node null costs more than its share: a claim's index scan for it
// begins where a queue's just-claimed tasks were ({node: -1, status: -2,
// queue} sorts right after {node: null, status: -2, ...}), and when no
// task of the queue has node null, WiredTiger walks every index entry
// those claims deleted and has not yet purged (thousands in a backlog)
// before it finds that out; the scan for node -1 walks them once more.
// With a backlog drained by one node, leaving node null out while the
// queue holds none took MongoDB's CPU per task from 880-1,008 to 812-888
// µs (three alternating pairs, stop 33; docs/scaling.md).
func claimFilter(queue bson.ObjectID, now time.Time, skipNull bool) bson.D {
	return append(claimKeys(queue, skipNull), notExpired(now))
}

// claimKeys is claimFilter but its expiry: what the claim index holds, so
// that a batched claim's candidates are read from the index without a
// document's fetch each (a claim contended by other nodes reads up to
// MaxClaimBatch of them for the few it takes).
func claimKeys(queue bson.ObjectID, skipNull bool) bson.D {
	var node any = unclaimed
	if skipNull {
		node = schema.Unclaimed
	}
	return bson.D{
		{Key: schema.TaskNode, Value: node},
		{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
		{Key: schema.TaskQueue, Value: queue},
	}
}

// from bounds a fifo claim's filter below by _id (TaskClaimParams.From).
func from(filter bson.D, sort schema.Sort, id bson.ObjectID) bson.D {
	if sort != schema.SortFIFO || id.IsZero() {
		return filter
	}
	return append(slices.Clip(filter), bson.E{Key: "_id", Value: bson.D{{Key: "$gte", Value: id}}})
}

// oldestFirst and newestFirst are the _id orders of fifo and lifo.
var (
	oldestFirst = bson.D{{Key: "_id", Value: 1}}
	newestFirst = bson.D{{Key: "_id", Value: -1}}
)

// claimOrder is the order in which a queue's tasks are claimed (nil:
// MongoDB's own): for SortPriority, the highest priority first, then the
// oldest (tasks without a priority sort last, as MongoDB puts null below
// numbers).
func claimOrder(sort schema.Sort) bson.D {
	switch sort {
	case schema.SortFIFO:
		return oldestFirst
	case schema.SortLIFO:
		return newestFirst
	case schema.SortPriority:
		return bson.D{{Key: schema.TaskPriority, Value: -1}, {Key: "_id", Value: 1}}
	}
	return nil
}

// claimPhase is one query of a claim: its filter and its order.
type claimPhase struct{ filter, order bson.D }

// claimPhases are the queries a claim tries in turn until it has what it
// asked for. One for the _id orders; SortPriority takes two, each served
// by an index: the tasks with a priority, highest first, then oldest (a
// partial index holds only those, so queues that never set one pay
// nothing for it), then the tasks without one, oldest first.
func claimPhases(filter bson.D, sort schema.Sort) []claimPhase {
	if sort != schema.SortPriority {
		return []claimPhase{{filter, claimOrder(sort)}}
	}
	with := func(exists bool) bson.D {
		return append(slices.Clip(filter), bson.E{Key: schema.TaskPriority, Value: bson.D{{Key: "$exists", Value: exists}}})
	}
	return []claimPhase{{with(true), claimOrder(sort)}, {with(false), oldestFirst}}
}

// claimCandidates reads up to limit of filter's tasks in the queue's
// claim order, each as stored (projection's fields). They are read raw: a
// decode into a struct costs the driver a 4 KiB reader per document, 14%
// of what a node allocated while draining.
func claimCandidates(ctx context.Context, tasks *mongo.Collection, filter bson.D, sort schema.Sort, limit int, projection bson.D) ([]bson.Raw, error) {
	var out []bson.Raw
	for _, ph := range claimPhases(filter, sort) {
		// The batch size as the limit: the server's first reply holds 101
		// documents unless told, so a contended queue's spread read (up to
		// MaxClaimBatch) took a getMore, a fourth round trip per claim.
		want := limit - len(out)
		fo := options.Find().SetLimit(int64(want)).SetBatchSize(int32(want)).SetProjection(projection)
		if ph.order != nil {
			fo.SetSort(ph.order)
		}
		cur, err := tasks.Find(ctx, ph.filter, fo)
		if err != nil {
			return nil, err
		}
		// One reply (the batch size is the limit): no getMore for ctx to
		// cut off, so no cursorReader on the claims' path.
		for cur.Next(ctx) {
			out = append(out, slices.Clone(cur.Current))
		}
		err = cur.Err()
		_ = cur.Close(ctx)
		if err != nil {
			return nil, err
		}
		if len(out) >= limit {
			break
		}
	}
	return out, nil
}

// notExpired: no expires_at, or one still ahead (a task is never claimed
// after its expires_at).
func notExpired(now time.Time) bson.E {
	return bson.E{Key: schema.TaskExpiresAt, Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$lte", Value: now}}}}}
}

// startable is the start's guard beyond {_id, node, status: -1}: no kill
// requested, not expired.
func startable(now time.Time) bson.D {
	return bson.D{
		{Key: schema.TaskKill, Value: bson.D{{Key: "$exists", Value: false}}},
		notExpired(now),
	}
}

// TaskRelease hands a claimed, not started task back to the queue:
// {_id, node, status: -1} to node -1, status -2.
func (s *Store) TaskRelease(ctx context.Context, p TaskTransitionParams) error {
	return s.guarded(ctx, "release", p, schema.StatusClaimed, bson.D{
		{Key: schema.TaskNode, Value: schema.Unclaimed},
		{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
		{Key: schema.TaskMTime, Value: s.nowMS()},
	})
}

// guarded moves the task from status from (held by p.Node) by set. When
// the guard fails it looks at the task: if it already is where set puts it
// (this node, the status set writes), an earlier attempt of the same write
// landed though its answer was lost (a timeout, a failover), and the write
// counts as done; otherwise ErrLostTask. Without this, a retried start whose
// first attempt landed would leave the task running on a live node for
// ever.
func (s *Store) guarded(ctx context.Context, what string, p TaskTransitionParams, from schema.Status, set bson.D) error {
	return s.guardedID(ctx, what, p.ID, p.Node, from, set)
}

// guardedID is guarded for a task whose _id may be any value.
func (s *Store) guardedID(ctx context.Context, what string, id any, node string, from schema.Status, set bson.D) error {
	res, err := s.tasks.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: id}, {Key: schema.TaskNode, Value: node}, {Key: schema.TaskStatus, Value: int32(from)}},
		setPiped(node, set))
	if err != nil {
		return fmt.Errorf("%s task %s: %w", what, idText(id), err)
	}
	if res.MatchedCount == 0 {
		if to, ok := setStatus(set); ok && s.taskIs(ctx, id, node, to) {
			return nil
		}
		return fmt.Errorf("%s task %s on node %s: %w", what, idText(id), node, ErrLostTask)
	}
	return nil
}

func idText(id any) string {
	if oid, ok := id.(bson.ObjectID); ok {
		return oid.Hex()
	}
	return fmt.Sprint(id)
}

// setStatus is the status a $set writes, when it keeps the node.
func setStatus(set bson.D) (int32, bool) {
	var status int32
	found := false
	for _, e := range set {
		switch e.Key {
		case schema.TaskNode:
			return 0, false // the task changes hands: its end state says nothing
		case schema.TaskStatus:
			status, found = e.Value.(int32)
		}
	}
	return status, found
}

// taskIs reports whether the task is held by node in status (false when it
// cannot tell).
func (s *Store) taskIs(ctx context.Context, id any, node string, status int32) bool {
	n, err := s.tasks.CountDocuments(ctx, bson.D{{Key: "_id", Value: id}, {Key: schema.TaskNode, Value: node}, {Key: schema.TaskStatus, Value: status}})
	return err == nil && n == 1
}

// TaskStartMany is TaskStart for many tasks in one round trip (one
// guarded updateMany when all are held by one node): one error per task,
// nil for those now running. A task whose guard failed gets ErrLostTask
// (unless it already runs on its node: see guarded), or ErrKillRequested
// or ErrExpired when it is still claimed by its node; when the write itself
// fails every task gets that error, and retrying is safe.
func (s *Store) TaskStartMany(ctx context.Context, ps []TaskTransitionParams) []error {
	ws := make([]guardedWrite, len(ps))
	now := s.nowMS()
	for i, p := range ps {
		ws[i] = guardedWrite{p: p, from: schema.StatusClaimed, to: schema.StatusRunning, guard: startable(now), update: setPiped(p.Node, bson.D{
			{Key: schema.TaskStatus, Value: int32(schema.StatusRunning)},
			{Key: schema.TaskMTime, Value: now},
		}, schema.TaskReason)} // the reason: see startClears
	}
	return s.guardedMany(ctx, "start", ws, sameNode(ps))
}

// priorSet is a pipeline's $set of schema.TaskPrior: the task's queue and
// status as they were before the stage, and node (that of the write's
// filter). A task without a queue or a status gets null: no prior.
func priorSet(node string) bson.E {
	// $convert, not $toString: a queue or status that is no scalar (a
	// malformed task) gives null, no prior, where $toString would fail
	// the whole update (recovery's, over every task of a node).
	str := func(field string) bson.D {
		return bson.D{{Key: "$convert", Value: bson.D{{Key: "input", Value: "$" + field}, {Key: "to", Value: "string"}, {Key: "onError", Value: nil}, {Key: "onNull", Value: nil}}}}
	}
	return bson.E{Key: schema.TaskPrior, Value: bson.D{{Key: "$concat", Value: bson.A{
		str(schema.TaskQueue), " ", str(schema.TaskStatus), " ",
		bson.NewObjectID().Hex(), " ", bson.D{{Key: "$literal", Value: node}},
	}}}}
}

// setPiped is an update that sets set's values and removes unset's
// fields, as {$set: set, $unset: unset} would, written as a pipeline so
// that it also says where each task stood (priorSet; node as there): the
// counter projector then needs no pre-image of the change. Every value is
// under $literal, so none is read as an expression. New fields are added
// in name order, as update operators add them.
func setPiped(node string, set bson.D, unset ...string) bson.A {
	lit := make(bson.D, len(set))
	for i, e := range set {
		lit[i] = bson.E{Key: e.Key, Value: literal(e.Value)}
	}
	return pipedSet(node, lit, unset)
}

// pipedSet is the pipeline of setPiped, its values already expressions.
func pipedSet(node string, exprs bson.D, unset []string) bson.A {
	slices.SortStableFunc(exprs, func(a, b bson.E) int { return strings.Compare(a.Key, b.Key) })
	stages := bson.A{bson.D{{Key: "$set", Value: append(exprs, priorSet(node))}}}
	if len(unset) > 0 {
		stages = append(stages, bson.D{{Key: "$unset", Value: unset}})
	}
	return stages
}

// startClears is the start's $unset: a running task has no reason (the
// reason says why a task ended or is held, e.g. retrying), so that every
// reason an attempt ends with is written afresh, and the counter projector
// counts it (projections.Stats.Reasons).
var startClears = bson.E{Key: "$unset", Value: bson.D{{Key: schema.TaskReason, Value: ""}}}

// TaskFinishMany is TaskFinish for many tasks (see TaskStartMany for the
// errors). Results small enough for the task document go in one update
// of them all (finishPiped), those of tasks held by another node than the
// first's in one bulk write; larger ones through TaskFinish one by one
// (GridFS).
func (s *Store) TaskFinishMany(ctx context.Context, ps []TaskFinishParams) []error {
	errs := make([]error, len(ps))
	var ws []guardedWrite
	var at, piped, alone []int
	now := s.nowMS()
	due, dueErr := s.retryClock(ctx, ps...)
	for i, p := range ps {
		switch {
		case !p.Status.Finished():
			errs[i] = fmt.Errorf("finish task %s: status %d is not a finished status (> 0)", p.ID.Hex(), p.Status)
		case p.Retry != nil && dueErr != nil:
			errs[i] = fmt.Errorf("finish task %s: %w", p.ID.Hex(), dueErr)
		case len(p.Stdout)+len(p.Stderr)+len(mixedout(p.Extra)) > s.threshold/16:
			errs[i] = s.TaskFinish(ctx, p)
			alone = append(alone, i)
		case p.Node == ps[0].Node:
			piped = append(piped, i)
		default:
			at = append(at, i)
			ws = append(ws, finishWrite(p, validUTF8(p.Stdout), validUTF8(p.Stderr), s.finishExtra(p, true), now, due))
		}
	}
	if len(ws) > 0 {
		for j, err := range s.guardedMany(ctx, "finish", ws, false) {
			errs[at[j]] = err
		}
	}
	for len(piped) > 0 {
		n := pipedChunk(ps, piped)
		part := make([]TaskFinishParams, n)
		for j, i := range piped[:n] {
			part[j] = ps[i]
		}
		for j, err := range s.finishPiped(ctx, part, now, due) {
			errs[piped[j]] = err
		}
		piped = piped[n:]
	}
	for i, err := range errs {
		if isTooLarge(err) && !slices.Contains(alone, i) {
			// Its document would outgrow 16 MiB with its output (large
			// parameters): alone, whose output goes to GridFS when so.
			errs[i] = s.TaskFinish(ctx, ps[i])
		}
	}
	return errs
}

// sameNode reports whether every task is held by the same node.
func sameNode(ps []TaskTransitionParams) bool {
	for _, p := range ps[1:] {
		if p.Node != ps[0].Node {
			return false
		}
	}
	return true
}

type guardedWrite struct {
	p        TaskTransitionParams
	from, to schema.Status
	guard    bson.D // more conditions, beyond {_id, node, status: from}
	update   bson.A // a pipeline (setPiped): it says where the task stood
	// attempt, when set, guards a finish by its attempt (attemptGuard);
	// the write counts as landed only where the task's attempt is it.
	attempt int
	// handsBack: the write leaves the task unclaimed (node -1).
	handsBack bool
}

func (w guardedWrite) filter(ids bson.A) bson.D {
	var f bson.D
	if ids != nil {
		f = bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}
	} else {
		f = bson.D{{Key: "_id", Value: w.p.ID}}
	}
	f = append(f, bson.E{Key: schema.TaskNode, Value: w.p.Node}, bson.E{Key: schema.TaskStatus, Value: int32(w.from)})
	if w.attempt > 0 {
		f = append(f, attemptGuard(w.attempt))
	}
	return append(f, w.guard...)
}

// attemptGuard is the condition that attempt (1 for the first) is the
// task's current one: attempt-1 attempts ended (none: the field missing,
// null or 0).
func attemptGuard(attempt int) bson.E {
	if attempt <= 1 {
		return bson.E{Key: schema.TaskAttempt, Value: bson.D{{Key: "$in", Value: bson.A{nil, 0}}}}
	}
	return bson.E{Key: schema.TaskAttempt, Value: attempt - 1}
}

// guardedMany writes ws together. With uniform (every write has the same
// node, guard and update, as TaskStartMany's do) one updateMany does them
// all, far less work for the server than as many statements in a bulk
// write.
func (s *Store) guardedMany(ctx context.Context, what string, ws []guardedWrite, uniform bool) []error {
	ids := make(bson.A, len(ws))
	for i, w := range ws {
		ids[i] = w.p.ID
	}
	var matched int64
	var err error
	if uniform {
		var res *mongo.UpdateResult
		res, err = s.tasks.UpdateMany(ctx, ws[0].filter(ids), ws[0].update)
		if err == nil {
			matched = res.MatchedCount
		}
	} else {
		models := make([]mongo.WriteModel, len(ws))
		for i, w := range ws {
			models[i] = mongo.NewUpdateOneModel().SetFilter(w.filter(nil)).SetUpdate(w.update)
		}
		var res *mongo.BulkWriteResult
		res, err = s.tasks.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
		if err == nil {
			matched = res.MatchedCount
		}
		var bwe mongo.BulkWriteException
		if errors.As(err, &bwe) && bwe.WriteConcernError == nil && len(bwe.WriteErrors) > 0 {
			return s.guardedEach(ctx, what, ws, bwe.WriteErrors)
		}
	}
	return s.guardedResolve(ctx, what, ws, ids, matched, err)
}

// guardedEach gives each of ws, written together in an unordered bulk
// write that the server refused for some (failed, by index), its error:
// the refused ones theirs, the others what their tasks' states say.
func (s *Store) guardedEach(ctx context.Context, what string, ws []guardedWrite, failed []mongo.BulkWriteError) []error {
	errs := make([]error, len(ws))
	for _, we := range failed {
		if we.Index >= 0 && we.Index < len(ws) {
			w := ws[we.Index]
			errs[we.Index] = fmt.Errorf("%s task %s on node %s: %w", what, w.p.ID.Hex(), w.p.Node, we)
		}
	}
	var rest []guardedWrite
	var at []int
	var ids bson.A
	for i, w := range ws {
		if errs[i] == nil {
			rest, at, ids = append(rest, w), append(at, i), append(ids, w.p.ID)
		}
	}
	if len(rest) > 0 {
		for j, err := range s.guardedResolve(ctx, what, rest, ids, -1, nil) { // -1: read every state
			errs[at[j]] = err
		}
	}
	return errs
}

// guardedResolve gives each of ws, written together (ids, in order) with
// err and matched documents, its error: err for all when the write failed;
// otherwise, when fewer than all matched, the tasks' states say which
// guards failed, and whether each failed write had landed already.
func (s *Store) guardedResolve(ctx context.Context, what string, ws []guardedWrite, ids bson.A, matched int64, err error) []error {
	errs := make([]error, len(ws))
	if err != nil {
		for i, w := range ws {
			errs[i] = fmt.Errorf("%s task %s (one of %d written together): %w", what, w.p.ID.Hex(), len(ws), err)
		}
		return errs
	}
	if matched == int64(len(ws)) {
		return errs
	}
	// Some guards failed: the tasks' states say which.
	cur, err := s.tasks.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}},
		options.Find().SetProjection(bson.D{{Key: schema.TaskNode, Value: 1}, {Key: schema.TaskStatus, Value: 1},
			{Key: schema.TaskKill, Value: 1}, {Key: schema.TaskExpiresAt, Value: 1}, {Key: schema.TaskAttempt, Value: 1}}))
	var docs []struct {
		ID        bson.ObjectID `bson:"_id"`
		Node      any           `bson:"node"`
		Status    any           `bson:"status"`
		Kill      any           `bson:"kill"`
		ExpiresAt any           `bson:"expires_at"`
		Attempt   any           `bson:"attempt"`
	}
	if err == nil {
		err = readAllInto(ctx, cur, &docs)
	}
	if err != nil {
		for i, w := range ws {
			errs[i] = fmt.Errorf("%s task %s: %d of %d guards failed and reading which failed: %w", what, w.p.ID.Hex(), int64(len(ws))-matched, len(ws), err)
		}
		return errs
	}
	type state struct {
		node    string
		status  int64
		kill    bool
		expires time.Time
		attempt int64 // ended attempts
	}
	now := make(map[bson.ObjectID]state, len(docs))
	for _, d := range docs {
		st := state{status: math.MinInt64, kill: d.Kill != nil, attempt: -1}
		st.node, _ = d.Node.(string)
		if dt, ok := d.ExpiresAt.(bson.DateTime); ok {
			st.expires = dt.Time()
		}
		switch v := d.Status.(type) {
		case int32:
			st.status = int64(v)
		case int64:
			st.status = v
		}
		switch v := d.Attempt.(type) {
		case int32:
			st.attempt = int64(v)
		case int64:
			st.attempt = v
		case float64:
			st.attempt = int64(v)
		}
		now[d.ID] = st
	}
	for i, w := range ws {
		st, ok := now[w.p.ID]
		wantNode := w.p.Node
		if w.handsBack {
			wantNode = ""
		}
		switch {
		case ok && st.node == wantNode && st.status == int64(w.to) && (w.attempt == 0 || st.attempt == int64(w.attempt)):
			// written, by this write or an earlier attempt of it (a
			// finish guarded by its attempt counted that attempt)
		case ok && w.guard != nil && st.node == w.p.Node && st.status == int64(w.from) && st.kill:
			errs[i] = fmt.Errorf("%s task %s on node %s: %w", what, w.p.ID.Hex(), w.p.Node, ErrKillRequested)
		case ok && w.guard != nil && st.node == w.p.Node && st.status == int64(w.from) && !st.expires.IsZero():
			errs[i] = fmt.Errorf("%s task %s on node %s: %w", what, w.p.ID.Hex(), w.p.Node, ErrExpired)
		default:
			errs[i] = fmt.Errorf("%s task %s on node %s: %w", what, w.p.ID.Hex(), w.p.Node, ErrLostTask)
		}
	}
	return errs
}

// TaskFinishParams are a task's result.
type TaskFinishParams struct {
	ID     bson.ObjectID
	Node   string
	Status schema.Status // must be > 0
	Stdout string
	Stderr string
	// Reason, when the task did not end as its plugin said (killed,
	// timeout): schema.Reason*.
	Reason string
	// Claimed and Started, when known, go into the attempt's record.
	Claimed, Started time.Time
	// Attempt, when set, is the attempt the result is of (plugin.Task's
	// Attempt: the task's ended attempts when it was claimed, plus one):
	// the finish lands only while that many minus one have ended. Node and
	// status alone cannot tell a node's claims of one task apart: a run
	// the node lost (its task recovered as a dead node's, rerun as the next
	// attempt) and claimed again must not end the new claim's attempt with
	// its result. 0: not guarded (a supervisor's spec from before it).
	Attempt int
	// Retry, when set, sends the task back for another attempt instead of
	// finishing it: held (-4) for its Delay, or queued (-2) when that is
	// not above 0, with its tries counted.
	Retry *TaskRetryAt
	// Extra are more fields for the task document, from its plugin
	// (plugin.Result.Extra), written with the result (retry or not). Only
	// schema.TaskResult (an integer) and schema.TaskMixedout (a string)
	// are written; any other key or type is dropped without an error, so
	// a plugin can never overwrite a field of the protocol. Mixedout, a
	// copy of stdout and stderr, is dropped too when stdout, stderr and it
	// together pass the output threshold, or when the document would not
	// fit: it never makes a finish fail or send output to GridFS. Either
	// field not written is removed, so that a document never shows an
	// earlier attempt's.
	Extra bson.D
	// Output, written when the task succeeds (and is not retried): an
	// object or a list of objects. Then, when set with an Output, is the
	// queue they become tasks of (ThenCreate); the finish marks the task
	// then_pending until they exist.
	Output bson.RawValue
	Then   string
}

// extraFields are the keys of TaskFinishParams.Extra a finish writes.
var extraFields = []string{schema.TaskResult, schema.TaskMixedout}

// mixedout is the mixedout in extra, or "".
func mixedout(extra bson.D) string {
	for _, e := range extra {
		if e.Key == schema.TaskMixedout {
			s, _ := e.Value.(string)
			return s
		}
	}
	return ""
}

// finishExtra is what of p.Extra a finish writes; keepMixed false drops
// mixedout whatever its size.
func (s *Store) finishExtra(p TaskFinishParams, keepMixed bool) bson.D {
	var set bson.D
	has := func(k string) bool {
		return slices.ContainsFunc(set, func(e bson.E) bool { return e.Key == k })
	}
	for _, e := range p.Extra {
		if has(e.Key) {
			continue // the first of a key counts
		}
		switch e.Key {
		case schema.TaskResult:
			switch e.Value.(type) {
			case int32, int64, int:
				set = append(set, e)
			}
		case schema.TaskMixedout:
			if m, ok := e.Value.(string); ok && keepMixed && len(p.Stdout)+len(p.Stderr)+len(m) <= s.threshold {
				set = append(set, bson.E{Key: e.Key, Value: validUTF8(m)})
			}
		}
	}
	return set
}

// TaskRetryAt schedules a failed attempt's retry. The store turns Delay
// into the task's not_before by the server's clock, read when the finish
// is written, as every moment several hosts must agree on is: the timers
// judge not_before by that clock, and a node whose own runs ahead or
// behind would otherwise stretch or cut every backoff by its error.
type TaskRetryAt struct {
	Delay time.Duration
	Tries int // failed attempts so far, this one included
}

// retryClock is the moment the retries among ps count their delays from:
// the server's clock (dueClock), read once, and only if one of them is a
// retry.
func (s *Store) retryClock(ctx context.Context, ps ...TaskFinishParams) (time.Time, error) {
	return s.dueClock(ctx, slices.ContainsFunc(ps, func(p TaskFinishParams) bool { return p.Retry != nil }))
}

// finishChange is what the write that ends an attempt does to its task:
// the fields it sets and removes, and the attempt's record it adds to the
// attempts (keeping the last schema.MaxAttemptsKept), the attempt counted
// by one; the status it leaves, and whether it hands the task back.
type finishChange struct {
	set, unset bson.D
	rec        bson.D
	to         schema.Status
	handsBack  bool
}

// finishOf is the change that ends p's attempt: the task finishes (or,
// with Retry, goes back), its attempt is recorded and counted. extra are
// the TaskFinishParams.Extra fields to set (finishExtra); the others of
// extraFields are removed. A retry's delay counts from due (retryClock).
// finishWrite writes it as update operators, finishPiped as a pipeline.
func finishOf(p TaskFinishParams, stdout, stderr any, extra bson.D, now, due time.Time) finishChange {
	var reason any
	if p.Reason != "" {
		reason = p.Reason
	}
	c := finishChange{rec: attemptRecord(p, now), to: p.Status}
	c.set = bson.D{
		{Key: schema.TaskStatus, Value: int32(p.Status)},
		{Key: schema.TaskStdout, Value: stdout},
		{Key: schema.TaskStderr, Value: stderr},
		{Key: schema.TaskMTime, Value: now},
		{Key: schema.TaskReason, Value: reason},
	}
	if p.Retry != nil {
		c.handsBack = true
		c.to = schema.StatusQueued
		if p.Retry.Delay > 0 {
			c.to = schema.StatusBlocked
		}
		c.set[0].Value = int32(c.to)
		c.set[4].Value = schema.ReasonRetrying
		c.set = append(c.set,
			bson.E{Key: schema.TaskNode, Value: schema.Unclaimed},
			bson.E{Key: schema.TaskNotBefore, Value: due.Add(p.Retry.Delay).UTC().Truncate(time.Millisecond)},
			bson.E{Key: schema.TaskTries, Value: p.Retry.Tries})
	}
	if p.Retry == nil {
		// As 4.103's task_runner marks a task whose result is written.
		c.set = append(c.set, bson.E{Key: schema.TaskComplete, Value: true})
	} else {
		c.unset = append(c.unset, bson.E{Key: schema.TaskComplete, Value: ""})
	}
	if p.Retry == nil && p.Status == schema.StatusSucceeded && p.Output.Type != 0 {
		c.set = append(c.set, bson.E{Key: schema.TaskOutput, Value: p.Output})
		if p.Then != "" {
			c.set = append(c.set, bson.E{Key: schema.TaskThenPending, Value: p.Then})
		}
	} else {
		c.unset = append(c.unset, bson.E{Key: schema.TaskOutput, Value: ""})
	}
	for _, k := range extraFields {
		if !slices.ContainsFunc(extra, func(e bson.E) bool { return e.Key == k }) {
			c.unset = append(c.unset, bson.E{Key: k, Value: ""})
		}
	}
	c.set = append(c.set, extra...)
	return c
}

// finishWrite is the guarded write of finishOf's change, as a pipeline
// that says where the task stood (finishChange.pipeline).
func finishWrite(p TaskFinishParams, stdout, stderr any, extra bson.D, now, due time.Time) guardedWrite {
	c := finishOf(p, stdout, stderr, extra, now, due)
	w := c.guarded(p)
	w.update = c.pipeline(p.Node)
	return w
}

// pipeline is c as an update pipeline of one task, as update operators
// would change it ($set and $unset; $inc of attempt; $push to attempts,
// keeping the last schema.MaxAttemptsKept), that also writes
// schema.TaskPrior (priorSet; node is the write's filter's). A null
// attempt or attempts counts as none.
func (c finishChange) pipeline(node string) bson.A {
	exprs := make(bson.D, 0, len(c.set)+2)
	for _, e := range c.set {
		exprs = append(exprs, bson.E{Key: e.Key, Value: literal(e.Value)})
	}
	exprs = append(exprs, bson.E{Key: schema.TaskAttempt, Value: attemptCounted}, bson.E{Key: schema.TaskAttempts, Value: attemptsWith(literal(c.rec))})
	unset := make([]string, len(c.unset))
	for i, e := range c.unset {
		unset[i] = e.Key
	}
	return pipedSet(node, exprs, unset)
}

// attemptCounted is the task's attempt plus one (none: 0), and
// attemptsWith its attempts with rec appended, keeping the last
// schema.MaxAttemptsKept: pipeline expressions of a finish.
var attemptCounted = bson.D{{Key: "$add", Value: bson.A{bson.D{{Key: "$ifNull", Value: bson.A{"$" + schema.TaskAttempt, 0}}}, 1}}}

func attemptsWith(rec any) bson.D {
	return bson.D{{Key: "$slice", Value: bson.A{
		bson.D{{Key: "$concatArrays", Value: bson.A{bson.D{{Key: "$ifNull", Value: bson.A{"$" + schema.TaskAttempts, bson.A{}}}}, bson.A{rec}}}},
		-schema.MaxAttemptsKept,
	}}}
}

// guarded is the guarded write of c on p's task, without its update.
func (c finishChange) guarded(p TaskFinishParams) guardedWrite {
	return guardedWrite{p: TaskTransitionParams{ID: p.ID, Node: p.Node}, from: schema.StatusRunning, to: c.to, handsBack: c.handsBack, attempt: p.Attempt}
}

// attemptRecord is the entry of p's attempt in the task's attempts.
func attemptRecord(p TaskFinishParams, now time.Time) bson.D {
	rec := bson.D{{Key: "node", Value: p.Node}}
	if !p.Claimed.IsZero() {
		rec = append(rec, bson.E{Key: "claimed", Value: p.Claimed.UTC().Truncate(time.Millisecond)})
	}
	if !p.Started.IsZero() {
		rec = append(rec, bson.E{Key: "started", Value: p.Started.UTC().Truncate(time.Millisecond)})
	}
	rec = append(rec, bson.E{Key: "finished", Value: now}, bson.E{Key: "status", Value: int32(p.Status)})
	if p.Reason != "" {
		rec = append(rec, bson.E{Key: "reason", Value: p.Reason})
	}
	return rec
}

// TaskFinish records a running task's result with an update guarded by
// {_id, node, status: 0}, so a node that lost its task can never overwrite a
// newer owner. Output over the store's threshold goes to GridFS (stdout
// first, as Disbatch 4 does); if the document would still be too large, both
// go to GridFS and mixedout is dropped, so a task never stays running
// because its output did not fit. Mixedout itself never goes to GridFS:
// see TaskFinishParams.Extra.
func (s *Store) TaskFinish(ctx context.Context, p TaskFinishParams) error {
	if !p.Status.Finished() {
		return fmt.Errorf("finish task %s: status %d is not a finished status (> 0)", p.ID.Hex(), p.Status)
	}
	stdoutGFS, stderrGFS := false, false
	if len(p.Stdout)+len(p.Stderr) > s.threshold {
		stdoutGFS = true
		stderrGFS = len(p.Stderr) > s.threshold
	}
	extra := s.finishExtra(p, true)
	err := s.finish(ctx, p, stdoutGFS, stderrGFS, extra)
	if isTooLarge(err) {
		if fewer := s.finishExtra(p, false); !(stdoutGFS && stderrGFS) || len(fewer) < len(extra) {
			err = s.finish(ctx, p, true, true, fewer)
		}
	}
	if isTooLarge(err) && p.Output.Type != 0 {
		// The output does not fit beside the parameters, and it has no
		// other place: the task fails saying so (it stayed running, its
		// finish retried for as long as its node ran).
		f := p
		f.Status, f.Output, f.Then = schema.StatusFailed, bson.RawValue{}, ""
		f.Stderr += fmt.Sprintf("\nits output (%d bytes) does not fit in the task's document beside its parameters (MongoDB's 16 MiB): not kept\n", len(p.Output.Value))
		err = s.finish(ctx, f, true, true, s.finishExtra(f, false))
	}
	return err
}

func (s *Store) finish(ctx context.Context, p TaskFinishParams, stdoutGFS, stderrGFS bool, extra bson.D) error {
	var written []bson.ObjectID
	value := func(name, text string, gfs bool) (any, error) {
		if !gfs {
			return validUTF8(text), nil
		}
		id, err := s.outputWrite(ctx, p.ID, name, text)
		if err != nil {
			return nil, err
		}
		written = append(written, id)
		return id, nil
	}
	stdout, err := value(schema.TaskStdout, p.Stdout, stdoutGFS)
	if err != nil {
		return fmt.Errorf("finish task %s: %w", p.ID.Hex(), err)
	}
	stderr, err := value(schema.TaskStderr, p.Stderr, stderrGFS)
	var due time.Time
	if err == nil {
		due, err = s.retryClock(ctx, p)
	}
	if err == nil {
		err = s.guardedMany(ctx, "finish", []guardedWrite{finishWrite(p, stdout, stderr, extra, s.nowMS(), due)}, false)[0]
	}
	if err != nil && len(written) > 0 {
		// The files belong to no task: remove them with a context that
		// outlives a cancelled caller.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = s.outputDelete(cctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: written}}}})
	}
	return err
}

// TaskFailParams fail a task this node holds in status From, e.g. a claimed
// task whose document cannot be understood.
type TaskFailParams struct {
	ID bson.ObjectID
	// DocID, when set, is the task's _id as stored, for a document whose
	// _id is not an ObjectId (ID is then ignored).
	DocID  any
	Node   string
	From   schema.Status
	Reason string
}

// TaskFail sets status 2 (failed) and stderr to the reason, guarded by
// {_id, node, status: From}.
func (s *Store) TaskFail(ctx context.Context, p TaskFailParams) error {
	var id any = p.ID
	if p.DocID != nil {
		id = p.DocID
	}
	return s.guardedID(ctx, "fail", id, p.Node, p.From, bson.D{
		{Key: schema.TaskStatus, Value: int32(schema.StatusFailed)},
		{Key: schema.TaskStderr, Value: validUTF8(p.Reason)},
		{Key: schema.TaskMTime, Value: s.nowMS()},
	})
}

// TaskListClaimedParams select one node's claimed (-1) tasks.
type TaskListClaimedParams struct {
	Node string
	// Running lists Node's tasks in status 0 instead (claimed straight
	// into running), by the same mtime rule.
	Running bool
	// ClaimedFor: only claims older than this, by this store's clock
	// (Options.Now), which wrote their mtime when Node claimed them.
	ClaimedFor time.Duration
	// Limit bounds the ids returned, in _id order after After (zero:
	// from the first): a caller pages through them over its calls.
	Limit int64
	After bson.ObjectID
}

// TaskListClaimed returns the ids of Node's tasks in status -1 claimed more
// than ClaimedFor ago, in _id order, for a node to find claims it does not
// know it made (the server applied a claim whose answer was lost).
func (s *Store) TaskListClaimed(ctx context.Context, p TaskListClaimedParams) ([]bson.ObjectID, error) {
	o := options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetSort(bson.D{{Key: "_id", Value: 1}})
	if p.Limit > 0 {
		o.SetLimit(p.Limit)
	}
	filter := bson.D{
		{Key: schema.TaskNode, Value: p.Node},
		{Key: schema.TaskStatus, Value: int32(claimTo(p.Running))},
		{Key: schema.TaskMTime, Value: bson.D{{Key: "$lt", Value: s.nowMS().Add(-p.ClaimedFor)}}},
	}
	if !p.After.IsZero() {
		filter = append(filter, bson.E{Key: "_id", Value: bson.D{{Key: "$gt", Value: p.After}}})
	}
	cur, err := s.tasks.Find(ctx, filter, o)
	if err != nil {
		return nil, fmt.Errorf("list tasks claimed by %s: %w", p.Node, err)
	}
	var docs []struct {
		ID any `bson:"_id"`
	}
	if err := readAllInto(ctx, cur, &docs); err != nil {
		return nil, fmt.Errorf("list tasks claimed by %s: %w", p.Node, err)
	}
	ids := make([]bson.ObjectID, 0, len(docs))
	for _, d := range docs {
		if id, ok := d.ID.(bson.ObjectID); ok {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// TaskUnstart hands a task this node marked running (0) but never started
// back to the queue: {_id, node, status: 0} to node -1, status -2. Only for
// a task whose plugin certainly did not run.
func (s *Store) TaskUnstart(ctx context.Context, p TaskTransitionParams) error {
	return s.guarded(ctx, "hand back", p, schema.StatusRunning, bson.D{
		{Key: schema.TaskNode, Value: schema.Unclaimed},
		{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
		{Key: schema.TaskMTime, Value: s.nowMS()},
	})
}

// TaskOrphanNodeParams name a node whose unfinished tasks are orphans.
type TaskOrphanNodeParams struct {
	Node string
	// Except are tasks left alone: the node adopts them (they still run
	// under their supervisors).
	Except []bson.ObjectID
}

// TaskOrphanNode settles every task of Node in status -1 or 0: at start-up
// a node's own such tasks were left by a previous run (seed 000). They are
// orphaned (-6), except that those an operator asked to kill finish as
// killed and running ones of a queue with rerun_orphans go back to the
// queue as a new attempt. The filters are the guard: a task that moved on
// in the meantime is left alone. It returns how many were settled.
func (s *Store) TaskOrphanNode(ctx context.Context, p TaskOrphanNodeParams) (int64, error) {
	filter := bson.D{{Key: schema.TaskNode, Value: p.Node}}
	if len(p.Except) > 0 {
		filter = append(filter, bson.E{Key: "_id", Value: bson.D{{Key: "$nin", Value: p.Except}}})
	}
	gone, err := s.settleGone(ctx, filter, true)
	if err != nil {
		return 0, fmt.Errorf("settle node %s's unfinished tasks: %w", p.Node, err)
	}
	n, err := s.orphan(ctx, append(filter, bson.E{Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)}))
	return n + gone.Killed + gone.Rerun + gone.Orphaned, err
}

// TaskOrphanStaleParams select claimed tasks whose claim is too old.
type TaskOrphanStaleParams struct {
	// OlderThan is the age of the claim (its mtime, by the server's clock).
	OlderThan time.Duration
}

// TaskOrphanStale sets status -6 on tasks claimed (-1) whose mtime is older
// than OlderThan by the server's clock ($$NOW): a claim is turned into a run
// within milliseconds, so an old one means its node died between the two
// (seed 000's 5-minute rule). The mtime was written by the claiming node's
// clock; minutes of margin make seconds of skew irrelevant. Tasks whose
// mtime is not a date (epoch seconds from old writers) are left alone.
func (s *Store) TaskOrphanStale(ctx context.Context, p TaskOrphanStaleParams) (int64, error) {
	if p.OlderThan <= 0 {
		return 0, errors.New("orphan stale claims: the age must be positive")
	}
	return s.orphan(ctx, bson.D{
		{Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)},
		{Key: schema.TaskMTime, Value: bson.D{{Key: "$type", Value: "date"}}},
		{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{
			"$" + schema.TaskMTime,
			bson.D{{Key: "$subtract", Value: bson.A{"$$NOW", p.OlderThan.Milliseconds()}}},
		}}}},
	})
}

func (s *Store) orphan(ctx context.Context, filter bson.D) (int64, error) {
	res, err := s.tasks.UpdateMany(ctx, filter, setPiped("", bson.D{
		{Key: schema.TaskStatus, Value: int32(schema.StatusOrphaned)},
		{Key: schema.TaskMTime, Value: s.nowMS()},
	}))
	if err != nil {
		return 0, fmt.Errorf("orphan tasks: %w", err)
	}
	return res.ModifiedCount, nil
}
