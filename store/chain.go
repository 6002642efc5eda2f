package store

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// ThenResult says what ThenCreate did for one task.
type ThenResult struct {
	Created int    // tasks inserted now
	Existed int    // tasks an earlier try had inserted
	Problem string // why the output could not become tasks (then recorded on the task as then_error)
}

// ThenCreate turns the output of a succeeded task marked then_pending into
// tasks of that queue (an object: one task; a list of objects: one each),
// then removes the mark. Exactly once, whoever calls it and however often:
// each follow-up's _id is derived from the task, its attempt and the
// output's index (its timestamp part is the finish time, so fifo order
// follows the finishes), so an insert a crash or a retry repeats fails
// with a duplicate key and counts as done. A task without the mark is a
// no-op. The node that ran the task calls it after the finish; the
// leader's sweep (ThenPending) catches what a crash left.
func (s *Store) ThenCreate(ctx context.Context, id bson.ObjectID) (ThenResult, error) {
	raw, err := s.tasks.FindOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: schema.TaskThenPending, Value: bson.D{{Key: "$exists", Value: true}}}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return ThenResult{}, nil
	}
	if err != nil {
		return ThenResult{}, fmt.Errorf("then of task %s: %w", id.Hex(), err)
	}
	var r ThenResult
	params, target, problem, err := s.thenOf(ctx, raw)
	if err != nil {
		return r, fmt.Errorf("then of task %s: %w", id.Hex(), err)
	}
	r.Problem = problem
	attempt, hasAttempt := raw.Lookup(schema.TaskAttempt).AsInt64OK()
	if problem == "" {
		finished := thenStamp(raw)
		for i, p := range params {
			tid := chainedID(id, attempt, i, finished)
			_, err := s.TaskInsertMany(ctx, TaskInsertManyParams{Queue: target, Parameters: []bson.Raw{p}, IDs: []bson.ObjectID{tid},
				Extra: bson.D{{Key: schema.TaskChainedFrom, Value: id}}})
			switch {
			case isDuplicateKey(err):
				r.Existed++
			case err != nil:
				return r, fmt.Errorf("then of task %s: %w", id.Hex(), err)
			default:
				r.Created++
			}
		}
	}
	update := bson.D{{Key: "$unset", Value: bson.D{{Key: schema.TaskThenPending, Value: ""}}}}
	if problem != "" {
		update = append(update, bson.E{Key: "$set", Value: bson.D{{Key: schema.TaskThenError, Value: problem}}})
	}
	// The mark of the attempt read: a later attempt's (the task retried
	// and succeeded again meanwhile) is its own to resolve.
	sameAttempt := bson.E{Key: schema.TaskAttempt, Value: attempt}
	if !hasAttempt {
		sameAttempt.Value = bson.D{{Key: "$exists", Value: false}}
	}
	if _, err := s.tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}, sameAttempt}, update); err != nil {
		return r, fmt.Errorf("then of task %s: %w", id.Hex(), err)
	}
	return r, nil
}

// thenOf reads the output's parameters and the then queue's id, or the
// problem that keeps the output from becoming tasks for good (no such
// queue, an output that is not objects). A failed read is an error: the
// mark stays, for the next try.
func (s *Store) thenOf(ctx context.Context, raw bson.Raw) ([]bson.Raw, bson.ObjectID, string, error) {
	name, _ := raw.Lookup(schema.TaskThenPending).StringValueOK()
	var q struct {
		ID bson.ObjectID `bson:"_id"`
	}
	byName := func(name string) error {
		return s.queues.FindOne(ctx, bson.D{{Key: schema.QueueName, Value: name}}, options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Decode(&q)
	}
	err := byName(name)
	if errors.Is(err, mongo.ErrNoDocuments) {
		// Renamed since the task's node read its queue's then (the task
		// ran meanwhile): the then its queue names now, if that exists.
		var own struct {
			Then string `bson:"then"`
		}
		if oerr := s.queues.FindOne(ctx, bson.D{{Key: "_id", Value: raw.Lookup(schema.TaskQueue)}},
			options.FindOne().SetProjection(bson.D{{Key: schema.QueueThen, Value: 1}})).Decode(&own); oerr != nil && !errors.Is(oerr, mongo.ErrNoDocuments) {
			return nil, bson.ObjectID{}, "", fmt.Errorf("read the queue of the task: %w", oerr)
		}
		if own.Then != "" && own.Then != name {
			err = byName(own.Then)
		}
	}
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, bson.ObjectID{}, fmt.Sprintf("then queue %q: no such queue", name), nil
	}
	if err != nil {
		return nil, bson.ObjectID{}, "", fmt.Errorf("read then queue %q: %w", name, err)
	}
	ps, err := schema.OutputParams(raw.Lookup(schema.TaskOutput))
	if err != nil {
		return nil, q.ID, err.Error(), nil
	}
	return ps, q.ID, "", nil
}

// thenStamp is the moment the chained tasks' _ids carry: the finish of
// the attempt whose output they are (its record's, the last in attempts),
// which a retry, a claim or a start does not move as they move mtime;
// mtime for a task without the record.
func thenStamp(raw bson.Raw) time.Time {
	if arr, ok := raw.Lookup(schema.TaskAttempts).ArrayOK(); ok {
		if vals, err := arr.Values(); err == nil && len(vals) > 0 {
			if doc, ok := vals[len(vals)-1].DocumentOK(); ok {
				if t, ok := doc.Lookup("finished").TimeOK(); ok {
					return t
				}
			}
		}
	}
	t, _ := raw.Lookup(schema.TaskMTime).TimeOK()
	return t
}

// chainedID is the _id of the i-th task made from a task's output.
func chainedID(parent bson.ObjectID, attempt int64, i int, finished time.Time) bson.ObjectID {
	h := sha256.New()
	h.Write(parent[:])
	_ = binary.Write(h, binary.BigEndian, attempt)
	_ = binary.Write(h, binary.BigEndian, int64(i))
	sum := h.Sum(nil)
	var id bson.ObjectID
	binary.BigEndian.PutUint32(id[:4], uint32(finished.Unix()))
	copy(id[4:], sum[:8])
	return id
}

// ThenPending lists up to limit tasks whose output has not yet become
// tasks (then_pending), for the leader's sweep.
func (s *Store) ThenPending(ctx context.Context, limit int) ([]bson.ObjectID, error) {
	cur, err := s.tasks.Find(ctx, bson.D{{Key: schema.TaskThenPending, Value: bson.D{{Key: "$exists", Value: true}}}},
		options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("tasks with then pending: %w", err)
	}
	var docs []struct {
		ID bson.ObjectID `bson:"_id"`
	}
	if err := readAllInto(ctx, cur, &docs); err != nil {
		return nil, fmt.Errorf("tasks with then pending: %w", err)
	}
	ids := make([]bson.ObjectID, len(docs))
	for i, d := range docs {
		ids[i] = d.ID
	}
	return ids, nil
}
