package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/disbatch-go/disbatch/schema"
)

// rawLoop drains queue in tasks with conc workers, telling obs of claims
// and finishes; it returns when the queue is empty or ctx ends.
type rawLoop func(ctx context.Context, tasks *mongo.Collection, queue bson.ObjectID, conc int, obs *drainObserver) error

// ceiling queues --ceiling-tasks tasks in a fresh database (the node's
// indexes, no pre-images, no projector) and drains them with loop.
func (e *env) ceiling(ctx context.Context, what string, conc int, loop rawLoop) (DrainRow, error) {
	db, q, drop, err := e.backlog(ctx, "ceiling", e.cfg.CeilingTasks)
	defer drop()
	if err != nil {
		return DrainRow{}, err
	}
	c, err := e.connect()
	if err != nil {
		return DrainRow{}, err
	}
	defer disconnect(c)
	tasks := c.Database(db.Name()).Collection(schema.CollTasks, options.Collection().SetWriteConcern(writeconcern.Majority()))
	obs := newDrainObserver(e.cfg.CeilingTasks)
	dctx, cancel := context.WithTimeout(ctx, e.cfg.DrainTimeout)
	defer cancel()
	cpu := e.meterCPU(ctx, nil)
	// The commit point is sampled as in the node drains, so that both
	// sides of a ratio pay the primary for it; its ages go unreported.
	age := sampleCommitAge(ctx, e.client)
	defer age.stop(0, 0)
	err = loop(dctx, tasks, q, conc, obs)
	age.stop(0, 0)
	cpu.stop(ctx)
	if err != nil && (!drainTimedOut(dctx, err) || ctx.Err() != nil) {
		return DrainRow{}, err
	}
	finished, span := obs.result()
	concurrency := fmt.Sprintf("%d goroutines", conc)
	if what == whatBatched {
		concurrency = batchedConcurrency(conc)
	}
	row := DrainRow{What: what, Concurrency: concurrency, Queued: e.cfg.CeilingTasks, Finished: finished, Seconds: span.Seconds(), Rate: rate(finished, span), Complete: finished == e.cfg.CeilingTasks}
	cpu.fill(&row)
	e.log.Info("throughput: ceiling done", "what", what, "concurrency", concurrency, "finished", finished, "tasks_per_s", round(row.Rate))
	return row, nil
}

// drainTimedOut tells whether a loop's error is its drain context's end:
// the context is done, or, within a second of its deadline, the driver
// refused to send an operation because less than a round trip was left
// (an error wrapping context.DeadlineExceeded, returned while the context
// still has those milliseconds to run). Other errors wrapping
// DeadlineExceeded (a server selection timeout, 30 s) are failures.
func drainTimedOut(dctx context.Context, err error) bool {
	if dctx.Err() != nil {
		return true
	}
	dl, ok := dctx.Deadline()
	return ok && time.Until(dl) < time.Second && errors.Is(err, context.DeadlineExceeded)
}

// workers runs n copies of fn; the first error cancels the others and is
// returned.
func workers(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := fn(ctx, i); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

var (
	queuedFilter = func(queue bson.ObjectID) bson.D {
		return bson.D{{Key: schema.TaskNode, Value: schema.Unclaimed}, {Key: schema.TaskStatus, Value: int32(schema.StatusQueued)}, {Key: schema.TaskQueue, Value: queue}}
	}
	byID = bson.D{{Key: "_id", Value: 1}}
)

// finishSet is the completion of a no-op task, as the node writes it.
func finishSet() bson.D {
	return bson.D{{Key: "$set", Value: bson.D{
		{Key: schema.TaskStatus, Value: int32(schema.StatusSucceeded)},
		{Key: schema.TaskStdout, Value: ""},
		{Key: schema.TaskStderr, Value: ""},
		{Key: schema.TaskMTime, Value: time.Now()},
	}}}
}

func statusSet(st schema.Status) bson.D {
	return bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskStatus, Value: int32(st)}, {Key: schema.TaskMTime, Value: time.Now()}}}}
}

