package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// Task graphs (seed 002): a task names its parents; it is held at -4 with
// awaiting_parents until every parent has succeeded, then queued by the
// leader's graph duty (package graph), which reads the parents' finish
// events (StreamLeader, EndsTask) and calls TaskGraphSettle, and sweeps with
// TaskGraphSweep. A parent that ends otherwise finishes its waiting
// descendants unrun (status 2, reason parent_failed), except children with
// on_parent_failure "run", which are queued once every parent has ended.
// Retrying a parent (TaskRetry) blocks again the descendants that ended
// with parent_failed. docs/scheduling.md, "Task graphs", has the design.

// ErrInvalidGraph: a graph insert was refused before anything was
// written; the error is a *GraphInputError that says which task and why.
var ErrInvalidGraph = errors.New("invalid task graph")

// GraphInputError is a task of a graph insert that cannot be inserted.
type GraphInputError struct {
	Task int    // its index in TaskInsertGraphParams.Tasks
	Ref  string // its GraphTask.Ref, if any
	Kind GraphErrorKind
	Msg  string
}

// GraphErrorKind says what is wrong with a graph, for callers that answer
// differently (an HTTP status).
type GraphErrorKind int

const (
	// GraphInvalidTask: a field of the task is wrong in itself (too many
	// parents, an on_parent_failure, a control field, no queue).
	GraphInvalidTask GraphErrorKind = iota
	// GraphUnknown: a parent or a queue it names does not exist.
	GraphUnknown
	// GraphConflict: the tasks contradict each other or the stored ones
	// (a cycle, a self-parent, an id given twice or already taken).
	GraphConflict
)

func (e *GraphInputError) Error() string {
	if e.Ref != "" {
		return fmt.Sprintf("task %d (ref %q): %s", e.Task, e.Ref, e.Msg)
	}
	return fmt.Sprintf("task %d: %s", e.Task, e.Msg)
}

// Unwrap makes errors.Is(err, ErrInvalidGraph) hold.
func (e *GraphInputError) Unwrap() error { return ErrInvalidGraph }

// GraphTask is one task of a graph insert.
type GraphTask struct {
	// ID is the task's _id, chosen by the caller so that children in the
	// same insert can name it; zero: one is chosen here.
	ID         bson.ObjectID
	Queue      bson.ObjectID
	Parameters bson.Raw
	// Parents are tasks of this insert or already stored, of any queues
	// (at most schema.MaxParents; duplicates count once).
	Parents []bson.ObjectID
	// OnParentFailure is "" or schema.OnParentFailureFail (finish unrun
	// with reason parent_failed when a parent fails), or
	// schema.OnParentFailureRun (queue it once every parent has ended).
	OnParentFailure string
	Control         *TaskInsertControl
	// Ref names the task in error messages (the submitter's local ref).
	Ref string
}

// MaxGraphInsert bounds the tasks of one graph insert: 50,000 tasks
// insert in a few seconds, well within a transaction's lifetime.
const MaxGraphInsert = 50000

// TaskInsertGraphParams are the tasks of one graph insert.
type TaskInsertGraphParams struct {
	Tasks []GraphTask
	// TraceParent and TraceState, when set, are written to every task.
	TraceParent string
	TraceState  string
}

