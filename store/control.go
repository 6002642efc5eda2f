package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// ErrKillRequested: a claimed task was not started because an operator
// asked to kill it; the node ends it unrun (TaskEndClaimed).
var ErrKillRequested = errors.New("an operator asked to kill the task")

// ErrExpired: a claimed task was not started because its expires_at has
// passed; the node ends it unrun (TaskEndClaimed).
var ErrExpired = errors.New("the task expired before it started")

// MaxControlIDs bounds the ids of one kill, cancel, retry or wait by ids;
// more go by filter.
const MaxControlIDs = 1000

// TaskFilter selects tasks for an operator's request by filter. Every set
// field must match.
type TaskFilter struct {
	Queue    bson.ObjectID   // zero: any queue
	Statuses []schema.Status // empty: any (within what the request allows)
	Reason   string          // "": any
	Node     string          // "": any
	// Since and Until bound the task's mtime (its last change): Since <=
	// mtime < Until; zero: unbounded.
	Since, Until time.Time
}

func (f TaskFilter) bson() bson.D {
	d := bson.D{}
	if !f.Queue.IsZero() {
		d = append(d, bson.E{Key: schema.TaskQueue, Value: f.Queue})
	}
	if len(f.Statuses) > 0 {
		a := make(bson.A, len(f.Statuses))
		for i, st := range f.Statuses {
			a[i] = int32(st)
		}
		d = append(d, bson.E{Key: schema.TaskStatus, Value: bson.D{{Key: "$in", Value: a}}})
	}
	if f.Reason != "" {
		d = append(d, bson.E{Key: schema.TaskReason, Value: f.Reason})
	}
	if f.Node != "" {
		d = append(d, bson.E{Key: schema.TaskNode, Value: f.Node})
	}
	if !f.Since.IsZero() || !f.Until.IsZero() {
		r := bson.D{}
		if !f.Since.IsZero() {
			r = append(r, bson.E{Key: "$gte", Value: f.Since})
		}
		if !f.Until.IsZero() {
			r = append(r, bson.E{Key: "$lt", Value: f.Until})
		}
		d = append(d, bson.E{Key: schema.TaskMTime, Value: r})
	}
	return d
}

// TaskTarget names the tasks of a request: IDs (at most MaxControlIDs), or
// a Filter.
type TaskTarget struct {
	IDs    []bson.ObjectID
	Filter *TaskFilter
}

func (t TaskTarget) validate(what string) error {
	switch {
	case len(t.IDs) > 0 && t.Filter != nil:
		return fmt.Errorf("%s: give task ids or a filter, not both", what)
	case len(t.IDs) == 0 && t.Filter == nil:
		return fmt.Errorf("%s: no task ids and no filter", what)
	case len(t.IDs) > MaxControlIDs:
		return fmt.Errorf("%s: %d task ids in one request; at most %d (select more with a filter)", what, len(t.IDs), MaxControlIDs)
	}
	return nil
}

// match returns the target's filter, within the allowed statuses.
func (t TaskTarget) match(allowed bson.D) bson.D {
	var d bson.D
	if t.Filter != nil {
		d = t.Filter.bson()
	} else {
		ids := make(bson.A, len(t.IDs))
		for i, id := range t.IDs {
			ids[i] = id
		}
		d = bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}
	}
	return bson.D{{Key: "$and", Value: bson.A{d, allowed}}}
}

// TaskSkip is a task of a request by ids that the request did not change,
// and why: in words (Why) and as a code callers can act on.
type TaskSkip struct {
	ID   bson.ObjectID
	Why  string
	Code SkipCode
}

// SkipCode says why a request left a task alone.
type SkipCode int

const (
	// SkipState: the task's state does not allow the request (finished,
	// running, ...).
	SkipState SkipCode = iota
	// SkipMissing: no task has the id.
	SkipMissing
	// SkipUnderway: what was asked is already under way (a kill requested
	// earlier, which its node is carrying out).
	SkipUnderway
)

// missing is the skip of an id that names no task.
func missing(id bson.ObjectID) TaskSkip {
	return TaskSkip{ID: id, Why: "no such task", Code: SkipMissing}
}

