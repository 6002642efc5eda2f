package apiv1

import (
	"encoding/json"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// The JSON shapes of the responses, as components.schemas of openapi.json
// describes them.

// Queue is a queue.
type Queue struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Plugin      string   `json:"plugin"`
	MaxThreads  *int     `json:"maxthreads"`
	Sort        string   `json:"sort"`
	NodesPin    []string `json:"nodes_pin"`
	NodesIgnore []string `json:"nodes_ignore"`
	Counts      Counts   `json:"counts"`
	// The queue's task control, each when set: a time limit for its tasks
	// (seconds), the failed attempts retried, their backoff, and whether a
	// dead node's running tasks are run again.
	Timeout      *float64 `json:"timeout,omitempty"`
	Retries      *int     `json:"retries,omitempty"`
	RetryBackoff *Backoff `json:"retry_backoff,omitempty"`
	RerunOrphans *bool    `json:"rerun_orphans,omitempty"`
	// Scheduling (docs/scheduling.md), as the nodes read it: defaults
	// filled in.
	Priority   float64         `json:"priority"`
	Weight     float64         `json:"weight"`
	MaxGetwork int             `json:"max_getwork"`
	MaxRunning int             `json:"max_running"`
	Admitted   int64           `json:"admitted"`
	Paused     bool            `json:"paused"`
	Continuous bool            `json:"continuous"`
	Interval   float64         `json:"interval"`
	Then       string          `json:"then,omitempty"`
	Config     json.RawMessage `json:"config,omitempty"`
}

// Backoff is a queue's retry backoff: the delay before retry n is
// min(max, base × 2^(n-1)) seconds, spread by ±jitter (a fraction).
type Backoff struct {
	Base   float64 `json:"base"`
	Max    float64 `json:"max"`
	Jitter float64 `json:"jitter"`
}

// Counts are a queue's tasks by status. Queued (status <= -2, orphaned
// included, as Disbatch 4.103 counts them), Finished (> 0) and Total come
// from the queue's counters (count_todo, count_total), which the nodes'
// counter projection keeps: they are null until a node has created them,
// and may trail the tasks by a moment. Running (claimed or running, -1 or
// 0) is counted at the request, for every queue in one aggregation.
// Failed (status 2, for any reason; Finished includes them) is the
// queue's count_failed, kept by the same projection (null until a node has
// created it). CountRunning is the queue's count_running: the same tasks
// as Running, all nodes', as the projection counts them (null until
// created; it may trail like the others), for scheduling by weight
// (docs/scheduling.md).
type Counts struct {
	Queued       *int64 `json:"queued"`
	Running      int64  `json:"running"`
	Finished     *int64 `json:"finished"`
	Failed       *int64 `json:"failed"`
	Total        *int64 `json:"total"`
	CountRunning *int64 `json:"count_running"`
}

func queueView(q schema.Queue, running map[bson.ObjectID]int64) Queue {
	sort := q.Sort
	if !sort.Valid() || sort == "" {
		sort = schema.SortDefault
	}
	v := Queue{
		ID:          q.ID.Hex(),
		Name:        q.Name,
		Plugin:      q.Constructor,
		MaxThreads:  q.MaxThreads,
		Sort:        string(sort),
		NodesPin:    nonNil(q.NodesPin),
		NodesIgnore: nonNil(q.NodesIgnore),
		Counts:      Counts{Running: running[q.ID]},
	}
	set := func(field string) bool {
		_, err := q.Raw.LookupErr(field)
		return err == nil
	}
	c := q.Control
	if set(schema.QueueTimeout) {
		v.Timeout = ptrTo(c.Timeout.Seconds())
	}
	if set(schema.QueueRetries) {
		v.Retries = ptrTo(c.Retries)
	}
	if set(schema.QueueRetryBackoff) {
		v.RetryBackoff = &Backoff{Base: c.Backoff.Base.Seconds(), Max: c.Backoff.Max.Seconds(), Jitter: c.Backoff.Jitter}
	}
	if set(schema.QueueRerunOrphans) {
		v.RerunOrphans = ptrTo(c.RerunOrphans)
	}
	if q.CountTodo != nil && q.CountTotal != nil {
		todo, total := *q.CountTodo, *q.CountTotal
		queued := max(todo-v.Counts.Running, 0)
		finished := max(total-todo, 0)
		v.Counts.Queued, v.Counts.Finished, v.Counts.Total = &queued, &finished, &total
	}
	if q.CountFailed != nil {
		v.Counts.Failed = ptrTo(*q.CountFailed)
	}
	if q.CountRunning != nil {
		v.Counts.CountRunning = ptrTo(*q.CountRunning)
	}
	sc := q.Sched
	v.Priority, v.Weight, v.MaxGetwork, v.MaxRunning, v.Admitted = sc.Priority, sc.Weight, sc.MaxGetwork, sc.MaxRunning, sc.Admitted
	v.Paused, v.Continuous, v.Interval, v.Then = sc.Paused, sc.Continuous, sc.Interval.Seconds(), sc.Then
	if sc.Config != nil {
		if cj, err := paramsJSON(sc.Config); err == nil {
			v.Config = cj
		}
	}
	return v
}

