package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/supervisor"
)

// errGraceExpired is the cause given to plugins killed at shutdown.
var errGraceExpired = errors.New("node shutting down: grace period expired")

// runnerStore is what the runner writes.
type runnerStore interface {
	TaskStartMany(ctx context.Context, ps []store.TaskTransitionParams) []error
	TaskFinishMany(ctx context.Context, ps []store.TaskFinishParams) []error
	TaskRelease(ctx context.Context, p store.TaskTransitionParams) error
	TaskUnstart(ctx context.Context, p store.TaskTransitionParams) error
	TaskFail(ctx context.Context, p store.TaskFailParams) error
	TaskEndClaimed(ctx context.Context, p store.TaskEndClaimedParams) error
	AdmissionsRelease(ctx context.Context, queue bson.ObjectID, ids []bson.ObjectID) (int64, error)
	ThenCreate(ctx context.Context, id bson.ObjectID) (store.ThenResult, error)
	TaskGraphSettle(ctx context.Context, p store.TaskGraphSettleParams) (store.TaskGraphResult, error)
	TaskGraphWaiting(ctx context.Context, parent bson.ObjectID) (*store.GraphWaiting, error)
	TaskStates(ctx context.Context, ids []bson.ObjectID) ([]store.TaskState, error)
}

// runnerConfig is what the runner needs of the node's config.
type runnerConfig struct {
	Name          string
	Store         runnerStore
	Plugins       *plugin.Registry
	PluginTimeout time.Duration
	Observer      Observer
	// HasWork tells the claimer that a queue has tasks to claim (children
	// this node just queued), ahead of their change events.
	HasWork func(q bson.ObjectID)
	// Supervise runs detachable plugins under supervisors (nil: in the
	// node); the rest is what their specs need.
	Supervise             *supervisor.Launcher
	SuperviseMongo        supervisor.Mongo
	FenceAfter, DeadAfter time.Duration
	// aliveAt is the send time of the last acknowledged heartbeat.
	aliveAt     func() time.Time
	beforeStart func(schema.Task) // test signal
	// writeFor is how long a task write is retried before it is given
	// up (a settle's round); 0: a minute. Tests shorten it.
	writeFor time.Duration
}

// runner executes claimed tasks: start (status 0), plugin, finish, each
// write guarded. One goroutine per task. It keeps a kill switch for every
// task whose plugin runs, so that one task, or all, can be killed.
type runner struct {
	cfg runnerConfig
	// finished gives a task's slot back (the claimer's Finished).
	finished func(q bson.ObjectID)
	clock    clock.Clock
	log      *slog.Logger

	mu       sync.Mutex
	stopping bool                                      // no task may start: the node is stopping
	fenced   bool                                      // no task may start: the node fenced itself
	held     map[bson.ObjectID]struct{}                // received from a claim and not let go
	running  map[bson.ObjectID]context.CancelCauseFunc // plugins running, and their kill
	// slotOf is the queue whose slot each task handled holds, until
	// freeSlot gives it back.
	slotOf map[bson.ObjectID]bson.ObjectID
	// pendingKills are kills of held tasks whose plugin has not started
	// yet: it starts killed.
	pendingKills map[bson.ObjectID]error
	// supervised are the tasks running under supervisors (nil until the
	// supervisor answers); detached those left running at stop.
	supervised map[bson.ObjectID]*supervisor.Handle
	detached   map[bson.ObjectID]bool
	// left are the tasks this run leaves in its name at the stop, still
	// running in the database: those whose result could not be written
	// before the node stopped (settle), and supervised ones left running
	// under their supervisors. The last heartbeat says how many
	// (schema.NodeLeftTasks), so that the node is judged like a silent one
	// should it never come back.
	left map[bson.ObjectID]bool
	wg   sync.WaitGroup

	// Concurrent tasks' start and finish writes share round trips.
	starts   *coalescer[store.TaskTransitionParams]
	finishes *coalescer[store.TaskFinishParams]
	releases *coalescer[admission]
}

// admission is a task of a capped queue whose admission to release.
type admission struct{ queue, task bson.ObjectID }

// writeBatch bounds how many tasks' writes go in one round trip.
const writeBatch = 128

