package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// WebQueuesReport is the web-queues group: GET /queues answered from the
// projected counters under load, and the same answer the 4.103 way.
type WebQueuesReport struct {
	Queues     int     `json:"queues"`
	Tasks      int     `json:"tasks"`
	Mix        string  `json:"status_mix"`
	InsertRate float64 `json:"insert_tasks_per_s"`
	Load       string  `json:"load"`
	// Projected: count_todo/count_total and one aggregation over the
	// claimed and running tasks, at the open-loop rate.
	Projected Latency `json:"projected"`
	Errors    int     `json:"errors"`
	// ProjectedSerial: the same, one request at a time.
	ProjectedSerial Latency `json:"projected_serial"`
	// CountQueries: the counters unset, so the route counts every queue
	// with store.QueueStatusCounts (3 count queries), one request at a time.
	CountQueries Latency `json:"count_queries"`
	// Ratio is CountQueries / ProjectedSerial (both one at a time);
	// RatioLoaded is CountQueries / Projected.
	Ratio       Ratio `json:"ratio"`
	RatioLoaded Ratio `json:"ratio_loaded"`
	Goal        Goal  `json:"goal"`
	// Wrong* count the queues whose answer differs from the tasks inserted.
	WrongProjected    int `json:"wrong_projected"`
	WrongCountQueries int `json:"wrong_count_queries"`
}

// How web-queues fills its database (raw InsertMany), and its goal.
const (
	webQueuesInsertBatch    = 10_000
	webQueuesInsertParallel = 4
	webQueuesGoalP99        = 10.0 // ms
	webQueuesGoalRatio      = 100.0
	// Claimed and running tasks per queue: a few, as the queues' maxthreads
	// keep them whatever the backlog.
	webQueuesClaimed, webQueuesRunning = 1, 4
	webWarmUp                          = 20  // concurrent requests before the timed ones
	webSerial                          = 200 // projected requests one at a time
)

// queueCounts is one queue's line of GET /queues.
type queueCounts struct {
	Queued    int64 `json:"queued"`
	Running   int64 `json:"running"`
	Completed int64 `json:"completed"`
}