func ptrTo[T any](v T) *T { return &v }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// Task is a task without its output's text.
type Task struct {
	ID         string          `json:"id"`
	Queue      string          `json:"queue"`
	Status     int             `json:"status"`
	StatusName *string         `json:"status_name"`
	Node       *string         `json:"node"`
	Params     json.RawMessage `json:"params"`
	CTime      *string         `json:"ctime"`
	MTime      *string         `json:"mtime"`
	Stdout     *Output         `json:"stdout"`
	Stderr     *Output         `json:"stderr"`
	// Task control, each when set.
	// Reason says why the task ended or is held, when not as its plugin
	// said (killed, cancelled, timeout, ...).
	Reason *string `json:"reason,omitempty"`
	// Attempt counts its attempts that ended; Attempts are the latest of
	// them (at most 20), the newest last.
	Attempt  *int          `json:"attempt,omitempty"`
	Attempts []AttemptView `json:"attempts,omitempty"`
	// Tries counts the failed attempts since it was submitted or last
	// requeued: what its queue's retries are spent on.
	Tries *int `json:"tries,omitempty"`
	// Kill is an operator's kill request, Cancel an operator's cancel,
	// Requeued the last requeue by an operator (its reason is empty).
	Kill     *KillView   `json:"kill,omitempty"`
	Cancel   *RecordView `json:"cancel,omitempty"`
	Requeued *RecordView `json:"requeued,omitempty"`
	// NotBefore holds the task until then; ExpiresAt finishes it unrun
	// if it has not started by then; Timeout (seconds) is its own time
	// limit, over its queue's.
	NotBefore *string  `json:"not_before,omitempty"`
	ExpiresAt *string  `json:"expires_at,omitempty"`
	Timeout   *float64 `json:"timeout,omitempty"`
	// Priority orders the tasks of a queue sorted by priority.
	Priority *int64 `json:"priority,omitempty"`
	// Task graphs: Parents are the tasks it waits for (ids),
	// OnParentFailure "run" when it runs even if one fails, and
	// AwaitingParents true while it is held for them.
	Parents         []string `json:"parents,omitempty"`
	OnParentFailure *string  `json:"on_parent_failure,omitempty"`
	AwaitingParents *bool    `json:"awaiting_parents,omitempty"`
	// Result is the exit code exec and shell tasks record; ThenError why
	// its output did not become tasks of its queue's then queue.
	Result    *int64  `json:"result,omitempty"`
	ThenError *string `json:"then_error,omitempty"`
}

// AttemptView is one attempt of a task.
type AttemptView struct {
	Node     string  `json:"node"`
	Claimed  *string `json:"claimed,omitempty"`
	Started  *string `json:"started,omitempty"`
	Finished *string `json:"finished"`
	Status   int     `json:"status"`
	Reason   *string `json:"reason,omitempty"`
}

// KillView is an operator's kill request: the node that held the task
// when asked (null for one that was not claimed), who asked, when, why.
type KillView struct {
	Node   *string `json:"node"`
	By     string  `json:"by"`
	At     *string `json:"at"`
	Reason string  `json:"reason"`
}

