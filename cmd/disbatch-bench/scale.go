package main

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// ScaleRow is claim latency and an in-process node's drain rate at one
// backlog.
type ScaleRow struct {
	Backlog int     `json:"backlog"`
	Claim   Latency `json:"claim"` // store.TaskClaim, one at a time
	// ClaimMany is store.TaskClaimMany of scaleBatch tasks, one at a time.
	ClaimMany Latency `json:"claim_many"`
	// CatchUp is how long the node's projector took, the queue paused, to
	// apply the inserts made since it last ran (a leader resuming after
	// the backlog was queued), before the timed drain.
	CatchUp      float64 `json:"catch_up_seconds"`
	DrainTasks   int     `json:"drain_tasks"`
	DrainSeconds float64 `json:"drain_seconds"`
	DrainRate    float64 `json:"drain_tasks_per_s"`
	// RawRate is the batched raw loop's rate (one claimer) draining as
	// many tasks of the same queue at the same backlog: the floor's fall.
	RawRate float64 `json:"raw_tasks_per_s"`
	// Recount is the median of three store.QueueRecount calls (the
	// projector's recount of every queue: one $group over every task's
	// {queue, status} index entry, as a snapshot) with RecountTasks in the
	// collection, in ms. A term's catch-up recount and the periodic one
	// are read while the batches go on; one after a change the projector
	// could not place holds them.
	Recount      float64 `json:"recount_ms"`
	RecountTasks int64   `json:"recount_tasks"`
}

// RSSRow is the memory of a node run as a separate process.
type RSSRow struct {
	Backlog  int     `json:"backlog"`
	Seconds  float64 `json:"seconds"`
	Samples  int     `json:"samples"`
	ReadyMiB float64 `json:"ready_mib"` // VmRSS once the node claims
	MaxMiB   float64 `json:"max_mib"`   // max of VmRSS samples and VmHWM
	Finished int     `json:"finished"`
}

// ScaleReport is the scale group.
type ScaleReport struct {
	Rows []ScaleRow `json:"rows"`
	RSS  *RSSRow    `json:"rss,omitempty"`
	// InsertRate is how fast the backlog was inserted (majority, 8 x 1000).
	InsertRate float64 `json:"insert_tasks_per_s"`
}

// scale grows one queue's backlog through --backlogs, measuring at each.
func (e *env) scale(ctx context.Context) (*ScaleReport, error) {
	db, drop := e.database("scale")
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return nil, err
	}
	q, err := newQueue(ctx, s, "scale", e.cfg.MaxThreads)
	if err != nil {
		return nil, err
	}
	rep := &ScaleReport{}
	var inserted int
	var insertTime time.Duration
	topUp := func(target int) error {
		queued, err := countStatus(ctx, db, q.ID, schema.StatusQueued)
		if err != nil {
			return err
		}
		n := target - int(queued)
		if n <= 0 {
			return nil
		}
		e.log.Info("scale: queueing", "tasks", n, "backlog", target)
		start := time.Now()
		if err := insertPadded(ctx, e.log, s, q.ID, n, e.cfg.ScaleTaskBytes); err != nil {
			return err
		}
		took := time.Since(start)
		inserted, insertTime = inserted+n, insertTime+took
		e.log.Info("scale: queued", "tasks", n, "took", took.Round(time.Millisecond), "tasks_per_s", round(rate(n, took)))
		return nil
	}
	for _, backlog := range e.cfg.Backlogs {
		if err := topUp(backlog); err != nil {
			return rep, err
		}
		e.log.Info("scale: claims", "backlog", backlog, "claims", e.cfg.Claims, "batched_claims", manyCalls(e.cfg.Claims))
		claim, err := e.timeClaims(ctx, db, s, q.ID, e.cfg.Claims, func(ctx context.Context, node string) (int, error) {
			_, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: node, Sort: schema.SortFIFO})
			return 1, err
		})
		if err != nil {
			return rep, fmt.Errorf("claims at backlog %d: %w", backlog, err)
		}
		many, err := e.timeClaims(ctx, db, s, q.ID, manyCalls(e.cfg.Claims), func(ctx context.Context, node string) (int, error) {
			res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: node, Sort: schema.SortFIFO, Limit: scaleBatch})
			return len(res.Tasks) + len(res.Malformed), err
		})
		if err != nil {
			return rep, fmt.Errorf("batched claims at backlog %d: %w", backlog, err)
		}
		if err := topUp(backlog); err != nil {
			return rep, err
		}
		row := ScaleRow{Backlog: backlog, Claim: claim, ClaimMany: many}
		if err := e.scaleDrain(ctx, db, s, q, &row); err != nil {
			return rep, err
		}
		if err := topUp(backlog); err != nil {
			return rep, err
		}
		if err := e.scaleRawDrain(ctx, db, q.ID, &row); err != nil {
			return rep, err
		}
		if err := timeRecount(ctx, db, s, &row); err != nil {
			return rep, err
		}
		rep.Rows = append(rep.Rows, row)
	}
	rep.InsertRate = rate(inserted, insertTime)
	largest := e.cfg.Backlogs[len(e.cfg.Backlogs)-1]
	if err := topUp(largest); err != nil {
		return rep, err
	}
	e.log.Info("scale: node process RSS", "backlog", largest, "duration", e.cfg.RSSDuration)
	rss, err := e.nodeRSS(ctx, db.Name(), largest)
	if err != nil {
		return rep, fmt.Errorf("node process: %w", err)
	}
	rep.RSS = &rss
	return rep, nil
}

