package store

import (
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/schema"
)

// maxPipedBytes bounds the output one piped finish carries (its update must
// stay well under MongoDB's 16 MiB command); more goes in another.
const maxPipedBytes = 4 << 20

// pipedField is the scratch field a piped finish gives each task its own
// values in; the update removes it again.
const pipedField = "__disbatch_finish"

// pipedChunk is how many of ps[at...] (in order) one piped finish takes:
// as many as fit in maxPipedBytes of output, at least one.
func pipedChunk(ps []TaskFinishParams, at []int) int {
	size := 0
	for n, i := range at {
		p := ps[i]
		size += len(p.Stdout) + len(p.Stderr) + len(mixedout(p.Extra)) + len(p.Output.Value)
		if n > 0 && size > maxPipedBytes {
			return n
		}
	}
	return len(at)
}

// finishPiped ends the running tasks ps, held by one node, none retried
// and none with output for GridFS, in one updateMany: a bulk write of one
// guarded update per task costs the server several times more per task
// (each statement is an operation of its own) than one statement over
// them all. The update is a pipeline: each task finds its own values
// (status, output, the attempt's record, extra fields) in a list by its
// position among the ids, under a $literal, so that no output is read as
// an expression. Its effect on each task is finishWrite's, so the
// resolution of failed guards is guardedMany's. A document the pipeline
// cannot update (a field of an unexpected type: attempt not a number,
// attempts not a list) fails the statement, which may have finished
// others first: then every finish is written again one by one
// (guardedMany), whose guards tell the ones already written.
func (s *Store) finishPiped(ctx context.Context, ps []TaskFinishParams, now time.Time) []error {
	node := ps[0].Node
	ids := make(bson.A, len(ps))
	vals := make(bson.A, len(ps))
	ws := make([]guardedWrite, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
		ws[i] = guardedWrite{p: TaskTransitionParams{ID: p.ID, Node: p.Node}, from: schema.StatusRunning, to: p.Status}
		var reason any
		if p.Reason != "" {
			reason = p.Reason
		}
		v := bson.D{
			{Key: "s", Value: int32(p.Status)},
			{Key: "o", Value: validUTF8(p.Stdout)},
			{Key: "e", Value: validUTF8(p.Stderr)},
			{Key: "r", Value: reason},
			{Key: "a", Value: attemptRecord(p, now)},
		}
		v = append(v, s.finishExtra(p, true)...)
		if p.Status == schema.StatusSucceeded && p.Output.Type != 0 {
			v = append(v, bson.E{Key: schema.TaskOutput, Value: p.Output})
			if p.Then != "" {
				v = append(v, bson.E{Key: schema.TaskThenPending, Value: p.Then})
			}
		}
		vals[i] = v
	}
	own := func(k string) string { return "$" + pipedField + "." + k }
	set := bson.D{
		{Key: schema.TaskStatus, Value: own("s")},
		{Key: schema.TaskStdout, Value: own("o")},
		{Key: schema.TaskStderr, Value: own("e")},
		{Key: schema.TaskMTime, Value: bson.D{{Key: "$literal", Value: now}}},
		{Key: schema.TaskReason, Value: own("r")},
		{Key: schema.TaskComplete, Value: true},
		{Key: schema.TaskAttempt, Value: bson.D{{Key: "$add", Value: bson.A{bson.D{{Key: "$ifNull", Value: bson.A{"$" + schema.TaskAttempt, 0}}}, 1}}}},
		{Key: schema.TaskAttempts, Value: bson.D{{Key: "$slice", Value: bson.A{
			bson.D{{Key: "$concatArrays", Value: bson.A{
				bson.D{{Key: "$ifNull", Value: bson.A{"$" + schema.TaskAttempts, bson.A{}}}},
				bson.A{own("a")},
			}}},
			-schema.MaxAttemptsKept,
		}}}},
		// A field a task's values lack is removed (a missing value removes
		// it), as finishWrite unsets the extra fields it does not write
		// and the output of a task that did not succeed with one.
		{Key: schema.TaskOutput, Value: own(schema.TaskOutput)},
		// then_pending is only ever set here, never removed.
		{Key: schema.TaskThenPending, Value: bson.D{{Key: "$ifNull", Value: bson.A{own(schema.TaskThenPending), "$" + schema.TaskThenPending}}}},
	}
	for _, k := range extraFields {
		set = append(set, bson.E{Key: k, Value: own(k)})
	}
	pipeline := bson.A{
		bson.D{{Key: "$set", Value: bson.D{{Key: pipedField, Value: bson.D{{Key: "$arrayElemAt", Value: bson.A{
			bson.D{{Key: "$literal", Value: vals}},
			bson.D{{Key: "$indexOfArray", Value: bson.A{bson.D{{Key: "$literal", Value: ids}}, "$_id"}}},
		}}}}}}},
		bson.D{{Key: "$set", Value: set}},
		bson.D{{Key: "$unset", Value: pipedField}},
	}
	filter := bson.D{
		{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}},
		{Key: schema.TaskNode, Value: node},
		{Key: schema.TaskStatus, Value: int32(schema.StatusRunning)},
	}
	res, err := s.tasks.UpdateMany(ctx, filter, pipeline)
	if we := (mongo.WriteException{}); errors.As(err, &we) && len(we.WriteErrors) > 0 {
		for i, p := range ps {
			ws[i] = finishWrite(p, validUTF8(p.Stdout), validUTF8(p.Stderr), s.finishExtra(p, true), now)
		}
		return s.guardedMany(ctx, "finish", ws, false)
	}
	var matched int64
	if err == nil {
		matched = res.MatchedCount
	}
	return s.guardedResolve(ctx, "finish", ws, ids, matched, err)
}