// TaskInsertGraph inserts tasks that may name parents, after checking the
// whole graph: every queue exists; every parent is a task of this insert
// or a stored task of an existing queue; no task is its own parent; at most
// schema.MaxParents parents each; no cycle. Nothing is inserted when any
// check fails (the error wraps ErrInvalidGraph and is a
// *GraphInputError), and the insert is one transaction: all or nothing,
// of at most MaxGraphInsert tasks (a transaction must commit within the
// server's transactionLifetimeLimitSeconds, 60 by default). A task whose
// parents have all succeeded already is inserted as TaskInsertMany would (queued, or held for its not_before);
// the others are held at -4 with awaiting_parents. After the insert, the
// held tasks are settled once (TaskGraphSettle's rules), so a parent that
// finished while they were being inserted, whose finish event found no
// child yet, does not leave them waiting for the sweep. It returns the ids
// in input order.
func (s *Store) TaskInsertGraph(ctx context.Context, p TaskInsertGraphParams) ([]bson.ObjectID, error) {
	if len(p.Tasks) == 0 {
		return nil, nil
	}
	if len(p.Tasks) > MaxGraphInsert {
		return nil, &GraphInputError{Task: MaxGraphInsert, Ref: p.Tasks[MaxGraphInsert].Ref, Kind: GraphInvalidTask,
			Msg: fmt.Sprintf("a graph of %d tasks; one insert takes at most %d (insert it in parts: a later part may name an earlier part's tasks by id)", len(p.Tasks), MaxGraphInsert)}
	}
	now := s.nowMS()
	badAs := func(kind GraphErrorKind, i int, format string, args ...any) error {
		return &GraphInputError{Task: i, Ref: p.Tasks[i].Ref, Kind: kind, Msg: fmt.Sprintf(format, args...)}
	}
	bad := func(i int, format string, args ...any) error { return badAs(GraphInvalidTask, i, format, args...) }
	ids := make([]bson.ObjectID, len(p.Tasks))
	index := make(map[bson.ObjectID]int, len(p.Tasks))
	for i, t := range p.Tasks {
		ids[i] = t.ID
		if ids[i].IsZero() {
			ids[i] = bson.NewObjectID()
		}
		if j, dup := index[ids[i]]; dup {
			return nil, badAs(GraphConflict, i, "id %s is also task %d's", ids[i].Hex(), j)
		}
		index[ids[i]] = i
	}
	parents := make([][]bson.ObjectID, len(p.Tasks))
	isParent := make([]bool, len(p.Tasks)) // named by a task of the insert
	external := map[bson.ObjectID][]int{}  // stored parents -> the tasks naming them
	queues := map[bson.ObjectID]bool{}     // the tasks' and their stored parents'
	for i, t := range p.Tasks {
		if t.Queue.IsZero() {
			return nil, bad(i, "no queue")
		}
		queues[t.Queue] = true
		if err := schema.ValidOnParentFailure(t.OnParentFailure); err != nil {
			return nil, bad(i, "%v", err)
		}
		if t.Control != nil {
			if err := t.Control.Validate(); err != nil {
				return nil, bad(i, "%v", err)
			}
		}
		if len(t.Parents) > schema.MaxParents {
			return nil, bad(i, "%d parents; a task may have at most %d", len(t.Parents), schema.MaxParents)
		}
		seen := make(map[bson.ObjectID]bool, len(t.Parents))
		for _, par := range t.Parents {
			switch {
			case par.IsZero():
				return nil, bad(i, "a parent id is empty")
			case par == ids[i]:
				return nil, badAs(GraphConflict, i, "a task cannot be its own parent")
			case seen[par]:
				continue
			}
			seen[par] = true
			parents[i] = append(parents[i], par)
			if j, in := index[par]; in {
				isParent[j] = true
			} else {
				external[par] = append(external[par], i)
			}
		}
	}
	if cycle := findCycle(ids, parents, index); cycle != nil {
		names := make([]string, len(cycle))
		for k, i := range cycle {
			names[k] = taskName(i, p.Tasks[i].Ref)
		}
		return nil, badAs(GraphConflict, cycle[0], "a cycle of parents: %s (each waits for the next)", strings.Join(names, " -> "))
	}
	// Stored parents: they exist, in queues that exist; their states say
	// whether a child may be queued at once.
	extIDs := make([]bson.ObjectID, 0, len(external))
	for id := range external {
		extIDs = append(extIDs, id)
	}
	slices.SortFunc(extIDs, func(a, b bson.ObjectID) int { return strings.Compare(a.Hex(), b.Hex()) })
	states, err := s.statesByID(ctx, extIDs)
	if err != nil {
		return nil, fmt.Errorf("insert task graph: %w", err)
	}
	for _, id := range extIDs {
		st, ok := states[id]
		if !ok {
			return nil, badAs(GraphUnknown, external[id][0], "parent %s: no such task", id.Hex())
		}
		queues[st.Queue] = true
	}
	known, err := s.queuesExisting(ctx, queues)
	if err != nil {
		return nil, fmt.Errorf("insert task graph: %w", err)
	}
	for i, t := range p.Tasks {
		if !known[t.Queue] {
			return nil, badAs(GraphUnknown, i, "queue %s does not exist", t.Queue.Hex())
		}
	}
	for i := range p.Tasks {
		for _, par := range parents[i] {
			if st, ok := states[par]; ok && !known[st.Queue] {
				return nil, badAs(GraphUnknown, i, "parent %s is in queue %s, which does not exist (it can never run)", par.Hex(), st.Queue.Hex())
			}
		}
	}
	taken, err := s.tasksExisting(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("insert task graph: %w", err)
	}
	if len(taken) > 0 {
		return nil, badAs(GraphConflict, index[taken[0]], "id %s is already a stored task's", taken[0].Hex())
	}

	docs := make([]any, len(p.Tasks))
	var held []bson.ObjectID
	delays := false
	for _, t := range p.Tasks {
		delays = delays || (t.Control != nil && !t.Control.NotBefore.IsZero())
	}
	due, err := s.dueClock(ctx, delays)
	if err != nil {
		return nil, fmt.Errorf("insert a graph: %w", err)
	}
	for i, t := range p.Tasks {
		awaiting := false
		for _, par := range parents[i] {
			if st, ok := states[par]; !ok || st.Status != schema.StatusSucceeded {
				awaiting = true // a parent of this insert, or a stored one not succeeded
			}
		}
		nt := newTask{Queue: t.Queue, Control: t.Control, TraceParent: p.TraceParent, TraceState: p.TraceState}
		d, err := nt.doc(ids[i], t.Parameters, now, due)
		if err != nil {
			return nil, bad(i, "%v", err)
		}
		if len(parents[i]) > 0 {
			d = append(d, bson.E{Key: schema.TaskParents, Value: anyIDs(parents[i])})
		}
		if t.OnParentFailure != "" {
			d = append(d, bson.E{Key: schema.TaskOnParentFailure, Value: t.OnParentFailure})
		}
		if isParent[i] {
			d = append(d, bson.E{Key: schema.TaskHasChildren, Value: true})
		}
		if awaiting {
			setField(d, schema.TaskStatus, int32(schema.StatusBlocked))
			d = append(d, bson.E{Key: schema.TaskAwaitingParents, Value: true})
			held = append(held, ids[i])
		}
		docs[i] = d
	}
	// The stored parents still to end are marked first, so that their
	// nodes settle the new children when they finish them. The mark is
	// outside the insert's transaction: a running parent's own writes
	// would conflict with it there, and a mark on a task that ends up
	// with no children (the insert fails) costs its node one empty settle.
	// A parent that ends before its node sees the mark is settled by the
	// frontier settle below, or by the leader's graph duty.
	var unended bson.A
	for _, id := range extIDs {
		if !schema.ParentEnded(states[id].Status) {
			unended = append(unended, id)
		}
	}
	if len(unended) > 0 {
		if _, err := s.tasks.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: unended}}}},
			bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskHasChildren, Value: true}}}}); err != nil {
			return nil, fmt.Errorf("insert task graph: mark the stored parents: %w", err)
		}
	}
	// One transaction: a server error partway (a failover, a duplicate
	// id inserted since the check, a validator) leaves no part of the
	// graph, whose children could wait for parents never inserted.
	if err := s.inTxn(ctx, func(ctx context.Context) error {
		_, err := s.tasks.InsertMany(ctx, docs)
		return err
	}); err != nil {
		return nil, fmt.Errorf("insert %d tasks of a graph: %w", len(docs), err)
	}
	if len(held) > 0 {
		var res TaskGraphResult
		if err := s.graphSettleFrontier(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(held)}}}}, &res); err != nil {
			return ids, fmt.Errorf("inserted %d tasks; settling the held ones whose parents already ended failed (the leader's sweep will): %w", len(ids), err)
		}
	}
	return ids, nil
}

