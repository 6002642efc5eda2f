package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/chromedp/cdproto/performance"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/internal/chromium"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// The dashboard group's goals (issue: a live web dashboard).
const (
	dashGoalPaintMS  = 1000 // first paint of the overview, and its queue table filled
	dashGoalServerMS = 50   // server time of each request the overview makes
	dashGoalRenders  = 5    // coalesced renders a second during a drain, at most
	dashNodes        = 50
	dashServerN      = 30 // requests timed per route
	dashDrainRate    = 2000
)

// DashboardReport is the dashboard group: the overview over many queues,
// nodes and tasks, timed at the server and in a real browser, and the open
// page during a drain.
type DashboardReport struct {
	Queues int `json:"queues"`
	Nodes  int `json:"nodes"`
	Tasks  int `json:"tasks"`
	// Server: each route the overview reads, one request at a time.
	Server []DashRoute `json:"server"`
	// Browser is nil without Chromium (Note says why).
	Browser *DashBrowser `json:"browser,omitempty"`
	Note    string       `json:"note,omitempty"`
	Goals   []Goal       `json:"goals"`
}

// DashRoute is one route's server time.
type DashRoute struct {
	Route   string  `json:"route"`
	Bytes   int     `json:"bytes"`
	Latency Latency `json:"latency"`
}

// DashBrowser is what Chromium measured.
type DashBrowser struct {
	Chromium string `json:"chromium"`
	// FirstPaintMS: first contentful paint; FilledMS: every queue's row
	// in the table (both from the navigation's start).
	FirstPaintMS float64 `json:"first_paint_ms"`
	FilledMS     float64 `json:"filled_ms"`
	// The drain: transitions written per second, events the page got,
	// its coalesced renders, its main thread's busy share, and how long
	// it took to answer an evaluation (responsiveness).
	Transitions    float64 `json:"transitions_per_s"`
	Events         float64 `json:"events_per_s"`
	Renders        float64 `json:"renders_per_s"`
	MainThreadBusy float64 `json:"main_thread_busy"`
	ScriptBusy     float64 `json:"script_busy"`
	Answer         Latency `json:"answer"`
	DrainSeconds   float64 `json:"drain_seconds"`
}

func (e *env) dashboard(ctx context.Context) (*DashboardReport, error) {
	db, drop := e.database("dashboard")
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return nil, err
	}
	rep := &DashboardReport{Queues: e.cfg.DashQueues, Nodes: dashNodes, Tasks: e.cfg.DashTasks}
	queues := make([]bson.ObjectID, e.cfg.DashQueues)
	for i := range queues {
		q, err := newQueue(ctx, s, fmt.Sprintf("dash-%04d", i), e.cfg.MaxThreads)
		if err != nil {
			return nil, err
		}
		queues[i] = q.ID
	}
	// Mixed settings, as on a shared cluster.
	if _, err := db.Collection(schema.CollQueues).UpdateMany(ctx, bson.D{},
		bson.D{{Key: "$set", Value: bson.D{{Key: "priority", Value: 1}, {Key: "weight", Value: 30}}}}); err != nil {
		return nil, err
	}
	e.log.Info("dashboard: inserting", "tasks", e.cfg.DashTasks, "queues", e.cfg.DashQueues)
	want, _, err := e.fillQueues(ctx, db.Name(), queues, e.cfg.DashTasks)
	if err != nil {
		return nil, err
	}
	if err := setCounters(ctx, db.Collection(schema.CollQueues), want); err != nil {
		return nil, err
	}
	for i := range dashNodes {
		var nq []schema.NodeQueue
		for j := range 20 {
			q := (i*20 + j) % len(queues)
			nq = append(nq, schema.NodeQueue{Name: fmt.Sprintf("dash-%04d", q), ID: queues[q].Hex(), Constructor: noopConstructor, TasksDoing: 1})
		}
		if _, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: fmt.Sprintf("dash-node-%02d", i), Queues: nq, State: schema.NodeStateRunning}); err != nil {
			return nil, err
		}
	}
	if err := e.client.Database("admin").RunCommand(ctx, bson.D{{Key: "fsync", Value: 1}}).Err(); err != nil {
		return nil, fmt.Errorf("fsync after the insert: %w", err)
	}
	w, err := e.startWeb(ctx, db.Name(), true)
	if err != nil {
		return nil, err
	}
	defer w.stop()
	hc := httpClient(time.Minute)
	defer hc.CloseIdleConnections()

	worst := 0.0
	for _, route := range []string{"/", "/ui/assets/app.js", "/api/v1/queues", "/api/v1/nodes", "/api/v1/cluster"} {
		var size int
		get := func(ctx context.Context) ([]byte, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url+route, nil)
			if err != nil {
				return nil, err
			}
			req.Header.Set("Accept", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				return nil, fmt.Errorf("GET %s: %d", route, resp.StatusCode)
			}
			size = len(b)
			return b, err
		}
		if _, err := get(ctx); err != nil { // warm-up, not counted
			return rep, err
		}
		lat, err := oneAtATime(ctx, dashServerN, get)
		if err != nil {
			return rep, err
		}
		worst = max(worst, lat.P99)
		rep.Server = append(rep.Server, DashRoute{Route: route, Bytes: size, Latency: lat})
		e.log.Info("dashboard: server time", "route", route, "bytes", size, "p50_ms", lat.P50, "p99_ms", lat.P99)
	}
	rep.Goals = append(rep.Goals, Goal{Goal: fmt.Sprintf("server time of every request of the overview p99 <= %d ms", dashGoalServerMS), Met: worst <= dashGoalServerMS})

	path, err := chromium.Path()
	if err != nil {
		rep.Note = err.Error() + ": browser figures not measured"
		return rep, nil
	}
	b, err := e.dashBrowser(ctx, path, w.url, db.Name(), len(queues))
	if err != nil {
		return rep, err
	}
	rep.Browser = b
	rep.Goals = append(rep.Goals,
		Goal{Goal: fmt.Sprintf("overview first paint and filled table <= %d ms", dashGoalPaintMS), Met: b.FirstPaintMS <= dashGoalPaintMS && b.FilledMS <= dashGoalPaintMS},
		Goal{Goal: fmt.Sprintf("<= %d renders/s during a %d transitions/s drain", dashGoalRenders, dashDrainRate), Met: b.Renders <= dashGoalRenders})
	return rep, nil
}

