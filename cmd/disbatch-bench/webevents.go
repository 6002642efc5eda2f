package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
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

// WebEventsReport is the web-events group: SSE subscribers of one hub
// while a writer moves tasks through their transitions.
type WebEventsReport struct {
	Subscribers int `json:"subscribers"`
	Tasks       int `json:"tasks"`
	// Chunk is how many tasks each of the writer's guarded updateMany moves.
	Chunk       int     `json:"writer_chunk"`
	Transitions int     `json:"transitions"` // written: 3 per task
	TargetRate  int     `json:"target_transitions_per_s"`
	Rate        float64 `json:"transitions_per_s"` // achieved: first write to last acknowledgement
	Seconds     float64 `json:"seconds"`
	// Lag: a subscriber's receipt of a transition minus the writer's
	// acknowledgement of the write that made it, over every receipt of
	// every subscriber (the first receipt of each transition).
	Lag Latency `json:"lag"`
	// CommitLag: receipt minus the event's "time" (the commit's wall
	// clock, millisecond resolution).
	CommitLag Latency `json:"commit_lag"`
	// Lost and Duplicated: transitions a subscriber never got or got more
	// than once, summed over subscribers; Unexpected: other events (task
	// events of no transition written, reset).
	Lost       int64 `json:"lost"`
	Duplicated int64 `json:"duplicated"`
	Unexpected int64 `json:"unexpected"`
	// Reconnects: streams a subscriber opened again with Last-Event-ID
	// (after an event lagged or an end); Dropped: the hub's count of
	// clients dropped for falling behind.
	Reconnects int64 `json:"reconnects"`
	Dropped    int64 `json:"dropped"`
	Goal       Goal  `json:"goal"`
}

const (
	sseChunk         = 10 // tasks per guarded updateMany of the writer
	sseWriters       = 8  // goroutines writing chunks
	sseGoalP99       = 50.0
	sseDeliveryWait  = 15 * time.Second // after the last write, for the last events
	sseReconnectWait = 100 * time.Millisecond
	sseWriterNode    = "bench-sse-writer"
)

