package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// notDone are the statuses of a task not yet finished: held, queued,
// claimed, running.
var notDone = bson.D{{Key: "$in", Value: bson.A{int32(schema.StatusBlocked), int32(schema.StatusQueued), int32(schema.StatusClaimed), int32(schema.StatusRunning)}}}

// ContinuousCreate creates the task of a continuous queue if it is due: the
// queue is continuous and not paused, it has no task held, queued, claimed
// or running, and its next_continuous has passed (or is unset). It is one
// transaction that moves next_continuous to the creation + interval and
// inserts the task (empty parameters, name the Unix time in seconds of
// its creation), so however many leaders or retries try at once, one
// task is created per interval: two transactions both write the queue
// document, and one of them aborts. It returns the new task's id, or false
// when nothing was due.
//
// now is when the caller judged the queue due, by the server's clock
// (ServerNow, which it reads): leaders on hosts whose clocks disagree then
// agree on when a queue is due, and a leader whose clock ran ahead does
// not stretch the interval after it for the next one. The moment of the
// creation is the server's clock read again once the transaction found no
// unfinished task, or now if that is later: a finish that landed between
// the caller's read and the transaction's (its count saw it) is then not
// after the creation of the task that follows it, as the clocks of one
// host tell.
func (s *Store) ContinuousCreate(ctx context.Context, queue bson.ObjectID, interval time.Duration, now time.Time) (bson.ObjectID, bool, error) {
	outside := ctx // no transaction: hello is not a transaction's command
	now = now.UTC().Truncate(time.Millisecond)
	var id bson.ObjectID
	var created bool
	err := s.inTxn(ctx, func(ctx context.Context) error {
		created = false
		n, err := s.tasks.CountDocuments(ctx, bson.D{{Key: schema.TaskQueue, Value: queue}, {Key: schema.TaskStatus, Value: notDone}})
		if err != nil || n > 0 {
			return err
		}
		at, err := s.ServerNow(outside)
		if err != nil {
			return err
		}
		if at = at.Truncate(time.Millisecond); at.Before(now) {
			at = now
		}
		res, err := s.queues.UpdateOne(ctx, bson.D{
			{Key: "_id", Value: queue},
			{Key: schema.QueueContinuous, Value: true},
			{Key: schema.QueuePaused, Value: bson.D{{Key: "$ne", Value: true}}},
			{Key: "$or", Value: bson.A{
				bson.D{{Key: schema.QueueNextContinuous, Value: bson.D{{Key: "$lte", Value: at}}}},
				bson.D{{Key: schema.QueueNextContinuous, Value: nil}},
			}},
		}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.QueueNextContinuous, Value: at.Add(interval)}}}})
		if err != nil || res.ModifiedCount == 0 {
			return err
		}
		// The name and ctime are one moment (a CI run once named a task
		// ...907 whose ctime was in ...908, from two reads of a clock).
		ids, err := s.TaskInsertMany(ctx, TaskInsertManyParams{Queue: queue, Parameters: []bson.Raw{emptyDoc}, At: at,
			Extra: bson.D{{Key: schema.TaskName, Value: strconv.FormatInt(at.Unix(), 10)}}})
		if err != nil {
			return err
		}
		id, created = ids[0], true
		return nil
	})
	if err != nil {
		return bson.ObjectID{}, false, fmt.Errorf("continuous queue %s: %w", queue.Hex(), err)
	}
	return id, created, nil
}