// dashBrowser opens the overview in Chromium, times its paint, then drives
// transitions at dashDrainRate while measuring the page.
func (e *env) dashBrowser(ctx context.Context, path, url, db string, queues int) (*DashBrowser, error) {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelA := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	out := &DashBrowser{Chromium: path}
	var version string
	if err := chromedp.Run(bctx, chromedp.Evaluate(`navigator.userAgent`, &version)); err != nil {
		return nil, fmt.Errorf("start chromium: %w", err)
	}
	if i := strings.Index(version, "Chrome/"); i >= 0 {
		out.Chromium += " (" + strings.Fields(version[i:])[0] + ")"
	}
	var paint []float64
	err := chromedp.Run(bctx,
		chromedp.Navigate(url+"/"),
		chromedp.Poll(fmt.Sprintf(`document.querySelectorAll('#queues tbody tr[data-queue]').length === %d ? performance.now() : 0`, queues), &out.FilledMS,
			chromedp.WithPollingInterval(5*time.Millisecond), chromedp.WithPollingTimeout(60*time.Second)),
		chromedp.Evaluate(`new Promise((resolve) => {
			new PerformanceObserver((l) => resolve(l.getEntries().filter((p) => p.name === 'first-contentful-paint').map((p) => p.startTime)))
				.observe({ type: 'paint', buffered: true });
			setTimeout(() => resolve([]), 5000);
		})`, &paint, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }))
	if err != nil {
		return nil, fmt.Errorf("the overview: %w", err)
	}
	if len(paint) == 0 {
		return nil, errors.New("the overview: Chromium reported no first contentful paint")
	}
	out.FirstPaintMS = paint[0]
	e.log.Info("dashboard: overview in chromium", "first_paint_ms", out.FirstPaintMS, "filled_ms", out.FilledMS)

	// The drain: queued tasks go -2 → -1 → 0 → 1, a third of the rate each
	// step, in a batch every 50 ms, by UpdateMany (one event per task).
	c, err := e.connect()
	if err != nil {
		return nil, err
	}
	defer disconnect(c)
	tasks := c.Database(db).Collection(schema.CollTasks)
	d := e.cfg.DashDrain
	per := dashDrainRate / 3 / 20 // tasks per step per 50 ms
	cur, err := tasks.Find(ctx, bson.D{{Key: schema.TaskStatus, Value: schema.StatusQueued}},
		options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(per*20*int(d.Seconds()+2))))
	if err != nil {
		return nil, err
	}
	var ids []bson.ObjectID
	for cur.Next(ctx) {
		ids = append(ids, cur.Current.Lookup("_id").ObjectID())
	}
	if err := cur.Err(); err != nil {
		return nil, err
	}
	if len(ids) < per*3 {
		return nil, errors.New("dashboard: too few queued tasks to drain")
	}
	metric := func() (task, script float64, err error) {
		var ms []*performance.Metric
		err = chromedp.Run(bctx, chromedp.ActionFunc(func(ctx context.Context) (err error) {
			ms, err = performance.GetMetrics().Do(ctx)
			return err
		}))
		for _, m := range ms {
			switch m.Name {
			case "TaskDuration":
				task = m.Value
			case "ScriptDuration":
				script = m.Value
			}
		}
		return task, script, err
	}
	if err := chromedp.Run(bctx, performance.Enable()); err != nil {
		return nil, err
	}
	var before struct{ Events, Renders float64 }
	if err := chromedp.Run(bctx, chromedp.Evaluate(`({Events: disbatchStats.events, Renders: disbatchStats.renders})`, &before)); err != nil {
		return nil, err
	}
	task0, script0, err := metric()
	if err != nil {
		return nil, err
	}
	var written atomic.Int64
	dctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var claimed, running []bson.ObjectID
		next := 0
		for {
			select {
			case <-dctx.Done():
				done <- nil
				return
			case <-tick.C:
			}
			step := func(batch []bson.ObjectID, to schema.Status) error {
				if len(batch) == 0 {
					return nil
				}
				r, err := tasks.UpdateMany(dctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: batch}}}},
					bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskStatus, Value: to}, {Key: schema.TaskNode, Value: "dash-node-00"}, {Key: "mtime", Value: time.Now()}}}})
				if err == nil {
					written.Add(r.ModifiedCount)
				}
				if errors.Is(err, context.DeadlineExceeded) {
					return nil // the drain's end, at any moment of a write
				}
				return err
			}
			if err := step(running, schema.StatusSucceeded); err != nil {
				done <- err
				return
			}
			if err := step(claimed, schema.StatusRunning); err != nil {
				done <- err
				return
			}
			running = claimed
			end := min(next+per, len(ids))
			claimed = ids[next:end]
			next = end
			if err := step(claimed, schema.StatusClaimed); err != nil {
				done <- err
				return
			}
		}
	}()
	// Meanwhile: how long the page takes to answer, every 100 ms.
	var answers []time.Duration
	for dctx.Err() == nil {
		t0 := time.Now()
		var one int
		if err := chromedp.Run(bctx, chromedp.Evaluate(`1`, &one)); err != nil {
			return nil, err
		}
		answers = append(answers, time.Since(t0))
		time.Sleep(100 * time.Millisecond)
	}
	if err := <-done; err != nil {
		return nil, fmt.Errorf("drain writer: %w", err)
	}
	wall := time.Since(start)
	time.Sleep(time.Second) // the last events and renders
	var after struct{ Events, Renders float64 }
	if err := chromedp.Run(bctx, chromedp.Evaluate(`({Events: disbatchStats.events, Renders: disbatchStats.renders})`, &after)); err != nil {
		return nil, err
	}
	task1, script1, err := metric()
	if err != nil {
		return nil, err
	}
	span := wall + time.Second
	out.DrainSeconds = wall.Seconds()
	out.Transitions = rate(int(written.Load()), wall)
	out.Events = (after.Events - before.Events) / wall.Seconds() // the tail's events are the drain's
	out.Renders = (after.Renders - before.Renders) / span.Seconds()
	out.MainThreadBusy = (task1 - task0) / span.Seconds()
	out.ScriptBusy = (script1 - script0) / span.Seconds()
	out.Answer = summarize(answers)
	e.log.Info("dashboard: drain", "transitions_per_s", round(out.Transitions), "events_per_s", round(out.Events), "renders_per_s", round(out.Renders),
		"main_thread_busy", round(out.MainThreadBusy*100)/100, "answer_p99_ms", out.Answer.P99)
	return out, nil
}

