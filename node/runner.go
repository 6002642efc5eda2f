package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/tracing"
)

// errGraceExpired is the cause given to plugins killed at shutdown.
var errGraceExpired = errors.New("node shutting down: grace period expired")

// runner executes claimed tasks: start (status 0), plugin, finish, each
// write guarded. One goroutine per task.
type runner struct {
	n *Node

	mu sync.Mutex
	// killCtx is cancelled (with a cause) to kill the plugins running
	// now; killRunning replaces it for the tasks that start later.
	killCtx  context.Context
	kill     context.CancelCauseFunc
	stopping bool
	fenced   bool // no task may start: the node fenced itself
	held     map[bson.ObjectID]struct{}
	wg       sync.WaitGroup

	// Concurrent tasks' start and finish writes share round trips.
	starts   *coalescer[store.TaskTransitionParams]
	finishes *coalescer[store.TaskFinishParams]
}

// writeBatch bounds how many tasks' writes go in one round trip.
const writeBatch = 128

func newRunner(n *Node) *runner {
	r := &runner{n: n, held: map[bson.ObjectID]struct{}{}}
	r.killCtx, r.kill = context.WithCancelCause(context.Background())
	st := n.cfg.Store
	r.starts = newCoalescer(writeBatch, func(ps []store.TaskTransitionParams) []error {
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		defer cancel()
		return st.TaskStartMany(ctx, ps)
	})
	r.finishes = newCoalescer(writeBatch, func(ps []store.TaskFinishParams) []error {
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		defer cancel()
		return st.TaskFinishMany(ctx, ps)
	})
	return r
}

// writeTimeout bounds one attempt of a task write.
const writeTimeout = 15 * time.Second

// dispatch is the claimer's Dispatch: the task is claimed (-1) by this node
// and its slot taken.
func (r *runner) dispatch(q claimer.Queue, t schema.Task, claim claimer.Timing) {
	r.n.cfg.Observer.TaskClaimed(q.Name)
	r.hold(t.ID, true)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.done(q)
		defer r.hold(t.ID, false)
		r.run(q, t, claim)
	}()
}

// hold records (or forgets) a task this node received from a claim.
func (r *runner) hold(id bson.ObjectID, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on {
		r.held[id] = struct{}{}
	} else {
		delete(r.held, id)
	}
}

// holds reports whether the node received the task from a claim and has
// not let go of it.
func (r *runner) holds(id bson.ObjectID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.held[id]
	return ok
}

// malformed is the claimer's Malformed: fail the task with the reason.
func (r *runner) malformed(q claimer.Queue, t schema.Task, derr error) {
	r.hold(t.ID, true)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.done(q)
		defer r.hold(t.ID, false)
		log := r.n.log.With("queue", q.Name, "task_id", t.ID.Hex())
		p := store.TaskFailParams{ID: t.ID, Node: r.n.cfg.Name, From: schema.StatusClaimed, Reason: "disbatchd: malformed task document: " + derr.Error()}
		if t.ID.IsZero() {
			// Its _id is not an ObjectId: fail it by the _id it has.
			v, err := t.Raw.LookupErr("_id")
			if err != nil {
				log.Error("claimed a task without a readable _id; it stays claimed until the reaper orphans it", "error", derr)
				return
			}
			var id any
			if err := v.Unmarshal(&id); err != nil {
				log.Error("claimed a task whose _id cannot be read back; it stays claimed until the reaper orphans it", "error", derr)
				return
			}
			p.DocID = id
			log = r.n.log.With("queue", q.Name, "task_id", schema.Describe(v))
			log.Warn("claimed a task whose _id is not an ObjectId; failing it", "error", derr)
		} else {
			log.Warn("claimed a malformed task; failing it", "error", derr)
		}
		r.write(log, "fail", func(ctx context.Context) error { return r.n.cfg.Store.TaskFail(ctx, p) })
	}()
}

