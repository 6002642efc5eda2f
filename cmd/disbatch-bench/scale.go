package main

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// ScaleRow is claim latency and an in-process node's drain rate at one
// backlog.
type ScaleRow struct {
	Backlog int     `json:"backlog"`
	Claim   Latency `json:"claim"` // store.TaskClaim, one at a time
	// ClaimMany is store.TaskClaimMany of scaleBatch tasks, one at a time.
	ClaimMany    Latency `json:"claim_many"`
	DrainTasks   int     `json:"drain_tasks"`
	DrainSeconds float64 `json:"drain_seconds"`
	DrainRate    float64 `json:"drain_tasks_per_s"`
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
		if err := insertTasks(ctx, e.log, s, q.ID, n); err != nil {
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
		e.log.Info("scale: node drain", "backlog", backlog, "tasks", e.cfg.ScaleDrain)
		obs := newDrainObserver(e.cfg.ScaleDrain)
		ns, err := e.startNodes(ctx, nodeSpec{DB: db.Name(), Count: 1, Name: fmt.Sprintf("bench-scale-%d", backlog), MaxThreads: e.cfg.MaxThreads, Plugins: noopRegistry(nil), Observer: obs})
		if err != nil {
			return rep, err
		}
		_, err = obs.wait(ctx, e.cfg.DrainTimeout)
		finished, span := obs.result()
		ns.stop()
		if err != nil {
			return rep, err
		}
		e.leftover(ctx, db, fmt.Sprintf("scale drain at backlog %d", backlog))
		rep.Rows = append(rep.Rows, ScaleRow{Backlog: backlog, Claim: claim, ClaimMany: many, DrainTasks: finished, DrainSeconds: span.Seconds(), DrainRate: rate(finished, span)})
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