// timeRecount times three whole recounts and keeps the median.
func timeRecount(ctx context.Context, db *mongo.Database, s *store.Store, row *ScaleRow) error {
	n, err := db.Collection(schema.CollTasks).EstimatedDocumentCount(ctx)
	if err != nil {
		return fmt.Errorf("count tasks: %w", err)
	}
	took := make([]time.Duration, 3)
	for i := range took {
		start := time.Now()
		if _, err := s.QueueRecount(ctx, store.QueueRecountParams{}); err != nil {
			return fmt.Errorf("recount at backlog %d: %w", row.Backlog, err)
		}
		took[i] = time.Since(start)
	}
	row.Recount, row.RecountTasks = summarize(took).P50, n
	return nil
}

// scaleBatch is the size of the timed batched claims (the claimer's
// default batch).
const scaleBatch = 64

// manyCalls is how many batched claims are timed per backlog.
func manyCalls(claims int) int { return max(10, claims/10) }

// timeClaims times calls claims, one after the other. After each, the
// tasks it took are queued again (untimed) so that the backlog stays put;
// at the end the claimed ones are marked finished.
func (e *env) timeClaims(ctx context.Context, db *mongo.Database, s *store.Store, queue bson.ObjectID, calls int, claim func(ctx context.Context, node string) (int, error)) (Latency, error) {
	const name = "bench-claim"
	lat := make([]time.Duration, 0, calls)
	taken := 0
	for range calls {
		start := time.Now()
		n, err := claim(ctx, name)
		if err != nil {
			return Latency{}, err
		}
		lat = append(lat, time.Since(start))
		if n == 0 {
			return Latency{}, fmt.Errorf("the claim found no task with a backlog")
		}
		if taken += n; taken >= scaleBatch {
			if _, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: queue, Parameters: make([]bson.Raw, taken)}); err != nil {
				return Latency{}, err
			}
			taken = 0
		}
	}
	if _, err := db.Collection(schema.CollTasks).UpdateMany(ctx,
		bson.D{{Key: schema.TaskNode, Value: name}, {Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)}},
		statusSet(schema.StatusSucceeded)); err != nil {
		return Latency{}, fmt.Errorf("finish claimed tasks: %w", err)
	}
	return summarize(lat), nil
}