// TaskState is where a task stands.
type TaskState struct {
	ID     bson.ObjectID
	Queue  bson.ObjectID
	Node   string
	Status schema.Status
	Reason string
	Kill   bool // a kill was requested
	Found  bool
}

// TaskStates reads the states of tasks by id, in the order asked (Found
// false for ids that name no task).
func (s *Store) TaskStates(ctx context.Context, ids []bson.ObjectID) ([]TaskState, error) {
	got, err := s.statesByID(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := make([]TaskState, len(ids))
	for i, id := range ids {
		st, ok := got[id]
		if !ok {
			st = TaskState{ID: id}
		}
		out[i] = st
	}
	return out, nil
}

// idChunk bounds the ids of one $in.
const idChunk = 10000

// statesByID reads the states of tasks by id, in chunks of idChunk; ids
// that name no task are absent from the map.
func (s *Store) statesByID(ctx context.Context, ids []bson.ObjectID) (map[bson.ObjectID]TaskState, error) {
	out := make(map[bson.ObjectID]TaskState, len(ids))
	for chunk := range slices.Chunk(ids, idChunk) {
		if err := s.readStates(ctx, chunk, out); err != nil {
			return nil, fmt.Errorf("read %d tasks' states: %w", len(ids), err)
		}
	}
	return out, nil
}

func (s *Store) readStates(ctx context.Context, ids []bson.ObjectID, into map[bson.ObjectID]TaskState) error {
	cur, err := s.tasks.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(ids)}}}},
		options.Find().SetProjection(bson.D{{Key: schema.TaskQueue, Value: 1}, {Key: schema.TaskNode, Value: 1},
			{Key: schema.TaskStatus, Value: 1}, {Key: schema.TaskReason, Value: 1}, {Key: schema.TaskKill, Value: 1}}))
	if err != nil {
		return err
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	for r.Next() {
		st := stateOf(cur.Current)
		into[st.ID] = st
	}
	return r.Err()
}

func stateOf(raw bson.Raw) TaskState {
	st := TaskState{Found: true}
	st.ID, _ = raw.Lookup("_id").ObjectIDOK()
	st.Queue, _ = raw.Lookup(schema.TaskQueue).ObjectIDOK()
	st.Node, _ = raw.Lookup(schema.TaskNode).StringValueOK()
	if v, err := raw.LookupErr(schema.TaskStatus); err == nil {
		if i, ok := v.AsInt64OK(); ok {
			st.Status = schema.Status(i)
		}
	}
	st.Reason, _ = raw.Lookup(schema.TaskReason).StringValueOK()
	if v, err := raw.LookupErr(schema.TaskKill); err == nil && v.Type != bson.TypeNull {
		st.Kill = true
	}
	return st
}

// Which statuses each request may change.
var (
	// held: not claimable, not started (queued, blocked, and the other
	// held negative codes), and unclaimed.
	heldStatuses = bson.D{{Key: schema.TaskStatus, Value: bson.D{{Key: "$in", Value: bson.A{
		int32(schema.StatusQueued), int32(schema.StatusBlocked), int32(schema.StatusCancelled), int32(schema.StatusTerminated)}}}},
		{Key: schema.TaskNode, Value: unclaimed}}
	holding = bson.D{{Key: schema.TaskStatus, Value: bson.D{{Key: "$in", Value: bson.A{int32(schema.StatusClaimed), int32(schema.StatusRunning)}}}},
		{Key: schema.TaskKill, Value: bson.D{{Key: "$exists", Value: false}}}}
	orphaned   = bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusOrphaned)}}
	retryables = bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: schema.TaskStatus, Value: bson.D{{Key: "$gt", Value: 0}}}},
		orphaned,
	}}}
)

// TaskKillParams ask to kill tasks.
type TaskKillParams struct {
	Target TaskTarget
	By     string // who asks (an operator, a user of the API)
	Reason string // why, in their words
	DryRun bool   // count what would be done, change nothing
}

// TaskKillResult says what a kill did.
type TaskKillResult struct {
	// Requested: running or claimed, the kill is recorded for the node
	// that holds them, which carries it out.
	Requested int64
	// Cancelled: queued or held, finished unrun (reason cancelled).
	Cancelled int64
	// Settled: orphaned, finished as killed.
	Settled int64
	Skipped []TaskSkip // with IDs: the tasks not changed
}