func newRunner(cfg runnerConfig, finished func(bson.ObjectID), c clock.Clock, log *slog.Logger) *runner {
	r := &runner{cfg: cfg, finished: finished, clock: clock.Or(c), log: log,
		held: map[bson.ObjectID]struct{}{}, slotOf: map[bson.ObjectID]bson.ObjectID{}, running: map[bson.ObjectID]context.CancelCauseFunc{}, pendingKills: map[bson.ObjectID]error{},
		supervised: map[bson.ObjectID]*supervisor.Handle{}, detached: map[bson.ObjectID]bool{}, left: map[bson.ObjectID]bool{}}
	st := cfg.Store
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
	r.releases = newCoalescer(writeBatch, func(as []admission) []error {
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		defer cancel()
		byQueue := map[bson.ObjectID][]bson.ObjectID{}
		for _, a := range as {
			byQueue[a.queue] = append(byQueue[a.queue], a.task)
		}
		errs := make([]error, len(as))
		for q, ids := range byQueue {
			if _, err := st.AdmissionsRelease(ctx, q, ids); err != nil {
				for i, a := range as {
					if a.queue == q {
						errs[i] = err
					}
				}
			}
		}
		return errs
	})
	return r
}

// writeTimeout bounds one attempt of a task write.
const writeTimeout = 15 * time.Second

// open lets tasks start again: a new run of the node.
func (r *runner) open() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopping, r.fenced = false, false
}

// dispatch is the claimer's Dispatch: the task is claimed (-1) by this node
// and its slot taken.
//
// A task this node still handles from an earlier claim (its last write,
// say a failed attempt sent back for a retry, landed but its answer was
// lost, and is being retried; meanwhile the task was claimed again) waits
// until that handling is over: the retried write is guarded by node and
// status, which this claim matches too, so it may yet land on this claim
// and send the task back, to be run by another node. It runs only if the
// task is still this claim's once that write is done (a fault suite run
// saw one attempt on this node overlap the next, elsewhere).
func (r *runner) dispatch(q claimer.Queue, t schema.Task, claim claimer.Timing) {
	steps := observeTask(r.cfg.Name, r.cfg.Observer, r.clock, q, t, claim)
	if !r.holds(t.ID) {
		r.handle(q, t, func() (after []func()) {
			steps.end(r.run(q, t, claim.End, steps, &after))
			return after
		})
		return
	}
	log := taskLogger(r.log, q.Name, t.ID.Hex())
	log.Info("claimed a task this node still handles from an earlier claim: starting it once that is over, if it is still this claim's")
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for r.holds(t.ID) {
			time.Sleep(5 * time.Millisecond) // an internal condition, not a timed behaviour
		}
		r.handle(q, t, func() (after []func()) {
			if !r.stillClaimed(log, t) {
				steps.end("lost")
				return nil
			}
			steps.end(r.run(q, t, claim.End, steps, &after))
			return after
		})
	}()
}

// stillClaimed reports whether t is still held by this node in the status
// its claim left it in.
func (r *runner) stillClaimed(log *slog.Logger, t schema.Task) bool {
	var st store.TaskState
	err := r.write(log, "check of its claim", func(ctx context.Context) error {
		states, err := r.cfg.Store.TaskStates(ctx, []bson.ObjectID{t.ID})
		if err != nil {
			return err
		}
		st = states[0]
		return nil
	})
	if err != nil {
		return false
	}
	if !st.Found || st.Node != r.cfg.Name || st.Status != t.Status {
		log.Warn("an earlier write for this task landed on its new claim; not running it here", "node", st.Node, "status", int(st.Status))
		return false
	}
	return true
}

// handle works on a task received from a claim in a goroutine of its own,
// holding it meanwhile, and gives its slot back when done (unless work
// gave it back sooner: freeSlot). What work returns runs after that,
// still in the goroutine: the task's follow-ups (its output chained, its
// children settled) need no slot.
//
// Its goroutine, as the other closures of a task's path, captures the
// task's id, not the task (or the queue): a captured one is copied to the
// heap at the function's start, 416 bytes a task each time (the queue 280).
func (r *runner) handle(q claimer.Queue, t schema.Task, work func() (after []func())) {
	id := t.ID
	r.hold(id, true)
	r.mu.Lock()
	r.slotOf[id] = q.ID
	r.mu.Unlock()
	capped, queueID, queueName := q.Sched.Capped(), q.ID, q.Name
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		var after []func()
		defer func() {
			for _, f := range after {
				f()
			}
		}()
		// The slot first, then the hold (deferred, they run in the
		// reverse order): once the hold is gone, a new claim of the same
		// task may take a slot under the same id, which a later
		// freeSlot here would give back.
		defer r.hold(id, false)
		defer r.freeSlot(id)
		after = work()
		if r.cfg.Supervise != nil && r.wasDetached(id) {
			return // still running under its supervisor: its admission and slot go with the node
		}
		if capped {
			r.release(queueID, queueName, id)
		}
	}()
}