func taskName(i int, ref string) string {
	if ref != "" {
		return fmt.Sprintf("%q", ref)
	}
	return fmt.Sprintf("task %d", i)
}

func setField(d bson.D, key string, v any) {
	for i := range d {
		if d[i].Key == key {
			d[i].Value = v
			return
		}
	}
}

// findCycle returns the indexes of tasks forming a cycle through their
// parents within the insert (a path whose last names the first as a
// descendant), or nil.
func findCycle(ids []bson.ObjectID, parents [][]bson.ObjectID, index map[bson.ObjectID]int) []int {
	const (
		unseen = iota
		onPath
		done
	)
	state := make([]int, len(ids))
	var path []int
	var visit func(i int) []int
	visit = func(i int) []int {
		state[i] = onPath
		path = append(path, i)
		for _, par := range parents[i] {
			j, in := index[par]
			if !in {
				continue
			}
			switch state[j] {
			case onPath:
				start := slices.Index(path, j)
				return append(slices.Clone(path[start:]), j)
			case unseen:
				if c := visit(j); c != nil {
					return c
				}
			}
		}
		path = path[:len(path)-1]
		state[i] = done
		return nil
	}
	for i := range ids {
		if state[i] == unseen {
			if c := visit(i); c != nil {
				return c
			}
		}
	}
	return nil
}

