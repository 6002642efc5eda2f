package schema

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Task graph fields (seed 002's DAG of tasks): this project's own, ignored
// by Disbatch 4 tools, which see a blocked child as status -4.
const (
	// TaskParents are the ids of the tasks (of any queues) a task waits
	// for: it runs once every one has succeeded.
	TaskParents = "parents"
	// TaskOnParentFailure says what a child does when a parent ends
	// otherwise than succeeded: OnParentFailureFail (the default: it
	// finishes unrun, ReasonParentFailed) or OnParentFailureRun (it is
	// queued once every parent has ended).
	TaskOnParentFailure = "on_parent_failure"
	// TaskAwaitingParents (true) marks a task held at StatusBlocked
	// because of its parents, not (only) its not_before: the leader's
	// timers never release it; the leader's graph duty does, when its
	// parents allow, removing the mark (it then stays held, for the
	// timers, if its not_before is still ahead).
	TaskAwaitingParents = "awaiting_parents"
	// TaskHasChildren (true) marks a task named as a parent by a task of
	// a graph insert: the node that finishes it settles its children at
	// once (the leader's graph duty does too, a change stream later).
	TaskHasChildren = "has_children"
)

// The values of on_parent_failure.
const (
	OnParentFailureFail = "fail"
	OnParentFailureRun  = "run"
)

// MaxParents bounds the parents of one task.
const MaxParents = 1000

// TaskGraph is what a task says about its place in a graph.
type TaskGraph struct {
	Parents         []bson.ObjectID
	OnParentFailure string // "" (fail) or OnParentFailureRun
	AwaitingParents bool
	HasChildren     bool
}

// ValidOnParentFailure checks a value of on_parent_failure ("" is the
// default, fail).
func ValidOnParentFailure(s string) error {
	switch s {
	case "", OnParentFailureFail, OnParentFailureRun:
		return nil
	}
	return fmt.Errorf("on_parent_failure must be %q or %q, got %q", OnParentFailureFail, OnParentFailureRun, s)
}

// ParentEnded reports whether a parent in this status has ended for good
// as far as its children are concerned: finished (> 0) or orphaned (-6:
// it will not be rerun; a rerun goes back to -2 instead).
func ParentEnded(s Status) bool { return s.Finished() || s == StatusOrphaned }

// decodeGraph reads the graph fields. It is tolerant: the graph is the
// leader's business (store.TaskGraph*), and a task whose parents field is
// not an array of ids still runs when claimed; such entries are skipped.
func decodeGraph(r *reader) TaskGraph {
	var g TaskGraph
	if _, v, ok := r.lookup(TaskParents); ok {
		g.Parents = DecodeParents(v)
	}
	if _, v, ok := r.lookup(TaskOnParentFailure); ok {
		g.OnParentFailure, _ = v.StringValueOK()
	}
	if _, v, ok := r.lookup(TaskAwaitingParents); ok {
		g.AwaitingParents, _ = v.BooleanOK()
	}
	if _, v, ok := r.lookup(TaskHasChildren); ok {
		g.HasChildren, _ = v.BooleanOK()
	}
	return g
}

// DecodeParents reads a parents field (TaskParents), tolerantly: a value
// that is not an array is no parents, and entries that are not ObjectIds
// are skipped.
func DecodeParents(v bson.RawValue) []bson.ObjectID {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil
	}
	vals, _ := arr.Values()
	var out []bson.ObjectID
	for _, e := range vals {
		if id, ok := e.ObjectIDOK(); ok {
			out = append(out, id)
		}
	}
	return out
}