// freeSlot gives the slot of a task handled back to the claimer, once.
func (r *runner) freeSlot(id bson.ObjectID) {
	r.mu.Lock()
	q, ok := r.slotOf[id]
	delete(r.slotOf, id)
	r.mu.Unlock()
	if ok {
		r.finished(q)
	}
}

// release gives back the max_running admission of a task of a capped queue
// once it is no longer claimed or running here (finished, handed back,
// lost): before its slot, so that the next claim finds it free. A release
// that fails is left to the leader's sweep.
func (r *runner) release(queue bson.ObjectID, queueName string, id bson.ObjectID) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	if err := r.releases.do(ctx, admission{queue: queue, task: id}); err != nil {
		r.log.Warn("release of a max_running admission failed; the leader's sweep will release it", "queue", queueName, "task_id", id.Hex(), "error", err)
	}
}

// then turns a succeeded task's output into tasks of its queue's then
// queue; a failure is left to the leader's sweep (package chain).
func (r *runner) then(log *slog.Logger, id bson.ObjectID) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	res, err := r.cfg.Store.ThenCreate(ctx, id)
	switch {
	case err != nil:
		log.Warn("then: creating tasks from the output failed; the leader's sweep will", "error", err)
	case res.Problem != "":
		log.Warn("then: the output could not become tasks", "problem", res.Problem)
	default:
		log.Debug("then: tasks created from the output", "created", res.Created)
	}
}

// children settles the task graph children of a task this node just
// finished, so they start without waiting for the leader's graph duty to
// hear the finish (it does too; the writes are guarded).
func (r *runner) children(log *slog.Logger, id bson.ObjectID, status schema.Status, reason string, waiting *store.GraphWaiting) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	p := store.TaskGraphSettleParams{Parents: []bson.ObjectID{id}, Waiting: waiting}
	if status == schema.StatusSucceeded {
		// A success is final for its children: they may run whatever
		// happens to the task next. A failure is not: an operator may
		// retry the task before the settle, and its children must then
		// wait for it, so the settle reads how it stands.
		p.Ended = &store.TaskState{Status: status, Reason: reason}
	}
	res, err := r.cfg.Store.TaskGraphSettle(ctx, p)
	if err != nil {
		log.Warn("graph: settling the task's children failed; the leader's graph duty will", "error", err)
		return
	}
	log.Debug("graph: children settled", "queued", res.Queued, "held", res.Held, "failed", res.Failed)
	if r.cfg.HasWork != nil {
		for _, q := range res.QueuedIn {
			r.cfg.HasWork(q)
		}
	}
}

// readWaiting reads the waiting children of a task in a goroutine of its
// own (the runner's Stop waits for it); the channel gives them, or nil
// when the read failed (the settle then reads them itself).
func (r *runner) readWaiting(log *slog.Logger, id bson.ObjectID) <-chan *store.GraphWaiting {
	out := make(chan *store.GraphWaiting, 1)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		defer cancel()
		w, err := r.cfg.Store.TaskGraphWaiting(ctx, id)
		if err != nil {
			log.Debug("graph: reading the children ahead of the settle failed; the settle reads them", "error", err)
			w = nil
		}
		out <- w
	}()
	return out
}

// hold records (or forgets) a task this node received from a claim.
func (r *runner) hold(id bson.ObjectID, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if on {
		r.held[id] = struct{}{}
	} else {
		delete(r.held, id)
		delete(r.pendingKills, id)
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

// keeps reports whether the task is this run's: held, or left in its name
// at the stop (see settle). The stray sweep hands back neither.
func (r *runner) keeps(id bson.ObjectID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.held[id]
	return ok || r.left[id]
}

// holdsAny reports whether the node holds a task.
func (r *runner) holdsAny() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held) > 0
}

