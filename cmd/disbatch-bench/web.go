package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/httpserver"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/web"
	"github.com/disbatch-go/disbatch/web/live"
)

// webServer is disbatch-web composed as cmd/disbatch-web composes it (the
// handler of package web, with a live hub when events are wanted), served
// in-process on a loopback port with a client of its own.
type webServer struct {
	url    string // http://127.0.0.1:PORT, no trailing slash
	hub    *live.Hub
	srv    *httpserver.Server
	client *mongo.Client
}

// startWeb serves database db; with events, GET /api/v1/events too.
func (e *env) startWeb(ctx context.Context, db string, events bool) (*webServer, error) {
	c, err := e.connect()
	if err != nil {
		return nil, err
	}
	w := &webServer{client: c}
	st := store.New(c.Database(db), store.Options{})
	var ev http.Handler
	if events {
		w.hub = live.New(live.Options{Store: st, Lookup: st, Logger: e.nodeLog})
		if err := w.hub.Start(ctx); err != nil {
			w.stop()
			return nil, fmt.Errorf("start the live event hub: %w", err)
		}
		ev = w.hub
	}
	h := web.NewHandler(web.Options{Store: st, Database: db, Plugins: []string{noopConstructor}, Monitoring: true, Events: ev, Logger: e.nodeLog})
	w.srv = httpserver.New(httpserver.Config{Name: "bench-web", Addr: "127.0.0.1:0", Handler: h, Logger: e.nodeLog})
	if err := w.srv.Start(ctx); err != nil {
		w.srv = nil
		w.stop()
		return nil, fmt.Errorf("serve the web handler: %w", err)
	}
	w.url = "http://" + w.srv.Addr()
	return w, nil
}

// stop ends the event streams, then the server, then the client.
func (w *webServer) stop() {
	if w.hub != nil {
		w.hub.Stop()
	}
	if w.srv != nil {
		w.srv.Stop()
	}
	disconnect(w.client)
}

// httpClient is a client of the bench's own, with a connection pool large
// enough for the open-loop load (every connection to 127.0.0.1).
func httpClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
}

// Goal is a goal's statement and whether this run met it (reported, never
// a reason to fail the run).
type Goal struct {
	Goal string `json:"goal"`
	Met  bool   `json:"met"`
}

func (g Goal) String() string {
	if g.Met {
		return "met: " + g.Goal
	}
	return "NOT MET: " + g.Goal
}

// median of positive rates (0 for none).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// renderWeb renders the web groups' tables.
func renderWeb(b *strings.Builder, r *Report) {
	if q := r.WebQueues; q != nil {
		t := table{title: fmt.Sprintf("GET /queues (Disbatch 4.103 route), ms, request start to body read, real HTTP on loopback: %d queues, %d tasks (%s)",
			q.Queues, q.Tasks, q.Mix),
			header: []string{"how", "load", "requests", "errors", "p50", "p95", "p99", "max"}}
		const projected = "projected counters + 1 aggregation (count_todo, count_total, TaskRunningCounts)"
		t.add(projected, q.Load, strconv.Itoa(q.Projected.N), strconv.Itoa(q.Errors),
			fms(q.Projected.P50), fms(q.Projected.P95), fms(q.Projected.P99), fms(q.Projected.Max))
		t.add(projected, "one at a time", strconv.Itoa(q.ProjectedSerial.N), "0",
			fms(q.ProjectedSerial.P50), fms(q.ProjectedSerial.P95), fms(q.ProjectedSerial.P99), fms(q.ProjectedSerial.Max))
		t.add(fmt.Sprintf("4.103 way: 3 count queries per queue (%d in all, store.QueueStatusCounts)", 3*q.Queues), "one at a time", strconv.Itoa(q.CountQueries.N), "0",
			fms(q.CountQueries.P50), fms(q.CountQueries.P95), fms(q.CountQueries.P99), fms(q.CountQueries.Max))
		t.render(b)
		t = table{title: "GET /queues RATIOS AND GOAL", header: []string{"ratio", "p50", "p99", "goal"}}
		t.add(q.Ratio.What, fx(q.Ratio.P50), fx(q.Ratio.P99), q.Goal.String())
		t.add(q.RatioLoaded.What, fx(q.RatioLoaded.P50), fx(q.RatioLoaded.P99), "")
		t.render(b)
		fmt.Fprintf(b, "  answers checked against the tasks inserted: %d queues wrong (projected), %d wrong (4.103 way); tasks inserted at %s/s\n\n",
			q.WrongProjected, q.WrongCountQueries, frate(q.InsertRate))
	}
	if ev := r.WebEvents; ev != nil {
		t := table{title: fmt.Sprintf("LIVE EVENTS, GET /api/v1/events: %d SSE clients on one hub, %d tasks moved -2 -> -1 -> 0 -> 1 by a raw writer (guarded updateMany of %d, majority), target %d transitions/s",
			ev.Subscribers, ev.Tasks, ev.Chunk, ev.TargetRate),
			header: []string{"lag, ms", "receipts", "p50", "p95", "p99", "max"}}
		t.add("receipt - writer's acknowledgement of the write", strconv.FormatInt(int64(ev.Lag.N), 10), fms(ev.Lag.P50), fms(ev.Lag.P95), fms(ev.Lag.P99), fms(ev.Lag.Max))
		t.add(`receipt - the event's "time" (commit wall clock, ms resolution)`, strconv.FormatInt(int64(ev.CommitLag.N), 10), fms(ev.CommitLag.P50), fms(ev.CommitLag.P95), fms(ev.CommitLag.P99), fms(ev.CommitLag.Max))
		t.render(b)
		t = table{title: "LIVE EVENTS: DELIVERY AND GOAL",
			header: []string{"transitions", "written/s", "seconds", "lost", "duplicated", "unexpected", "reconnects", "dropped by hub", "goal"}}
		t.add(strconv.Itoa(ev.Transitions), frate(ev.Rate), fmt.Sprintf("%.1f", ev.Seconds), strconv.FormatInt(ev.Lost, 10), strconv.FormatInt(ev.Duplicated, 10),
			strconv.FormatInt(ev.Unexpected, 10), strconv.FormatInt(ev.Reconnects, 10), strconv.FormatInt(ev.Dropped, 10), ev.Goal.String())
		t.render(b)
	}
	if s := r.WebSubmit; s != nil {
		t := table{title: fmt.Sprintf("SUBMIT %d TASKS (params like {\"commands\":\"a\",\"user\":…,\"n\":…}), median of %d, alternating", s.Tasks, s.Repeats),
			header: []string{"how", "median seconds", "tasks/s", "runs, tasks/s"}}
		for _, row := range s.Rows {
			runs := make([]string, len(row.Rates))
			for i, v := range row.Rates {
				runs[i] = frate(v)
			}
			t.add(row.How, fmt.Sprintf("%.3f", row.Seconds), frate(row.Rate), strings.Join(runs, " "))
		}
		t.render(b)
		t = table{title: "SUBMIT RATIO", header: []string{"ratio", "value"}}
		t.add("POST /api/v1/tasks / disbatch task submit, tasks/s", fx(s.Ratio))
		t.render(b)
	}
}

