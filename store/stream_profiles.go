package store

import (
	"fmt"
	"math"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// StreamProfile names what a change stream carries: its filter on the
// server (changes nobody asked for never leave it), the fields it keeps
// (a task's parameters and output never travel), and whether its events
// carry the document before the change (pre-images).
type StreamProfile int

const (
	// StreamWakeups is what a node must hear: queues created, changed
	// (not when only their projected counters or next_continuous moved) or
	// deleted; tasks inserted, replaced or deleted; task updates that make
	// a task queued (-2) or move it to another queue (the claimer's work);
	// and kill requests (an update setting schema.TaskKill: the node named
	// in it kills the task). The claim, start and finish updates, two
	// thirds of all task events, stay on the server. Events carry the
	// task's queue, status and node, and a kill request whole. One stream
	// per node reads the oplog for all of it: a second one for the rare
	// kills cost the nodes about a tenth of their throughput.
	StreamWakeups StreamProfile = iota + 1
	// StreamCounters is what changes the queues' counters: every task
	// insert, replace and delete, and every update of a task's status or
	// queue (set or removed) or reason (set), with the task's queue and
	// status before the change (Before: from the write's schema.TaskPrior,
	// or the pre-image when TasksPreImagesSet turned them on); and
	// queue inserts and replaces (a new queue gets its counters). Events
	// carry the task's reason as written (the projector counts reasons).
	// The counter projector's.
	StreamCounters
	// StreamTransitions is every task transition (insert, delete, replace,
	// a change of status, queue or node) with its pre-image or the
	// write's schema.TaskPrior (Before, as StreamCounters'), every queue
	// change, and node changes other than heartbeats (state, drain, dead,
	// maxthreads; inserts and deletes): for live subscribers. Documents
	// come whole but for a task's parameters and output.
	StreamTransitions
	// StreamTaskStates is the status changes (and deletes) of the tasks
	// StreamParams.Tasks names, for waiting on them: events carry the new
	// status and reason.
	StreamTaskStates
	// StreamLeader is what moves the leader's task timers and task
	// graphs. Timers: tasks inserted or replaced with a not_before or an
	// expires_at, and updates that set either. Graphs: tasks that start
	// waiting on their parents (inserted or replaced with
	// awaiting_parents, updates that set it; WaitsOnParents) and, with
	// StreamParams.GraphEnds, tasks that end (updates that set a status
	// > 0 or -6, replaces with such a status) and task deletes: their
	// waiting children may now be queued or fail (EndsTask). Events carry
	// not_before, expires_at, awaiting_parents and the status set. One
	// stream for both duties: every stream reads every oplog entry. The
	// ends are every task's finish: carrying them cost a one-node drain
	// about 25 µs of mongod CPU per task (8%), so they are asked for only
	// while some task waits on its parents.
	StreamLeader
)

func (p StreamProfile) String() string {
	switch p {
	case StreamWakeups:
		return "wakeups"
	case StreamCounters:
		return "counters"
	case StreamTransitions:
		return "transitions"
	case StreamTaskStates:
		return "task-states"
	case StreamLeader:
		return "leader"
	}
	return fmt.Sprintf("StreamProfile(%d)", int(p))
}

// The fields of the change events every profile keeps.
var eventFields = bson.D{
	{Key: "operationType", Value: 1}, {Key: "ns", Value: 1}, {Key: "documentKey", Value: 1},
	{Key: "clusterTime", Value: 1}, {Key: "wallTime", Value: 1},
}

func match(or ...bson.D) bson.D {
	a := make(bson.A, len(or))
	for i, d := range or {
		a[i] = d
	}
	return bson.D{{Key: "$match", Value: bson.D{{Key: "$or", Value: a}}}}
}

// projected are the queue fields the leader and the projector keep up to
// date as tasks move: an update of only these changes nothing a node
// serves (the weights read count_running on the next tick's refresh), so
// it does not wake every node. admitted is not among them: a release is
// what a capped queue waits for.
var projected = []any{schema.QueueCountTodo, schema.QueueCountTotal, schema.QueueCountRunning, schema.QueueCountFailed, schema.QueueCountsApplied,
	schema.QueueNextContinuous}

// admissionsOnly is the StreamWakeups event field that says a queue update
// moved only its admissions (ChangeEvent.AdmissionsOnly).
const admissionsOnly = "admissionsOnly"

// admissionsOnlyField adds admissionsOnly to an event: a queue update that
// set only admitted (and projected fields) and removed nothing.
func admissionsOnlyField() bson.D {
	eq := func(a, b any) bson.D { return bson.D{{Key: "$eq", Value: bson.A{a, b}}} }
	removed := bson.D{{Key: "$size", Value: bson.D{{Key: "$ifNull", Value: bson.A{"$updateDescription.removedFields", bson.A{}}}}}}
	beyond := updatesBeyond(append([]any{schema.QueueAdmitted}, projected...)...)
	return bson.D{{Key: "$addFields", Value: bson.D{{Key: admissionsOnly, Value: bson.D{{Key: "$and", Value: bson.A{
		eq("$ns.coll", schema.CollQueues), eq("$operationType", "update"), eq(removed, 0),
		bson.D{{Key: "$not", Value: bson.A{beyond}}},
	}}}}}}}
}

// updatesBeyond is true for an update event that sets a field other than
// fields.
func updatesBeyond(fields ...any) bson.D {
	keys := bson.D{{Key: "$map", Value: bson.D{
		{Key: "input", Value: bson.D{{Key: "$objectToArray", Value: "$updateDescription.updatedFields"}}},
		{Key: "in", Value: "$$this.k"},
	}}}
	return bson.D{{Key: "$gt", Value: bson.A{
		bson.D{{Key: "$size", Value: bson.D{{Key: "$setDifference", Value: bson.A{keys, bson.A(fields)}}}}},
		0,
	}}}
}

func exists() bson.D { return bson.D{{Key: "$exists", Value: true}} }

func in(vals ...any) bson.D { return bson.D{{Key: "$in", Value: bson.A(vals)}} }

func project(fields ...string) bson.D {
	p := append(bson.D(nil), eventFields...)
	for _, f := range fields {
		p = append(p, bson.E{Key: f, Value: 1})
	}
	return bson.D{{Key: "$project", Value: p}}
}

// databaseEnd: the database was dropped; every profile must hear it, as
// its view of the database is then stale.
var databaseEnd = bson.D{{Key: "operationType", Value: in("dropDatabase", "invalidate")}}

// streamShape is what a profile asks of the server.
type streamShape struct {
	pipeline  mongo.Pipeline
	preImages bool // fullDocumentBeforeChange: whenAvailable
}

// options returns fresh change stream options for the shape. The server
// sends at most batch events per reply: without a cap a reader far behind
// (a projector resuming after a million inserts) gets 16 MiB replies, and
// the driver holds each whole while it is decoded.
func (sh streamShape) options(maxAwait time.Duration, batch int) *options.ChangeStreamOptionsBuilder {
	o := options.ChangeStream().SetMaxAwaitTime(maxAwait).SetBatchSize(int32(min(batch, math.MaxInt32)))
	if sh.preImages {
		o.SetFullDocumentBeforeChange(options.WhenAvailable)
	}
	return o
}

// shape returns the profile's server-side pipeline and options.
func (p StreamProfile) shape(sp StreamParams) (streamShape, error) {
	switch p {
	case StreamWakeups:
		return streamShape{pipeline: mongo.Pipeline{
			match(
				bson.D{{Key: "ns.coll", Value: schema.CollQueues}, {Key: "$or", Value: bson.A{
					bson.D{{Key: "operationType", Value: bson.D{{Key: "$ne", Value: "update"}}}},
					bson.D{{Key: "updateDescription.removedFields.0", Value: exists()}},
					bson.D{{Key: "$expr", Value: updatesBeyond(projected...)}},
				}}},
				bson.D{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "operationType", Value: in("insert", "replace", "delete", "drop", "rename")}},
				bson.D{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "operationType", Value: "update"}, {Key: "$or", Value: bson.A{
					bson.D{{Key: "updateDescription.updatedFields." + schema.TaskStatus, Value: int32(schema.StatusQueued)}},
					bson.D{{Key: "updateDescription.updatedFields." + schema.TaskQueue, Value: exists()}},
					bson.D{{Key: "updateDescription.updatedFields." + schema.TaskKill, Value: exists()}},
				}}},
				databaseEnd,
			),
			admissionsOnlyField(),
			project("fullDocument."+schema.TaskQueue, "fullDocument."+schema.TaskStatus, "fullDocument."+schema.TaskNode,
				"updateDescription.updatedFields."+schema.TaskStatus, "updateDescription.updatedFields."+schema.TaskQueue,
				"updateDescription.updatedFields."+schema.TaskKill, "updateDescription.updatedFields."+schema.TaskNode, admissionsOnly),
		}}, nil
	case StreamCounters:
		updates := bson.A{
			bson.D{{Key: "updateDescription.updatedFields." + schema.TaskStatus, Value: exists()}},
			bson.D{{Key: "updateDescription.updatedFields." + schema.TaskQueue, Value: exists()}},
			bson.D{{Key: "updateDescription.updatedFields." + schema.TaskReason, Value: exists()}},
			bson.D{{Key: "updateDescription.removedFields", Value: in(schema.TaskStatus, schema.TaskQueue)}},
		}
		if sp.Leader {
			// The leader's clauses that the counters' do not cover are
			// updates that set a time or awaiting_parents (the counters
			// carry every insert, replace, delete, drop and end). They
			// are added as the counters' are, $exists alone (LeaderMatch
			// keeps awaiting_parents: true): a clause of another shape
			// made the projector's replies slower (stop 42).
			for _, f := range []string{schema.TaskNotBefore, schema.TaskExpiresAt, schema.TaskAwaitingParents} {
				updates = append(updates, bson.D{{Key: "updateDescription.updatedFields." + f, Value: exists()}})
			}
		}
		clauses := []bson.D{
			{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "operationType", Value: in("insert", "replace", "delete", "drop", "rename")}},
			{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "operationType", Value: "update"}, {Key: "$or", Value: updates}},
			{{Key: "ns.coll", Value: schema.CollQueues}, {Key: "operationType", Value: in("insert", "replace", "drop", "rename")}},
			databaseEnd,
		}
		fields := []string{"fullDocument." + schema.TaskQueue, "fullDocument." + schema.TaskStatus, "fullDocument." + schema.TaskReason,
			"fullDocumentBeforeChange." + schema.TaskQueue, "fullDocumentBeforeChange." + schema.TaskStatus, "fullDocumentBeforeChange." + schema.TaskReason,
			"updateDescription.updatedFields." + schema.TaskStatus, "updateDescription.updatedFields." + schema.TaskQueue,
			"updateDescription.updatedFields." + schema.TaskReason, "updateDescription.updatedFields." + schema.TaskPrior, "updateDescription.removedFields"}
		if sp.Leader {
			for _, f := range leaderFields {
				if !slices.Contains(fields, f) {
					fields = append(fields, f)
				}
			}
		}
		return streamShape{preImages: true, pipeline: mongo.Pipeline{match(clauses...), project(fields...)}}, nil
	case StreamTransitions:
		heavy := []string{schema.TaskParameters, schema.TaskParams, schema.TaskStdout, schema.TaskStderr, schema.TaskMixedout}
		drop := bson.D{}
		for _, f := range heavy {
			drop = append(drop, bson.E{Key: "fullDocument." + f, Value: 0}, bson.E{Key: "fullDocumentBeforeChange." + f, Value: 0},
				bson.E{Key: "updateDescription.updatedFields." + f, Value: 0})
		}
		drop = append(drop, bson.E{Key: "updateDescription.truncatedArrays", Value: 0}, bson.E{Key: "txnNumber", Value: 0}, bson.E{Key: "lsid", Value: 0})
		changed := func(fields ...string) bson.A {
			var a bson.A
			for _, f := range fields {
				a = append(a, bson.D{{Key: "updateDescription.updatedFields." + f, Value: exists()}})
			}
			return append(a, bson.D{{Key: "updateDescription.removedFields", Value: in(anys(fields)...)}})
		}
		return streamShape{preImages: true, pipeline: mongo.Pipeline{
			match(
				bson.D{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "operationType", Value: in("insert", "replace", "delete", "drop", "rename")}},
				bson.D{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "operationType", Value: "update"}, {Key: "$or", Value: changed(schema.TaskStatus, schema.TaskQueue, schema.TaskNode)}},
				bson.D{{Key: "ns.coll", Value: schema.CollQueues}},
				bson.D{{Key: "ns.coll", Value: schema.CollNodes}, {Key: "operationType", Value: in("insert", "replace", "delete", "drop", "rename")}},
				bson.D{{Key: "ns.coll", Value: schema.CollNodes}, {Key: "operationType", Value: "update"}, {Key: "$or", Value: changed(schema.NodeState, schema.NodeDrain, schema.NodeDead, schema.NodeMaxThreads)}},
				databaseEnd,
			),
			{{Key: "$project", Value: drop}},
		}}, nil
	case StreamTaskStates:
		if len(sp.Tasks) == 0 || len(sp.Tasks) > MaxControlIDs {
			return streamShape{}, fmt.Errorf("change stream profile %s: %d tasks; want 1 to %d", p, len(sp.Tasks), MaxControlIDs)
		}
		ids := make([]any, len(sp.Tasks))
		for i, id := range sp.Tasks {
			ids[i] = id
		}
		return streamShape{pipeline: mongo.Pipeline{
			match(
				bson.D{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "documentKey._id", Value: in(ids...)}, {Key: "$or", Value: bson.A{
					bson.D{{Key: "operationType", Value: in("delete", "replace")}},
					bson.D{{Key: "updateDescription.updatedFields." + schema.TaskStatus, Value: exists()}},
				}}},
				bson.D{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "operationType", Value: in("drop", "rename")}},
				databaseEnd,
			),
			project("fullDocument."+schema.TaskStatus, "fullDocument."+schema.TaskReason,
				"updateDescription.updatedFields."+schema.TaskStatus, "updateDescription.updatedFields."+schema.TaskReason),
		}}, nil
	case StreamLeader:
		return streamShape{pipeline: mongo.Pipeline{match(leaderClauses(sp.GraphEnds)...), project(leaderFields...)}}, nil
	}
	return streamShape{}, fmt.Errorf("unknown change stream profile %d", int(p))
}