// TaskKill records an operator's kill request. A running or claimed task
// gets {kill: {node, by, at, reason}} (the node named there hears it on its
// wake-up stream and kills the plugin, or does not start it); a queued or
// held one is cancelled at once, an orphaned one finished as killed. Each
// write is guarded by the state it changes: a finished task is never
// touched, and a second request for a task already being killed changes
// nothing.
func (s *Store) TaskKill(ctx context.Context, p TaskKillParams) (TaskKillResult, error) {
	if err := p.Target.validate("kill tasks"); err != nil {
		return TaskKillResult{}, err
	}
	var res TaskKillResult
	var before []TaskState
	if p.Target.IDs != nil {
		var err error
		if before, err = s.TaskStates(ctx, p.Target.IDs); err != nil {
			return res, err
		}
	}
	if p.DryRun {
		n, skipped, err := s.dryRun(ctx, p.Target, before, killSkip, holding, heldStatuses, orphaned)
		if err != nil {
			return res, fmt.Errorf("count tasks to kill: %w", err)
		}
		res.Requested, res.Cancelled, res.Settled, res.Skipped = n[0], n[1], n[2], skipped
		return res, nil
	}
	kill := bson.D{
		{Key: schema.KillNode, Value: "$" + schema.TaskNode},
		{Key: schema.KillBy, Value: literal(p.By)},
		{Key: schema.KillAt, Value: "$$NOW"},
		{Key: schema.KillReason, Value: literal(p.Reason)},
	}
	r, err := s.tasks.UpdateMany(ctx, p.Target.match(holding), mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: schema.TaskKill, Value: kill}}}}})
	if err != nil {
		return res, fmt.Errorf("request kills: %w", err)
	}
	res.Requested = r.ModifiedCount
	r, err = s.tasks.UpdateMany(ctx, p.Target.match(heldStatuses), endUnrun(schema.ReasonCancelled, requestLine("cancelled by a kill request", p.By, p.Reason), bson.E{Key: schema.TaskKill, Value: kill}))
	if err != nil {
		return res, fmt.Errorf("cancel queued tasks asked to be killed: %w", err)
	}
	res.Cancelled = r.ModifiedCount
	r, err = s.tasks.UpdateMany(ctx, p.Target.match(orphaned), endUnrun(schema.ReasonKilled, requestLine("killed while orphaned", p.By, p.Reason), bson.E{Key: schema.TaskKill, Value: kill}))
	if err != nil {
		return res, fmt.Errorf("finish orphaned tasks asked to be killed: %w", err)
	}
	res.Settled = r.ModifiedCount
	if before != nil {
		res.Skipped, err = s.skipped(ctx, before, killSkip)
	}
	return res, err
}

// killSkip says why a kill leaves a task alone.
func killSkip(b TaskState) TaskSkip {
	switch {
	case b.Status.Finished():
		return TaskSkip{Why: fmt.Sprintf("already finished (status %s): nothing to kill", b.Status)}
	case b.Kill && (b.Status == schema.StatusClaimed || b.Status == schema.StatusRunning):
		return TaskSkip{Why: "a kill was already requested; its node is carrying it out", Code: SkipUnderway}
	}
	return TaskSkip{}
}

// dryRun counts the tasks of t each of filters would change, and, for a
// target by ids (before: their states), says why each of the others would
// be left alone (why, as the request itself would).
func (s *Store) dryRun(ctx context.Context, t TaskTarget, before []TaskState, why func(TaskState) TaskSkip, filters ...bson.D) ([]int64, []TaskSkip, error) {
	n := make([]int64, len(filters))
	either := make(bson.A, len(filters))
	for i, f := range filters {
		c, err := s.tasks.CountDocuments(ctx, t.match(f))
		if err != nil {
			return nil, nil, err
		}
		n[i], either[i] = c, f
	}
	if before == nil {
		return n, nil, nil
	}
	would, err := s.findIDs(ctx, s.tasks, t.match(bson.D{{Key: "$or", Value: either}}))
	if err != nil {
		return nil, nil, err
	}
	return n, skips(before, func(_ int, b TaskState) bool { return slices.Contains(would, b.ID) }, why), nil
}