// webQueues fills a database with --web-queue-count queues and --web-tasks
// tasks, serves it, and times GET /queues both ways.
func (e *env) webQueues(ctx context.Context) (*WebQueuesReport, error) {
	db, drop := e.database("webqueues")
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return nil, err
	}
	rep := &WebQueuesReport{Queues: e.cfg.WebQueues, Tasks: e.cfg.WebTasks,
		Load: fmt.Sprintf("%d/s open-loop for %s", e.cfg.WebRate, e.cfg.WebDuration)}
	queues := make([]bson.ObjectID, e.cfg.WebQueues)
	for i := range queues {
		q, err := newQueue(ctx, s, fmt.Sprintf("web-%03d", i), e.cfg.MaxThreads)
		if err != nil {
			return nil, err
		}
		queues[i] = q.ID
	}
	e.log.Info("web-queues: inserting", "tasks", e.cfg.WebTasks, "queues", e.cfg.WebQueues, "batch", webQueuesInsertBatch, "parallel", webQueuesInsertParallel)
	start := time.Now()
	want, mix, err := e.fillQueues(ctx, db.Name(), queues, e.cfg.WebTasks)
	if err != nil {
		return nil, err
	}
	took := time.Since(start)
	rep.Mix, rep.InsertRate = mix, rate(e.cfg.WebTasks, took)
	e.log.Info("web-queues: inserted", "tasks", e.cfg.WebTasks, "took", took.Round(time.Millisecond), "tasks_per_s", round(rep.InsertRate))
	if err := setCounters(ctx, db.Collection(schema.CollQueues), want); err != nil {
		return nil, err
	}

	// A steady state to measure: what the bulk load left dirty is written
	// out first (a checkpoint), as on a server whose tasks came over time.
	if err := e.client.Database("admin").RunCommand(ctx, bson.D{{Key: "fsync", Value: 1}}).Err(); err != nil {
		return nil, fmt.Errorf("fsync after the insert: %w", err)
	}
	w, err := e.startWeb(ctx, db.Name(), false)
	if err != nil {
		return nil, err
	}
	defer w.stop()
	hc := httpClient(time.Minute)
	defer hc.CloseIdleConnections()
	get := func(ctx context.Context) ([]byte, error) { return getQueues(ctx, hc, w.url) }

	// Warm up the connection pools with a burst (not counted), and check
	// the answer.
	if err := workers(ctx, webWarmUp, func(ctx context.Context, _ int) error {
		_, err := get(ctx)
		return err
	}); err != nil {
		return rep, err
	}
	if rep.WrongProjected, err = checkQueues(ctx, get, want); err != nil {
		return rep, err
	}
	if rep.ProjectedSerial, err = oneAtATime(ctx, webSerial, get); err != nil {
		return rep, err
	}
	e.log.Info("web-queues: GET /queues, projected counters", "rate", e.cfg.WebRate, "duration", e.cfg.WebDuration, "one_at_a_time_p50_ms", rep.ProjectedSerial.P50)
	lat, failed, err := openLoop(ctx, e.cfg.WebRate, e.cfg.WebDuration, func(ctx context.Context) error {
		_, err := get(ctx)
		return err
	})
	if err != nil {
		return rep, err
	}
	if failed.n > 0 {
		e.log.Warn("web-queues: requests failed", "failed", failed.n, "first_error", failed.first)
	}
	rep.Projected, rep.Errors = summarize(lat), failed.n
	e.log.Info("web-queues: projected", "p50_ms", rep.Projected.P50, "p99_ms", rep.Projected.P99, "errors", failed.n)

	// The 4.103 way: without counters the route counts each queue with
	// three count queries (store.QueueStatusCounts).
	if _, err := db.Collection(schema.CollQueues).UpdateMany(ctx, bson.D{},
		bson.D{{Key: "$unset", Value: bson.D{{Key: schema.QueueCountTodo, Value: ""}, {Key: schema.QueueCountTotal, Value: ""}}}}); err != nil {
		return rep, fmt.Errorf("unset the counters: %w", err)
	}
	if rep.WrongCountQueries, err = checkQueues(ctx, get, want); err != nil { // also the warm-up
		return rep, err
	}
	e.log.Info("web-queues: GET /queues, 3 count queries per queue", "requests", e.cfg.WebSlow)
	if rep.CountQueries, err = oneAtATime(ctx, e.cfg.WebSlow, get); err != nil {
		return rep, fmt.Errorf("the 4.103 way: %w", err)
	}
	ratios := func(what string, fast Latency) Ratio {
		return Ratio{What: what, P50: ratio(rep.CountQueries.P50, fast.P50), P99: ratio(rep.CountQueries.P99, fast.P99)}
	}
	rep.Ratio = ratios("4.103 way / projected, both one at a time", rep.ProjectedSerial)
	rep.RatioLoaded = ratios(fmt.Sprintf("4.103 way (one at a time) / projected (%d/s)", e.cfg.WebRate), rep.Projected)
	rep.Goal = Goal{
		Goal: fmt.Sprintf("projected p99 <= %g ms at %d/s, and >= %gx faster than the 4.103 way at p50 and p99 (both one at a time)", webQueuesGoalP99, e.cfg.WebRate, webQueuesGoalRatio),
		Met:  rep.Projected.P99 <= webQueuesGoalP99 && rep.Ratio.P50 >= webQueuesGoalRatio && rep.Ratio.P99 >= webQueuesGoalRatio,
	}
	e.log.Info("web-queues: 4.103 way", "p50_ms", rep.CountQueries.P50, "p99_ms", rep.CountQueries.P99, "ratio_p50", round(rep.Ratio.P50))
	return rep, nil
}

