package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/supervisor"
	"github.com/disbatch-go/disbatch/supervisor/finish"
)

// errDetach is the cause given to supervised tasks the node leaves
// running when it stops.
var errDetach = errors.New("node stopping: task left running under its supervisor")

// supervisedEnd is how a supervised run ended for the node.
type supervisedEnd int

const (
	endResult   supervisedEnd = iota // a result for the node to write
	endWritten                       // the supervisor wrote the finish itself
	endDetached                      // the node let go; the task runs on
)

// killWait bounds how long the node waits for a supervisor to answer a
// kill with its result.
const killWait = 30 * time.Second

// launched is a supervisor being forked while its task's start is written
// (nil: none; the task is not supervised). Its fork runs beside the write
// and is awaited after it; should it fail, runSupervised starts one itself.
type launched struct {
	done chan struct{}
	p    *supervisor.Pending // once done; nil when the fork failed
}

// launch forks the supervisor of a task whose plugin p is detachable, in
// the background.
func (r *runner) launch(log *slog.Logger, t schema.Task, p plugin.Plugin) *launched {
	if r.cfg.Supervise == nil {
		return nil
	}
	if _, ok := p.(plugin.Detachable); !ok {
		return nil
	}
	l := &launched{done: make(chan struct{})}
	id := t.ID
	go func() {
		defer close(l.done)
		pending, err := r.cfg.Supervise.Launch(id.Hex())
		if err != nil {
			log.Warn("cannot fork the task's supervisor ahead of its start; trying again after", "error", err)
			return
		}
		l.p = pending
	}()
	return l
}

// take waits for the fork and returns it (nil: it failed), once.
func (l *launched) take() *supervisor.Pending {
	if l == nil {
		return nil
	}
	<-l.done
	p := l.p
	l.p = nil
	return p
}

// cancel stops a supervisor forked for a task that will not run under it.
func (l *launched) cancel() {
	if p := l.take(); p != nil {
		p.Cancel()
	}
}

// runSupervised runs a task under a supervisor process of its own: the one
// launched ahead, or a new one.
func (r *runner) runSupervised(ctx context.Context, log *slog.Logger, q claimer.Queue, t schema.Task, d plugin.Detachable, pt plugin.Task,
	claimed, started time.Time, pre *launched) (plugin.Result, supervisedEnd, func()) {
	command, bad := d.Prepare(pt)
	if bad != nil { // bad parameters: nothing to run, here or there
		pre.cancel()
		return *bad, endResult, func() {}
	}
	named, err := json.Marshal(d.Detached())
	if err != nil {
		pre.cancel()
		return plugin.Result{Status: schema.StatusFailed, Stderr: "disbatchd: the plugin's name for its supervisor: " + err.Error() + "\n"}, endResult, func() {}
	}
	spec := supervisor.Spec{
		Node: r.cfg.Name, TaskID: t.ID.Hex(), Plugin: named, Command: command, PluginTimeout: r.cfg.PluginTimeout,
		FenceAfter: r.cfg.FenceAfter, DeadAfter: r.cfg.DeadAfter, Mongo: r.cfg.SuperviseMongo,
		Finish: supervisor.Finish{Claimed: claimed, Started: started, Then: q.Sched.Then, Attempt: pt.Attempt},
	}
	if r.cfg.aliveAt != nil {
		spec.Alive = r.cfg.aliveAt()
	}
	if spec.Alive.IsZero() {
		spec.Alive = time.Now()
	}
	if limit, from := timeLimit(q, t); limit > 0 {
		spec.Deadline = started.Add(limit)
		spec.TimeoutText = fmt.Sprintf("timeout of %s (%s)", limit, from)
		spec.TimeoutReason = schema.ReasonTimeout
	}
	if rt := r.retry(q, t, schema.StatusFailed, ""); rt != nil {
		spec.Finish.RetryTries, spec.Finish.RetryDelay = rt.Tries, rt.Delay
	}
	r.mu.Lock()
	r.supervised[t.ID] = nil
	r.mu.Unlock()
	var h *supervisor.Handle
	if p := pre.take(); p != nil {
		h, err = p.Run(spec)
	} else {
		h, err = r.cfg.Supervise.Start(spec)
	}
	if err != nil {
		r.forgetSupervised(t.ID)
		log.Error("cannot start the task's supervisor", "error", err)
		return plugin.Result{Status: schema.StatusFailed, Stderr: "disbatchd: cannot start the task's supervisor: " + err.Error() + "\n"}, endResult, func() {}
	}
	log.Debug("task running under a supervisor", "supervisor_pid", h.PID)
	return r.await(ctx, log, t.ID, h, &spec)
}

