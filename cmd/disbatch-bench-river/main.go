// Command disbatch-bench-river measures River (a Go job queue on
// PostgreSQL) the way disbatch-bench measures our node: the pickup (insert
// start to the worker's Work, jobs inserted one at a time at a steady rate)
// and the drain of a backlog of no-op jobs. It is issue 20's peer group, a
// module of its own so that River and pgx stay out of the project's
// dependencies; disbatch-bench --river runs it and puts its figures beside
// ours.
//
// It starts a throwaway PostgreSQL (Debian's postgresql package: initdb and
// pg_ctl, found in /usr/lib/postgresql/*/bin or on PATH) in a temporary
// directory, run as the postgres user when this program runs as root, and
// removes it at the end. Its figures go to stdout as one JSON object.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// Report is what one run measured: every pickup (insert start -> Work) in
// ms, in insert order, and the drain (disbatch-bench summarizes).
type Report struct {
	River         string    `json:"river"`
	Postgres      string    `json:"postgres"`
	FetchCooldown string    `json:"fetch_cooldown"`
	MaxWorkers    int       `json:"max_workers"`
	Rate          int       `json:"rate_per_s"`
	PickupMS      []float64 `json:"pickup_ms"`
	DrainJobs     int       `json:"drain_jobs"`
	DrainSeconds  float64   `json:"drain_seconds"`
	DrainRate     float64   `json:"drain_jobs_per_s"`
}

// riverVersion is the River this module requires (go.mod).
const riverVersion = "v0.51.1"

func main() {
	rate := flag.Int("rate", 50, "pickup: jobs inserted per second, one at a time")
	duration := flag.Duration("duration", 10*time.Second, "pickup: how long jobs are inserted")
	jobs := flag.Int("jobs", 20000, "drain: no-op jobs queued before the client starts")
	workers := flag.Int("max-workers", 64, "the queue's MaxWorkers")
	cooldown := flag.Duration("fetch-cooldown", time.Millisecond, "River's FetchCooldown (its minimum is 1ms: its best pickup)")
	verbose := flag.Bool("verbose", false, "River's logs, and where PostgreSQL runs, on stderr (PostgreSQL's own log is shown only when it fails to start)")
	flag.Parse()
	if *rate < 1 || *rate > 1000 || *duration <= 0 || *jobs < 1 || *workers < 1 {
		fmt.Fprintln(os.Stderr, "disbatch-bench-river: --rate 1..1000, --duration, --jobs and --max-workers must be positive")
		os.Exit(2)
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, log, *rate, *duration, *jobs, *workers, *cooldown)
	if err != nil {
		fmt.Fprintln(os.Stderr, "disbatch-bench-river:", err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(rep)
}

func run(ctx context.Context, log *slog.Logger, rate int, duration time.Duration, jobs, workers int, cooldown time.Duration) (*Report, error) {
	pg, err := startPostgres(ctx, log)
	if err != nil {
		return nil, err
	}
	defer pg.stop()
	pool, err := pgxpool.New(ctx, pg.url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return nil, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("River's migrations: %w", err)
	}
	rep := &Report{River: riverVersion, Postgres: pg.version, FetchCooldown: cooldown.String(), MaxWorkers: workers, Rate: rate}

	var pickups []time.Duration
	if err := withClient(ctx, log, pool, workers, cooldown, func(c *river.Client[pgx.Tx], w *noopWorker) error {
		pickups, err = pickup(ctx, c, w, rate, duration)
		return err
	}); err != nil {
		return nil, fmt.Errorf("pickup: %w", err)
	}
	for _, d := range pickups {
		rep.PickupMS = append(rep.PickupMS, float64(d)/float64(time.Millisecond))
	}

	if err := drain(ctx, log, pool, workers, cooldown, jobs, rep); err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	return rep, nil
}

// noopArgs is a no-op job; Kind names it.
type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

// noopWorker notes when Work is called: first, and for each job when
// started is set.
type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	mu      sync.Mutex
	started map[int64]time.Time
	first   atomic.Int64 // Unix ns of the first Work (0: none yet)
}

func (w *noopWorker) Work(_ context.Context, job *river.Job[noopArgs]) error {
	now := time.Now()
	w.first.CompareAndSwap(0, now.UnixNano())
	if w.started != nil {
		w.mu.Lock()
		w.started[job.ID] = now
		w.mu.Unlock()
	}
	return nil
}

// newClient is a River client of one queue worked by w.
func newClient(log *slog.Logger, pool *pgxpool.Pool, workers int, cooldown time.Duration, w *noopWorker) (*river.Client[pgx.Tx], error) {
	ws := river.NewWorkers()
	river.AddWorker(ws, w)
	return river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:           ws,
		FetchCooldown:     cooldown,
		FetchPollInterval: max(cooldown, 50*time.Millisecond),
		Logger:            log,
	})
}

