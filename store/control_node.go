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

// TaskEndClaimedParams end a task this node claimed but will not start.
type TaskEndClaimedParams struct {
	ID     bson.ObjectID
	Node   string
	Reason string // schema.ReasonKilled or schema.ReasonExpired
	Stderr string // the line that says why
}

// TaskEndClaimed finishes a claimed task unrun: {_id, node, status: -1} to
// status 2 with the reason and a line in stderr. The node does this when
// its start found a kill request or an expiry.
func (s *Store) TaskEndClaimed(ctx context.Context, p TaskEndClaimedParams) error {
	return s.guardedID(ctx, "end unstarted", p.ID, p.Node, schema.StatusClaimed, bson.D{
		{Key: schema.TaskStatus, Value: int32(schema.StatusFailed)},
		{Key: schema.TaskReason, Value: p.Reason},
		{Key: schema.TaskStderr, Value: validUTF8(p.Stderr)},
		{Key: schema.TaskMTime, Value: s.nowMS()},
	})
}

// TaskKillRequest is a kill request for a task a node holds.
type TaskKillRequest struct {
	ID      bson.ObjectID
	Queue   bson.ObjectID
	Status  schema.Status
	Request schema.KillRequest
}

// TaskKillsPending returns the kill requests for tasks Node holds (claimed
// or running): the node's safety net for a kill whose change event it
// missed.
func (s *Store) TaskKillsPending(ctx context.Context, node string) ([]TaskKillRequest, error) {
	cur, err := s.tasks.Find(ctx, bson.D{
		{Key: schema.TaskNode, Value: node},
		{Key: schema.TaskStatus, Value: bson.D{{Key: "$in", Value: bson.A{int32(schema.StatusClaimed), int32(schema.StatusRunning)}}}},
		{Key: schema.TaskKill, Value: bson.D{{Key: "$exists", Value: true}}},
	}, options.Find().SetProjection(bson.D{{Key: schema.TaskQueue, Value: 1}, {Key: schema.TaskStatus, Value: 1}, {Key: schema.TaskKill, Value: 1}}).SetLimit(10000))
	if err != nil {
		return nil, fmt.Errorf("read kill requests for node %s: %w", node, err)
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	var out []TaskKillRequest
	for r.Next() {
		if k, ok := KillRequestOf(cur.Current); ok && !k.ID.IsZero() {
			out = append(out, k)
		}
	}
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("read kill requests for node %s: %w", node, err)
	}
	return out, nil
}

// KillRequestOf reads a task's kill request from a document holding at
// least status and kill.
func KillRequestOf(doc bson.Raw) (TaskKillRequest, bool) {
	var k TaskKillRequest
	k.ID, _ = doc.Lookup("_id").ObjectIDOK()
	k.Queue, _ = doc.Lookup(schema.TaskQueue).ObjectIDOK()
	if st, ok := doc.Lookup(schema.TaskStatus).AsInt64OK(); ok {
		k.Status = schema.Status(st)
	}
	kd, ok := doc.Lookup(schema.TaskKill).DocumentOK()
	if !ok {
		return k, false
	}
	k.Request = schema.DecodeKillRequest(kd)
	return k, true
}