// await waits for a supervised task's outcome, passing on kills; a
// detach lets go of it. The outcome is read with the task's spec (nil:
// the one in the state directory). Once the node has written the finish (or given
// up), it calls the returned ack: the supervisor then exits. Should the
// node die before, its next start adopts the supervisor and gets the
// outcome again.
func (r *runner) await(ctx context.Context, log *slog.Logger, id bson.ObjectID, h *supervisor.Handle, spec *supervisor.Spec) (plugin.Result, supervisedEnd, func()) {
	r.mu.Lock()
	r.supervised[id] = h
	r.mu.Unlock()
	defer r.forgetSupervised(id)
	select {
	case <-h.Done():
	case <-ctx.Done():
		cause := context.Cause(ctx)
		if errors.Is(cause, errDetach) {
			r.mu.Lock()
			r.detached[id], r.left[id] = true, true
			r.mu.Unlock()
			h.Close()
			log.Info("task left running under its supervisor", "supervisor_pid", h.PID)
			return plugin.Result{}, endDetached, func() {}
		}
		reason := ""
		var ck *controlKill
		if errors.As(cause, &ck) {
			reason = ck.reason
		}
		if err := h.Kill(reason, cause.Error()); err != nil {
			log.Warn("telling the supervisor to kill the task failed", "error", err)
		}
		select {
		case <-h.Done():
		case <-time.After(killWait):
			h.Close()
			return plugin.Result{Status: schema.StatusFailed, Stderr: fmt.Sprintf("disbatchd: the task's supervisor (pid %d) did not answer a kill within %s\n", h.PID, killWait)}, endResult, func() {}
		}
	}
	o, err := h.Outcome()
	if err != nil {
		h.Close()
		return plugin.Result{Status: schema.StatusFailed, Stderr: "disbatchd: " + err.Error() + "\n"}, endResult, func() {}
	}
	if spec == nil {
		s, err := supervisor.ReadSpec(r.cfg.Supervise.Dir, id.Hex())
		if err != nil {
			h.Close()
			return plugin.Result{Status: schema.StatusFailed, Stderr: "disbatchd: the supervised task's spec: " + err.Error() + "\n"}, endResult, func() {}
		}
		spec = &s
	}
	res, err := finish.Result(*spec, o)
	if err != nil {
		h.Close()
		return plugin.Result{Status: schema.StatusFailed, Stderr: "disbatchd: the supervised task's result: " + err.Error() + "\n"}, endResult, func() {}
	}
	if o.Written {
		h.Ack()
		return res, endWritten, func() {}
	}
	return res, endResult, h.Ack
}

func (r *runner) forgetSupervised(id bson.ObjectID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.supervised, id)
}

// wasDetached reports (once) whether a task was left running at stop.
func (r *runner) wasDetached(id bson.ObjectID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.detached[id]
	delete(r.detached, id)
	return d
}

// detachSupervised lets go of every supervised task, leaving it running;
// it returns how many.
func (r *runner) detachSupervised() int {
	r.mu.Lock()
	var cancels []context.CancelCauseFunc
	for id := range r.supervised {
		if c, ok := r.running[id]; ok {
			cancels = append(cancels, c)
		}
	}
	r.mu.Unlock()
	for _, c := range cancels {
		c(errDetach)
	}
	return len(cancels)
}

