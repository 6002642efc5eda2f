package node

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/tracing"
)

// taskSteps follows one task through the runner, step by step; the runner
// calls them in this order, each at most once, and end last. Tracing and
// metrics implement it, so the runner's state machine holds neither.
type taskSteps interface {
	// handedBack: claimed but not started, the task went back to the queue.
	handedBack(why string)
	// startFailed: the write to running failed; the task is not this
	// node's any more.
	startFailed(err error)
	// started: the task is running (status 0) and its plugin starts.
	started()
	// unstarted: marked running, but the plugin did not start (the node
	// fenced itself); the task was handed back when err is nil.
	unstarted(why string, err error)
	// ran: the plugin ended with res.
	ran(res plugin.Result)
	// finished: the result write; err nil means it was recorded.
	finished(res plugin.Result, err error)
	// controlled: task control acted on the task (at any point): action
	// is one of the Control* names, detail says more.
	controlled(action, detail string)
	// end closes the task's record with its outcome (a status name,
	// "released" or "lost").
	end(outcome string)
}

// What task control does to a task on a node, as metrics and trace events
// name it.
const (
	ControlKilled  = "killed"  // an operator's kill: the plugin was killed, or the claimed task not started
	ControlTimeout = "timeout" // killed at its deadline
	ControlExpired = "expired" // claimed after its expires_at: not started
	ControlRetry   = "retry"   // a failed attempt sent back for another
	ControlFenced  = "fenced"  // its node fenced itself (no heartbeat acknowledged) and killed it
	// Supervised tasks across a node's restart:
	ControlDetached = "detached" // the node stopped and left the task running under its supervisor
	ControlAdopted  = "adopted"  // the node's next start took the running task back from its supervisor
	// The leader's timers, for the cluster:
	ControlReleased       = "released"        // delayed tasks queued at their not_before
	ControlExpiredWaiting = "expired_waiting" // waiting tasks finished unrun at their expires_at
)

// observeTask returns the steps of a task just claimed: its trace and its
// metrics.
func observeTask(name string, obs Observer, c clock.Clock, q claimer.Queue, t schema.Task, claim claimer.Timing) taskSteps {
	obs.TaskClaimed(q.Name)
	since := queuedSince(t)
	return stepsList{newTaskTrace(name, q, t, claim, since), &taskMetrics{obs: obs, clock: c, queue: q.Name, ctime: since}}
}

// queuedSince is when the task's wait for this attempt began: its ctime,
// or later its not_before (a delay, a retry's backoff), the end of its
// last attempt, or an operator's requeue. A retry's pickup and wait
// counted from the ctime took in the earlier attempts and their backoffs.
func queuedSince(t schema.Task) time.Time {
	since := t.CTime
	later := func(at time.Time) {
		if at.After(since) {
			since = at
		}
	}
	later(t.Control.NotBefore)
	if n := len(t.Control.Attempts); n > 0 {
		later(t.Control.Attempts[n-1].Finished)
	}
	// A task ended unrun (cancelled, parent_failed) has no attempt, but an
	// operator may have requeued it.
	if at, ok := t.Raw.Lookup(schema.TaskRequeued, schema.KillAt).TimeOK(); ok {
		later(at)
	}
	return since
}

// stepsList tells each of its steps in turn.
type stepsList []taskSteps

func (l stepsList) handedBack(why string) {
	for _, s := range l {
		s.handedBack(why)
	}
}

func (l stepsList) startFailed(err error) {
	for _, s := range l {
		s.startFailed(err)
	}
}

func (l stepsList) started() {
	for _, s := range l {
		s.started()
	}
}

func (l stepsList) unstarted(why string, err error) {
	for _, s := range l {
		s.unstarted(why, err)
	}
}

func (l stepsList) ran(res plugin.Result) {
	for _, s := range l {
		s.ran(res)
	}
}

func (l stepsList) finished(res plugin.Result, err error) {
	for _, s := range l {
		s.finished(res, err)
	}
}

func (l stepsList) controlled(action, detail string) {
	for _, s := range l {
		s.controlled(action, detail)
	}
}

func (l stepsList) end(outcome string) {
	for _, s := range l {
		s.end(outcome)
	}
}

// taskMetrics tells the node's Observer about a task.
type taskMetrics struct {
	obs     Observer
	clock   clock.Clock
	queue   string
	ctime   time.Time
	startAt time.Time
	retried bool // the attempt was sent back for a retry (ControlRetry)
}

func (m *taskMetrics) handedBack(string)       {}
func (m *taskMetrics) startFailed(error)       {}
func (m *taskMetrics) unstarted(string, error) {}
func (m *taskMetrics) ran(plugin.Result)       {}
func (m *taskMetrics) end(string)              {}

func (m *taskMetrics) controlled(action, _ string) {
	m.retried = m.retried || action == ControlRetry
	m.obs.TaskControlled(m.queue, action, 1)
}

func (m *taskMetrics) started() {
	m.startAt = m.clock.Now()
	if !m.ctime.IsZero() {
		m.obs.TaskStarted(m.queue, m.startAt.Sub(m.ctime))
	}
}

func (m *taskMetrics) finished(res plugin.Result, err error) {
	if err == nil {
		m.obs.TaskFinished(m.queue, res.Status, m.clock.Since(m.startAt), m.retried)
	}
}

// taskTrace is one trace per task, joined to the submitter's when the task
// carries its trace context. The task span starts when the task's wait
// for this attempt began (queuedSince), so the time it waited is visible, with children queued, claim
// (both writes: claimed and running), run (the plugin) and complete.
type taskTrace struct {
	ctx         context.Context
	constructor string
	task        trace.Span
	claim       trace.Span
	run         trace.Span
	complete    trace.Span
}