func anyIDs(ids []bson.ObjectID) bson.A {
	a := make(bson.A, len(ids))
	for i, id := range ids {
		a[i] = id
	}
	return a
}

// queuesExisting says which of the queues exist.
func (s *Store) queuesExisting(ctx context.Context, queues map[bson.ObjectID]bool) (map[bson.ObjectID]bool, error) {
	ids := make([]bson.ObjectID, 0, len(queues))
	for q := range queues {
		ids = append(ids, q)
	}
	found, err := s.findIDs(ctx, s.queues, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(ids)}}}})
	if err != nil {
		return nil, fmt.Errorf("read %d queues: %w", len(ids), err)
	}
	out := make(map[bson.ObjectID]bool, len(found))
	for _, id := range found {
		out[id] = true
	}
	return out, nil
}

// tasksExisting returns those of ids that are stored tasks' ids.
func (s *Store) tasksExisting(ctx context.Context, ids []bson.ObjectID) ([]bson.ObjectID, error) {
	var out []bson.ObjectID
	for chunk := range slices.Chunk(ids, idChunk) {
		found, err := s.findIDs(ctx, s.tasks, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(chunk)}}}})
		if err != nil {
			return nil, fmt.Errorf("check %d new task ids: %w", len(ids), err)
		}
		out = append(out, found...)
	}
	return out, nil
}

// TaskGraphResult says what settling children did.
type TaskGraphResult struct {
	// Queued: their parents allow it (all succeeded, or all ended for
	// on_parent_failure "run"): queued (-2).
	Queued int64
	// Held: their parents allow it but their not_before is ahead: left
	// at -4 without awaiting_parents, for the timers.
	Held int64
	// Failed: a parent ended otherwise than succeeded: finished unrun
	// (status 2, reason parent_failed), and so, in turn, their own
	// waiting descendants.
	Failed int64
	// QueuedIn are the queues children were queued in (each once).
	QueuedIn []bson.ObjectID
}

func (r *TaskGraphResult) add(o TaskGraphResult) {
	r.Queued += o.Queued
	r.Held += o.Held
	r.Failed += o.Failed
	for _, q := range o.QueuedIn {
		r.queuedIn(q)
	}
}

func (r *TaskGraphResult) queuedIn(q bson.ObjectID) {
	if !slices.Contains(r.QueuedIn, q) {
		r.QueuedIn = append(r.QueuedIn, q)
	}
}

// TaskGraphSettleParams name tasks that ended (or were deleted): their
// waiting children are settled.
type TaskGraphSettleParams struct {
	Parents []bson.ObjectID
	// Ended, when set, is how every one of Parents ended, as the caller
	// knows it (the node that finished them): they are not read again.
	Ended *TaskState
	// Waiting, when set, are Parents' waiting children as read by
	// TaskGraphWaiting (for one parent, alongside its finish write): they
	// are not read again. A child inserted after that read is not
	// settled here; the leader's graph duty, which hears the finish,
	// settles it.
	Waiting *GraphWaiting
}

// GraphWaiting are a task's children held awaiting their parents, as read
// at one moment (TaskGraphWaiting).
type GraphWaiting struct {
	parent   bson.ObjectID
	children []graphChild
}

// TaskGraphWaiting reads the children of parent held awaiting their
// parents, for a TaskGraphSettle of parent that should not wait for the
// read: the node reads them while it writes the parent's finish.
func (s *Store) TaskGraphWaiting(ctx context.Context, parent bson.ObjectID) (*GraphWaiting, error) {
	children, err := s.graphWaiting(ctx, bson.D{{Key: schema.TaskParents, Value: parent}}, nil)
	if err != nil {
		return nil, err
	}
	return &GraphWaiting{parent: parent, children: children}, nil
}

