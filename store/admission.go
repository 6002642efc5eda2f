package store

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/disbatch-go/disbatch/schema"
)

// Admissions: the exact cluster-wide cap of a queue (max_running). A task
// of a capped queue is claimed by our nodes only together with an
// admission: admitted: true on the task, counted in the queue's admitted
// field, both written in the claim's transaction, which commits only if
// the count stays within the cap. Every change to admissions is a
// transaction that also writes the queue document, so two of them cannot
// both build on the same count: MongoDB aborts one with a write conflict
// and the driver runs it again. docs/scheduling.md says why this is exact.

// runningStatuses are the statuses that count against the cap: claimed
// and running.
var runningStatuses = bson.A{int32(schema.StatusClaimed), int32(schema.StatusRunning)}

// inTxn runs fn in one transaction (snapshot reads, majority commit) of a
// session of its own; the driver runs fn again on a transient error such
// as a write conflict, so fn must start from nothing each time.
func (s *Store) inTxn(ctx context.Context, fn func(ctx context.Context) error) error {
	sess, end, err := s.txnSession(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { end(err) }()
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) { return nil, fn(ctx) },
		options.Transaction().SetReadConcern(readconcern.Snapshot()).SetWriteConcern(writeconcern.Majority()))
	return err
}

// TaskClaimCappedParams ask for up to Limit tasks of a queue whose claimed
// and running tasks may number at most Max across the cluster.
type TaskClaimCappedParams struct {
	Queue bson.ObjectID
	Node  string
	Sort  schema.Sort
	Limit int // 1..MaxClaimBatch
	Max   int // > 0
}

// ErrCapReached: the queue's admissions are all taken.
var ErrCapReached = errors.New("the queue's max_running is reached")