// quiet: the task span does not record, and stands in for every child.
func (tt *taskTrace) quiet() bool { return !tt.task.IsRecording() }

// newTaskTrace starts a task's trace; since is when its wait began
// (queuedSince; zero: it did not wait, and has no queued span).
func newTaskTrace(node string, q claimer.Queue, t schema.Task, claim claimer.Timing, since time.Time) *taskTrace {
	tracer := tracing.Tracer()
	begin := claim.Start
	if !since.IsZero() && since.Before(begin) {
		begin = since
	}
	ctx, task := tracer.Start(tracing.Extract(context.Background(), t.TraceParent, t.TraceState), "disbatch.task",
		trace.WithTimestamp(begin), trace.WithSpanKind(trace.SpanKindConsumer))
	// Attributes and child spans only for a span that records. Under any
	// sampler disbatchd can be given (parent-based by default; the
	// OTEL_TRACES_SAMPLER ones decide by the parent or the trace id), a
	// child of a span that does not record records nothing either: it
	// stands in for each of them (End, events and attributes on it do
	// nothing). Without tracing, the attributes and three child spans
	// were built for every task and dropped, 1 KB a task
	// (BenchmarkNewTaskTrace).
	if !task.IsRecording() {
		return &taskTrace{ctx: ctx, constructor: q.Constructor, task: task, claim: task}
	}
	task.SetAttributes(
		attribute.String("disbatch.task.id", t.ID.Hex()),
		attribute.String("disbatch.queue", q.Name),
		attribute.String("disbatch.queue.id", q.ID.Hex()),
		attribute.String("disbatch.constructor", q.Constructor),
		attribute.String("disbatch.node", node),
	)
	if !since.IsZero() {
		wait := claim.Start.Sub(since)
		task.SetAttributes(attribute.Float64("disbatch.queue.wait_ms", float64(wait.Microseconds())/1000))
		_, queued := tracer.Start(ctx, "disbatch.queued", trace.WithTimestamp(since))
		queued.End(trace.WithTimestamp(claim.Start))
	}
	_, claimSpan := tracer.Start(ctx, "disbatch.claim", trace.WithTimestamp(claim.Start))
	return &taskTrace{ctx: ctx, constructor: q.Constructor, task: task, claim: claimSpan}
}

// adoptedTrace is the trace of a task a start takes back from its
// supervisor: it begins now, with no queued span (it has been running:
// one from its ctime showed the run as a wait).
func adoptedTrace(node string, q claimer.Queue, t schema.Task, now time.Time) *taskTrace {
	return newTaskTrace(node, q, t, claimer.Timing{Start: now, End: now}, time.Time{})
}

func (tt *taskTrace) handedBack(why string) {
	tt.claim.AddEvent("handed back: " + why)
	tt.claim.End()
}

func (tt *taskTrace) startFailed(err error) {
	tt.claim.RecordError(err)
	tt.claim.SetStatus(codes.Error, "could not mark the task running")
	tt.claim.End()
}

func (tt *taskTrace) started() {
	tt.claim.End()
	if tt.quiet() {
		tt.run = tt.task
		return
	}
	_, tt.run = tracing.Tracer().Start(tt.ctx, "disbatch.run", trace.WithAttributes(attribute.String("disbatch.constructor", tt.constructor)))
}

func (tt *taskTrace) unstarted(why string, _ error) {
	tt.run.AddEvent("handed back: " + why)
	tt.run.End()
}

func (tt *taskTrace) ran(res plugin.Result) {
	tt.run.SetAttributes(attribute.Int("disbatch.status", int(res.Status)))
	if res.Status != schema.StatusSucceeded {
		tt.run.SetStatus(codes.Error, "task "+res.Status.String()+": "+lastLine(res.Stderr))
	}
	tt.run.End()
	if tt.quiet() {
		tt.complete = tt.task
		return
	}
	_, tt.complete = tracing.Tracer().Start(tt.ctx, "disbatch.complete")
}

func (tt *taskTrace) finished(res plugin.Result, err error) {
	tt.task.SetAttributes(attribute.Int("disbatch.status", int(res.Status)))
	if err != nil {
		tt.complete.RecordError(err)
		tt.complete.SetStatus(codes.Error, "result not recorded")
		tt.complete.End()
		return
	}
	tt.complete.End()
	if res.Status != schema.StatusSucceeded {
		tt.task.SetStatus(codes.Error, "task "+res.Status.String())
	}
}

func (tt *taskTrace) controlled(action, detail string) {
	tt.task.AddEvent("disbatch."+action, trace.WithAttributes(attribute.String("disbatch.control.detail", detail)))
}

func (tt *taskTrace) end(outcome string) {
	tt.task.SetAttributes(attribute.String("disbatch.outcome", outcome))
	// A child a path left open (a claim found lost, a run left to its
	// supervisor) ends with the task, or it is never exported; ending
	// one already ended does nothing.
	for _, s := range []trace.Span{tt.claim, tt.run, tt.complete} {
		if s != nil {
			s.End()
		}
	}
	tt.task.End()
}

// lastLine is the last non-empty line of s, at most 200 bytes.
func lastLine(s string) string {
	l := strings.Join(lastLines(s, 1), "")
	if len(l) > 200 {
		l = l[:200]
	}
	return l
}

// lastLines are the last n non-empty lines of s, trimmed, in order: read
// from the end, as s may be megabytes of stderr.
func lastLines(s string, n int) []string {
	var lines []string
	for rest := s; rest != "" && len(lines) < n; {
		i := strings.LastIndexByte(rest, '\n')
		if l := strings.TrimSpace(rest[i+1:]); l != "" {
			lines = append([]string{l}, lines...)
		}
		if i < 0 {
			break
		}
		rest = rest[:i]
	}
	return lines
}