func (r *runner) done(q claimer.Queue) {
	r.n.slots.Release(q.ID)
	r.n.claimer.SlotFreed(q.ID)
}

// handBack reports why a claimed task must not start now, or "".
func (r *runner) handBack() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.stopping:
		return "the node is stopping"
	case r.fenced:
		return "the node is fenced"
	}
	return ""
}

// runContext is the context a plugin starting now runs under, or an error
// saying why it must not start.
func (r *runner) runContext() (context.Context, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fenced {
		return nil, errors.New("the node fenced itself (no heartbeat acknowledged) just after marking it running, so it did not start it")
	}
	return r.killCtx, nil
}

// killRunning kills every plugin running now with cause; with fence, no
// task starts until unfence.
func (r *runner) killRunning(cause error, fence bool) {
	r.mu.Lock()
	kill := r.kill
	r.killCtx, r.kill = context.WithCancelCause(context.Background())
	if fence {
		r.fenced = true
	}
	r.mu.Unlock()
	kill(cause)
}

// unfence lets tasks start again; it reports whether the runner was fenced.
func (r *runner) unfence() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	was := r.fenced
	r.fenced = false
	return was
}

// run takes a claimed task through start, plugin and finish, tracing it:
// one trace per task, joined to the submitter's when the task carries its
// trace context. The task span starts at the task's ctime, so the time it
// waited in the queue is visible, with children queued, claim (both writes:
// claimed and running), run (the plugin) and complete.
func (r *runner) run(q claimer.Queue, t schema.Task, claim claimer.Timing) {
	cfg := r.n.cfg
	log := r.n.log.With("queue", q.Name, "task_id", t.ID.Hex())
	tracer := tracing.Tracer()
	begin := claim.Start
	if !t.CTime.IsZero() && t.CTime.Before(begin) {
		begin = t.CTime
	}
	ctx, task := tracer.Start(tracing.Extract(context.Background(), t.TraceParent, t.TraceState), "disbatch.task",
		trace.WithTimestamp(begin), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("disbatch.task.id", t.ID.Hex()),
			attribute.String("disbatch.queue", q.Name),
			attribute.String("disbatch.queue.id", q.ID.Hex()),
			attribute.String("disbatch.constructor", q.Constructor),
			attribute.String("disbatch.node", cfg.Name),
		))
	outcome := "released"
	defer func() {
		task.SetAttributes(attribute.String("disbatch.outcome", outcome))
		task.End()
	}()
	if !t.CTime.IsZero() {
		wait := claim.Start.Sub(t.CTime)
		task.SetAttributes(attribute.Float64("disbatch.queue.wait_ms", float64(wait.Microseconds())/1000))
		_, queued := tracer.Start(ctx, "disbatch.queued", trace.WithTimestamp(t.CTime))
		queued.End(trace.WithTimestamp(claim.Start))
	}
	_, claimSpan := tracer.Start(ctx, "disbatch.claim", trace.WithTimestamp(claim.Start))

	if cfg.beforeStart != nil {
		cfg.beforeStart(t)
	}
	tr := store.TaskTransitionParams{ID: t.ID, Node: cfg.Name}
	if why := r.handBack(); why != "" {
		log.Info("handing back a claimed task: " + why)
		claimSpan.AddEvent("handed back: " + why)
		claimSpan.End()
		r.write(log, "release", func(ctx context.Context) error { return cfg.Store.TaskRelease(ctx, tr) })
		return
	}
	if err := r.write(log, "start", func(ctx context.Context) error { return r.starts.do(ctx, tr) }); err != nil {
		claimSpan.RecordError(err)
		claimSpan.SetStatus(codes.Error, "could not mark the task running")
		claimSpan.End()
		outcome = "lost"
		return
	}
	claimSpan.End()
	started := time.Now()
	if !t.CTime.IsZero() {
		cfg.Observer.TaskStarted(q.Name, started.Sub(t.CTime))
	}
	_, runSpan := tracer.Start(ctx, "disbatch.run", trace.WithAttributes(attribute.String("disbatch.constructor", q.Constructor)))
	p, ok := cfg.Plugins.Lookup(q.Constructor)
	var res plugin.Result
	runCtx, notNow := r.runContext()
	if notNow != nil {
		// Marked running, but the node fenced itself before the plugin
		// started: nothing ran, so the task goes back to the queue.
		log.Info("handing back a task marked running: " + notNow.Error())
		runSpan.AddEvent("handed back: the node fenced itself before the plugin started")
		runSpan.End()
		if err := r.write(log, "hand back", func(ctx context.Context) error { return cfg.Store.TaskUnstart(ctx, tr) }); err == nil {
			outcome = "released"
		} else {
			outcome = "lost"
		}
		return
	}
	switch {
	case !ok:
		res = plugin.Result{Status: schema.StatusFailed, Stderr: "disbatchd: no plugin for constructor " + q.Constructor + " on node " + cfg.Name}
	default:
		log.Debug("task running")
		res = plugin.Run(runCtx, p, plugin.Task{
			ID: t.ID, QueueID: q.ID, Queue: q.Name, Constructor: q.Constructor, Node: cfg.Name,
			Parameters: t.Parameters, Document: t.Raw,
		}, cfg.PluginTimeout)
	}
	runSpan.SetAttributes(attribute.Int("disbatch.status", int(res.Status)))
	if res.Status != schema.StatusSucceeded {
		runSpan.SetStatus(codes.Error, "task "+res.Status.String()+": "+lastLine(res.Stderr))
	}
	runSpan.End()

	_, complete := tracer.Start(ctx, "disbatch.complete")
	err := r.write(log, "finish", func(ctx context.Context) error {
		return r.finishes.do(ctx, store.TaskFinishParams{ID: t.ID, Node: cfg.Name, Status: res.Status, Stdout: res.Stdout, Stderr: res.Stderr})
	})
	task.SetAttributes(attribute.Int("disbatch.status", int(res.Status)))
	if err != nil {
		complete.RecordError(err)
		complete.SetStatus(codes.Error, "result not recorded")
		complete.End()
		outcome = "lost"
		return
	}
	complete.End()
	outcome = res.Status.String()
	if res.Status != schema.StatusSucceeded {
		task.SetStatus(codes.Error, "task "+res.Status.String())
	}
	cfg.Observer.TaskFinished(q.Name, res.Status, time.Since(started))
	log.Debug("task finished", "status", int(res.Status))
}

