package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

const (
	dagWarmUp = 5                // pairs inserted first and not counted
	dagWait   = 30 * time.Second // after the last insert, before a child counts as missing
)

// schedDAG inserts --dag-edges parent -> child pairs, one pair every
// 1/--pickup-rate s (after dagWarmUp not counted), into one queue served by
// one in-process node, and times each parent done -> its child running.
func (e *env) schedDAG(ctx context.Context, rep *DAGFigures) error {
	db, drop := e.database("dag")
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return err
	}
	q, err := newQueue(ctx, s, "dag", e.cfg.MaxThreads)
	if err != nil {
		return err
	}
	rep.Edges, rep.Rate = e.cfg.DAGEdges, e.cfg.PickupRate
	fail := func(format string, args ...any) {
		if len(rep.Failures) < maxFailures {
			rep.Failures = append(rep.Failures, fmt.Sprintf(format, args...))
		}
	}

	// A parent's first update to 1 is its finish; a child's first to -2
	// its release by the graph duty.
	w, err := e.watchStatus(ctx, db.Name(), bson.D{{Key: "$in", Value: bson.A{int32(schema.StatusQueued), int32(schema.StatusSucceeded)}}})
	if err != nil {
		return err
	}
	defer w.close()
	ran := newRunLog()
	ns, err := e.startNodes(ctx, nodeSpec{DB: db.Name(), Count: 1, Name: "bench-dag", MaxThreads: e.cfg.MaxThreads, Plugins: noopRegistry(ran.record)})
	if err != nil {
		return err
	}
	defer ns.stop()

	submit := func(n int) (parents, children []bson.ObjectID, err error) {
		tick := time.NewTicker(time.Second / time.Duration(e.cfg.PickupRate))
		defer tick.Stop()
		for range n {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
			p, c := bson.NewObjectID(), bson.NewObjectID()
			if _, err := s.TaskInsertGraph(ctx, store.TaskInsertGraphParams{Tasks: []store.GraphTask{
				{ID: p, Queue: q.ID}, {ID: c, Queue: q.ID, Parents: []bson.ObjectID{p}},
			}}); err != nil {
				return nil, nil, fmt.Errorf("insert a parent and its child: %w", err)
			}
			parents, children = append(parents, p), append(children, c)
		}
		return parents, children, nil
	}

	// Warm-up: the node's first term as leader opens the graph duty's
	// stream (a child inserted before that waits for the term's first
	// sweep).
	_, warm, err := submit(dagWarmUp)
	if err != nil {
		return err
	}
	if left, err := ran.wait(ctx, warm, dagWait); err != nil {
		return err
	} else if left > 0 {
		return fmt.Errorf("%d of %d warm-up children not started within %s: is the graph duty running?", left, len(warm), dagWait)
	}

	parents, children, err := submit(rep.Edges)
	if err != nil {
		return err
	}
	left, err := ran.wait(ctx, children, dagWait)
	if err != nil {
		return err
	}
	if left > 0 {
		rep.Missing = left
		fail("%d of %d children not started within %s of the last insert", left, len(children), dagWait)
	}

	// The node's own record: every task finished, the attempts' times.
	all := append(append([]bson.ObjectID{}, parents...), children...)
	if left, err := e.waitFinished(ctx, db, all, 10*time.Second); err != nil {
		return err
	} else if left > 0 {
		fail("%d of %d tasks not finished 10 s after the children started", left, len(all))
	}
	records, err := readAttempts(ctx, db, all)
	if err != nil {
		return err
	}

	var edge, released, pickup, attempts []time.Duration
	events := time.NewTimer(10 * time.Second) // for the last events to arrive
	defer events.Stop()
	for i, c := range children {
		p := parents[i]
		pr, cr := ran.runs(p), ran.runs(c)
		for _, x := range []struct {
			id   bson.ObjectID
			runs []time.Time
		}{{p, pr}, {c, cr}} {
			if len(x.runs) > 1 {
				rep.Twice++
				fail("task %s ran %d times", x.id.Hex(), len(x.runs))
			}
		}
		pa, ca := records[p], records[c]
		for _, x := range []struct {
			id  bson.ObjectID
			rec taskRecord
		}{{p, pa}, {c, ca}} {
			if x.rec.Status != int32(schema.StatusSucceeded) {
				fail("task %s: status %d, want 1", x.id.Hex(), x.rec.Status)
			}
		}
		early := false
		if len(pr) > 0 && len(cr) > 0 {
			d := cr[0].Sub(pr[0])
			early = d < 0
			edge = append(edge, d)
		}
		if !pa.Finished.IsZero() && !ca.Started.IsZero() {
			d := ca.Started.Sub(pa.Finished)
			early = early || d < 0
			attempts = append(attempts, d)
		}
		if early {
			rep.Early++
			fail("child %s started before its parent %s was done", c.Hex(), p.Hex())
		}
		ps, cs := w.expect(p), w.expect(c)
		if !waitSlot(ctx, ps, events.C) || !waitSlot(ctx, cs, events.C) {
			continue
		}
		if ps.status != int32(schema.StatusSucceeded) || cs.status != int32(schema.StatusQueued) {
			continue // a hand-back: not a release
		}
		released = append(released, cs.at.Sub(ps.at))
		if len(cr) > 0 {
			pickup = append(pickup, cr[0].Sub(cs.at))
		}
	}
	rep.Edge, rep.Released, rep.Pickup, rep.Attempts = summarize(edge), summarize(released), summarize(pickup), summarize(attempts)
	return nil
}