// settleGone ends the unfinished tasks of a node that went away (dead, or
// restarting), within filter (which names the node): claimed ones asked to
// be killed finish unrun; running ones asked to be killed finish as
// killed; running ones of a queue with rerun_orphans go back to the queue
// as a new attempt, spending one of the queue's retries (at least one rerun
// even with retries 0), so that a task that kills its node is not rerun on
// every death; the other running ones are orphaned (-6), their attempt
// recorded. Claimed ones not asked to be killed are left to the caller.
func (s *Store) settleGone(ctx context.Context, filter bson.D, claimedToo bool) (settled goneTasks, err error) {
	withStatus := func(st bson.D, more ...bson.E) bson.D {
		f := append(append(bson.D{}, filter...), bson.E{Key: schema.TaskStatus, Value: st})
		return append(f, more...)
	}
	killed := bson.E{Key: schema.TaskKill, Value: bson.D{{Key: "$exists", Value: true}}}
	notKilled := bson.E{Key: schema.TaskKill, Value: bson.D{{Key: "$exists", Value: false}}}
	statuses := bson.A{int32(schema.StatusRunning)}
	if claimedToo {
		statuses = append(statuses, int32(schema.StatusClaimed))
	}
	r, err := s.tasks.UpdateMany(ctx, withStatus(bson.D{{Key: "$in", Value: statuses}}, killed), mongo.Pipeline{{{Key: "$set", Value: append(bson.D{
		{Key: schema.TaskStatus, Value: int32(schema.StatusFailed)},
		{Key: schema.TaskReason, Value: schema.ReasonKilled},
		{Key: schema.TaskStderr, Value: appendLineExpr("$"+schema.TaskStderr, "killed: its node went away before it could kill it; the kill was settled by recovery")},
		{Key: schema.TaskMTime, Value: "$$NOW"},
		priorSet(""),
	}, attemptEnded(schema.StatusFailed, schema.ReasonKilled)...)}}})
	if err != nil {
		return settled, fmt.Errorf("settle kills: %w", err)
	}
	settled.Killed = r.ModifiedCount
	budgets, err := s.rerunBudgets(ctx)
	if err != nil {
		return settled, err
	}
	for budget, queues := range budgets {
		r, err = s.tasks.UpdateMany(ctx, withStatus(bson.D{{Key: "$eq", Value: int32(schema.StatusRunning)}}, notKilled,
			bson.E{Key: schema.TaskQueue, Value: bson.D{{Key: "$in", Value: queues}}},
			bson.E{Key: "$expr", Value: bson.D{{Key: "$lt", Value: bson.A{triesExpr, budget}}}}),
			mongo.Pipeline{{{Key: "$set", Value: append(attemptEnded(schema.StatusOrphaned, schema.ReasonOrphaned),
				bson.E{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
				bson.E{Key: schema.TaskNode, Value: int32(schema.Unclaimed)},
				bson.E{Key: schema.TaskReason, Value: schema.ReasonRerun},
				bson.E{Key: schema.TaskTries, Value: bson.D{{Key: "$add", Value: bson.A{triesExpr, 1}}}},
				bson.E{Key: schema.TaskMTime, Value: "$$NOW"},
				priorSet(""),
			)}}})
		if err != nil {
			return settled, fmt.Errorf("requeue orphans of queues with rerun_orphans: %w", err)
		}
		settled.Rerun += r.ModifiedCount
	}
	r, err = s.tasks.UpdateMany(ctx, withStatus(bson.D{{Key: "$eq", Value: int32(schema.StatusRunning)}}, notKilled),
		mongo.Pipeline{{{Key: "$set", Value: append(attemptEnded(schema.StatusOrphaned, schema.ReasonOrphaned),
			bson.E{Key: schema.TaskStatus, Value: int32(schema.StatusOrphaned)},
			bson.E{Key: schema.TaskReason, Value: schema.ReasonOrphaned},
			bson.E{Key: schema.TaskMTime, Value: "$$NOW"},
			priorSet(""),
		)}}})
	if err != nil {
		return settled, fmt.Errorf("orphan tasks: %w", err)
	}
	settled.Orphaned = r.ModifiedCount
	return settled, nil
}

// triesExpr is the task's tries, 0 when it has none.
var triesExpr = bson.D{{Key: "$cond", Value: bson.A{bson.D{{Key: "$isNumber", Value: "$" + schema.TaskTries}}, "$" + schema.TaskTries, 0}}}

// rerunBudgets groups the queues with rerun_orphans by how many tries a
// rerun may reach: the queue's retries, at least 1.
func (s *Store) rerunBudgets(ctx context.Context) (map[int][]bson.ObjectID, error) {
	cur, err := s.queues.Find(ctx, bson.D{{Key: schema.QueueRerunOrphans, Value: bson.D{{Key: "$in", Value: bson.A{true, 1, int64(1), 1.0}}}}},
		options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}, {Key: schema.QueueRetries, Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("read queues with rerun_orphans: %w", err)
	}
	var qs []bson.Raw
	if err := readAllInto(ctx, cur, &qs); err != nil {
		return nil, fmt.Errorf("read queues with rerun_orphans: %w", err)
	}
	out := map[int][]bson.ObjectID{}
	for _, q := range qs {
		id, ok := q.Lookup("_id").ObjectIDOK()
		if !ok {
			continue // tasks name queues by ObjectId
		}
		budget := 1
		if n, ok := q.Lookup(schema.QueueRetries).AsInt64OK(); ok && n > 1 {
			budget = int(min(n, schema.MaxRetries))
		}
		out[budget] = append(out[budget], id)
	}
	return out, nil
}

type goneTasks struct {
	Killed, Rerun, Orphaned int64
}

// TaskTimersParams are the leader's view of time for delayed and expiring
// tasks.
type TaskTimersParams struct {
	Now time.Time
}

// notAwaitingParents: not held for its parents (schema.TaskAwaitingParents):
// the timers leave such tasks to the graph duty, which hands them back to
// the timers (removing the mark) once their parents allow. The mark is
// true or absent, so an equality on null: the first key of the timers'
// {awaiting_parents, not_before} index, whose bounds it keeps tight.
var notAwaitingParents = bson.E{Key: schema.TaskAwaitingParents, Value: nil}

// TaskReleaseDue queues the held tasks whose not_before has come:
// {status -4, not_before <= Now} to -2 (the claimers hear it at once),
// except those still awaiting their parents. It returns how many.
func (s *Store) TaskReleaseDue(ctx context.Context, p TaskTimersParams) (int64, error) {
	r, err := s.tasks.UpdateMany(ctx, bson.D{
		{Key: schema.TaskStatus, Value: int32(schema.StatusBlocked)},
		{Key: schema.TaskNotBefore, Value: bson.D{{Key: "$lte", Value: p.Now}}},
		notAwaitingParents,
	}, bson.A{bson.D{{Key: "$set", Value: bson.D{ // a pipeline: it says where each task stood
		{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
		{Key: schema.TaskMTime, Value: s.nowMS()},
		priorSet(""),
	}}}})
	if err != nil {
		return 0, fmt.Errorf("queue delayed tasks: %w", err)
	}
	return r.ModifiedCount, nil
}

// expirable: todo, unclaimed, not orphaned (the partial index's range).
func expirable(now time.Time) bson.D {
	return bson.D{
		{Key: schema.TaskStatus, Value: bson.D{{Key: "$lte", Value: int32(schema.StatusQueued)}, {Key: "$ne", Value: int32(schema.StatusOrphaned)}}},
		{Key: schema.TaskExpiresAt, Value: bson.D{{Key: "$lte", Value: now}}},
		{Key: schema.TaskNode, Value: unclaimed},
	}
}

// TaskExpireDue finishes unrun the tasks not started by their expires_at
// (queued, delayed or blocked; status 2, reason expired; no longer
// awaiting parents). It returns how many per queue.
func (s *Store) TaskExpireDue(ctx context.Context, p TaskTimersParams) (map[bson.ObjectID]int64, error) {
	filter := expirable(p.Now)
	cur, err := s.tasks.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: schema.TaskQueue, Value: 1}}).SetLimit(10000))
	if err != nil {
		return nil, fmt.Errorf("find expired tasks: %w", err)
	}
	var docs []struct {
		ID    any           `bson:"_id"`
		Queue bson.ObjectID `bson:"queue"`
	}
	if err := readAllInto(ctx, cur, &docs); err != nil {
		return nil, fmt.Errorf("find expired tasks: %w", err)
	}
	if len(docs) == 0 {
		return nil, nil
	}
	byQueue := map[bson.ObjectID]bson.A{}
	for _, d := range docs {
		byQueue[d.Queue] = append(byQueue[d.Queue], d.ID)
	}
	out := map[bson.ObjectID]int64{}
	for q, ids := range byQueue {
		r, err := s.tasks.UpdateMany(ctx, append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, filter...),
			endUnrun(schema.ReasonExpired, "expired: not started by its expires_at"))
		if err != nil {
			return out, fmt.Errorf("expire tasks: %w", err)
		}
		if r.ModifiedCount > 0 {
			out[q] = r.ModifiedCount
		}
	}
	return out, nil
}

// TaskTimerNext returns the earliest time a delayed task is due (tasks
// awaiting their parents are not the timers' yet) or a waiting task
// expires (ok false when none), read from the two partial indexes (the
// first sorted by not_before after its awaiting_parents equality).
func (s *Store) TaskTimerNext(ctx context.Context) (time.Time, bool, error) {
	var next time.Time
	for _, q := range []struct {
		filter bson.D
		field  string
	}{
		{bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusBlocked)}, {Key: schema.TaskNotBefore, Value: bson.D{{Key: "$type", Value: "date"}}}, notAwaitingParents}, schema.TaskNotBefore},
		{expirable(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)), schema.TaskExpiresAt},
	} {
		var doc bson.Raw
		doc, err := s.tasks.FindOne(ctx, q.filter, options.FindOne().SetSort(bson.D{{Key: q.field, Value: 1}}).
			SetProjection(bson.D{{Key: q.field, Value: 1}})).Raw()
		if errors.Is(err, mongo.ErrNoDocuments) {
			continue
		}
		if err != nil {
			return time.Time{}, false, fmt.Errorf("read the next task timer: %w", err)
		}
		if t, ok := doc.Lookup(q.field).TimeOK(); ok && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return next.UTC(), !next.IsZero(), nil
}