// endUnrun finishes a task that will not run (again): status 2, the
// reason, a line in stderr, and more (a request's record: kill or
// cancel); a task held for its parents is no longer awaiting them (the
// mark would keep it among the graph's waiting children).
func endUnrun(reason, line string, more ...bson.E) mongo.Pipeline {
	set := bson.D{
		{Key: schema.TaskStatus, Value: int32(schema.StatusFailed)},
		{Key: schema.TaskReason, Value: reason},
		{Key: schema.TaskStderr, Value: appendLineExpr("$"+schema.TaskStderr, line)},
		{Key: schema.TaskMTime, Value: "$$NOW"},
		priorSet(""),
	}
	return mongo.Pipeline{
		{{Key: "$set", Value: append(set, more...)}},
		{{Key: "$unset", Value: bson.A{schema.TaskAwaitingParents}}},
	}
}

// requestLine is the stderr line of an operator's request: "what by who:
// why".
func requestLine(what, by, why string) string {
	line := what + " by " + by
	if why != "" {
		line += ": " + why
	}
	return line
}

// appendLineExpr appends a line to a string field, or sets it when the
// field is not a string (null, or a GridFS id: the line then replaces the
// reference, which stays in tasks.files under the task's id).
func appendLineExpr(field, line string) bson.D {
	return bson.D{{Key: "$cond", Value: bson.A{
		bson.D{{Key: "$and", Value: bson.A{
			bson.D{{Key: "$eq", Value: bson.A{bson.D{{Key: "$type", Value: field}}, "string"}}},
			bson.D{{Key: "$ne", Value: bson.A{field, ""}}},
		}}},
		bson.D{{Key: "$concat", Value: bson.A{field, literal("\n" + line + "\n")}}},
		literal(line + "\n"),
	}}}
}

// skipped reads the tasks of a request by ids again and says why each one
// the request did not change was left alone: why(before) for the caller's
// own reasons (its ID is filled in here), or a generic one when its Why is
// empty.
func (s *Store) skipped(ctx context.Context, before []TaskState, why func(b TaskState) TaskSkip) ([]TaskSkip, error) {
	ids := make([]bson.ObjectID, len(before))
	for i, b := range before {
		ids[i] = b.ID
	}
	after, err := s.TaskStates(ctx, ids)
	if err != nil {
		return nil, err
	}
	// Changed by this request (or by someone at the same moment): not
	// left alone.
	return skips(before, func(i int, b TaskState) bool { return changed(b, after[i]) }, why), nil
}

// skips are the tasks of before a request left alone (not done), each
// with why (missing, or not changed: its status, when why says nothing).
func skips(before []TaskState, done func(i int, b TaskState) bool, why func(TaskState) TaskSkip) []TaskSkip {
	var out []TaskSkip
	for i, b := range before {
		switch {
		case !b.Found:
			out = append(out, missing(b.ID))
		case done(i, b):
		default:
			sk := why(b)
			if sk.Why == "" {
				sk = TaskSkip{Why: fmt.Sprintf("not changed: its status is %s", b.Status)}
			}
			sk.ID = b.ID
			out = append(out, sk)
		}
	}
	return out
}

func changed(b, a TaskState) bool {
	return b.Status != a.Status || b.Kill != a.Kill || b.Node != a.Node || b.Reason != a.Reason
}

// TaskCancelParams ask to cancel tasks that have not started.
type TaskCancelParams struct {
	Target TaskTarget
	By     string
	Reason string
	DryRun bool // count what would be cancelled, change nothing
}

// TaskCancelResult says what a cancel did.
type TaskCancelResult struct {
	Cancelled int64
	Skipped   []TaskSkip
}