// scaleDrain has one in-process node drain --scale-drain tasks of q. The
// queue is paused (threads 0) while the node's projector catches up with
// the backlog's inserts, so that the timed drain is the steady state of a
// node that was up while the tasks were queued; the catch-up is timed on
// its own.
func (e *env) scaleDrain(ctx context.Context, db *mongo.Database, s *store.Store, q schema.Queue, row *ScaleRow) error {
	threads := func(n int) error {
		return s.QueueUpdate(ctx, store.QueueUpdateParams{ID: q.ID, SetMaxThreads: true, MaxThreads: &n})
	}
	if err := threads(0); err != nil {
		return err
	}
	total, err := db.Collection(schema.CollTasks).CountDocuments(ctx, bson.D{{Key: schema.TaskQueue, Value: q.ID}})
	if err != nil {
		return err
	}
	obs := newDrainObserver(scaleDrainTasks(e.cfg.ScaleDrain, row.Backlog))
	start := time.Now()
	ns, err := e.startNodes(ctx, nodeSpec{DB: db.Name(), Count: 1, Name: fmt.Sprintf("bench-scale-%d", row.Backlog), MaxThreads: e.cfg.MaxThreads, Plugins: noopRegistry(nil), Observer: obs})
	if err != nil {
		return err
	}
	defer ns.stop()
	for {
		c, err := s.QueueCounters(ctx)
		if err != nil {
			return err
		}
		if t := c[q.ID].Total; t != nil && *t == total {
			break
		}
		if time.Since(start) > e.cfg.DrainTimeout {
			return fmt.Errorf("scale: the projector did not catch up with %d tasks within %s", total, e.cfg.DrainTimeout)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	row.CatchUp = time.Since(start).Seconds()
	e.log.Info("scale: node drain", "backlog", row.Backlog, "tasks", scaleDrainTasks(e.cfg.ScaleDrain, row.Backlog), "projector_catch_up_s", round(row.CatchUp))
	if err := threads(e.cfg.MaxThreads); err != nil {
		return err
	}
	reached, err := obs.wait(ctx, e.cfg.DrainTimeout)
	if err == nil && !reached {
		err = fmt.Errorf("scale drain at backlog %d: not done within %s", row.Backlog, e.cfg.DrainTimeout)
	}
	finished, span := obs.result()
	row.DrainTasks, row.DrainSeconds, row.DrainRate = finished, span.Seconds(), rate(finished, span)
	ns.stop()
	if err != nil {
		return err
	}
	e.leftover(ctx, db, fmt.Sprintf("scale drain at backlog %d", row.Backlog))
	return nil
}

// scaleDrainTasks is how many tasks the drains take at a backlog: drain,
// or the whole backlog when it is smaller.
func scaleDrainTasks(drain, backlog int) int { return min(drain, backlog) }

// scaleRawDrain has the batched raw loop (one claimer) drain as many tasks
// of the same queue: what MongoDB allows at this backlog.
func (e *env) scaleRawDrain(ctx context.Context, db *mongo.Database, queue bson.ObjectID, row *ScaleRow) error {
	n := scaleDrainTasks(e.cfg.ScaleDrain, row.Backlog)
	obs := newDrainObserver(n)
	rctx, cancel := context.WithTimeout(ctx, e.cfg.DrainTimeout)
	defer cancel()
	go func() {
		select {
		case <-obs.Done():
			cancel()
		case <-rctx.Done():
		}
	}()
	tasks := db.Collection(schema.CollTasks, options.Collection().SetWriteConcern(writeconcern.Majority()))
	if err := e.batchedLoop(rctx, tasks, queue, 1, obs); err != nil && !drainTimedOut(rctx, err) {
		return fmt.Errorf("raw loop at backlog %d: %w", row.Backlog, err)
	}
	finished, span := obs.result()
	if finished < n {
		return fmt.Errorf("raw loop at backlog %d: %d of %d tasks in %s", row.Backlog, finished, n, e.cfg.DrainTimeout)
	}
	row.RawRate = rate(finished, span)
	e.log.Info("scale: raw loop", "backlog", row.Backlog, "tasks_per_s", round(row.RawRate))
	return nil
}
