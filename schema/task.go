package schema

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Task BSON field names (seed 000).
const (
	TaskQueue      = "queue"
	TaskCTime      = "ctime"
	TaskMTime      = "mtime"
	TaskNode       = "node"
	TaskStatus     = "status"
	TaskParameters = "parameters"
	TaskParams     = "params" // Disbatch 4.103 name of parameters
	TaskStdout     = "stdout"
	TaskStderr     = "stderr"
	TaskComplete   = "complete" // written by the Disbatch 4.103 task runner
	// TaskTraceParent and TaskTraceState carry the submitter's W3C trace
	// context (https://www.w3.org/TR/trace-context/), so the node's spans
	// join the submitter's trace. Optional; this project's own fields.
	TaskTraceParent = "traceparent"
	TaskTraceState  = "tracestate"
	// TaskClaimToken marks the tasks one batched claim won (seed 004's
	// update-then-find claim), so the claimer reads back exactly those. It
	// is this project's own field and means nothing once read.
	TaskClaimToken = "claim_token"
	// TaskPrior is where a task stood before this project's last write of
	// its status or queue: "<queue hex> <status> <fresh id>[ <node>]"
	// (schema.Prior), so that the change event says it without a
	// pre-image. The fresh id makes every such write change it, so it is
	// always among the event's updated fields. This project's own field.
	TaskPrior = "prior"
	// TaskKill is an operator's request to kill a task ({node, by, at,
	// reason}): the nodes' wake-up change stream (store.StreamWakeups)
	// delivers it to the node named in it.
	TaskKill = "kill"
	// TaskResult and TaskMixedout are written by the exec and shell
	// plugins (seed 002's command nodes): the process's exit code (-N when
	// signal N killed it) and its stdout and stderr interleaved. This
	// project's own fields.
	TaskResult   = "result"
	TaskMixedout = "mixedout"
)

// Unclaimed is the node value of a task nobody has claimed (seed 000). The
// Disbatch 4.103 Perl code writes null instead; both are understood.
const Unclaimed = -1

// Task is a document of the tasks collection.
type Task struct {
	ID    bson.ObjectID
	Queue bson.ObjectID
	CTime time.Time
	MTime time.Time
	// Node is the node that claimed the task; "" when unclaimed (-1 or null).
	Node       string
	Status     Status
	Parameters bson.Raw // an object; nil when absent
	Stdout     Output
	Stderr     Output
	// TraceParent and TraceState are the submitter's trace context, if any.
	TraceParent string
	TraceState  string
	// Control is what the task says about its control (timeouts, holds,
	// kill requests, history).
	Control TaskControl
	// Graph is its parents and what it does when one fails.
	Graph TaskGraph

	Raw bson.Raw
}

// Output is a task's stdout or stderr: absent (null), inline text, or a
// GridFS file in tasks.files / tasks.chunks.
type Output struct {
	Text   string
	FileID bson.ObjectID // non-zero when the output lives in GridFS
	Set    bool          // false for null or missing
}

// InGridFS reports whether the output is stored as a GridFS file.
func (o Output) InGridFS() bool { return !o.FileID.IsZero() }

// DecodeTask decodes a tasks document.
func DecodeTask(raw bson.Raw) (Task, error) {
	r := newReader(CollTasks, raw)
	t := Task{
		ID:     r.objectID(true, "_id"),
		Queue:  r.objectID(true, TaskQueue),
		CTime:  r.timeOf(TaskCTime),
		MTime:  r.timeOf(TaskMTime),
		Node:   taskNode(r),
		Status: taskStatus(r),
		Stdout: output(r, TaskStdout),
		Stderr: output(r, TaskStderr),
		Raw:    raw,
	}
	t.Control = decodeControl(r)
	t.Graph = decodeGraph(r)
	// A malformed trace context is ignored, never fatal: tracing is optional.
	if _, v, ok := r.lookup(TaskTraceParent); ok {
		t.TraceParent, _ = v.StringValueOK()
	}
	if _, v, ok := r.lookup(TaskTraceState); ok {
		t.TraceState, _ = v.StringValueOK()
	}
	if n, v, ok := r.lookup(TaskParameters, TaskParams); ok {
		doc, isDoc := v.DocumentOK()
		if !isDoc {
			r.fail(n, wantGot("an object", v))
		}
		t.Parameters = doc
	}
	if r.err != nil {
		return Task{}, r.err
	}
	return t, nil
}

func taskNode(r *reader) string {
	_, v, ok := r.lookup(TaskNode)
	if !ok {
		return ""
	}
	if s, ok := v.StringValueOK(); ok {
		return s
	}
	if i, err := asInt(v, false); err == nil && i == Unclaimed {
		return ""
	}
	r.fail(TaskNode, wantGot("a node name, -1 or null", v))
	return ""
}

func taskStatus(r *reader) Status {
	_, v, ok := r.lookup(TaskStatus)
	if !ok {
		r.fail(TaskStatus, errMissing)
		return 0
	}
	i, err := asInt(v, false)
	if err == nil && (i < -1<<31 || i > 1<<31-1) {
		err = wantGot("a 32-bit status code", v)
	}
	if err != nil {
		r.fail(TaskStatus, err)
		return 0
	}
	return Status(i)
}

func output(r *reader, name string) Output {
	_, v, ok := r.lookup(name)
	if !ok {
		return Output{}
	}
	switch v.Type {
	case bson.TypeString:
		return Output{Text: v.StringValue(), Set: true}
	case bson.TypeObjectID:
		return Output{FileID: v.ObjectID(), Set: true}
	}
	r.fail(name, wantGot("a string, a GridFS ObjectId or null", v))
	return Output{}
}