// TaskGraphSettle settles the children of Parents held awaiting their
// parents, by the states of all their parents: every parent succeeded
// (status 1): queued, or held for the timers when their not_before is
// ahead; a parent ended otherwise (finished with another status, orphaned
// at -6, or deleted): finished unrun with reason parent_failed and a line
// in stderr naming the parent, and then their own waiting children in
// turn, transitively; but a child with on_parent_failure "run" is queued
// once every parent has ended, however. Children whose parents still run
// are left alone. Every write is guarded by {status -4,
// awaiting_parents}, so concurrent settles (a sweep, an insert) change a
// child once.
func (s *Store) TaskGraphSettle(ctx context.Context, p TaskGraphSettleParams) (TaskGraphResult, error) {
	var res TaskGraphResult
	if len(p.Parents) == 0 {
		return res, nil
	}
	var known map[bson.ObjectID]TaskState
	if p.Ended != nil {
		known = make(map[bson.ObjectID]TaskState, len(p.Parents))
		for _, id := range p.Parents {
			st := *p.Ended
			st.ID, st.Found = id, true
			known[id] = st
		}
	}
	if w := p.Waiting; w != nil {
		if len(p.Parents) != 1 || p.Parents[0] != w.parent {
			return res, fmt.Errorf("settle task graph: the waiting children read are %s's, not those of %d parents", w.parent.Hex(), len(p.Parents))
		}
		return res, s.graphSettleCascade(ctx, w.children, known, &res)
	}
	for chunk := range slices.Chunk(p.Parents, idChunk) {
		children, err := s.graphWaiting(ctx, bson.D{{Key: schema.TaskParents, Value: bson.D{{Key: "$in", Value: anyIDs(chunk)}}}}, nil)
		if err != nil {
			return res, err
		}
		if err := s.graphSettleCascade(ctx, children, known, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// TaskGraphSweep settles every task held awaiting its parents, in pages
// of _id order: the safety net for finish events nobody acted on (the
// leader died between a parent's finish and its children's settling, or
// its stream lost its position).
func (s *Store) TaskGraphSweep(ctx context.Context) (TaskGraphResult, error) {
	var res TaskGraphResult
	var last bson.ObjectID
	for {
		f := bson.D{}
		if !last.IsZero() {
			f = bson.D{{Key: "_id", Value: bson.D{{Key: "$gt", Value: last}}}}
		}
		page, err := s.graphWaiting(ctx, f, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(graphPage))
		if err != nil {
			return res, fmt.Errorf("sweep task graphs: %w", err)
		}
		if len(page) == 0 {
			return res, nil
		}
		last = page[len(page)-1].ID
		if err := s.graphSettleCascade(ctx, page, nil, &res); err != nil {
			return res, fmt.Errorf("sweep task graphs: %w", err)
		}
		if len(page) < graphPage {
			return res, nil
		}
	}
}

// graphPage is how many waiting children one read takes.
const graphPage = 1000

// graphChild is a child held awaiting its parents.
type graphChild struct {
	ID        bson.ObjectID
	Queue     bson.ObjectID
	Parents   []bson.ObjectID
	Run       bool // on_parent_failure run
	NotBefore time.Time
}

// awaiting is the filter of children held awaiting their parents.
var awaiting = bson.D{
	{Key: schema.TaskStatus, Value: int32(schema.StatusBlocked)},
	{Key: schema.TaskAwaitingParents, Value: true},
}

// TaskGraphAnyWaiting says whether any task is held awaiting its parents
// (one read of the {awaiting_parents, not_before} index).
func (s *Store) TaskGraphAnyWaiting(ctx context.Context) (bool, error) {
	err := s.tasks.FindOne(ctx, awaiting, options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, mongo.ErrNoDocuments):
		return false, nil
	}
	return false, fmt.Errorf("read whether a task waits on its parents: %w", err)
}

// graphWaiting reads the children within filter held awaiting parents.
func (s *Store) graphWaiting(ctx context.Context, filter bson.D, o *options.FindOptionsBuilder) ([]graphChild, error) {
	if o == nil {
		o = options.Find()
	}
	o.SetProjection(bson.D{{Key: schema.TaskQueue, Value: 1}, {Key: schema.TaskParents, Value: 1}, {Key: schema.TaskOnParentFailure, Value: 1}, {Key: schema.TaskNotBefore, Value: 1}})
	cur, err := s.tasks.Find(ctx, append(append(bson.D{}, filter...), awaiting...), o)
	if err != nil {
		return nil, fmt.Errorf("read waiting children: %w", err)
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	var out []graphChild
	for r.Next() {
		raw := cur.Current
		var c graphChild
		c.ID, _ = raw.Lookup("_id").ObjectIDOK()
		if c.ID.IsZero() {
			continue // tasks of graphs have ObjectIds
		}
		c.Queue, _ = raw.Lookup(schema.TaskQueue).ObjectIDOK()
		c.Parents = schema.DecodeParents(raw.Lookup(schema.TaskParents))
		opf, _ := raw.Lookup(schema.TaskOnParentFailure).StringValueOK()
		c.Run = opf == schema.OnParentFailureRun
		if t, ok := raw.Lookup(schema.TaskNotBefore).TimeOK(); ok {
			c.NotBefore = t
		}
		out = append(out, c)
	}
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("read waiting children: %w", err)
	}
	return out, nil
}

// graphSettleFrontier settles the waiting children within filter
// (graphSettleCascade).
func (s *Store) graphSettleFrontier(ctx context.Context, filter bson.D, res *TaskGraphResult) error {
	children, err := s.graphWaiting(ctx, filter, nil)
	if err != nil {
		return err
	}
	return s.graphSettleCascade(ctx, children, nil, res)
}

// graphSettleCascade settles waiting children, then, through
// TaskGraphSettle, the children of those it failed, until none fails.
// known are parents' states already known (not read again).
func (s *Store) graphSettleCascade(ctx context.Context, children []graphChild, known map[bson.ObjectID]TaskState, res *TaskGraphResult) error {
	var failed []bson.ObjectID
	for chunk := range slices.Chunk(children, graphPage) {
		f, err := s.graphSettleChildren(ctx, chunk, known, res)
		if err != nil {
			return err
		}
		failed = append(failed, f...)
	}
	if len(failed) == 0 {
		return nil
	}
	// They were just failed with parent_failed, but they are read again:
	// a retry of their ancestor may have blocked them anew since, and then
	// their children must wait rather than fail.
	more, err := s.TaskGraphSettle(ctx, TaskGraphSettleParams{Parents: failed})
	res.add(more)
	return err
}

// graphSettleChildren decides and writes each child's fate; it returns
// the children it failed (their own children are next).
func (s *Store) graphSettleChildren(ctx context.Context, children []graphChild, known map[bson.ObjectID]TaskState, res *TaskGraphResult) ([]bson.ObjectID, error) {
	var ids []bson.ObjectID
	seen := map[bson.ObjectID]bool{}
	for _, c := range children {
		for _, par := range c.Parents {
			if _, ok := known[par]; !ok && !seen[par] {
				seen[par] = true
				ids = append(ids, par)
			}
		}
	}
	states, err := s.statesByID(ctx, ids)
	if err != nil {
		return nil, err
	}
	stateOf := func(id bson.ObjectID) (TaskState, bool) {
		if st, ok := known[id]; ok {
			return st, true
		}
		st, ok := states[id]
		return st, ok
	}
	var queue, hold []bson.ObjectID
	var fails []mongo.WriteModel
	var failedIDs, failing []bson.ObjectID
	// A child whose parents let it go waits for its not_before by the
	// server's clock (dueClock), read once, and only if one has it.
	var due time.Time
	for _, c := range children {
		allOK, pending := true, false
		var failedParent bson.ObjectID
		var why string
		for _, par := range c.Parents {
			st, ok := stateOf(par)
			switch {
			case !ok:
				allOK = false
				if failedParent.IsZero() {
					failedParent, why = par, "no longer exists"
				}
			case st.Status == schema.StatusSucceeded:
			case schema.ParentEnded(st.Status):
				allOK = false
				if failedParent.IsZero() {
					failedParent, why = par, "ended with status "+st.Status.String()
					if st.Reason != "" {
						why += " (reason " + st.Reason + ")"
					}
				}
			default:
				allOK, pending = false, true
			}
		}
		switch {
		case allOK || (c.Run && !pending):
			if !c.NotBefore.IsZero() && due.IsZero() {
				if due, err = s.dueClock(ctx, true); err != nil {
					return nil, fmt.Errorf("settle children: %w", err)
				}
			}
			if c.NotBefore.After(due) {
				hold = append(hold, c.ID)
			} else {
				queue = append(queue, c.ID)
				res.queuedIn(c.Queue)
			}
		case !failedParent.IsZero() && !c.Run:
			failedIDs = append(failedIDs, c.ID)
			if !slices.Contains(failing, failedParent) {
				failing = append(failing, failedParent)
			}
			line := fmt.Sprintf("parent_failed: not run: its parent %s %s", failedParent.Hex(), why)
			fails = append(fails, mongo.NewUpdateOneModel().
				SetFilter(append(bson.D{{Key: "_id", Value: c.ID}}, awaiting...)).
				SetUpdate(endUnrun(schema.ReasonParentFailed, line)))
		}
	}
	if len(queue) > 0 {
		r, err := s.tasks.UpdateMany(ctx, append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(queue)}}}}, awaiting...),
			setPiped("", bson.D{
				{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
				{Key: schema.TaskNode, Value: schema.Unclaimed},
				{Key: schema.TaskMTime, Value: s.nowMS()},
			}, schema.TaskAwaitingParents))
		if err != nil {
			return nil, fmt.Errorf("queue %d children whose parents allow it: %w", len(queue), err)
		}
		res.Queued += r.ModifiedCount
	}
	if len(hold) > 0 {
		r, err := s.tasks.UpdateMany(ctx, append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(hold)}}}}, awaiting...),
			bson.D{
				{Key: "$set", Value: bson.D{{Key: schema.TaskMTime, Value: s.nowMS()}}},
				{Key: "$unset", Value: bson.D{{Key: schema.TaskAwaitingParents, Value: ""}}},
			})
		if err != nil {
			return nil, fmt.Errorf("hand %d children over to the timers: %w", len(hold), err)
		}
		res.Held += r.ModifiedCount
	}
	if len(fails) > 0 {
		r, err := s.tasks.BulkWrite(ctx, fails, options.BulkWrite().SetOrdered(false))
		if err != nil {
			return nil, fmt.Errorf("finish %d children of failed parents: %w", len(fails), err)
		}
		res.Failed += r.ModifiedCount
		// A retry of a parent read as failed may have come between that
		// read and this write: it requeued the parent, then looked for
		// its parent_failed children and found none yet. The parents are
		// read again after the write, so that one side always sees the
		// other's (write skew, which a transaction would not prevent):
		// a parent no longer failed has its children blocked again.
		again, err := s.statesByID(ctx, failing)
		if err != nil {
			return nil, fmt.Errorf("read again the parents of the children failed: %w", err)
		}
		var retried []bson.ObjectID
		for _, id := range failing {
			if st, ok := again[id]; ok && (st.Status == schema.StatusSucceeded || !schema.ParentEnded(st.Status)) {
				retried = append(retried, id)
			}
		}
		if len(retried) > 0 {
			if _, err := s.graphReblock(ctx, retried); err != nil {
				return nil, err
			}
		}
	}
	return failedIDs, nil
}

