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

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// schedCapNodes is how many in-process nodes drain the max_running queue:
// the cap is cluster-wide.
const schedCapNodes = 2

// schedCaps drains --sched-tasks tasks of one queue three times with
// schedCapNodes nodes: without max_running, with a cap above every slot
// the nodes have (it never binds) and with one a quarter of one node's
// maxthreads (it binds).
func (e *env) schedCaps(ctx context.Context, rep *CapFigures) error {
	rep.Nodes = schedCapNodes
	for _, limit := range []int{0, 2 * schedCapNodes * e.cfg.MaxThreads, max(1, e.cfg.MaxThreads/4)} {
		what := capWhat(limit, schedCapNodes, e.cfg.MaxThreads)
		e.log.Info("scheduling: max_running drain", "cap", what, "nodes", schedCapNodes, "tasks", e.cfg.SchedTasks, "timeout", e.cfg.DrainTimeout)
		row, err := e.capDrain(ctx, limit)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		e.log.Info("scheduling: drained", "cap", what, "finished", row.Finished, "tasks_per_s", round(row.Rate), "most_held", row.MaxHeld)
		rep.Rows = append(rep.Rows, row)
	}
	return nil
}

// capDrain queues --sched-tasks tasks in one queue capped at limit (0:
// none) and drains them with schedCapNodes in-process nodes, while a
// change stream counts the tasks in -1/0.
func (e *env) capDrain(ctx context.Context, limit int) (CapRow, error) {
	db, drop := e.database("cap")
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return CapRow{}, err
	}
	q, err := newQueue(ctx, s, "cap", e.cfg.MaxThreads)
	if err != nil {
		return CapRow{}, err
	}
	if limit > 0 {
		if err := s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, MaxRunning: &limit}); err != nil {
			return CapRow{}, fmt.Errorf("set max_running: %w", err)
		}
	}
	if err := insertTasks(ctx, e.log, s, q.ID, e.cfg.SchedTasks); err != nil {
		return CapRow{}, err
	}
	sentinel := bson.NewObjectID()
	hw, err := e.watchHeld(ctx, db.Name(), sentinel)
	if err != nil {
		return CapRow{}, err
	}
	defer hw.close()

	obs := newDrainObserver(e.cfg.SchedTasks)
	ns, err := e.startNodes(ctx, nodeSpec{DB: db.Name(), Count: schedCapNodes, Name: "bench-cap", MaxThreads: e.cfg.MaxThreads, Plugins: noopRegistry(nil), Observer: obs})
	if err != nil {
		return CapRow{}, err
	}
	complete, err := obs.wait(ctx, e.cfg.DrainTimeout)
	finished, span := obs.result()
	var refused int64
	for _, n := range ns.list {
		refused += n.ClaimerStats().CapReached
	}
	ns.stop()
	if err != nil {
		return CapRow{}, err
	}
	what := capWhat(limit, schedCapNodes, e.cfg.MaxThreads)
	e.leftover(ctx, db, "max_running, "+what)

	// A write after the nodes stopped: once the stream delivers it, it
	// delivered every status change before it.
	if _, err := db.Collection(schema.CollTasks).InsertOne(ctx, taskDoc(sentinel, bson.NewObjectID(), time.Now())); err != nil {
		return CapRow{}, fmt.Errorf("insert the sentinel task: %w", err)
	}
	seen, err := hw.waitSentinel(ctx, 30*time.Second)
	if err != nil {
		return CapRow{}, err
	}
	most, transitions := hw.result()
	var qd struct {
		Admitted int64 `bson:"admitted"`
	}
	if err := db.Collection(schema.CollQueues).FindOne(ctx, bson.D{{Key: "_id", Value: q.ID}},
		options.FindOne().SetProjection(bson.D{{Key: schema.QueueAdmitted, Value: 1}})).Decode(&qd); err != nil {
		return CapRow{}, fmt.Errorf("read the queue's admitted count: %w", err)
	}
	return CapRow{What: what, Cap: limit, Queued: e.cfg.SchedTasks, Finished: finished, Seconds: span.Seconds(), Rate: rate(finished, span), Complete: complete,
		MaxHeld: most, Transitions: transitions, Seen: seen, CapReached: refused, Admitted: qd.Admitted}, nil
}

// heldWatch replays every task status change of a database, in commit
// order, and keeps the most tasks in -1/0 at once.
type heldWatch struct {
	client   *mongo.Client
	cs       *mongo.ChangeStream
	cancel   context.CancelFunc
	ended    chan struct{}
	sentinel chan struct{} // closed when the sentinel's insert arrives

	mu          sync.Mutex
	held        map[bson.ObjectID]bool
	most        int
	transitions int64
}

// watchHeld opens the stream: status updates, and the insert of the
// sentinel task.
func (e *env) watchHeld(ctx context.Context, db string, sentinel bson.ObjectID) (*heldWatch, error) {
	c, err := e.connect()
	if err != nil {
		return nil, err
	}
	statusPath := "updateDescription.updatedFields." + schema.TaskStatus
	cs, err := c.Database(db).Collection(schema.CollTasks).Watch(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: "operationType", Value: "update"}, {Key: statusPath, Value: bson.D{{Key: "$exists", Value: true}}}},
			bson.D{{Key: "operationType", Value: "insert"}, {Key: "documentKey._id", Value: sentinel}},
		}}}}},
		{{Key: "$project", Value: bson.D{{Key: "operationType", Value: 1}, {Key: "documentKey", Value: 1}, {Key: statusPath, Value: 1}}}},
	})
	if err != nil {
		disconnect(c)
		return nil, fmt.Errorf("watch the tasks' status changes: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &heldWatch{client: c, cs: cs, cancel: cancel, ended: make(chan struct{}), sentinel: make(chan struct{}), held: map[bson.ObjectID]bool{}}
	go func() {
		defer close(w.ended)
		for cs.Next(wctx) {
			id, ok := cs.Current.Lookup("documentKey", "_id").ObjectIDOK()
			if !ok {
				continue
			}
			if op, _ := cs.Current.Lookup("operationType").StringValueOK(); op == "insert" {
				if id == sentinel {
					close(w.sentinel)
					return
				}
				continue
			}
			st, ok := cs.Current.Lookup("updateDescription", "updatedFields", schema.TaskStatus).AsInt64OK()
			if ok {
				w.apply(id, schema.Status(st))
			}
		}
	}()
	return w, nil
}

// apply records task id's move to status st.
func (w *heldWatch) apply(id bson.ObjectID, st schema.Status) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.transitions++
	if st == schema.StatusClaimed || st == schema.StatusRunning {
		w.held[id] = true
		w.most = max(w.most, len(w.held))
		return
	}
	delete(w.held, id)
}

// waitSentinel reports whether the sentinel's insert arrived in time.
func (w *heldWatch) waitSentinel(ctx context.Context, timeout time.Duration) (bool, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.sentinel:
		return true, nil
	case <-w.ended:
		select {
		case <-w.sentinel:
			return true, nil
		default:
		}
		if err := w.cs.Err(); err != nil && !errors.Is(err, context.Canceled) {
			return false, fmt.Errorf("the status change stream ended: %w", err)
		}
		return false, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// result is the most tasks seen in -1/0 at once and the status changes seen.
func (w *heldWatch) result() (most int, transitions int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.most, w.transitions
}

func (w *heldWatch) close() {
	w.cancel()
	<-w.ended
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.cs.Close(ctx)
	disconnect(w.client)
}