// RecordView records an operator's cancel or requeue: who, when, why.
type RecordView struct {
	By     string  `json:"by"`
	At     *string `json:"at"`
	Reason string  `json:"reason"`
}

// Output says where a task's stdout or stderr is and how large; null when
// the task has none yet. Read it from /api/v1/tasks/{id}/stdout or stderr.
type Output struct {
	// Inline: in the task document; false: a GridFS file.
	Inline bool `json:"inline"`
	// Bytes is its length; null when its GridFS file is missing.
	Bytes *int64 `json:"bytes"`
}

// statusNames are the named status codes (schema.Status).
var statusNames = map[schema.Status]bool{
	schema.StatusOrphaned: true, schema.StatusCancelled: true, schema.StatusBlocked: true, schema.StatusTerminated: true,
	schema.StatusQueued: true, schema.StatusClaimed: true, schema.StatusRunning: true, schema.StatusSucceeded: true, schema.StatusFailed: true,
}

func taskView(t store.TaskSummary) (Task, error) {
	params, err := paramsJSON(t.Parameters)
	if err != nil {
		return Task{}, err
	}
	v := Task{
		ID:     t.ID.Hex(),
		Queue:  t.Queue.Hex(),
		Status: int(t.Status),
		Params: params,
		CTime:  timeView(t.CTime),
		MTime:  timeView(t.MTime),
		Stdout: outputView(t.Stdout, t.StdoutBytes),
		Stderr: outputView(t.Stderr, t.StderrBytes),
	}
	if statusNames[t.Status] {
		name := t.Status.String()
		v.StatusName = &name
	}
	if t.Node != "" {
		v.Node = &t.Node
	}
	controlView(&v, t.Task)
	return v, nil
}

func controlView(v *Task, t schema.Task) {
	c := t.Control
	if c.Reason != "" {
		v.Reason = ptrTo(c.Reason)
	}
	if c.Attempt > 0 {
		v.Attempt = ptrTo(c.Attempt)
	}
	for _, a := range c.Attempts {
		av := AttemptView{Node: a.Node, Claimed: timeView(a.Claimed), Started: timeView(a.Started), Finished: timeView(a.Finished), Status: int(a.Status)}
		if a.Reason != "" {
			av.Reason = ptrTo(a.Reason)
		}
		v.Attempts = append(v.Attempts, av)
	}
	if c.Tries > 0 {
		v.Tries = ptrTo(c.Tries)
	}
	if k := c.Kill; k != nil {
		v.Kill = &KillView{By: k.By, At: timeView(k.At), Reason: k.Reason}
		if k.Node != "" {
			v.Kill.Node = ptrTo(k.Node)
		}
	}
	// The decoded task does not carry these records: read them as stored.
	v.Cancel = recordView(t.Raw, schema.TaskCancel)
	v.Requeued = recordView(t.Raw, schema.TaskRequeued)
	v.NotBefore = timeView(c.NotBefore)
	v.ExpiresAt = timeView(c.ExpiresAt)
	if c.Timeout > 0 {
		v.Timeout = ptrTo(c.Timeout.Seconds())
	}
	if c.Priority > 0 { // as the openapi document says: absent or from 1
		v.Priority = ptrTo(c.Priority)
	}
	g := t.Graph
	for _, p := range g.Parents {
		v.Parents = append(v.Parents, p.Hex())
	}
	if g.OnParentFailure != "" {
		v.OnParentFailure = ptrTo(g.OnParentFailure)
	}
	if g.AwaitingParents {
		v.AwaitingParents = ptrTo(true)
	}
	if r, ok := t.Raw.Lookup(schema.TaskResult).AsInt64OK(); ok {
		v.Result = ptrTo(r)
	}
	if e, ok := t.Raw.Lookup(schema.TaskThenError).StringValueOK(); ok && e != "" {
		v.ThenError = ptrTo(e)
	}
}

// recordView reads a {by, at, reason} record of a task as stored; nil when
// there is none.
func recordView(raw bson.Raw, field string) *RecordView {
	doc, ok := raw.Lookup(field).DocumentOK()
	if !ok {
		return nil
	}
	v := &RecordView{}
	v.By, _ = doc.Lookup(schema.KillBy).StringValueOK()
	v.Reason, _ = doc.Lookup(schema.KillReason).StringValueOK()
	if at, ok := doc.Lookup(schema.KillAt).TimeOK(); ok {
		v.At = timeView(at)
	}
	return v
}