// graphReblock blocks again, awaiting their parents, the descendants of
// parents (tasks just requeued) that ended with parent_failed,
// transitively, and settles them once (a requeued parent may already
// have finished again). It returns how many it blocked.
func (s *Store) graphReblock(ctx context.Context, parents []bson.ObjectID) (int64, error) {
	var n int64
	var all []bson.ObjectID
	parentFailed := bson.D{
		{Key: schema.TaskStatus, Value: int32(schema.StatusFailed)},
		{Key: schema.TaskReason, Value: schema.ReasonParentFailed},
	}
	frontier := parents
	for len(frontier) > 0 {
		var next []bson.ObjectID
		for chunk := range slices.Chunk(frontier, idChunk) {
			ids, err := s.findIDs(ctx, s.tasks, append(bson.D{{Key: schema.TaskParents, Value: bson.D{{Key: "$in", Value: anyIDs(chunk)}}}}, parentFailed...))
			if err != nil {
				return n, fmt.Errorf("find descendants to block again: %w", err)
			}
			if len(ids) == 0 {
				continue
			}
			r, err := s.tasks.UpdateMany(ctx, append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(ids)}}}}, parentFailed...),
				setPiped("", bson.D{
					{Key: schema.TaskStatus, Value: int32(schema.StatusBlocked)},
					{Key: schema.TaskNode, Value: schema.Unclaimed},
					{Key: schema.TaskAwaitingParents, Value: true},
					{Key: schema.TaskMTime, Value: s.nowMS()},
				}, schema.TaskReason))
			if err != nil {
				return n, fmt.Errorf("block descendants again: %w", err)
			}
			n += r.ModifiedCount
			next = append(next, ids...)
		}
		all = append(all, next...)
		frontier = next
	}
	if len(all) > 0 {
		var res TaskGraphResult
		for chunk := range slices.Chunk(all, idChunk) {
			if err := s.graphSettleFrontier(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(chunk)}}}}, &res); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// GraphNode is one task of a graph view.