// leaderClauses are StreamLeader's filter (LeaderMatch is the same in Go).
func leaderClauses(graphEnds bool) []bson.D {
	coll := bson.E{Key: "ns.coll", Value: schema.CollTasks}
	op := func(ops ...any) bson.E { return bson.E{Key: "operationType", Value: in(ops...)} }
	either := func(prefix string) bson.E {
		return bson.E{Key: "$or", Value: bson.A{
			bson.D{{Key: prefix + schema.TaskNotBefore, Value: exists()}},
			bson.D{{Key: prefix + schema.TaskExpiresAt, Value: exists()}},
		}}
	}
	ends := func(o, status string) []bson.D {
		return []bson.D{
			{coll, op(o), {Key: status, Value: bson.D{{Key: "$gt", Value: 0}}}},
			{coll, op(o), {Key: status, Value: int32(schema.StatusOrphaned)}},
		}
	}
	clauses := []bson.D{
		{coll, op("insert", "replace"), either("fullDocument.")},
		{coll, op("update"), either("updateDescription.updatedFields.")},
		{coll, op("insert", "replace"), {Key: "fullDocument." + schema.TaskAwaitingParents, Value: true}},
		{coll, op("update"), {Key: "updateDescription.updatedFields." + schema.TaskAwaitingParents, Value: true}},
		{coll, op("drop", "rename")},
		databaseEnd,
	}
	if graphEnds {
		clauses = append(clauses, ends("update", "updateDescription.updatedFields."+schema.TaskStatus)...)
		clauses = append(clauses, ends("replace", "fullDocument."+schema.TaskStatus)...)
		clauses = append(clauses, bson.D{coll, op("delete")})
	}
	return clauses
}