// alive passes an acknowledged heartbeat on to the supervisors.
func (r *runner) alive(sent time.Time) {
	r.mu.Lock()
	hs := make([]*supervisor.Handle, 0, len(r.supervised))
	for _, h := range r.supervised {
		if h != nil {
			hs = append(hs, h)
		}
	}
	r.mu.Unlock()
	for _, h := range hs {
		_ = h.Alive(sent)
	}
}

// attachSupervisors connects to the supervisors a previous run left in
// the state directory.
func (r *runner) attachSupervisors() map[bson.ObjectID]*supervisor.Handle {
	l := r.cfg.Supervise
	ids, err := supervisor.List(l.Dir)
	if err != nil {
		r.log.Warn("cannot list the state directory's supervisors", "dir", l.Dir, "error", err)
		return nil
	}
	hs := map[bson.ObjectID]*supervisor.Handle{}
	for _, s := range ids {
		id, err := bson.ObjectIDFromHex(s)
		if err != nil {
			continue
		}
		h, err := supervisor.Attach(l.Dir, s)
		if errors.Is(err, syscall.ECONNREFUSED) {
			// Nothing listens on it: its supervisor is gone (a node that
			// died while handing it a task, a supervisor killed), and
			// every start would try it again.
			if rerr := supervisor.RemoveSocket(l.Dir, s); rerr == nil {
				r.log.Info("removed a supervisor's socket that nothing listens on", "task_id", s)
			}
			continue
		}
		if err != nil {
			r.log.Info("a supervisor left in the state directory did not answer", "task_id", s, "error", err)
			continue
		}
		if h.Node != r.cfg.Name || h.Database != r.cfg.SuperviseMongo.Database {
			r.log.Warn("a supervisor in the state directory runs another node's task: left alone (give each node its own --state-dir)",
				"task_id", s, "its_node", h.Node, "its_database", h.Database)
			h.Close()
			continue
		}
		hs[id] = h
	}
	return hs
}

// adoptStore is what adoption reads.
type adoptStore interface {
	TaskStates(ctx context.Context, ids []bson.ObjectID) ([]store.TaskState, error)
	TaskGet(ctx context.Context, id bson.ObjectID) (schema.Task, error)
}