// malformed is the claimer's Malformed: fail the task with the reason.
func (r *runner) malformed(q claimer.Queue, t schema.Task, derr error) {
	held := t
	if t.ID.IsZero() {
		// Its _id is not an ObjectId, and the zero one would be every
		// such task's: held under an id of its own, so that two at once
		// each give their slot back.
		held.ID = bson.NewObjectID()
	}
	r.handle(q, held, func() []func() {
		log := taskLogger(r.log, q.Name, t.ID.Hex())
		p := store.TaskFailParams{ID: t.ID, Node: r.cfg.Name, From: t.Status, Reason: "disbatchd: malformed task document: " + derr.Error()}
		if t.ID.IsZero() {
			// Its _id is not an ObjectId: fail it by the _id it has.
			v, err := t.Raw.LookupErr("_id")
			if err != nil {
				log.Error("claimed a task without a readable _id; it stays claimed until the reaper orphans it", "error", derr)
				return nil
			}
			var id any
			if err := v.Unmarshal(&id); err != nil {
				log.Error("claimed a task whose _id cannot be read back; it stays claimed until the reaper orphans it", "error", derr)
				return nil
			}
			p.DocID = id
			log = r.log.With("queue", q.Name, "task_id", schema.Describe(v))
			log.Warn("claimed a task whose _id is not an ObjectId; failing it", "error", derr)
		} else {
			log.Warn("claimed a malformed task; failing it", "error", derr)
		}
		r.write(log, "fail", func(ctx context.Context) error { return r.cfg.Store.TaskFail(ctx, p) })
		return nil
	})
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

// runContext registers a task whose plugin starts now and returns the
// context it runs under (cancelled by kill and killAll), or an error
// saying why it must not start.
func (r *runner) runContext(id bson.ObjectID) (context.Context, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fenced {
		return nil, errors.New("the node fenced itself (no heartbeat acknowledged) just after marking it running, so it did not start it")
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	r.running[id] = cancel
	if cause, ok := r.pendingKills[id]; ok {
		delete(r.pendingKills, id)
		cancel(cause)
	}
	return ctx, nil
}

// ran forgets a task whose plugin ended.
func (r *runner) ran(id bson.ObjectID) {
	r.mu.Lock()
	cancel := r.running[id]
	delete(r.running, id)
	r.mu.Unlock()
	if cancel != nil {
		cancel(nil)
	}
}

// kill kills one task's plugin (its whole process group) with cause; the
// task then finishes as failed with the cause in stderr. A task the node
// holds whose plugin has not started yet starts killed. It reports whether
// the node holds the task.
func (r *runner) kill(id bson.ObjectID, cause error) bool {
	r.mu.Lock()
	cancel, ok := r.running[id]
	_, held := r.held[id]
	if !ok && held {
		if _, already := r.pendingKills[id]; !already {
			r.pendingKills[id] = cause
		}
	}
	r.mu.Unlock()
	if ok {
		cancel(cause)
	}
	return ok || held
}

// controlKill is why task control killed a task's plugin: an operator's
// kill request, the task's deadline, or its node's fence.
type controlKill struct {
	reason string // schema.ReasonKilled, ReasonTimeout or ReasonFenced
	text   string
}

func (k *controlKill) Error() string { return k.text }

// killRequested is the cause of an operator's kill.
func killRequested(req schema.KillRequest) *controlKill {
	text := "kill requested by " + orUnknown(req.By)
	if !req.At.IsZero() {
		text += " at " + req.At.Format(time.RFC3339)
	}
	if req.Reason != "" {
		text += ": " + req.Reason
	}
	return &controlKill{reason: schema.ReasonKilled, text: text}
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

// killAll kills every plugin running now with cause; with fence, no task
// starts until unfence.
func (r *runner) killAll(cause error, fence bool) {
	r.mu.Lock()
	if fence {
		r.fenced = true
	}
	kills := make([]context.CancelCauseFunc, 0, len(r.running))
	for _, cancel := range r.running {
		kills = append(kills, cancel)
	}
	r.mu.Unlock()
	for _, kill := range kills {
		kill(cause)
	}
}

// unfence lets tasks start again after a fence.
func (r *runner) unfence() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fenced = false
}

// run takes a claimed task through start, plugin and finish, telling steps
// about each, and returns the outcome. The finished task's follow-ups go
// to after, for once its slot is free.
func (r *runner) run(q claimer.Queue, t schema.Task, claimed time.Time, steps taskSteps, after *[]func()) string {
	cfg := r.cfg
	log := taskLogger(r.log, q.Name, t.ID.Hex())
	if cfg.beforeStart != nil {
		cfg.beforeStart(t)
	}
	tr := store.TaskTransitionParams{ID: t.ID, Node: cfg.Name}
	// Claimed straight into running (Config.ClaimRunning): no start write.
	startedAtClaim := t.Status == schema.StatusRunning
	if why := r.handBack(); why != "" {
		log.Info("handing back a claimed task: " + why)
		steps.handedBack(why)
		if startedAtClaim {
			r.write(log, "hand back", func(ctx context.Context) error { return cfg.Store.TaskUnstart(ctx, tr) })
		} else {
			r.write(log, "release", func(ctx context.Context) error { return cfg.Store.TaskRelease(ctx, tr) })
		}
		return "released"
	}
	p, havePlugin := cfg.Plugins.Lookup(q.Constructor) // once per task
	if rw, ok := p.(plugin.ResultWriter); ok {
		return r.runWritingResult(log, q, t, rw, steps)
	}
	// A supervised task's supervisor is forked while its start is
	// written; it waits for the node's word before it runs anything.
	pending := r.launch(log, t, p)
	if startedAtClaim {
		if t.Control.Kill != nil {
			// An operator asked to kill it before it was requeued: it
			// starts killed, as a task the node held would.
			r.kill(t.ID, killRequested(*t.Control.Kill))
		}
	} else if err := r.write(log, "start", func(ctx context.Context) error { return r.starts.do(ctx, tr) }); err != nil {
		pending.cancel()
		if errors.Is(err, store.ErrKillRequested) || errors.Is(err, store.ErrExpired) {
			return r.endUnstarted(log, q, t, err, steps)
		}
		steps.startFailed(err)
		return "lost"
	}
	started := r.clock.Now()
	steps.started()
	runCtx, notNow := r.runContext(t.ID)
	if notNow != nil {
		pending.cancel()
		// Marked running, but the node fenced itself before the plugin
		// started: nothing ran, so the task goes back to the queue.
		log.Info("handing back a task marked running: " + notNow.Error())
		err := r.write(log, "hand back", func(ctx context.Context) error { return cfg.Store.TaskUnstart(ctx, tr) })
		steps.unstarted("the node fenced itself before the plugin started", err)
		if err != nil {
			return "lost"
		}
		return "released"
	}
	if limit, from := timeLimit(q, t); limit > 0 {
		id := t.ID
		deadline := time.AfterFunc(limit, func() {
			r.kill(id, &controlKill{reason: schema.ReasonTimeout, text: fmt.Sprintf("timeout of %s (%s)", limit, from)})
		})
		defer deadline.Stop()
	}
	var res plugin.Result
	written := false
	ack := func() {} // a supervisor's: once the finish is written
	if havePlugin {
		log.Debug("task running")
		pt := plugin.Task{
			ID: t.ID, QueueID: q.ID, Queue: q.Name, Constructor: q.Constructor, Node: cfg.Name,
			Attempt: t.Control.Attempt + 1, Parameters: t.Parameters, Document: t.Raw, Config: q.Sched.Config,
		}
		if d, ok := p.(plugin.Detachable); ok && cfg.Supervise != nil && runCtx.Err() == nil {
			var end supervisedEnd
			res, end, ack = r.runSupervised(runCtx, log, q, t, d, pt, claimed, started, pending)
			switch end {
			case endDetached:
				r.ran(t.ID)
				steps.controlled(ControlDetached, "the node stopped; the task runs on under its supervisor")
				return "detached"
			case endWritten:
				written = true
			}
		} else {
			pending.cancel()
			res = plugin.Run(runCtx, p, pt, cfg.PluginTimeout)
		}
	} else {
		pending.cancel()
		res = plugin.Result{Status: schema.StatusFailed, Stderr: "disbatchd: no plugin for constructor " + q.Constructor + " on node " + cfg.Name}
	}
	defer ack()
	return r.complete(log, q, t, runCtx, res, claimed, started, written, steps, after)
}

// complete settles a task whose plugin ended with res: its task-control
// reason, a retry, the finish write (unless its supervisor wrote it), and
// its follow-ups (to after).
func (r *runner) complete(log *slog.Logger, q claimer.Queue, t schema.Task, runCtx context.Context, res plugin.Result,
	claimed, started time.Time, written bool, steps taskSteps, after *[]func()) string {
	cfg := r.cfg
	var ck *controlKill
	reason := ""
	if errors.As(context.Cause(runCtx), &ck) && res.Status != schema.StatusSucceeded {
		reason = ck.reason
		action := ControlKilled
		switch reason {
		case schema.ReasonTimeout:
			action = ControlTimeout
		case schema.ReasonFenced:
			action = ControlFenced
		}
		log.Info("task killed", "reason", reason, "why", ck.text)
		steps.controlled(action, ck.text)
	}
	r.ran(t.ID)
	steps.ran(res)
	fp := store.TaskFinishParams{ID: t.ID, Node: cfg.Name, Status: res.Status, Stdout: res.Stdout, Stderr: res.Stderr,
		Reason: reason, Claimed: claimed, Started: started, Extra: res.Extra, Output: res.Output, Then: q.Sched.Then,
		Attempt: t.Control.Attempt + 1}
	if fp.Retry = r.retry(q, t, res.Status, reason); fp.Retry != nil {
		wait := fp.Retry.Delay.Round(time.Millisecond)
		log.Info("task failed; retrying it", "try", fp.Retry.Tries, "retries", q.Control.Retries, "in", wait)
		steps.controlled(ControlRetry, fmt.Sprintf("try %d of %d in %s", fp.Retry.Tries, q.Control.Retries, wait))
	}
	var waiting <-chan *store.GraphWaiting
	if t.Graph.HasChildren && res.Status == schema.StatusSucceeded && fp.Retry == nil {
		// Its children are read while the finish is written: settling
		// them then takes one write, not a read and a write.
		waiting = r.readWaiting(log, t.ID)
	}
	if !q.Sched.Capped() {
		// Its plugin is done: the slot (a task the node runs at once) is
		// free while the finish is written, so that the next claim does
		// not wait for that write. A capped queue's slot waits for the
		// release of its admission, after the finish.
		r.freeSlot(t.ID)
	}
	var err error
	if !written {
		err = r.settle(log, t.ID, "finish", func(ctx context.Context) error { return r.finishes.do(ctx, fp) })
	}
	steps.finished(res, err)
	if err != nil {
		return "lost"
	}
	if res.Status == schema.StatusSucceeded {
		log.Debug("task finished", "status", int(res.Status), "written_by_supervisor", written)
	} else {
		// A failure says why in the log too: a plugin that cannot start or
		// answers garbage fails every task of its queue, and the task's
		// stderr is the only other place that says so.
		log.Info("task failed", "status", int(res.Status), "reason", reason, "retrying", fp.Retry != nil,
			"stderr", stderrTail(res.Stderr), "written_by_supervisor", written)
	}
	if fp.Retry != nil {
		return "retrying"
	}
	id := t.ID
	if fp.Then != "" && res.Status == schema.StatusSucceeded && res.Output.Type != 0 {
		*after = append(*after, func() { r.then(log, id) })
	}
	if t.Graph.HasChildren {
		*after = append(*after, func() {
			var w *store.GraphWaiting
			if waiting != nil {
				w = <-waiting
			}
			r.children(log, id, res.Status, reason, w)
		})
	}
	return res.Status.String()
}

// runWritingResult runs a task whose plugin writes its start and result
// itself (Disbatch 4.103's task_runner: plugin.TaskRunner), then looks at
// what it left: finished, done; still claimed (it never started the task),
// failed here with why; still running (it died, or was killed or timed
// out), finished here as failed.
func (r *runner) runWritingResult(log *slog.Logger, q claimer.Queue, t schema.Task, rw plugin.ResultWriter, steps taskSteps) string {
	cfg := r.cfg
	tr := store.TaskTransitionParams{ID: t.ID, Node: cfg.Name}
	runCtx, notNow := r.runContext(t.ID)
	if notNow != nil {
		log.Info("handing back a claimed task: " + notNow.Error())
		steps.handedBack(notNow.Error())
		r.write(log, "release", func(ctx context.Context) error { return cfg.Store.TaskRelease(ctx, tr) })
		return "released"
	}
	if limit, from := timeLimit(q, t); limit > 0 {
		id := t.ID
		deadline := time.AfterFunc(limit, func() {
			r.kill(id, &controlKill{reason: schema.ReasonTimeout, text: fmt.Sprintf("timeout of %s (%s)", limit, from)})
		})
		defer deadline.Stop()
	}
	steps.started()
	log.Debug("task handed to its task_runner")
	tail, runErr := rw.RunWritingResult(runCtx, plugin.Task{
		ID: t.ID, QueueID: q.ID, Queue: q.Name, Constructor: q.Constructor, Node: cfg.Name,
		Attempt: t.Control.Attempt + 1, Parameters: t.Parameters, Document: t.Raw, Config: q.Sched.Config,
	})
	r.ran(t.ID)
	reason, why := "", "task_runner ended without writing a result"
	var ck *controlKill
	if errors.As(context.Cause(runCtx), &ck) {
		reason, why = ck.reason, ck.text
	}
	if runErr != nil {
		why += ": " + runErr.Error()
		if tail != "" {
			why += "\n" + tail
		}
	}
	var st store.TaskState
	err := r.settle(log, t.ID, "read back", func(ctx context.Context) error {
		states, err := cfg.Store.TaskStates(ctx, []bson.ObjectID{t.ID})
		if err == nil && len(states) == 1 {
			st = states[0]
		}
		return err
	})
	switch {
	case err != nil || !st.Found || st.Node != cfg.Name && st.Status <= 0:
		res := plugin.Result{Status: schema.StatusFailed}
		steps.ran(res)
		steps.finished(res, errors.New("the task is no longer this node's"))
		return "lost"
	case st.Status.Finished():
		res := plugin.Result{Status: st.Status}
		steps.ran(res)
		steps.finished(res, nil)
		log.Debug("task finished by its task_runner", "status", int(st.Status))
		return st.Status.String()
	case st.Status == schema.StatusClaimed:
		// It never marked the task running (it runs only a task claimed
		// by its host's name: is --node this host's name?).
		log.Warn("task_runner did not start the task", "why", why)
		err := r.write(log, "fail", func(ctx context.Context) error {
			return cfg.Store.TaskFail(ctx, store.TaskFailParams{ID: t.ID, Node: cfg.Name, From: schema.StatusClaimed, Reason: "task_runner did not start the task: " + why})
		})
		res := plugin.Result{Status: schema.StatusFailed}
		steps.ran(res)
		steps.finished(res, err)
		return "failed"
	default: // running: it died, or was killed
		res := plugin.Result{Status: schema.StatusFailed, Stderr: why + "\n"}
		steps.ran(res)
		fp := store.TaskFinishParams{ID: t.ID, Node: cfg.Name, Status: schema.StatusFailed, Stderr: res.Stderr, Reason: reason,
			Attempt: t.Control.Attempt + 1}
		err := r.settle(log, t.ID, "finish", func(ctx context.Context) error { return r.finishes.do(ctx, fp) })
		steps.finished(res, err)
		if err != nil {
			return "lost"
		}
		return "failed"
	}
}

// timeLimit is the task's time limit and where it comes from: its own
// timeout, else its queue's; 0 for none.
func timeLimit(q claimer.Queue, t schema.Task) (time.Duration, string) {
	if t.Control.Timeout > 0 {
		return t.Control.Timeout, "the task's timeout"
	}
	if q.Control.Timeout > 0 {
		return q.Control.Timeout, "queue " + q.Name + "'s timeout"
	}
	return 0, ""
}

// retry says when a failed attempt runs again: a failure (status >= 2,
// a timeout, a crashed plugin) of a queue with retries left goes back,
// delayed by the queue's exponential backoff; a kill never does.
func (r *runner) retry(q claimer.Queue, t schema.Task, status schema.Status, reason string) *store.TaskRetryAt {
	if status < schema.StatusFailed || reason == schema.ReasonKilled {
		return nil
	}
	tries := t.Control.Tries + 1
	if tries > q.Control.Retries {
		return nil
	}
	return &store.TaskRetryAt{Delay: RetryDelay(q.Control.Backoff, tries), Tries: tries}
}

// RetryDelay is the delay before retry n (1 for the first): exponential
// from the backoff's base, doubling, capped at its max, spread by its
// jitter (cenkalti/backoff's randomization).
func RetryDelay(b schema.Backoff, n int) time.Duration {
	if b.Base <= 0 {
		return 0
	}
	eb := backoff.NewExponentialBackOff()
	eb.InitialInterval = b.Base
	eb.MaxInterval = b.Max
	eb.Multiplier = 2
	eb.RandomizationFactor = b.Jitter
	eb.MaxElapsedTime = 0
	eb.Reset()
	var d time.Duration
	for range n {
		d = eb.NextBackOff()
	}
	return d
}

// endUnstarted ends a claimed task the start found asked to be killed or
// expired: it never runs.
func (r *runner) endUnstarted(log *slog.Logger, q claimer.Queue, t schema.Task, why error, steps taskSteps) string {
	p := store.TaskEndClaimedParams{ID: t.ID, Node: r.cfg.Name, Reason: schema.ReasonExpired,
		Stderr: "disbatchd: not started: it expired (expires_at " + t.Control.ExpiresAt.Format(time.RFC3339Nano) + ") before node " + r.cfg.Name + " could start it"}
	action := ControlExpired
	if errors.Is(why, store.ErrKillRequested) {
		p.Reason, action = schema.ReasonKilled, ControlKilled
		p.Stderr = "disbatchd: not started: an operator asked to kill it while node " + r.cfg.Name + " held it"
	}
	log.Info("not starting a claimed task", "reason", p.Reason)
	steps.controlled(action, p.Stderr)
	steps.handedBack(p.Stderr)
	if err := r.write(log, "end unstarted", func(ctx context.Context) error { return r.cfg.Store.TaskEndClaimed(ctx, p) }); err != nil {
		return "lost"
	}
	return p.Reason
}

// write performs a guarded write, retrying transient errors with backoff
// for up to a minute. A lost guard is logged and not retried: another node
// or an operator owns the task now, and this node's write must not land.
func (r *runner) write(log *slog.Logger, what string, fn func(context.Context) error) error {
	err := r.retried(log, what, fn)
	if err != nil && !guarded(err) {
		log.Error(fmt.Sprintf("task %s could not be written; giving up", what), "error", err)
	}
	return err
}

// settle is write for a task whose plugin started in this run: its finish,
// or the read of what its task_runner wrote. The task is running under this
// node's name in the database, and only this node's write (or, once the
// node is found dead, the reaper's) may settle it: one given up would
// leave it to the stray sweep, which would hand it back to run again. So
// settle goes on retrying, a minute at a time, until the write lands or a
// guard answers, for as long as the node runs; the task stays held
// meanwhile. At the node's stop it gives up and keeps the task in left,
// which the sweep leaves alone; the node's next start orphans it
// (reaper.OrphanOwn). A write the server refuses for good (not a lost
// connection) is retried as long, an error logged each minute: a held
// task is visible, a task run twice is not.
func (r *runner) settle(log *slog.Logger, id bson.ObjectID, what string, fn func(context.Context) error) error {
	for {
		err := r.retried(log, what, fn)
		if err == nil || guarded(err) {
			return err
		}
		if r.isStopping() {
			r.mu.Lock()
			r.left[id] = true
			r.mu.Unlock()
			log.Error(fmt.Sprintf("task %s could not be written before the node stopped; the task stays running under this node's name, and its next start orphans it (it is not run again)", what), "error", err)
			return err
		}
		log.Error(fmt.Sprintf("task %s could not be written for a minute; still retrying, as long as the node runs (no other node may run the task meanwhile)", what), "error", err)
	}
}

// leftBehind is how many tasks this run leaves in its name (left).
func (r *runner) leftBehind() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.left)
}

