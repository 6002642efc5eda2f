package store

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/schema"
)

// maxPipedBytes bounds the output one piped finish carries (its update must
// stay well under MongoDB's 16 MiB command); more goes in another.
const maxPipedBytes = 4 << 20

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
// update is a pipeline of one $set stage that applies each task's own
// finishOf change as update operators would: every field one of the
// changes sets or removes is computed, in name order, as update operators
// add new fields; the attempt counted and recorded. What the changes share
// is written once (pipedFields): a value every change sets alike is a
// literal, a field every change removes is removed; only what differs is
// looked up by the task's place among the ids (under $literal, so that no
// output is read as an expression). So the resolution of failed guards is
// guardedMany's. A document the pipeline cannot update (a field of an
// unexpected type: attempt not a number, attempts not a list) fails the
// statement, which may have finished others first: then every finish is
// written again one by one (guardedMany), whose guards tell the ones
// already written.
func (s *Store) finishPiped(ctx context.Context, ps []TaskFinishParams, now, due time.Time) []error {
	ids := make(bson.A, len(ps))
	recs := make(bson.A, len(ps))
	ws := make([]guardedWrite, len(ps))
	changes := make([]finishChange, len(ps))
	for i, p := range ps {
		c := finishOf(p, validUTF8(p.Stdout), validUTF8(p.Stderr), s.finishExtra(p, true), now, due)
		ids[i], ws[i], changes[i], recs[i] = p.ID, c.guarded(p), c, c.rec
	}
	// The task's place among the ids, looked up for each value that
	// differs: a scan of at most a batch's ids, cheaper for the server
	// than a stage of its own that would copy every document.
	place := bson.D{{Key: "$indexOfArray", Value: bson.A{bson.D{{Key: "$literal", Value: ids}}, "$_id"}}}
	own := func(vals bson.A) bson.D {
		return bson.D{{Key: "$arrayElemAt", Value: bson.A{bson.D{{Key: "$literal", Value: vals}}, place}}}
	}
	set := bson.D{
		{Key: schema.TaskAttempt, Value: attemptCounted},
		{Key: schema.TaskAttempts, Value: attemptsWith(own(recs))},
	}
	for _, f := range pipedFields(changes) {
		set = append(set, bson.E{Key: f.key, Value: f.expr(own)})
	}
	slices.SortFunc(set, func(a, b bson.E) int { return strings.Compare(a.Key, b.Key) })
	// Where each task stood, read as it was (a stage's expressions see
	// the document before the stage): schema.TaskPrior.
	pipeline := bson.A{bson.D{{Key: "$set", Value: append(set, priorSet(ps[0].Node))}}}
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

// pipedField is one field a piped finish writes, as its changes have it:
// which set it and to what, which remove it.
type pipedField struct {
	key          string
	vals         []any
	set, removed []bool
}

// pipedFields are the fields the changes set or remove, but attempt and
// attempts (in no order).
func pipedFields(changes []finishChange) []*pipedField {
	var out []*pipedField
	field := func(k string) *pipedField {
		for _, f := range out {
			if f.key == k {
				return f
			}
		}
		n := len(changes)
		f := &pipedField{key: k, vals: make([]any, n), set: make([]bool, n), removed: make([]bool, n)}
		out = append(out, f)
		return f
	}
	for i, c := range changes {
		for _, e := range c.set {
			f := field(e.Key)
			f.vals[i], f.set[i] = e.Value, true
		}
		for _, e := range c.unset {
			field(e.Key).removed[i] = true
		}
	}
	return out
}

// expr is f's value expression in a piped finish's $set; own(vals) is
// the element of vals of the task the expression is evaluated for.
//   - Every change removes the field: removed.
//   - Every change sets it to one value: that value.
//   - Every change sets it, values differing: the task's own.
//   - Otherwise (some set it, some remove it, some keep it): per task
//     {v: value}, {r: true} or {}, read as such.
func (f *pipedField) expr(own func(bson.A) bson.D) any {
	if !slices.Contains(f.removed, false) {
		return "$$REMOVE"
	}
	if !slices.Contains(f.set, false) {
		if f.alike() {
			return literal(f.vals[0])
		}
		return own(bson.A(f.vals))
	}
	per := make(bson.A, len(f.vals))
	for i, v := range f.vals {
		switch {
		case f.removed[i]:
			per[i] = bson.D{{Key: "r", Value: true}}
		case f.set[i]:
			per[i] = bson.D{{Key: "v", Value: v}}
		default:
			per[i] = bson.D{}
		}
	}
	return bson.D{{Key: "$let", Value: bson.D{
		{Key: "vars", Value: bson.D{{Key: "t", Value: own(per)}}},
		{Key: "in", Value: bson.D{{Key: "$cond", Value: bson.A{
			bson.D{{Key: "$eq", Value: bson.A{"$$t.r", true}}},
			"$$REMOVE",
			bson.D{{Key: "$cond", Value: bson.A{
				bson.D{{Key: "$eq", Value: bson.A{bson.D{{Key: "$type", Value: "$$t.v"}}, "missing"}}},
				"$" + f.key,
				"$$t.v",
			}}},
		}}}},
	}}}
}

// alike says whether every value of f is the same, type and bytes.
func (f *pipedField) alike() bool {
	if alike, sure := plainAlike(f.vals); sure {
		return alike
	}
	return encodedAlike(f.vals)
}

// plainAlike answers alike without encoding when every value is of one
// plain type, as a finish's values mostly are (a batch's status, mtime,
// output): equal values encode alike, and unequal strings, booleans and
// integers of one type do not. sure is false when it cannot tell (other
// types; times unequal in Go may be one millisecond in BSON). Encoding
// every value to compare it was 7% of a node process's allocations.
func plainAlike(vals []any) (alike, sure bool) {
	first := vals[0]
	exact := true // of first's type, unequal values encode apart
	switch first.(type) {
	case nil, string, bool, int32, int64:
	case time.Time, bson.DateTime:
		exact = false
	default:
		return false, false
	}
	for _, v := range vals[1:] {
		switch v.(type) {
		case nil, string, bool, int32, int64, time.Time, bson.DateTime:
		default:
			return false, false
		}
		if v != first {
			return false, exact && reflect.TypeOf(v) == reflect.TypeOf(first)
		}
	}
	return true, true
}

// encodedAlike is alike by each value's BSON type and bytes.
func encodedAlike(vals []any) bool {
	var first []byte
	for i, v := range vals {
		t, b, err := bson.MarshalValue(v)
		if v == nil {
			t, b, err = bson.TypeNull, nil, nil // MarshalValue refuses nil
		}
		if err != nil {
			return false
		}
		b = append([]byte{byte(t)}, b...)
		if i == 0 {
			first = b
		} else if !bytes.Equal(first, b) {
			return false
		}
	}
	return true
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