// TaskCancel finishes queued, delayed and blocked tasks unrun: status 2,
// reason cancelled, {cancel: {by, at, reason}}, a line in stderr. Claimed
// and running tasks are left alone (kill them instead), finished ones too.
func (s *Store) TaskCancel(ctx context.Context, p TaskCancelParams) (TaskCancelResult, error) {
	if err := p.Target.validate("cancel tasks"); err != nil {
		return TaskCancelResult{}, err
	}
	var before []TaskState
	if p.Target.IDs != nil {
		var err error
		if before, err = s.TaskStates(ctx, p.Target.IDs); err != nil {
			return TaskCancelResult{}, err
		}
	}
	if p.DryRun {
		n, skipped, err := s.dryRun(ctx, p.Target, before, cancelSkip, heldStatuses)
		if err != nil {
			return TaskCancelResult{}, fmt.Errorf("count tasks to cancel: %w", err)
		}
		return TaskCancelResult{Cancelled: n[0], Skipped: skipped}, nil
	}
	r, err := s.tasks.UpdateMany(ctx, p.Target.match(heldStatuses), endUnrun(schema.ReasonCancelled, requestLine("cancelled", p.By, p.Reason),
		bson.E{Key: schema.TaskCancel, Value: bson.D{
			{Key: schema.KillBy, Value: literal(p.By)}, {Key: schema.KillAt, Value: "$$NOW"}, {Key: schema.KillReason, Value: literal(p.Reason)},
		}}))
	if err != nil {
		return TaskCancelResult{}, fmt.Errorf("cancel tasks: %w", err)
	}
	res := TaskCancelResult{Cancelled: r.ModifiedCount}
	if before != nil {
		res.Skipped, err = s.skipped(ctx, before, cancelSkip)
	}
	return res, err
}

// cancelSkip says why a cancel leaves a task alone.
func cancelSkip(b TaskState) TaskSkip {
	switch {
	case b.Status.Finished():
		return TaskSkip{Why: fmt.Sprintf("already finished (status %s)", b.Status)}
	case b.Status == schema.StatusClaimed || b.Status == schema.StatusRunning:
		return TaskSkip{Why: fmt.Sprintf("%s on node %s: kill it instead", b.Status, b.Node)}
	case b.Status == schema.StatusOrphaned:
		return TaskSkip{Why: "orphaned: retry it, or kill it to finish it"}
	}
	return TaskSkip{}
}

// TaskRetryParams ask to requeue finished or orphaned tasks.
type TaskRetryParams struct {
	Target TaskTarget
	By     string
	DryRun bool // count what would be requeued, change nothing
	// Progress, when set, is called after each chunk with the tasks done
	// and the total (as counted at the start).
	Progress func(done, total int64)
}

// TaskRetryResult says what a retry did (or, dry, would do).
type TaskRetryResult struct {
	Requeued int64
	Skipped  []TaskSkip
	// Reblocked: descendants of the requeued tasks that had ended with
	// parent_failed, held again awaiting their parents.
	Reblocked int64
}

// retryChunk is how many tasks one write of a retry requeues.
const retryChunk = 1000