// leaderFields are the fields StreamLeader's events keep.
var leaderFields = []string{
	"fullDocument." + schema.TaskNotBefore, "fullDocument." + schema.TaskExpiresAt, "fullDocument." + schema.TaskStatus,
	"fullDocument." + schema.TaskAwaitingParents,
	"updateDescription.updatedFields." + schema.TaskNotBefore, "updateDescription.updatedFields." + schema.TaskExpiresAt,
	"updateDescription.updatedFields." + schema.TaskStatus, "updateDescription.updatedFields." + schema.TaskAwaitingParents,
}

// LeaderMatch says whether an event of StreamLeader's (with graphEnds:
// StreamParams.GraphEnds) is one, as its filter on the server says: for
// a reader of StreamCounters with StreamParams.Leader, which carries
// both profiles' events.
func LeaderMatch(ev ChangeEvent, graphEnds bool) bool {
	switch ev.Op {
	case "dropDatabase", "invalidate":
		return true
	}
	if ev.Coll != schema.CollTasks {
		return false
	}
	has := func(doc bson.Raw, f string) bool {
		_, err := doc.LookupErr(f)
		return err == nil
	}
	isTrue := func(doc bson.Raw) bool {
		b, ok := doc.Lookup(schema.TaskAwaitingParents).BooleanOK()
		return ok && b
	}
	var doc bson.Raw
	switch ev.Op {
	case "drop", "rename":
		return true
	case "insert", "replace":
		doc = ev.Doc
	case "update":
		doc = ev.Updated
	}
	if doc != nil && (has(doc, schema.TaskNotBefore) || has(doc, schema.TaskExpiresAt) || isTrue(doc)) {
		return true
	}
	return graphEnds && EndsTask(ev)
}