// TaskClaimCapped claims up to Limit queued tasks of a capped queue, and
// at most as many as the cap leaves, in one transaction: it reads the
// queue's admitted count, claims the tasks (node, status -1, mtime, a
// fresh claim token, admitted: true) and adds the new admissions to the
// count. A task that still holds an admission from an earlier claim (it
// was handed back and not yet released) keeps it and adds nothing. It
// returns ErrCapReached when no admission is free, and no tasks and no
// error when nothing is queued. The won tasks are read back after the
// commit, as TaskClaimMany does.
func (s *Store) TaskClaimCapped(ctx context.Context, p TaskClaimCappedParams) (TaskClaimManyResult, error) {
	if p.Limit < 1 || p.Limit > MaxClaimBatch {
		return TaskClaimManyResult{}, fmt.Errorf("claim tasks: limit %d is not within 1..%d", p.Limit, MaxClaimBatch)
	}
	if p.Max < 1 {
		return TaskClaimManyResult{}, fmt.Errorf("claim tasks: max_running %d is not positive", p.Max)
	}
	token := bson.NewObjectID()
	var ids bson.A
	full := false
	err := s.inTxn(ctx, func(ctx context.Context) error {
		ids, full = nil, false
		var q struct {
			Admitted *int64 `bson:"admitted"`
		}
		err := s.queues.FindOne(ctx, bson.D{{Key: "_id", Value: p.Queue}}, options.FindOne().SetProjection(bson.D{{Key: schema.QueueAdmitted, Value: 1}})).Decode(&q)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return nil // the queue is gone
		}
		if err != nil {
			return err
		}
		var admitted int64
		if q.Admitted != nil {
			admitted = *q.Admitted
		}
		// Tasks claimed or running without an admission count too: a
		// Disbatch 4.103 node's (its claims take none; threads is its
		// cap across every node) until the leader's sweep adopts them.
		unadmitted, err := s.tasks.CountDocuments(ctx, bson.D{
			{Key: schema.TaskQueue, Value: p.Queue},
			{Key: schema.TaskStatus, Value: bson.D{{Key: "$in", Value: bson.A{int32(schema.StatusClaimed), int32(schema.StatusRunning)}}}},
			{Key: schema.TaskAdmitted, Value: bson.D{{Key: "$ne", Value: true}}},
		})
		if err != nil {
			return err
		}
		admitted += unadmitted
		filter := claimFilter(p.Queue, s.nowMS(), false)
		cands, err := claimCandidates(ctx, s.tasks, filter, p.Sort, p.Limit, bson.D{{Key: "_id", Value: 1}, {Key: schema.TaskAdmitted, Value: 1}})
		if err != nil {
			return err
		}
		// In claim order: a task handed back with its admission needs no
		// free one; the others take what the cap leaves.
		free := int64(p.Max) - admitted
		var newly int64
		for _, c := range cands {
			// A value that is not a boolean counts as not admitted: it takes
			// a free admission, so the cap holds.
			own, _ := c.Lookup(schema.TaskAdmitted).BooleanOK()
			if own || newly < free {
				ids = append(ids, c.Lookup("_id"))
			}
			if !own && newly < free {
				newly++
			}
		}
		if len(ids) == 0 {
			full = len(cands) > 0
			return nil
		}
		// The snapshot saw them queued; a claimer that took one since
		// makes this write conflict, and the transaction runs again.
		res, err := s.tasks.UpdateMany(ctx, append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, filter...),
			bson.D{{Key: "$set", Value: bson.D{
				{Key: schema.TaskNode, Value: p.Node},
				{Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)},
				{Key: schema.TaskMTime, Value: s.nowMS()},
				{Key: schema.TaskClaimToken, Value: token},
				{Key: schema.TaskAdmitted, Value: true},
				{Key: schema.TaskPrior, Value: schema.Prior{Queue: p.Queue, Status: schema.StatusQueued}.String()},
			}}})
		if err != nil {
			return err
		}
		if res.ModifiedCount != int64(len(ids)) {
			return fmt.Errorf("claimed %d of %d tasks read in the same snapshot", res.ModifiedCount, len(ids))
		}
		if newly == 0 {
			return nil
		}
		up, err := s.queues.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: p.Queue}, {Key: "$or", Value: bson.A{
				bson.D{{Key: schema.QueueAdmitted, Value: bson.D{{Key: "$lte", Value: int64(p.Max) - newly}}}},
				bson.D{{Key: schema.QueueAdmitted, Value: nil}},
			}}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: schema.QueueAdmitted, Value: newly}}}})
		if err != nil {
			return err
		}
		if up.MatchedCount == 0 {
			// Not possible within one snapshot; refuse rather than exceed.
			return fmt.Errorf("admitted changed within the transaction")
		}
		return nil
	})
	if err != nil {
		return TaskClaimManyResult{}, fmt.Errorf("claim tasks in capped queue %s: %w", p.Queue.Hex(), err)
	}
	if full {
		return TaskClaimManyResult{}, ErrCapReached
	}
	if len(ids) == 0 {
		return TaskClaimManyResult{}, nil
	}
	return s.readBackClaimed(ctx, p.Queue, p.Node, ids, token, p.Sort, schema.StatusClaimed)
}

// AdmissionsRelease gives back the admissions of the given tasks of a
// queue that are no longer claimed or running, in one transaction, and
// returns how many it released. It is idempotent: a task whose admission
// is gone, or that is still in -1/0, is left alone. The node that ran a
// capped queue's tasks calls it after their finish; the leader's sweep
// (AdmissionsSweep) catches the rest.
func (s *Store) AdmissionsRelease(ctx context.Context, queue bson.ObjectID, ids []bson.ObjectID) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var released int64
	err := s.inTxn(ctx, func(ctx context.Context) error {
		released = 0
		res, err := s.tasks.UpdateMany(ctx, bson.D{
			{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}},
			{Key: schema.TaskQueue, Value: queue},
			{Key: schema.TaskAdmitted, Value: true},
			{Key: schema.TaskStatus, Value: bson.D{{Key: "$nin", Value: runningStatuses}}},
		}, bson.D{{Key: "$unset", Value: bson.D{{Key: schema.TaskAdmitted, Value: ""}}}})
		if err != nil || res.ModifiedCount == 0 {
			return err
		}
		released = res.ModifiedCount
		_, err = s.queues.UpdateOne(ctx, bson.D{{Key: "_id", Value: queue}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: schema.QueueAdmitted, Value: -released}}}})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("release admissions of queue %s: %w", queue.Hex(), err)
	}
	return released, nil
}