type GraphNode struct {
	ID              bson.ObjectID
	Queue           bson.ObjectID
	Status          schema.Status
	Reason          string
	Parents         []bson.ObjectID
	OnParentFailure string
	AwaitingParents bool
	// Depth is the distance from the task asked about: negative for its
	// ancestors, 0 for itself, positive for its descendants (the shortest
	// path, when there are several).
	Depth int
}

// TaskGraphView is a task with its ancestors and descendants.
type TaskGraphView struct {
	Nodes []GraphNode // ancestors (farthest first), the task, descendants (nearest first)
	// Truncated: more than the limit; the farthest were left out.
	Truncated bool
}

// TaskGraphGetParams ask for a task's graph.
type TaskGraphGetParams struct {
	ID    bson.ObjectID
	Limit int // tasks at most, the task included; default and cap 10000
}

// MaxGraphView bounds a graph view.
const MaxGraphView = 10000

// TaskGraphGet returns a task with its ancestors (through parents) and
// descendants (the tasks naming it as a parent, indexed), level by level.
// ErrNotFound when the task does not exist.
func (s *Store) TaskGraphGet(ctx context.Context, p TaskGraphGetParams) (TaskGraphView, error) {
	limit := p.Limit
	if limit <= 0 || limit > MaxGraphView {
		limit = MaxGraphView
	}
	root, err := s.graphNodes(ctx, bson.D{{Key: "_id", Value: p.ID}}, 1)
	if err != nil {
		return TaskGraphView{}, err
	}
	if len(root) == 0 {
		return TaskGraphView{}, fmt.Errorf("task %s: %w", p.ID.Hex(), ErrNotFound)
	}
	seen := map[bson.ObjectID]bool{p.ID: true}
	var view TaskGraphView
	var ancestors, descendants []GraphNode
	room := func() int { return limit - 1 - len(ancestors) - len(descendants) }
	// Ancestors.
	frontier := root[0].Parents
	for depth := -1; len(frontier) > 0; depth-- {
		var ids []bson.ObjectID
		for _, id := range frontier {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			break
		}
		if len(ids) > room() {
			view.Truncated = true
			ids = ids[:room()]
		}
		level, err := s.graphNodes(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(ids)}}}}, 0)
		if err != nil {
			return TaskGraphView{}, err
		}
		frontier = nil
		for _, n := range level {
			n.Depth = depth
			ancestors = append(ancestors, n)
			frontier = append(frontier, n.Parents...)
		}
	}
	// Descendants.
	frontier = []bson.ObjectID{p.ID}
	for depth := 1; len(frontier) > 0 && room() > 0; depth++ {
		level, err := s.graphNodes(ctx, bson.D{{Key: schema.TaskParents, Value: bson.D{{Key: "$in", Value: anyIDs(frontier)}}}}, 0)
		if err != nil {
			return TaskGraphView{}, err
		}
		frontier = nil
		for _, n := range level {
			if seen[n.ID] {
				continue
			}
			if room() == 0 {
				view.Truncated = true
				break
			}
			seen[n.ID] = true
			n.Depth = depth
			descendants = append(descendants, n)
			frontier = append(frontier, n.ID)
		}
	}
	if len(frontier) > 0 && room() == 0 {
		n, err := s.tasks.CountDocuments(ctx, bson.D{{Key: schema.TaskParents, Value: bson.D{{Key: "$in", Value: anyIDs(frontier)}}}}, options.Count().SetLimit(1))
		if err != nil {
			return TaskGraphView{}, fmt.Errorf("read a task graph: %w", err)
		}
		if n > 0 {
			view.Truncated = true
		}
	}
	slices.Reverse(ancestors)
	view.Nodes = append(append(ancestors, root[0]), descendants...)
	return view, nil
}