// isStopping reports whether the node is stopping.
func (r *runner) isStopping() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopping
}

// guarded reports whether err is a guard's answer to a task write: the
// task is no longer this node's to write as it was, and retrying cannot
// change that.
func guarded(err error) bool {
	return errors.Is(err, store.ErrLostTask) || errors.Is(err, store.ErrKillRequested) || errors.Is(err, store.ErrExpired)
}

// retried performs a guarded write, retrying transient errors with backoff
// for up to a minute; a guard's answer ends it at once.
func (r *runner) retried(log *slog.Logger, what string, fn func(context.Context) error) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 5 * time.Second
	b.MaxElapsedTime = cmp.Or(r.cfg.writeFor, time.Minute)
	op := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		defer cancel()
		err := fn(ctx)
		if guarded(err) {
			return backoff.Permanent(err)
		}
		return err
	}
	err := backoff.RetryNotify(op, b, func(err error, wait time.Duration) {
		log.Warn("task write failed; retrying", "write", what, "in", wait, "error", err)
	})
	if errors.Is(err, store.ErrLostTask) {
		log.Warn("task was taken from this node; its "+what+" was not written", "error", err)
	} // a kill asked for, or an expiry: the caller settles it
	return err
}

// drain stops new starts, hands back claimed tasks, waits up to grace for
// running ones, then kills them (they are marked failed) and waits for
// their final writes.
func (r *runner) drain(grace time.Duration) {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	grace = max(grace, 0) // NoGrace
	if r.wait(grace) {
		return
	}
	r.mu.Lock()
	running := len(r.running)
	r.mu.Unlock()
	if n := r.detachSupervised(); n > 0 {
		r.log.Info("grace period expired: leaving supervised tasks running for the node's next start", "grace", grace, "detached", n)
		running -= n
	}
	if running > 0 {
		r.log.Warn("grace period expired: killing running tasks", "grace", grace, "running", running)
	}
	r.killAll(fmt.Errorf("%w (%s)", errGraceExpired, grace), false)
	r.wg.Wait()
}

// wait waits for every task goroutine, at most d; it reports whether they
// all ended.
func (r *runner) wait(d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// stderrTail is the end of a failure's stderr for the log: its last three
// non-empty lines (a plugin's own cause, then what the runner appends,
// such as "exit status 3"), joined by " | ", at most 300 bytes.
func stderrTail(text string) string {
	tail := strings.Join(lastLines(text, 3), " | ")
	if len(tail) > 300 {
		tail = "…" + strings.ToValidUTF8(tail[len(tail)-300:], "")
	}
	return tail
}