// stopClient stops c, waiting up to 30 s for its jobs.
func stopClient(ctx context.Context, c *river.Client[pgx.Tx]) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_ = c.Stop(sctx)
}

// withClient runs fn with a started River client of one queue.
func withClient(ctx context.Context, log *slog.Logger, pool *pgxpool.Pool, workers int, cooldown time.Duration, fn func(*river.Client[pgx.Tx], *noopWorker) error) error {
	w := &noopWorker{started: map[int64]time.Time{}}
	c, err := newClient(log, pool, workers, cooldown, w)
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	defer stopClient(ctx, c)
	time.Sleep(time.Second) // its producer listens and a leader stands
	return fn(c, w)
}

// pickup inserts one job every 1/rate for duration (five first, not
// counted) and returns, per job, insert start to Work.
func pickup(ctx context.Context, c *river.Client[pgx.Tx], w *noopWorker, rate int, duration time.Duration) ([]time.Duration, error) {
	const warmUp = 5
	gap := time.Second / time.Duration(rate)
	inserted := map[int64]time.Time{}
	var order []int64
	next := time.Now()
	for i := 0; i < warmUp+int(duration/gap); i++ {
		time.Sleep(time.Until(next))
		next = next.Add(gap)
		t0 := time.Now()
		res, err := c.Insert(ctx, noopArgs{}, nil)
		if err != nil {
			return nil, err
		}
		if i >= warmUp {
			inserted[res.Job.ID] = t0
			order = append(order, res.Job.ID)
		}
	}
	deadline := time.Now().Add(time.Minute)
	var out []time.Duration
	for _, id := range order {
		for {
			w.mu.Lock()
			at, ok := w.started[id]
			w.mu.Unlock()
			if ok {
				out = append(out, at.Sub(inserted[id]))
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("job %d was not worked within a minute", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return out, nil
}

// drain queues jobs no-op jobs, then starts a client and times its first
// Work to the last job's completion (a completed event).
func drain(ctx context.Context, log *slog.Logger, pool *pgxpool.Pool, workers int, cooldown time.Duration, jobs int, rep *Report) error {
	if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		return err
	}
	loader, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: log})
	if err != nil {
		return err
	}
	params := make([]river.InsertManyParams, 0, 1000)
	for left := jobs; left > 0; {
		params = params[:0]
		for range min(left, 1000) {
			params = append(params, river.InsertManyParams{Args: noopArgs{}})
		}
		if _, err := loader.InsertManyFast(ctx, params); err != nil {
			return err
		}
		left -= len(params)
	}
	return withDrainClient(ctx, log, pool, workers, cooldown, jobs, rep)
}

func withDrainClient(ctx context.Context, log *slog.Logger, pool *pgxpool.Pool, workers int, cooldown time.Duration, jobs int, rep *Report) error {
	w := &noopWorker{}
	c, err := newClient(log, pool, workers, cooldown, w)
	if err != nil {
		return err
	}
	// A channel for every completion: River drops events a full channel
	// cannot take.
	events, cancel := c.SubscribeConfig(&river.SubscribeConfig{ChanSize: jobs + 100, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer cancel()
	if err := c.Start(ctx); err != nil {
		return err
	}
	defer stopClient(ctx, c)
	done, timeout := 0, time.After(5*time.Minute)
	var last time.Time
	for done < jobs {
		select {
		case _, ok := <-events:
			if !ok {
				return errors.New("River closed its event channel")
			}
			done++
			last = time.Now()
		case <-timeout:
			return fmt.Errorf("%d of %d jobs completed within 5 minutes", done, jobs)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	span := last.Sub(time.Unix(0, w.first.Load()))
	rep.DrainJobs, rep.DrainSeconds, rep.DrainRate = jobs, span.Seconds(), float64(jobs)/span.Seconds()
	return nil
}