// TaskRetry requeues finished (status > 0) and orphaned (-6) tasks: status
// -2, node -1, reason requeued, {requeued: {by, at}}, their kill request,
// delay, expiry and spent retries cleared; their history (attempts) stays.
// A filter's tasks go in chunks of 1000 in _id order, each chunk one
// guarded write, so a retry of millions reports progress and an interrupted
// one can simply be run again. A requeued task runs whatever its own
// parents say (the operator asked for it); its descendants that ended with
// parent_failed are held again awaiting their parents (Reblocked).
func (s *Store) TaskRetry(ctx context.Context, p TaskRetryParams) (TaskRetryResult, error) {
	if err := p.Target.validate("retry tasks"); err != nil {
		return TaskRetryResult{}, err
	}
	var res TaskRetryResult
	if p.Target.IDs != nil {
		before, err := s.TaskStates(ctx, p.Target.IDs)
		if err != nil {
			return res, err
		}
		if p.DryRun {
			for _, b := range before {
				switch {
				case !b.Found:
					res.Skipped = append(res.Skipped, missing(b.ID))
				case retryable(b.Status):
					res.Requeued++
				default:
					res.Skipped = append(res.Skipped, TaskSkip{ID: b.ID, Why: notRetryable(b)})
				}
			}
			return res, nil
		}
		var ids []bson.ObjectID
		for _, b := range before {
			if b.Found && retryable(b.Status) {
				ids = append(ids, b.ID)
			}
		}
		since, err := s.dueClock(ctx, true)
		if err != nil {
			return res, fmt.Errorf("requeue tasks: %w", err)
		}
		rt := &retrying{by: p.By, since: since, res: &res}
		if err := s.retryPage(ctx, ids, rt); err != nil {
			return res, fmt.Errorf("requeue tasks: %w", err)
		}
		if err := s.retryWaited(ctx, rt); err != nil {
			return res, fmt.Errorf("requeued %d tasks: %w", res.Requeued, err)
		}
		if p.Progress != nil {
			p.Progress(res.Requeued, res.Requeued)
		}
		res.Skipped, err = s.skipped(ctx, before, func(b TaskState) TaskSkip { return TaskSkip{Why: notRetryable(b)} })
		return res, err
	}
	match := p.Target.match(retryables)
	total, err := s.tasks.CountDocuments(ctx, match)
	if err != nil {
		return res, fmt.Errorf("count tasks to requeue: %w", err)
	}
	if p.DryRun {
		res.Requeued = total
		return res, nil
	}
	since, err := s.dueClock(ctx, true)
	if err != nil {
		return res, fmt.Errorf("requeue tasks: %w", err)
	}
	rt := &retrying{by: p.By, filter: match, since: since, res: &res}
	var last bson.ObjectID
	for res.Requeued < total {
		page := match
		if !last.IsZero() {
			page = bson.D{{Key: "$and", Value: bson.A{match, bson.D{{Key: "_id", Value: bson.D{{Key: "$gt", Value: last}}}}}}}
		}
		chunk, err := s.findIDs(ctx, s.tasks, page, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(retryChunk))
		if err != nil {
			return res, fmt.Errorf("requeue tasks (%d of %d done): %w", res.Requeued, total, err)
		}
		if len(chunk) == 0 {
			break
		}
		last = chunk[len(chunk)-1]
		if err := s.retryPage(ctx, chunk, rt); err != nil {
			return res, fmt.Errorf("requeue tasks (%d of %d done): %w", res.Requeued, total, err)
		}
		if p.Progress != nil {
			p.Progress(res.Requeued, total)
		}
	}
	if err := s.retryWaited(ctx, rt); err != nil {
		return res, fmt.Errorf("requeued %d tasks: %w", res.Requeued, err)
	}
	return res, nil
}

// retrying is what a retry keeps from page to page.
type retrying struct {
	by     string
	filter bson.D // the retry's filter; nil for a retry by ids (one page)
	// since is the server's clock when the retry began: a task requeued
	// since (requeued.at, $$NOW) was requeued by it, in an earlier page
	// (or by another retry meanwhile: as good a reason to wait for it).
	since time.Time
	// waiting are the tasks it requeued held (parentWaits), to settle once
	// every page is done.
	waiting []bson.ObjectID
	res     *TaskRetryResult
}

// retryPage requeues the retryable tasks among ids, then holds again the
// descendants of theirs that had ended parent_failed (graphReblock). A
// task of the page that had itself ended parent_failed, and one of whose
// parents this retry requeues (in this page, an earlier one, or, being
// matched by the retry's filter, a later one), is requeued held, waiting
// for its parents (-4, awaiting_parents), as its descendants are; its
// parent's page may come before it or after it, and the outcome is the
// same. One the retry names without its failed parent runs whatever the
// parent says: the operator asked for it.
func (s *Store) retryPage(ctx context.Context, ids []bson.ObjectID, rt *retrying) error {
	if len(ids) == 0 {
		return nil
	}
	waits, pending, err := s.parentWaits(ctx, ids, rt)
	if err != nil {
		return err
	}
	// An output not yet made tasks of (then_pending: a crash between the
	// finish and its ThenCreate, the leader's sweep still to come) is made
	// so first: the next attempt's finish replaces or removes the output.
	for _, id := range pending {
		if _, err := s.ThenCreate(ctx, id); err != nil {
			return err
		}
	}
	var now, held []bson.ObjectID
	for _, id := range ids {
		if waits[id] {
			held = append(held, id)
		} else {
			now = append(now, id)
		}
	}
	for _, part := range []struct {
		ids    []bson.ObjectID
		update mongo.Pipeline
	}{{now, requeue(rt.by)}, {held, requeueHeld(rt.by)}} {
		if len(part.ids) == 0 {
			continue
		}
		r, err := s.tasks.UpdateMany(ctx, bson.D{{Key: "$and", Value: bson.A{bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(part.ids)}}}}, retryables}}}, part.update)
		if err != nil {
			return err
		}
		rt.res.Requeued += r.ModifiedCount
	}
	rt.waiting = append(rt.waiting, held...)
	n, err := s.graphReblock(ctx, ids)
	rt.res.Reblocked += n
	return err
}