// webEvents measures delivery lag and exactness of GET /api/v1/events.
func (e *env) webEvents(ctx context.Context) (*WebEventsReport, error) {
	db, drop := e.database("webevents")
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.TasksPreImagesEnable(ctx); err != nil { // as the projector leaves it
		return nil, err
	}
	if err := s.IndexesEnsure(ctx); err != nil {
		return nil, err
	}
	q, err := newQueue(ctx, s, "events", e.cfg.MaxThreads)
	if err != nil {
		return nil, err
	}
	chunks := max(1, (int(float64(e.cfg.SSERate)*e.cfg.SSEDuration.Seconds())+3*sseChunk-1)/(3*sseChunk))
	n := chunks * sseChunk
	rep := &WebEventsReport{Subscribers: e.cfg.SSESubscribers, Tasks: n, Chunk: sseChunk, Transitions: 3 * n, TargetRate: e.cfg.SSERate}
	if err := insertTasks(ctx, e.log, s, q.ID, n); err != nil {
		return nil, err
	}
	c, err := e.connect() // the writer's client
	if err != nil {
		return nil, err
	}
	defer disconnect(c)
	tasks := c.Database(db.Name()).Collection(schema.CollTasks, options.Collection().SetWriteConcern(writeconcern.Majority()))
	ids, err := findIDs(ctx, tasks, queuedFilter(q.ID), options.Find().SetSort(byID).SetProjection(byID))
	if err != nil {
		return nil, fmt.Errorf("read the task ids: %w", err)
	}
	if len(ids) != n {
		return nil, fmt.Errorf("%d tasks queued, want %d", len(ids), n)
	}
	index := make(map[string]int32, n)
	for i, id := range ids {
		index[id.Hex()] = int32(i)
	}

	w, err := e.startWeb(ctx, db.Name(), true)
	if err != nil {
		return nil, err
	}
	defer w.stop()

	base := time.Now()
	sctx, stopSubs := context.WithCancel(ctx)
	defer stopSubs()
	hc := httpClient(0)
	defer hc.CloseIdleConnections()
	subs := make([]*sseSub, e.cfg.SSESubscribers)
	ready := make(chan struct{}, len(subs))
	var wg sync.WaitGroup
	for i := range subs {
		subs[i] = &sseSub{url: w.url + "/api/v1/events?types=task&queue=" + q.ID.Hex(), hc: hc, index: index, base: base,
			recv: make([]int64, 3*n), got: make([]uint8, 3*n)}
		wg.Go(func() { subs[i].run(sctx, func() { ready <- struct{}{} }) })
	}
	stop := func() {
		stopSubs()
		wg.Wait()
	}
	e.log.Info("web-events: connecting", "subscribers", len(subs))
	connectBy := time.After(30 * time.Second)
	for range subs {
		select {
		case <-ready:
		case <-connectBy:
			stop()
			return rep, errors.New("the subscribers did not all connect within 30 s")
		case <-ctx.Done():
			stop()
			return rep, ctx.Err()
		}
	}

	e.log.Info("web-events: writing", "tasks", n, "transitions", 3*n, "rate", e.cfg.SSERate)
	ack := make([]int64, 3*n)
	first, last, err := sseWrite(ctx, tasks, ids, e.cfg.SSERate, base, ack)
	if err != nil {
		stop()
		return rep, err
	}
	rep.Seconds = last.Sub(first).Seconds()
	rep.Rate = rate(3*n, last.Sub(first))
	e.log.Info("web-events: written", "transitions_per_s", round(rep.Rate))

	// Wait for the last events to reach everyone (or give up).
	deadline := time.Now().Add(sseDeliveryWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		all := true
		for _, sb := range subs {
			if sb.distinct.Load() < int64(3*n) {
				all = false
				break
			}
		}
		if all {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rep.Dropped = w.hub.Stats().Dropped
	stop()
	if err := ctx.Err(); err != nil {
		return rep, err
	}

	lags := make([]time.Duration, 0, len(subs)*3*n)
	var commit []time.Duration
	for _, sb := range subs {
		for k, r := range sb.recv {
			if r != 0 {
				lags = append(lags, time.Duration(r-1-ack[k]))
			}
		}
		commit = append(commit, sb.commitLag...)
		rep.Lost += int64(3*n) - sb.distinct.Load()
		rep.Duplicated += sb.duplicated
		rep.Unexpected += sb.unexpected
		rep.Reconnects += sb.reconnects
		if sb.err != nil {
			e.log.Warn("web-events: a subscriber's stream failed", "error", sb.err)
		}
	}
	rep.Lag, rep.CommitLag = summarize(lags), summarize(commit)
	rep.Goal = Goal{Goal: fmt.Sprintf("lag p99 <= %g ms, nothing lost or duplicated", sseGoalP99),
		Met: rep.Lag.P99 <= sseGoalP99 && rep.Lost == 0 && rep.Duplicated == 0}
	e.log.Info("web-events: delivered", "lag_p50_ms", rep.Lag.P50, "lag_p99_ms", rep.Lag.P99, "lost", rep.Lost, "duplicated", rep.Duplicated, "reconnects", rep.Reconnects)
	return rep, nil
}

// sseWrite moves ids through -2 -> -1 -> 0 -> 1 in chunks of sseChunk, a
// chunk's three guarded updateMany one after the other, chunks started on
// a schedule of rate transitions a second by sseWriters goroutines. ack
// gets, per task and step (i*3 + step), when the write was acknowledged
// (ns since base).
func sseWrite(ctx context.Context, tasks *mongo.Collection, ids []bson.ObjectID, rate int, base time.Time, ack []int64) (first, last time.Time, err error) {
	type step struct {
		from, to schema.Status
		set      func() bson.D
	}
	steps := []step{
		{schema.StatusQueued, schema.StatusClaimed, func() bson.D {
			return bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskNode, Value: sseWriterNode}, {Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)}, {Key: schema.TaskMTime, Value: time.Now()}}}}
		}},
		{schema.StatusClaimed, schema.StatusRunning, func() bson.D { return statusSet(schema.StatusRunning) }},
		{schema.StatusRunning, schema.StatusSucceeded, finishSet},
	}
	chunks := len(ids) / sseChunk
	interval := time.Duration(float64(time.Second) * float64(3*sseChunk) / float64(rate))
	work := make(chan int)
	var lastAck atomic.Int64
	first = time.Now()
	err = workers(ctx, sseWriters+1, func(ctx context.Context, w int) error {
		if w == sseWriters { // the pacer
			defer close(work)
			timer := time.NewTimer(time.Hour)
			defer timer.Stop()
			for i := range chunks {
				if wait := time.Until(first.Add(time.Duration(i) * interval)); wait > 0 {
					timer.Reset(wait)
					select {
					case <-timer.C:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				select {
				case work <- i:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
		for i := range work {
			chunk := ids[i*sseChunk : (i+1)*sseChunk]
			for si, st := range steps {
				node := any(sseWriterNode)
				if st.from == schema.StatusQueued {
					node = schema.Unclaimed
				}
				res, err := tasks.UpdateMany(ctx,
					bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: chunk}}}, {Key: schema.TaskNode, Value: node}, {Key: schema.TaskStatus, Value: int32(st.from)}},
					st.set())
				if err != nil {
					return fmt.Errorf("move tasks %d -> %d: %w", st.from, st.to, err)
				}
				at := int64(time.Since(base))
				if res.ModifiedCount != int64(len(chunk)) {
					return fmt.Errorf("move tasks %d -> %d: the guard matched %d of %d", st.from, st.to, res.ModifiedCount, len(chunk))
				}
				for k := range chunk {
					ack[(i*sseChunk+k)*3+si] = at
				}
				for {
					l := lastAck.Load()
					if at <= l || lastAck.CompareAndSwap(l, at) {
						break
					}
				}
			}
		}
		return nil
	})
	if err == nil {
		err = ctx.Err()
	}
	return first, base.Add(time.Duration(lastAck.Load())), err
}