// adopt takes back the tasks of a previous run that still run under their
// supervisors: each takes a slot of its queue and is finished as if this
// run had started it. A supervisor whose task is not this node's running
// one any more (recovered, finished) is told to kill it and let go.
func (r *runner) adopt(ctx context.Context, st adoptStore, hs map[bson.ObjectID]*supervisor.Handle, queues []claimer.Queue,
	take func(q bson.ObjectID), obs Observer) error {
	if len(hs) == 0 {
		return nil
	}
	ids := make([]bson.ObjectID, 0, len(hs))
	for id := range hs {
		ids = append(ids, id)
	}
	// Read until read (as a task write is retried): a task killed for a
	// read that failed would stay running under this node's name, which
	// OrphanOwn has already passed over.
	var states []store.TaskState
	err := r.retried(r.log, "read of the supervised tasks' states", func(wctx context.Context) (err error) {
		if err := ctx.Err(); err != nil {
			return backoff.Permanent(err) // the start is abandoned
		}
		states, err = st.TaskStates(wctx, ids)
		return err
	})
	if err != nil {
		return fmt.Errorf("read the states of the tasks still running under their supervisors: %w", err)
	}
	byID := map[bson.ObjectID]store.TaskState{}
	for i, s := range states {
		byID[ids[i]] = s
	}
	// Every task read before any is acted on: Start fails with none
	// adopted or killed.
	tasks := map[bson.ObjectID]schema.Task{}
	for id := range hs {
		if s := byID[id]; !s.Found || s.Node != r.cfg.Name || s.Status != schema.StatusRunning {
			continue
		}
		var t schema.Task
		err := r.retried(r.log.With("task_id", id.Hex()), "read of a supervised task", func(wctx context.Context) (err error) {
			if err := ctx.Err(); err != nil {
				return backoff.Permanent(err)
			}
			t, err = st.TaskGet(wctx, id)
			return err
		})
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return fmt.Errorf("read task %s, still running under its supervisor: %w", id.Hex(), err)
		default:
			tasks[id] = t
		}
	}
	sent := time.Now()
	if r.cfg.aliveAt != nil {
		sent = r.cfg.aliveAt()
	}
	adopted := 0
	for id, h := range hs {
		log := r.log.With("task_id", id.Hex())
		s := byID[id]
		t, ok := tasks[id]
		if !ok || !r.sameAttempt(log, t) {
			log.Warn("a supervisor's task is no longer this node's running task: killing it", "status", int(s.Status), "node", s.Node, "found", s.Found)
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				_ = h.Kill("", "task killed: it is no longer node "+r.cfg.Name+"'s running task")
				select {
				case <-h.Done():
				case <-time.After(killWait):
				}
				h.Ack()
			}()
			continue
		}
		_ = h.Alive(sent)
		q := claimer.Queue{ID: t.Queue, Name: t.Queue.Hex()}
		for _, x := range queues {
			if x.ID == t.Queue {
				q = x
			}
		}
		take(q.ID)
		adopted++
		tt := adoptedTrace(r.cfg.Name, q, t, r.clock.Now())
		steps := stepsList{tt, &taskMetrics{obs: obs, clock: r.clock, queue: q.Name}}
		steps.controlled(ControlAdopted, fmt.Sprintf("taken back from its supervisor (pid %d) by the node's new run", h.PID))
		log.Info("adopted a running task from its supervisor", "queue", q.Name, "supervisor_pid", h.PID)
		r.handle(q, t, func() (after []func()) {
			steps.end(r.resume(log, q, t, h, steps, &after))
			return after
		})
	}
	if adopted > 0 {
		r.log.Info("adopted the previous run's running tasks", "tasks", adopted)
	}
	return nil
}

// sameAttempt reports whether t's attempt is the one its supervisor runs
// (as its spec says; a spec from before attempts were written says
// nothing, and counts as the same): this node may have lost the run (its
// task recovered as a dead node's and rerun) and claimed the task again.
func (r *runner) sameAttempt(log *slog.Logger, t schema.Task) bool {
	spec, err := supervisor.ReadSpec(r.cfg.Supervise.Dir, t.ID.Hex())
	if err != nil || spec.Finish.Attempt == 0 || spec.Finish.Attempt == t.Control.Attempt+1 {
		return true // an unreadable spec fails the adopted task's result later, as before
	}
	log.Warn("a supervisor runs an earlier attempt of its task than the one this node now holds", "supervised_attempt", spec.Finish.Attempt, "attempt", t.Control.Attempt+1)
	return false
}

// resume finishes an adopted task as run does one it started.
func (r *runner) resume(log *slog.Logger, q claimer.Queue, t schema.Task, h *supervisor.Handle, steps taskSteps, after *[]func()) string {
	runCtx, notNow := r.runContext(t.ID)
	if notNow != nil {
		// The node fenced itself meanwhile: the supervisor fences the
		// task on its own clock.
		runCtx = context.Background()
	}
	steps.started()
	r.mu.Lock()
	r.supervised[t.ID] = nil
	r.mu.Unlock()
	res, end, ack := r.await(runCtx, log, t.ID, h, nil)
	defer ack()
	if end == endDetached {
		r.ran(t.ID)
		steps.controlled(ControlDetached, "the node stopped; the task runs on under its supervisor")
		return "detached"
	}
	return r.complete(log, q, t, runCtx, res, time.Time{}, time.Time{}, end == endWritten, steps, after)
}