// fillQueues inserts n tasks spread evenly over queues with raw InsertMany
// (unordered, majority) in big batches, on a client of its own. In each
// queue, in _id order: finished tasks (1 in 100 failed, the rest
// succeeded), then webQueuesClaimed claimed and webQueuesRunning running,
// then 7% queued. It returns what GET /queues must answer and the mix.
func (e *env) fillQueues(ctx context.Context, db string, queues []bson.ObjectID, n int) (map[bson.ObjectID]queueCounts, string, error) {
	c, err := e.connect()
	if err != nil {
		return nil, "", err
	}
	defer disconnect(c)
	tasks := c.Database(db).Collection(schema.CollTasks, options.Collection().SetWriteConcern(writeconcern.Majority()))

	want := make(map[bson.ObjectID]queueCounts, len(queues))
	var byStatus [5]int // succeeded, failed, claimed, running, queued
	batches := make(chan []any, webQueuesInsertParallel)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range webQueuesInsertParallel {
		wg.Go(func() {
			for b := range batches {
				if _, err := tasks.InsertMany(ctx, b, options.InsertMany().SetOrdered(false)); err != nil {
					cancel(fmt.Errorf("insert tasks: %w", err))
					continue
				}
				if d := done.Add(int64(len(b))); n >= 200_000 && d%100_000 < int64(len(b)) {
					e.log.Info("inserting", "done", d, "of", n, "elapsed", time.Since(start).Round(time.Millisecond))
				}
			}
		})
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	batch := make([]any, 0, webQueuesInsertBatch)
	send := func() bool {
		select {
		case batches <- batch:
			batch = make([]any, 0, webQueuesInsertBatch)
			return true
		case <-ctx.Done():
			return false
		}
	}
produce:
	for qi, q := range queues {
		size := n / len(queues)
		if qi < n%len(queues) {
			size++
		}
		claimed, running := min(webQueuesClaimed, size), min(webQueuesRunning, max(size-webQueuesClaimed, 0))
		queued := min(size*7/100, size-claimed-running)
		finished := size - claimed - running - queued
		var qc queueCounts
		for j := range size {
			var st schema.Status
			var node any = fmt.Sprintf("bench-web-node-%d", qi%4)
			switch {
			case j < finished && j%100 == 99:
				st, qc.Completed = schema.StatusFailed, qc.Completed+1
				byStatus[1]++
			case j < finished:
				st, qc.Completed = schema.StatusSucceeded, qc.Completed+1
				byStatus[0]++
			case j < finished+claimed:
				st, qc.Running = schema.StatusClaimed, qc.Running+1
				byStatus[2]++
			case j < finished+claimed+running:
				st, qc.Running = schema.StatusRunning, qc.Running+1
				byStatus[3]++
			default:
				st, node, qc.Queued = schema.StatusQueued, schema.Unclaimed, qc.Queued+1
				byStatus[4]++
			}
			batch = append(batch, webTaskDoc(q, st, node, j, now))
			if len(batch) == webQueuesInsertBatch && !send() {
				break produce
			}
		}
		want[q] = qc
	}
	if len(batch) > 0 {
		send()
	}
	close(batches)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, "", fmt.Errorf("insert %d tasks (%d done): %w", n, done.Load(), err)
	}
	mix := fmt.Sprintf("%d succeeded, %d failed, %d claimed, %d running, %d queued; %d tasks per queue", byStatus[0], byStatus[1], byStatus[2], byStatus[3], byStatus[4], n/len(queues))
	return want, mix, nil
}