// sseSub is one subscriber: an HTTP client reading text/event-stream,
// reconnecting with Last-Event-ID as a browser's EventSource does (after
// sseReconnectWait rather than the stream's retry: 2 s).
type sseSub struct {
	url   string
	hc    *http.Client
	index map[string]int32
	base  time.Time

	// Written by run's goroutine, read once it returned.
	recv       []int64 // first receipt of each transition, ns since base + 1 (0: none)
	got        []uint8 // receipts of each transition (saturating)
	commitLag  []time.Duration
	duplicated int64
	unexpected int64
	reconnects int64
	lastID     string
	err        error // the last stream's failure, if any

	distinct atomic.Int64 // transitions received at least once
}

// run reads streams until ctx ends; ready is called once, when the first
// stream's response headers came.
func (s *sseSub) run(ctx context.Context, ready func()) {
	var once sync.Once
	for {
		err := s.stream(ctx, func() { once.Do(ready) })
		if ctx.Err() != nil {
			return
		}
		s.err = err
		s.reconnects++
		select {
		case <-time.After(sseReconnectWait):
		case <-ctx.Done():
			return
		}
	}
}

// stream reads one response until it ends.
func (s *sseSub) stream(ctx context.Context, ready func()) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	if s.lastID != "" {
		req.Header.Set("Last-Event-ID", s.lastID)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return fmt.Errorf("GET /api/v1/events: %s, Content-Type %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	ready()
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	var event, id string
	var data []byte
	for {
		line, err := rd.ReadSlice('\n')
		if err != nil {
			return fmt.Errorf("read the event stream: %w", err)
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0: // dispatch
			if id != "" {
				s.lastID = id
			}
			switch event {
			case "":
			case "task":
				s.task(data, time.Now())
			case "lagged":
				// The stream ends next; the reconnection resumes from lastID.
			default:
				s.unexpected++
			}
			event, id, data = "", "", data[:0]
		case line[0] == ':':
		case bytes.HasPrefix(line, []byte("id: ")):
			id = string(line[4:])
		case bytes.HasPrefix(line, []byte("event: ")):
			event = string(line[7:])
		case bytes.HasPrefix(line, []byte("data: ")):
			data = append(data[:0], line[6:]...)
		}
	}
}

// task records the receipt of a task event's data.
func (s *sseSub) task(data []byte, at time.Time) {
	i, step, commit, ok := parseTaskEvent(data, s.index)
	if !ok {
		s.unexpected++
		return
	}
	k := int(i)*3 + step
	if s.got[k] < 255 {
		s.got[k]++
	}
	if s.got[k] > 1 {
		s.duplicated++
		return
	}
	s.recv[k] = int64(at.Sub(s.base)) + 1
	s.distinct.Add(1)
	if !commit.IsZero() {
		s.commitLag = append(s.commitLag, at.Sub(commit))
	}
}

// parseTaskEvent reads "id", "to" and "time" of a task event's data (see
// web/live's package doc) without decoding the rest: the task's index,
// the step (0: to -1, 1: to 0, 2: to 1) and the commit time.
func parseTaskEvent(data []byte, index map[string]int32) (i int32, step int, commit time.Time, ok bool) {
	field := func(name string) []byte {
		k := bytes.Index(data, []byte(`"`+name+`":`))
		if k < 0 {
			return nil
		}
		return data[k+len(name)+3:]
	}
	idv := field("id")
	if len(idv) < 26 || idv[0] != '"' || idv[25] != '"' {
		return 0, 0, time.Time{}, false
	}
	i, ok = index[string(idv[1:25])]
	if !ok {
		return 0, 0, time.Time{}, false
	}
	to := field("to")
	end := bytes.IndexAny(to, ",}")
	if end < 0 {
		return 0, 0, time.Time{}, false
	}
	st, err := strconv.Atoi(string(to[:end]))
	if err != nil || st < int(schema.StatusClaimed) || st > int(schema.StatusSucceeded) {
		return 0, 0, time.Time{}, false
	}
	if tv := field("time"); len(tv) > 1 && tv[0] == '"' {
		if end := bytes.IndexByte(tv[1:], '"'); end > 0 {
			commit, _ = time.Parse(time.RFC3339Nano, string(tv[1:1+end]))
		}
	}
	return i, st - int(schema.StatusClaimed), commit, true
}
