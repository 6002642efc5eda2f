package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// noopConstructor is the constructor of every benchmark queue.
const noopConstructor = "bench-noop"

// noopRegistry registers a plugin that succeeds at once, calling started
// (if set) first with the task's id.
func noopRegistry(started func(bson.ObjectID)) *plugin.Registry {
	reg := plugin.NewRegistry()
	reg.Register(noopConstructor, plugin.Func(func(_ context.Context, t plugin.Task) plugin.Result {
		if started != nil {
			started(t.ID)
		}
		return plugin.Result{Status: schema.StatusSucceeded}
	}))
	return reg
}

// newQueue creates a fifo queue of the no-op plugin.
func newQueue(ctx context.Context, s *store.Store, name string, maxThreads int) (schema.Queue, error) {
	q, err := s.QueueCreate(ctx, store.QueueCreateParams{Name: name, Constructor: noopConstructor, MaxThreads: &maxThreads, Sort: schema.SortFIFO})
	if err != nil {
		return schema.Queue{}, fmt.Errorf("create queue %s: %w", name, err)
	}
	return q, nil
}

// taskDoc is a queued task exactly as store.TaskInsertMany writes it.
func taskDoc(id, queue bson.ObjectID, now time.Time) bson.D {
	now = now.UTC().Truncate(time.Millisecond)
	return bson.D{
		{Key: "_id", Value: id},
		{Key: schema.TaskQueue, Value: queue},
		{Key: schema.TaskCTime, Value: now},
		{Key: schema.TaskMTime, Value: now},
		{Key: schema.TaskNode, Value: schema.Unclaimed},
		{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)},
		{Key: schema.TaskParameters, Value: bson.D{}},
		{Key: schema.TaskStdout, Value: nil},
		{Key: schema.TaskStderr, Value: nil},
	}
}

// Insert parallelism for backlogs, as the CLI's submit does it.
const (
	insertBatch    = 1000
	insertParallel = 8
)

// insertTasks queues n no-op tasks with store.TaskInsertMany, in batches of
// insertBatch, insertParallel at once, logging progress for big counts.
func insertTasks(ctx context.Context, log *slog.Logger, s *store.Store, queue bson.ObjectID, n int) error {
	return insertTasksControl(ctx, log, s, queue, n, nil)
}

// maxTaskBytes bounds --scale-task-bytes: well under MongoDB's 16 MiB
// document.
const maxTaskBytes = 1 << 20

// insertPadded is insertTasks with parameters {pad: <pad random bytes>},
// new bytes for each task (a document repeated would compress to nothing
// on disk, where real parameters and output do not).
func insertPadded(ctx context.Context, log *slog.Logger, s *store.Store, queue bson.ObjectID, n, pad int) error {
	if pad == 0 {
		return insertTasks(ctx, log, s, queue, n)
	}
	return insertTasksWith(ctx, log, s, queue, n, nil, func(size int) []bson.Raw {
		params := make([]bson.Raw, size)
		b := make([]byte, pad)
		for i := range params {
			rand.Read(b) //nolint:errcheck // never fails (crypto/rand)
			params[i] = bson.Raw(bsoncore.NewDocumentBuilder().AppendBinary("pad", 0, b).Build())
		}
		return params
	})
}

// insertTasksControl is insertTasks with control fields (a delay, ...) on
// every task.
func insertTasksControl(ctx context.Context, log *slog.Logger, s *store.Store, queue bson.ObjectID, n int, ctl *store.TaskInsertControl) error {
	return insertTasksWith(ctx, log, s, queue, n, ctl, func(size int) []bson.Raw { return make([]bson.Raw, size) })
}

// insertTasksWith is insertTasksControl with each batch's parameters made
// by params.
func insertTasksWith(ctx context.Context, log *slog.Logger, s *store.Store, queue bson.ObjectID, n int, ctl *store.TaskInsertControl, params func(size int) []bson.Raw) error {
	start := time.Now()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	batches := make(chan int)
	var done atomic.Int64
	var wg sync.WaitGroup
	for range insertParallel {
		wg.Go(func() {
			for size := range batches {
				if _, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: queue, Parameters: params(size), Control: ctl}); err != nil {
					cancel(err)
					continue
				}
				if d := done.Add(int64(size)); n >= 200_000 && d%100_000 < int64(size) {
					log.Info("inserting", "done", d, "of", n, "elapsed", time.Since(start).Round(time.Millisecond))
				}
			}
		})
	}
send:
	for left := n; left > 0; left -= insertBatch {
		select {
		case batches <- min(left, insertBatch):
		case <-ctx.Done():
			break send
		}
	}
	close(batches)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("insert %d tasks (%d done): %w", n, done.Load(), err)
	}
	log.Debug("inserted", "tasks", n, "took", time.Since(start))
	return nil
}

// countStatus counts a queue's tasks in status st (the {queue, status} index).
func countStatus(ctx context.Context, db *mongo.Database, queue bson.ObjectID, st schema.Status) (int64, error) {
	n, err := db.Collection(schema.CollTasks).CountDocuments(ctx, bson.D{{Key: schema.TaskQueue, Value: queue}, {Key: schema.TaskStatus, Value: int32(st)}})
	if err != nil {
		return 0, fmt.Errorf("count tasks in status %d: %w", st, err)
	}
	return n, nil
}

// leftover counts the tasks left claimed (-1) or running (0) in db after
// every node stopped, and warns about them: a node's Stop should hand back
// or finish everything it held.
func (e *env) leftover(ctx context.Context, db *mongo.Database, what string) {
	var claimed, running int64
	for _, c := range []struct {
		st schema.Status
		n  *int64
	}{{schema.StatusClaimed, &claimed}, {schema.StatusRunning, &running}} {
		n, err := db.Collection(schema.CollTasks).CountDocuments(ctx, bson.D{{Key: schema.TaskStatus, Value: int32(c.st)}})
		if err != nil {
			e.log.Warn("count tasks left claimed or running", "error", err)
			return
		}
		*c.n = n
	}
	if claimed+running > 0 {
		e.log.Warn("tasks left claimed or running after the nodes stopped", "run", what, "claimed", claimed, "running", running)
	}
}

// backlog makes a fresh database named after what with the node's
// indexes and one no-op queue holding n queued tasks; drop removes it.
func (e *env) backlog(ctx context.Context, what string, n int) (db *mongo.Database, q bson.ObjectID, drop func(), err error) {
	db, drop = e.database(what)
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return db, q, drop, err
	}
	queue, err := newQueue(ctx, s, what, e.cfg.MaxThreads)
	if err != nil {
		return db, q, drop, err
	}
	return db, queue.ID, drop, insertTasks(ctx, e.log, s, queue.ID, n)
}