func outputView(o schema.Output, n int64) *Output {
	if !o.Set {
		return nil
	}
	v := &Output{Inline: !o.InGridFS()}
	if n >= 0 {
		v.Bytes = &n
	}
	return v
}

// timeView renders a time as RFC 3339 in UTC with milliseconds, or null
// for none (or one RFC 3339 cannot write).
func timeView(t time.Time) *string {
	if t.IsZero() || t.Year() < 1 || t.Year() > 9999 {
		return nil
	}
	s := t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
	return &s
}

// Node is an execution node, from the document it keeps with heartbeats.
type Node struct {
	ID   *string `json:"id"`
	Node string  `json:"node"`
	// Timestamp is its last heartbeat; HeartbeatAgeMS is its age by the
	// database server's clock (never the client's or this server's).
	Timestamp      *string `json:"timestamp"`
	HeartbeatAgeMS *int64  `json:"heartbeat_age_ms"`
	State          *string `json:"state"`
	Drain          bool    `json:"drain"`
	MaxThreads     *int    `json:"maxthreads"`
	// OwnMaxThreads is the node's own cap (its --maxthreads), as its
	// heartbeat says; MaxThreads the operator's. It runs the lower.
	OwnMaxThreads *int `json:"own_maxthreads"`
	// FenceAfterMS is the node's --fence-after as its heartbeat says
	// (null: it does not say; 4.103's nodes never fence): with a
	// heartbeat older than this, it has stopped its tasks.
	FenceAfterMS *int64      `json:"fence_after_ms"`
	Dead         bool        `json:"dead"`
	DeadAt       *string     `json:"dead_at"`
	DeadBy       *string     `json:"dead_by"`
	Queues       []NodeQueue `json:"queues"`
	// Serves, Full and WakeupStream are null for a node that does not
	// say (schema.NodeServes).
	Serves       []string `json:"serves"`
	Full         []string `json:"full"`
	WakeupStream *bool    `json:"wakeup_stream"`
}

// NodeQueue is a queue as a node reports it in its heartbeat.
type NodeQueue struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Plugin     string `json:"plugin"`
	MaxThreads *int   `json:"maxthreads"`
	TasksTodo  int64  `json:"tasks_todo"`
	TasksDoing int64  `json:"tasks_doing"`
	TasksDone  int64  `json:"tasks_done"`
}

func nodeView(n schema.Node, now time.Time) Node {
	v := Node{
		Node:          n.Node,
		Timestamp:     timeView(n.Timestamp),
		Drain:         n.Drain,
		MaxThreads:    n.MaxThreads,
		OwnMaxThreads: n.OwnMaxThreads,
		Dead:          n.Dead,
		DeadAt:        timeView(n.DeadAt),
		Queues:        make([]NodeQueue, 0, len(n.Queues)),
	}
	if !n.ID.IsZero() {
		id := n.ID.Hex()
		v.ID = &id
	}
	if v.Timestamp != nil && !now.IsZero() {
		age := max(now.Sub(n.Timestamp).Milliseconds(), 0)
		v.HeartbeatAgeMS = &age
	}
	if n.State != "" {
		v.State = &n.State
	}
	if n.FenceAfter > 0 {
		ms := n.FenceAfter.Milliseconds()
		v.FenceAfterMS = &ms
	}
	if n.DeadBy != "" {
		v.DeadBy = &n.DeadBy
	}
	if n.Serves != nil {
		stream := n.WakeupStream
		v.Serves, v.Full, v.WakeupStream = n.Serves, n.Full, &stream
	}
	for _, q := range n.Queues {
		v.Queues = append(v.Queues, NodeQueue{ID: q.ID, Name: q.Name, Plugin: q.Constructor, MaxThreads: q.MaxThreads,
			TasksTodo: q.TasksTodo, TasksDoing: q.TasksDoing, TasksDone: q.TasksDone})
	}
	return v
}