// perTaskLoop: each worker claims with findOneAndUpdate (sorted by _id),
// marks running and finishes with guarded updateOnes, one task at a time.
func (e *env) perTaskLoop(ctx context.Context, tasks *mongo.Collection, queue bson.ObjectID, conc int, obs *drainObserver) error {
	claimOpts := options.FindOneAndUpdate().SetSort(byID).SetReturnDocument(options.After)
	return workers(ctx, conc, func(ctx context.Context, i int) error {
		name := fmt.Sprintf("bench-raw-%d", i)
		guard := func(id bson.ObjectID, st schema.Status) bson.D {
			return bson.D{{Key: "_id", Value: id}, {Key: schema.TaskNode, Value: name}, {Key: schema.TaskStatus, Value: int32(st)}}
		}
		for ctx.Err() == nil {
			raw, err := tasks.FindOneAndUpdate(ctx, queuedFilter(queue),
				bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskNode, Value: name}, {Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)}, {Key: schema.TaskMTime, Value: time.Now()}}}},
				claimOpts).Raw()
			if errors.Is(err, mongo.ErrNoDocuments) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("claim: %w", err)
			}
			obs.TaskClaimed("")
			id := raw.Lookup("_id").ObjectID()
			if _, err := tasks.UpdateOne(ctx, guard(id, schema.StatusClaimed), statusSet(schema.StatusRunning)); err != nil {
				return fmt.Errorf("start: %w", err)
			}
			res, err := tasks.UpdateOne(ctx, guard(id, schema.StatusRunning), finishSet())
			if err != nil {
				return fmt.Errorf("finish: %w", err)
			}
			if res.ModifiedCount == 1 {
				obs.TaskFinished("", schema.StatusSucceeded, 0, false)
			}
		}
		return ctx.Err()
	})
}

// batchedLoop is PERFORMANCE.md's batched claim: find up to 64 candidate
// ids, claim them with one guarded updateMany carrying a claim token, read
// back the ones won, one updateMany to running, one unordered bulkWrite of
// guarded completions.
func (e *env) batchedLoop(ctx context.Context, tasks *mongo.Collection, queue bson.ObjectID, conc int, obs *drainObserver) error {
	findOpts := options.Find().SetSort(byID).SetLimit(ceilingBatch).SetProjection(byID)
	return workers(ctx, conc, func(ctx context.Context, i int) error {
		name := fmt.Sprintf("bench-batched-%d", i)
		for ctx.Err() == nil {
			ids, err := findIDs(ctx, tasks, queuedFilter(queue), findOpts)
			if err != nil {
				return fmt.Errorf("find candidates: %w", err)
			}
			if len(ids) == 0 {
				return nil
			}
			token := bson.NewObjectID()
			res, err := tasks.UpdateMany(ctx,
				bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: schema.TaskNode, Value: schema.Unclaimed}, {Key: schema.TaskStatus, Value: int32(schema.StatusQueued)}},
				bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskNode, Value: name}, {Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)}, {Key: "claim", Value: token}, {Key: schema.TaskMTime, Value: time.Now()}}}})
			if err != nil {
				return fmt.Errorf("claim: %w", err)
			}
			if res.ModifiedCount == 0 {
				continue // another claimer won them all
			}
			obs.TaskClaimed("")
			won, err := findIDs(ctx, tasks, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: "claim", Value: token}}, options.Find().SetProjection(byID))
			if err != nil {
				return fmt.Errorf("read back claimed: %w", err)
			}
			if _, err := tasks.UpdateMany(ctx,
				bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: won}}}, {Key: schema.TaskNode, Value: name}, {Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)}},
				statusSet(schema.StatusRunning)); err != nil {
				return fmt.Errorf("start: %w", err)
			}
			models := make([]mongo.WriteModel, len(won))
			for j, id := range won {
				models[j] = mongo.NewUpdateOneModel().
					SetFilter(bson.D{{Key: "_id", Value: id}, {Key: schema.TaskNode, Value: name}, {Key: schema.TaskStatus, Value: int32(schema.StatusRunning)}}).
					SetUpdate(finishSet())
			}
			br, err := tasks.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
			if err != nil {
				return fmt.Errorf("finish: %w", err)
			}
			for range br.ModifiedCount {
				obs.TaskFinished("", schema.StatusSucceeded, 0, false)
			}
		}
		return ctx.Err()
	})
}

func findIDs(ctx context.Context, coll *mongo.Collection, filter bson.D, opts *options.FindOptionsBuilder) ([]bson.ObjectID, error) {
	cur, err := coll.Find(ctx, filter, opts)
	if err != nil {
		return nil, err
	}
	defer cur.Close(ctx)
	var ids []bson.ObjectID
	for cur.Next(ctx) {
		if id, ok := cur.Current.Lookup("_id").ObjectIDOK(); ok {
			ids = append(ids, id)
		}
	}
	return ids, cur.Err()
}
