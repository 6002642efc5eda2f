package store

import (
	"context"
	"errors"
	"slices"
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

// finishPiped ends the attempts of the running tasks ps, held by one
// node, none with output for GridFS, in one updateMany: a bulk write of one guarded update
// per task costs the server several times more per task (each statement
// is an operation of its own) than one statement over them all. The
// update is a pipeline that applies each task's own finishOf change,
// found by the task's place among the ids (under $literal, so that no
// output is read as an expression), as update operators would:
// every field one of the changes sets or removes is computed in one $set
// stage, in name order, as update operators add new fields; a task's own
// value where its change sets one, removed where it removes it, kept
// where it does neither; the attempt counted and recorded. So the
// resolution of failed guards is guardedMany's. A document the pipeline
// cannot update (a field of an unexpected type: attempt not a number,
// attempts not a list) fails the statement, which may have finished
// others first: then every finish is written again one by one
// (guardedMany), whose guards tell the ones already written.
func (s *Store) finishPiped(ctx context.Context, ps []TaskFinishParams, now time.Time) []error {
	ids := make(bson.A, len(ps))
	vals := make(bson.A, len(ps))
	ws := make([]guardedWrite, len(ps))
	changes := make([]finishChange, len(ps))
	fields := []string{schema.TaskAttempt, schema.TaskAttempts}
	for i, p := range ps {
		c := finishOf(p, validUTF8(p.Stdout), validUTF8(p.Stderr), s.finishExtra(p, true), now)
		ids[i], ws[i], changes[i] = p.ID, c.guarded(p), c
		unset := make(bson.A, len(c.unset))
		for j, e := range c.unset {
			unset[j] = e.Key
		}
		for _, e := range append(slices.Clone(c.set), c.unset...) {
			if !slices.Contains(fields, e.Key) {
				fields = append(fields, e.Key)
			}
		}
		vals[i] = bson.D{{Key: "s", Value: c.set}, {Key: "u", Value: unset}, {Key: "a", Value: c.rec}}
	}
	slices.Sort(fields)
	own := "$" + pipedField
	set := make(bson.D, len(fields))
	for i, k := range fields {
		var v any
		switch k {
		case schema.TaskAttempt:
			v = attemptCounted
		case schema.TaskAttempts:
			v = attemptsWith(own + ".a")
		default:
			mine := own + ".s." + k
			v = bson.D{{Key: "$cond", Value: bson.A{
				bson.D{{Key: "$in", Value: bson.A{k, own + ".u"}}},
				"$$REMOVE",
				bson.D{{Key: "$cond", Value: bson.A{
					bson.D{{Key: "$eq", Value: bson.A{bson.D{{Key: "$type", Value: mine}}, "missing"}}},
					"$" + k,
					mine,
				}}},
			}}}
		}
		set[i] = bson.E{Key: k, Value: v}
	}
	// Where each task stood, read as it was (this stage's expressions see
	// the document before the stage): schema.TaskPrior.
	set = append(set, priorSet(ps[0].Node))
	pipeline := bson.A{
		bson.D{{Key: "$set", Value: bson.D{{Key: pipedField, Value: bson.D{{Key: "$arrayElemAt", Value: bson.A{
			bson.D{{Key: "$literal", Value: vals}},
			bson.D{{Key: "$indexOfArray", Value: bson.A{bson.D{{Key: "$literal", Value: ids}}, "$_id"}}},
		}}}}}}},
		bson.D{{Key: "$set", Value: set}},
		bson.D{{Key: "$unset", Value: pipedField}},
	}
	filter := append(pipedIDs(ps, ids),
		bson.E{Key: schema.TaskNode, Value: ps[0].Node},
		bson.E{Key: schema.TaskStatus, Value: int32(schema.StatusRunning)})
	res, err := s.tasks.UpdateMany(ctx, filter, pipeline)
	if we := (mongo.WriteException{}); errors.As(err, &we) && len(we.WriteErrors) > 0 {
		for i, c := range changes {
			ws[i].update = c.pipeline(ps[i].Node)
		}
		return s.guardedMany(ctx, "finish", ws, false)
	}
	var matched int64
	if err == nil {
		matched = res.MatchedCount
	}
	return s.guardedResolve(ctx, "finish", ws, ids, matched, err)
}

// pipedIDs is the part of a piped finish's filter that names its tasks
// (ids, in ps's order), each guarded by its Attempt (attemptGuard): one
// $in when every finish has the same attempt, as is usual (a batch of
// first attempts), else a $in per attempt under $or.
func pipedIDs(ps []TaskFinishParams, ids bson.A) bson.D {
	var attempts []int
	for _, p := range ps {
		if !slices.Contains(attempts, p.Attempt) {
			attempts = append(attempts, p.Attempt)
		}
	}
	of := func(attempt int, ids bson.A) bson.D {
		f := bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}
		if attempt > 0 {
			f = append(f, attemptGuard(attempt))
		}
		return f
	}
	if len(attempts) == 1 {
		return of(attempts[0], ids)
	}
	or := make(bson.A, len(attempts))
	for i, a := range attempts {
		var some bson.A
		for j, p := range ps {
			if p.Attempt == a {
				some = append(some, ids[j])
			}
		}
		or[i] = of(a, some)
	}
	return bson.D{{Key: "$or", Value: or}}
}