// parentWaits reads the retryable tasks among ids and says which had
// ended parent_failed with a parent the retry requeues (one of ids, one
// its filter matches, still to come, or one requeued since it began,
// already done), and which have an output still to become tasks
// (then_pending).
func (s *Store) parentWaits(ctx context.Context, ids []bson.ObjectID, rt *retrying) (map[bson.ObjectID]bool, []bson.ObjectID, error) {
	cur, err := s.tasks.Find(ctx, bson.D{{Key: "$and", Value: bson.A{bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(ids)}}}}, retryables}}},
		options.Find().SetProjection(bson.D{{Key: schema.TaskReason, Value: 1}, {Key: schema.TaskParents, Value: 1}, {Key: schema.TaskThenPending, Value: 1}}))
	if err != nil {
		return nil, nil, err
	}
	var docs []bson.Raw
	if err := readAllInto(ctx, cur, &docs); err != nil {
		return nil, nil, err
	}
	children := map[bson.ObjectID][]bson.ObjectID{}
	page := map[bson.ObjectID]bool{}
	var unknown, pending []bson.ObjectID
	for _, d := range docs {
		id, _ := d.Lookup("_id").ObjectIDOK()
		page[id] = true
		if d.Lookup(schema.TaskThenPending).Type != 0 {
			pending = append(pending, id)
		}
		if r, _ := d.Lookup(schema.TaskReason).StringValueOK(); r == schema.ReasonParentFailed {
			if ps := schema.DecodeParents(d.Lookup(schema.TaskParents)); len(ps) > 0 {
				children[id] = ps
				unknown = append(unknown, ps...)
			}
		}
	}
	waits := map[bson.ObjectID]bool{}
	if len(children) == 0 {
		return waits, pending, nil
	}
	requeued := bson.A{bson.D{{Key: schema.TaskRequeued + "." + schema.KillAt, Value: bson.D{{Key: "$gte", Value: rt.since}}}}}
	if rt.filter != nil {
		requeued = append(requeued, rt.filter)
	}
	slices.SortFunc(unknown, func(a, b bson.ObjectID) int { return bytes.Compare(a[:], b[:]) })
	unknown = slices.Compact(unknown)
	byRetry := map[bson.ObjectID]bool{}
	for chunk := range slices.Chunk(unknown, idChunk) {
		found, err := s.findIDs(ctx, s.tasks, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(chunk)}}}, {Key: "$or", Value: requeued}})
		if err != nil {
			return nil, nil, err
		}
		for _, id := range found {
			byRetry[id] = true
		}
	}
	for id, ps := range children {
		waits[id] = slices.ContainsFunc(ps, func(p bson.ObjectID) bool { return page[p] || byRetry[p] })
	}
	return waits, pending, nil
}

// retryWaited settles the tasks a retry requeued held, once every page
// is done: their parents requeued by then, they wait for them; one whose
// parents all succeeded meanwhile is queued.
func (s *Store) retryWaited(ctx context.Context, rt *retrying) error {
	var res TaskGraphResult
	for chunk := range slices.Chunk(rt.waiting, idChunk) {
		if err := s.graphSettleFrontier(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: anyIDs(chunk)}}}}, &res); err != nil {
			return err
		}
	}
	return nil
}

// retryable: what a retry requeues, finished or orphaned (retryables, the
// filter).
func retryable(st schema.Status) bool { return st.Finished() || st == schema.StatusOrphaned }

func notRetryable(b TaskState) string {
	switch {
	case b.Status == schema.StatusClaimed || b.Status == schema.StatusRunning:
		return fmt.Sprintf("%s on node %s: only finished or orphaned tasks are retried", b.Status, b.Node)
	case b.Status.Todo():
		return fmt.Sprintf("not finished (status %s): it will run anyway", b.Status)
	}
	return fmt.Sprintf("not changed: its status is %s", b.Status)
}