// OnlyEvents is evs without the events keep refuses: evs itself when it
// refuses none, else a new slice (a batch handed to two readers is
// shared).
func OnlyEvents(evs []ChangeEvent, keep func(ChangeEvent) bool) []ChangeEvent {
	for i, ev := range evs {
		if keep(ev) {
			continue
		}
		out := append(make([]ChangeEvent, 0, len(evs)-1), evs[:i]...)
		for _, ev := range evs[i+1:] {
			if keep(ev) {
				out = append(out, ev)
			}
		}
		return out
	}
	return evs
}

// CountersMatch says whether an event of StreamCounters' is one of the
// profile's own, as its filter on the server says: with
// StreamParams.Leader the stream carries the leader's too.
func CountersMatch(ev ChangeEvent) bool {
	switch ev.Op {
	case "dropDatabase", "invalidate":
		return true
	}
	switch {
	case ev.Coll == schema.CollQueues:
		return slices.Contains([]string{"insert", "replace", "drop", "rename"}, ev.Op)
	case ev.Coll != schema.CollTasks:
		return false
	case ev.Op != "update":
		return slices.Contains([]string{"insert", "replace", "delete", "drop", "rename"}, ev.Op)
	}
	for _, f := range []string{schema.TaskStatus, schema.TaskQueue, schema.TaskReason} {
		if _, err := ev.Updated.LookupErr(f); err == nil {
			return true
		}
	}
	for _, f := range ev.Removed {
		if f == schema.TaskStatus || f == schema.TaskQueue {
			return true
		}
	}
	return false
}

// EndsTask says whether a StreamLeader event is a task's end, as the
// profile matches one: an update setting a status above 0 or -6
// (orphaned), a replace with such a status, a delete.
func EndsTask(ev ChangeEvent) bool {
	if ev.Coll != schema.CollTasks {
		return false
	}
	var status bson.RawValue
	switch ev.Op {
	case "delete":
		return true
	case "update":
		status = ev.Updated.Lookup(schema.TaskStatus)
	case "replace":
		status = ev.Doc.Lookup(schema.TaskStatus)
	default:
		return false
	}
	f, ok := schema.Number(status)
	return ok && (f > 0 || f == float64(schema.StatusOrphaned))
}

// WaitsOnParents says whether a StreamLeader event is a task that starts
// waiting on its parents: inserted or replaced with awaiting_parents, or
// an update setting it.
func WaitsOnParents(ev ChangeEvent) bool {
	if ev.Coll != schema.CollTasks {
		return false
	}
	var v bson.RawValue
	switch ev.Op {
	case "insert", "replace":
		v = ev.Doc.Lookup(schema.TaskAwaitingParents)
	case "update":
		v = ev.Updated.Lookup(schema.TaskAwaitingParents)
	}
	b, ok := v.BooleanOK()
	return ok && b
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