// webTaskDoc is a task as a node leaves it in status st.
func webTaskDoc(queue bson.ObjectID, st schema.Status, node any, n int, now time.Time) bson.D {
	var out any
	if st >= schema.StatusSucceeded {
		out = ""
	}
	return bson.D{
		{Key: "_id", Value: bson.NewObjectID()},
		{Key: schema.TaskQueue, Value: queue},
		{Key: schema.TaskCTime, Value: now},
		{Key: schema.TaskMTime, Value: now},
		{Key: schema.TaskNode, Value: node},
		{Key: schema.TaskStatus, Value: int32(st)},
		{Key: schema.TaskParameters, Value: bson.D{{Key: "commands", Value: "a"}, {Key: "n", Value: int32(n)}}},
		{Key: schema.TaskStdout, Value: out},
		{Key: schema.TaskStderr, Value: out},
	}
}

// setCounters sets each queue's count_todo (status <= 0) and count_total
// to the exact counts, as the projector keeps them.
func setCounters(ctx context.Context, queues *mongo.Collection, want map[bson.ObjectID]queueCounts) error {
	models := make([]mongo.WriteModel, 0, len(want))
	for id, c := range want {
		models = append(models, mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: id}}).
			SetUpdate(bson.D{{Key: "$set", Value: bson.D{
				{Key: schema.QueueCountTodo, Value: c.Queued + c.Running},
				{Key: schema.QueueCountTotal, Value: c.Queued + c.Running + c.Completed},
			}}}))
	}
	if _, err := queues.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false)); err != nil {
		return fmt.Errorf("set the queues' counters: %w", err)
	}
	return nil
}

// getQueues is one GET /queues, its body read to the end.
func getQueues(ctx context.Context, hc *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/queues", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET /queues: read the body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /queues: %s: %.200s", resp.Status, body)
	}
	return body, nil
}

// checkQueues gets GET /queues once and counts the queues whose counts
// differ from want (a queue missing from the answer, or one too many,
// counts too).
func checkQueues(ctx context.Context, get func(context.Context) ([]byte, error), want map[bson.ObjectID]queueCounts) (int, error) {
	body, err := get(ctx)
	if err != nil {
		return 0, err
	}
	var got []struct {
		ID string `json:"id"`
		queueCounts
	}
	if err := json.Unmarshal(body, &got); err != nil {
		return 0, fmt.Errorf("GET /queues: decode: %w", err)
	}
	wrong, seen := 0, 0
	for _, g := range got {
		id, err := bson.ObjectIDFromHex(g.ID)
		w, ok := want[id]
		if err != nil || !ok || w != g.queueCounts {
			wrong++
			continue
		}
		seen++
	}
	return wrong + len(want) - seen, nil
}

// oneAtATime times n calls of get, one after the other.
func oneAtATime(ctx context.Context, n int, get func(context.Context) ([]byte, error)) (Latency, error) {
	lat := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if _, err := get(ctx); err != nil {
			return Latency{}, err
		}
		lat = append(lat, time.Since(t0))
	}
	return summarize(lat), nil
}

// failures counts failed calls of an open loop.
type failures struct {
	n     int
	first error
}

// openLoop calls do rate times a second for d, each call in a goroutine of
// its own started on schedule whatever the earlier calls are doing (open
// loop). A call's latency counts from its scheduled moment, so a stall is
// not hidden by the requests it kept from being sent. It returns the
// latencies of the calls that succeeded.
func openLoop(ctx context.Context, rate int, d time.Duration, do func(ctx context.Context) error) ([]time.Duration, failures, error) {
	n := max(1, int(float64(rate)*d.Seconds()))
	interval := time.Second / time.Duration(rate)
	lat := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				wg.Wait()
				return nil, failures{}, ctx.Err()
			}
		}
		wg.Go(func() {
			errs[i] = do(ctx)
			lat[i] = time.Since(at)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, failures{}, err
	}
	var f failures
	ok := lat[:0]
	for i, err := range errs {
		if err != nil {
			f.n++
			if f.first == nil {
				f.first = err
			}
			continue
		}
		ok = append(ok, lat[i])
	}
	return ok, f, nil
}