// requeue is TaskRetry's update.
func requeue(by string) mongo.Pipeline { return requeueAs(by, false) }

// requeueHeld is TaskRetry's update of a task that waits for its parents
// (retryPage): held, awaiting them, for a settle to queue.
func requeueHeld(by string) mongo.Pipeline { return requeueAs(by, true) }

func requeueAs(by string, held bool) mongo.Pipeline {
	status, unset := int32(schema.StatusQueued), bson.A{schema.TaskKill, schema.TaskCancel, schema.TaskNotBefore, schema.TaskExpiresAt, schema.TaskTries, schema.TaskAwaitingParents, schema.TaskComplete}
	var waits bson.D
	if held {
		status, unset = int32(schema.StatusBlocked), slices.DeleteFunc(unset, func(k any) bool { return k == schema.TaskAwaitingParents })
		waits = bson.D{{Key: schema.TaskAwaitingParents, Value: true}}
	}
	return mongo.Pipeline{
		{{Key: "$set", Value: append(bson.D{
			{Key: schema.TaskStatus, Value: status},
			{Key: schema.TaskNode, Value: int32(schema.Unclaimed)},
			{Key: schema.TaskReason, Value: schema.ReasonRequeued},
			{Key: schema.TaskRequeued, Value: bson.D{{Key: schema.KillBy, Value: literal(by)}, {Key: schema.KillAt, Value: "$$NOW"}}},
			{Key: schema.TaskMTime, Value: "$$NOW"},
			priorSet(""),
		}, waits...)}},
		{{Key: "$unset", Value: unset}},
	}
}

// findIDs returns the _ids of coll's documents within filter (ObjectIds:
// the ids of tasks and queues), with opts (a sort, a limit).
func (s *Store) findIDs(ctx context.Context, coll *mongo.Collection, filter bson.D, opts ...options.Lister[options.FindOptions]) ([]bson.ObjectID, error) {
	opts = append(opts, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	cur, err := coll.Find(ctx, filter, opts...)
	if err != nil {
		return nil, err
	}
	var docs []struct {
		ID bson.ObjectID `bson:"_id"`
	}
	if err := readAllInto(ctx, cur, &docs); err != nil {
		return nil, err
	}
	ids := make([]bson.ObjectID, len(docs))
	for i, d := range docs {
		ids[i] = d.ID
	}
	return ids, nil
}

// pushAttempt is a pipeline expression: the attempts array with rec
// appended, capped at schema.MaxAttemptsKept (a non-array is replaced).
func pushAttempt(rec bson.D) bson.D {
	old := bson.D{{Key: "$cond", Value: bson.A{
		bson.D{{Key: "$isArray", Value: "$" + schema.TaskAttempts}}, "$" + schema.TaskAttempts, bson.A{},
	}}}
	return bson.D{{Key: "$slice", Value: bson.A{
		bson.D{{Key: "$concatArrays", Value: bson.A{old, bson.A{rec}}}}, -schema.MaxAttemptsKept,
	}}}
}

// incAttempt is a pipeline expression: the attempt count plus one.
var incAttempt = bson.D{{Key: "$add", Value: bson.A{
	bson.D{{Key: "$cond", Value: bson.A{bson.D{{Key: "$isNumber", Value: "$" + schema.TaskAttempt}}, "$" + schema.TaskAttempt, 0}}}, 1,
}}}

// attemptEnded records, in a pipeline, an attempt that ended without its
// node saying so (its node went away or a kill was settled for it):
// started is the task's mtime when it was running.
func attemptEnded(status schema.Status, reason string) bson.D {
	return bson.D{
		{Key: schema.TaskAttempts, Value: pushAttempt(bson.D{
			{Key: "node", Value: "$" + schema.TaskNode},
			{Key: "started", Value: bson.D{{Key: "$cond", Value: bson.A{
				bson.D{{Key: "$eq", Value: bson.A{"$" + schema.TaskStatus, int32(schema.StatusRunning)}}}, "$" + schema.TaskMTime, "$$REMOVE"}}}},
			{Key: "finished", Value: "$$NOW"},
			{Key: "status", Value: int32(status)},
			{Key: "reason", Value: reason},
		})},
		{Key: schema.TaskAttempt, Value: incAttempt},
	}
}