// graphNodes reads tasks for a graph view, in _id order.
func (s *Store) graphNodes(ctx context.Context, filter bson.D, limit int64) ([]GraphNode, error) {
	o := options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetProjection(bson.D{
		{Key: schema.TaskQueue, Value: 1}, {Key: schema.TaskStatus, Value: 1}, {Key: schema.TaskReason, Value: 1},
		{Key: schema.TaskParents, Value: 1}, {Key: schema.TaskOnParentFailure, Value: 1}, {Key: schema.TaskAwaitingParents, Value: 1}})
	if limit > 0 {
		o.SetLimit(limit)
	}
	cur, err := s.tasks.Find(ctx, filter, o)
	if err != nil {
		return nil, fmt.Errorf("read a task graph: %w", err)
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	var out []GraphNode
	for r.Next() {
		st := stateOf(cur.Current)
		if st.ID.IsZero() {
			continue
		}
		n := GraphNode{ID: st.ID, Queue: st.Queue, Status: st.Status, Reason: st.Reason}
		n.Parents = schema.DecodeParents(cur.Current.Lookup(schema.TaskParents))
		n.OnParentFailure, _ = cur.Current.Lookup(schema.TaskOnParentFailure).StringValueOK()
		n.AwaitingParents, _ = cur.Current.Lookup(schema.TaskAwaitingParents).BooleanOK()
		out = append(out, n)
	}
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("read a task graph: %w", err)
	}
	return out, nil
}