// AdmissionsSweepResult says what one sweep of a queue changed.
type AdmissionsSweepResult struct {
	Released int64 // admissions of tasks no longer in -1/0
	Adopted  int64 // tasks in -1/0 without one (claimed before the cap, or by a 4.103 node)
	Admitted int64 // the queue's admitted count after the sweep
	Drift    int64 // admitted minus the admissions counted, before the repair
}

// AdmissionsSweep makes a queue's admissions exact, in one transaction:
// it releases those of tasks no longer claimed or running (finished,
// handed back, requeued by recovery, cancelled), gives one to every task
// in -1/0 that lacks one (claimed before the queue was capped, or by a
// Disbatch 4.103 node, which takes no admissions), and sets admitted to
// the number of admissions counted (a deleted task's admission is gone
// with it). A queue with no cap has its admissions removed. The leader
// runs it for every queue with a cap or admissions.
func (s *Store) AdmissionsSweep(ctx context.Context, queue bson.ObjectID, capped bool) (AdmissionsSweepResult, error) {
	var r AdmissionsSweepResult
	err := s.inTxn(ctx, func(ctx context.Context) error {
		r = AdmissionsSweepResult{}
		var q struct {
			Admitted *int64 `bson:"admitted"`
		}
		err := s.queues.FindOne(ctx, bson.D{{Key: "_id", Value: queue}}, options.FindOne().SetProjection(bson.D{{Key: schema.QueueAdmitted, Value: 1}})).Decode(&q)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return nil
		}
		if err != nil {
			return err
		}
		release := bson.D{{Key: schema.TaskQueue, Value: queue}, {Key: schema.TaskAdmitted, Value: true}}
		if capped {
			release = append(release, bson.E{Key: schema.TaskStatus, Value: bson.D{{Key: "$nin", Value: runningStatuses}}})
		}
		res, err := s.tasks.UpdateMany(ctx, release, bson.D{{Key: "$unset", Value: bson.D{{Key: schema.TaskAdmitted, Value: ""}}}})
		if err != nil {
			return err
		}
		r.Released = res.ModifiedCount
		if capped {
			res, err = s.tasks.UpdateMany(ctx, bson.D{
				{Key: schema.TaskQueue, Value: queue},
				{Key: schema.TaskStatus, Value: bson.D{{Key: "$in", Value: runningStatuses}}},
				{Key: schema.TaskAdmitted, Value: bson.D{{Key: "$ne", Value: true}}},
			}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskAdmitted, Value: true}}}})
			if err != nil {
				return err
			}
			r.Adopted = res.ModifiedCount
		}
		n, err := s.tasks.CountDocuments(ctx, bson.D{{Key: schema.TaskQueue, Value: queue}, {Key: schema.TaskAdmitted, Value: true}})
		if err != nil {
			return err
		}
		var before int64
		if q.Admitted != nil {
			before = *q.Admitted
		}
		r.Admitted = n
		r.Drift = before - r.Released + r.Adopted - n
		if r.Released == 0 && r.Adopted == 0 && q.Admitted != nil && before == n {
			return nil // nothing to write: no conflict with claims
		}
		_, err = s.queues.UpdateOne(ctx, bson.D{{Key: "_id", Value: queue}},
			bson.D{{Key: "$set", Value: bson.D{{Key: schema.QueueAdmitted, Value: n}}}})
		return err
	})
	if err != nil {
		return AdmissionsSweepResult{}, fmt.Errorf("sweep admissions of queue %s: %w", queue.Hex(), err)
	}
	return r, nil
}