// lastLine is the last non-empty line of s, at most 200 bytes.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// write performs a guarded write, retrying transient errors with backoff
// for up to a minute. A lost guard is logged and not retried: another node
// or an operator owns the task now, and this node's write must not land.
func (r *runner) write(log *slog.Logger, what string, fn func(context.Context) error) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 5 * time.Second
	b.MaxElapsedTime = time.Minute
	op := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		defer cancel()
		err := fn(ctx)
		if errors.Is(err, store.ErrLostTask) {
			return backoff.Permanent(err)
		}
		return err
	}
	err := backoff.RetryNotify(op, b, func(err error, wait time.Duration) {
		log.Warn("task write failed; retrying", "write", what, "in", wait, "error", err)
	})
	switch {
	case errors.Is(err, store.ErrLostTask):
		log.Warn("task was taken from this node; its "+what+" was not written", "error", err)
	case err != nil:
		log.Error(fmt.Sprintf("task %s could not be written; giving up", what), "error", err)
	}
	return err
}

// drain stops new starts, hands back claimed tasks, waits up to grace for
// running ones, then kills them (they are marked failed) and waits for
// their final writes.
func (r *runner) drain(grace time.Duration) {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	finished := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
		return
	case <-time.After(grace):
	}
	r.n.log.Warn("grace period expired: killing running tasks", "grace", grace, "running", r.n.slots.Total())
	r.killRunning(fmt.Errorf("%w (%s)", errGraceExpired, grace), false)
	<-finished
}