// web checks the web groups' figures and answers.
func (k *checker) web(r *Report, cfg config) {
	if cfg.runs(groupWebQueues) {
		k.webQueues(r.WebQueues)
	}
	if cfg.runs(groupWebEvents) {
		k.webEvents(r.WebEvents)
	}
	if cfg.runs(groupWebSubmit) {
		k.webSubmit(r.WebSubmit)
	}
}

func (k *checker) webQueues(q *WebQueuesReport) {
	if q == nil {
		k.bad("web-queues: missing")
		return
	}
	k.latency("web-queues, projected", q.Projected)
	k.latency("web-queues, projected one at a time", q.ProjectedSerial)
	k.latency("web-queues, 4.103 way", q.CountQueries)
	for _, x := range []Ratio{q.Ratio, q.RatioLoaded} {
		k.positive("web-queues ratio "+x.What+" p50", x.P50)
		k.positive("web-queues ratio "+x.What+" p99", x.P99)
	}
	k.positive("web-queues insert rate", q.InsertRate)
	if q.Errors > 0 {
		k.bad("web-queues: %d of %d requests failed", q.Errors, q.Projected.N+q.Errors)
	}
	if q.WrongProjected > 0 || q.WrongCountQueries > 0 {
		k.bad("web-queues: GET /queues answered wrong counts for %d queues (projected) and %d (4.103 way)", q.WrongProjected, q.WrongCountQueries)
	}
}

func (k *checker) webEvents(ev *WebEventsReport) {
	if ev == nil {
		k.bad("web-events: missing")
		return
	}
	k.latency("web-events, lag from acknowledgement", ev.Lag)
	k.positive("web-events, transitions written/s", ev.Rate)
	if ev.Transitions <= 0 {
		k.bad("web-events: no transitions written")
	}
	if ev.Lost != 0 || ev.Duplicated != 0 {
		k.bad("web-events: %d transitions lost and %d duplicated over %d subscribers, want 0 and 0", ev.Lost, ev.Duplicated, ev.Subscribers)
	}
	if want := int64(ev.Transitions) * int64(ev.Subscribers); int64(ev.Lag.N) != want-ev.Lost {
		k.bad("web-events: %d lag samples, want %d", ev.Lag.N, want-ev.Lost)
	}
}

func (k *checker) webSubmit(s *WebSubmitReport) {
	if s == nil {
		k.bad("web-submit: missing")
		return
	}
	if len(s.Rows) != 2 {
		k.bad("web-submit: %d rows, want 2", len(s.Rows))
	}
	for _, row := range s.Rows {
		k.positive("web-submit, "+row.How+", tasks/s", row.Rate)
		k.positive("web-submit, "+row.How+", seconds", row.Seconds)
	}
	k.positive("web-submit ratio", s.Ratio)
	if s.Inserted != s.Expected {
		k.bad("web-submit: %d tasks in the queue afterwards, want %d", s.Inserted, s.Expected)
	}
}