func renderDashboard(b *strings.Builder, r *Report) {
	d := r.Dashboard
	if d == nil {
		return
	}
	t := table{title: fmt.Sprintf("Dashboard overview, ms, server time one request at a time (request start to body read): %d queues, %d nodes, %d tasks",
		d.Queues, d.Nodes, d.Tasks), header: []string{"route", "bytes", "requests", "p50", "p99", "max"}}
	for _, s := range d.Server {
		t.add(s.Route, strconv.Itoa(s.Bytes), strconv.Itoa(s.Latency.N), fms(s.Latency.P50), fms(s.Latency.P99), fms(s.Latency.Max))
	}
	t.render(b)
	if br := d.Browser; br != nil {
		t := table{title: "Dashboard in " + br.Chromium, header: []string{"figure", "value"}}
		t.add("overview: first contentful paint", fms(br.FirstPaintMS)+" ms")
		t.add("overview: every queue's row in the table", fms(br.FilledMS)+" ms")
		t.add(fmt.Sprintf("drain of %.1f s: transitions written", br.DrainSeconds), fmt.Sprintf("%.0f/s", br.Transitions))
		t.add("drain: events the page received", fmt.Sprintf("%.0f/s", br.Events))
		t.add("drain: coalesced renders (fetch + draw)", fmt.Sprintf("%.1f/s", br.Renders))
		t.add("drain: main thread busy (script)", fmt.Sprintf("%.0f%% (%.0f%%)", br.MainThreadBusy*100, br.ScriptBusy*100))
		t.add("drain: page answers an evaluation, p50 / p99", fms(br.Answer.P50)+" / "+fms(br.Answer.P99)+" ms")
		t.render(b)
	} else if d.Note != "" {
		fmt.Fprintf(b, "Dashboard in a browser: %s\n\n", d.Note)
	}
	for _, g := range d.Goals {
		fmt.Fprintf(b, "Dashboard goal %s\n", g)
	}
	b.WriteString("\n")
}
