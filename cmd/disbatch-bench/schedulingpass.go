package main

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/store"
)

// The queues of the many-queue drain: priorities 0..schedPriorities-1 and
// weights 1..100, spread over the queues so that every priority has every
// kind of weight.
const schedPriorities = 4

func schedPriority(i int) float64 { return float64(i % schedPriorities) }
func schedWeight(i int) float64   { return float64(1 + (i*37)%100) }

// passesWhat names a drain of n queues.
func passesWhat(n int) string {
	if n == 1 {
		return "1 queue (priority 0, weight 20)"
	}
	return fmt.Sprintf("%d queues (priorities 0-%d, weights 1-100)", n, schedPriorities-1)
}

// schedPasses queues --sched-tasks no-op tasks spread evenly over n queues
// (mixed priorities and weights when n > 1), drains them with one
// in-process node and reads its claimer's counters.
func (e *env) schedPasses(ctx context.Context, queues int) (PassRow, error) {
	db, drop := e.database(fmt.Sprintf("passes%d", queues))
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return PassRow{}, err
	}
	start := time.Now()
	ids, err := e.schedQueues(ctx, s, queues)
	if err != nil {
		return PassRow{}, err
	}
	if err := insertSpread(ctx, s, ids, e.cfg.SchedTasks); err != nil {
		return PassRow{}, err
	}
	e.log.Info("scheduling: queued", "queues", queues, "tasks", e.cfg.SchedTasks, "took", time.Since(start).Round(time.Millisecond))

	obs := newDrainObserver(e.cfg.SchedTasks)
	began := time.Now()
	ns, err := e.startNodes(ctx, nodeSpec{DB: db.Name(), Count: 1, Name: "bench-passes", MaxThreads: e.cfg.MaxThreads, Plugins: noopRegistry(nil), Observer: obs})
	if err != nil {
		return PassRow{}, err
	}
	complete, err := obs.wait(ctx, e.cfg.DrainTimeout)
	finished, span := obs.result()
	// A pass ends when every slot is taken or every queue it tries is
	// found empty: on a backlog spread over many queues one pass may last
	// the whole drain. Its time is counted when it ends, at the latest
	// when Stop cancels it, so the counters are read after Stop.
	n := ns.list[0]
	ns.stop()
	alive := time.Since(began)
	st := n.ClaimerStats()
	if err != nil {
		return PassRow{}, err
	}
	e.leftover(ctx, db, "passes, "+passesWhat(queues))
	row := PassRow{What: passesWhat(queues), Queues: queues, Queued: e.cfg.SchedTasks, Finished: finished, Seconds: span.Seconds(), Rate: rate(finished, span), Complete: complete,
		Passes: st.Passes, ClaimingPasses: st.WakePasses + st.TickPasses, Claims: st.Claims, EmptyClaims: st.EmptyClaims, Batches: st.Batches,
		PassMean: ratio(ms(st.PassTime), float64(st.Passes)), PassPerTask: ratio(ms(st.PassTime), float64(st.Claims)), Busy: ratio(st.PassTime.Seconds(), alive.Seconds())}
	return row, nil
}

// schedQueues creates n queues of the no-op plugin; with more than one,
// each with its priority and weight.
func (e *env) schedQueues(ctx context.Context, s *store.Store, n int) ([]bson.ObjectID, error) {
	ids := make([]bson.ObjectID, n)
	err := forEach(ctx, n, insertParallel, func(ctx context.Context, i int) error {
		q, err := newQueue(ctx, s, fmt.Sprintf("sched-%04d", i), e.cfg.MaxThreads)
		if err != nil {
			return err
		}
		ids[i] = q.ID
		if n == 1 {
			return nil
		}
		pr, w := schedPriority(i), schedWeight(i)
		if err := s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, Priority: &pr, Weight: &w}); err != nil {
			return fmt.Errorf("set queue %s's priority and weight: %w", q.Name, err)
		}
		return nil
	})
	return ids, err
}

// insertSpread queues n no-op tasks spread evenly over queues (the first
// n % len(queues) get one more), in batches of at most insertBatch,
// insertParallel at once.
func insertSpread(ctx context.Context, s *store.Store, queues []bson.ObjectID, n int) error {
	type batch struct {
		queue bson.ObjectID
		size  int
	}
	var batches []batch
	for i, q := range queues {
		k := n / len(queues)
		if i < n%len(queues) {
			k++
		}
		for ; k > 0; k -= insertBatch {
			batches = append(batches, batch{q, min(k, insertBatch)})
		}
	}
	return forEach(ctx, len(batches), insertParallel, func(ctx context.Context, i int) error {
		b := batches[i]
		if _, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: b.queue, Parameters: make([]bson.Raw, b.size)}); err != nil {
			return fmt.Errorf("insert %d tasks: %w", b.size, err)
		}
		return nil
	})
}