// waitSlot waits for a status watch's slot until expired fires.
func waitSlot(ctx context.Context, s *statusSlot, expired <-chan time.Time) bool {
	select {
	case <-s.done:
		return true
	default:
	}
	select {
	case <-s.done:
		return true
	case <-expired:
		return false
	case <-ctx.Done():
		return false
	}
}

// runLog records when the plugin ran each task, on this process's clock.
type runLog struct {
	mu      sync.Mutex
	ran     map[bson.ObjectID][]time.Time
	changed chan struct{}
}

func newRunLog() *runLog {
	return &runLog{ran: map[bson.ObjectID][]time.Time{}, changed: make(chan struct{}, 1)}
}

// record is the no-op plugin's callback.
func (r *runLog) record(id bson.ObjectID) {
	now := time.Now()
	r.mu.Lock()
	r.ran[id] = append(r.ran[id], now)
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// runs returns when task id ran.
func (r *runLog) runs(id bson.ObjectID) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ran[id]
}

// wait returns when every id ran, or how many did not by the timeout.
func (r *runLog) wait(ctx context.Context, ids []bson.ObjectID, timeout time.Duration) (int, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		r.mu.Lock()
		left := 0
		for _, id := range ids {
			if len(r.ran[id]) == 0 {
				left++
			}
		}
		r.mu.Unlock()
		if left == 0 {
			return 0, nil
		}
		select {
		case <-r.changed:
		case <-t.C:
			return left, nil
		case <-ctx.Done():
			return left, ctx.Err()
		}
	}
}

// taskRecord is what the node recorded of a task: its status and its last
// attempt's times.
type taskRecord struct {
	Status   int32
	Started  time.Time
	Finished time.Time
}

// readAttempts reads the status and last attempt of each id.
func readAttempts(ctx context.Context, db *mongo.Database, ids []bson.ObjectID) (map[bson.ObjectID]taskRecord, error) {
	cur, err := db.Collection(schema.CollTasks).Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}},
		options.Find().SetProjection(bson.D{{Key: schema.TaskStatus, Value: 1}, {Key: schema.TaskAttempts, Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("read the tasks' attempts: %w", err)
	}
	var docs []struct {
		ID       bson.ObjectID    `bson:"_id"`
		Status   int32            `bson:"status"`
		Attempts []schema.Attempt `bson:"attempts"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("read the tasks' attempts: %w", err)
	}
	out := make(map[bson.ObjectID]taskRecord, len(docs))
	for _, d := range docs {
		r := taskRecord{Status: d.Status}
		if n := len(d.Attempts); n > 0 {
			r.Started, r.Finished = d.Attempts[n-1].Started, d.Attempts[n-1].Finished
		}
		out[d.ID] = r
	}
	return out, nil
}
