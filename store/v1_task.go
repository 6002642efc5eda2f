package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// This file and the other v1_*.go files are the store's side of the v1 JSON
// API (web/apiv1).

// TaskSearchParams select tasks for a listing, one page at a time, in _id
// order. Every condition given must hold. Only tasks whose _id is an
// ObjectId are found (the cursor is an ObjectId).
type TaskSearchParams struct {
	// IDs, when set, restricts the search to these tasks.
	IDs []bson.ObjectID
	// Queue, when set, selects the tasks of one queue.
	Queue *bson.ObjectID
	// Statuses, when set, selects tasks in any of these statuses.
	Statuses []schema.Status
	// Node, when set, selects the tasks claimed by this node.
	Node string
	// Reason, when set, selects the tasks with this reason.
	Reason string
	// CreatedAfter and CreatedBefore, when set, bound ctime (both
	// exclusive). Tasks whose ctime is not a date are then not found.
	CreatedAfter, CreatedBefore time.Time
	// Params select tasks by their parameters.
	Params []ParamMatch
	// After is the cursor: the _id of the last task of the previous page
	// (zero for the first page). The page holds the tasks beyond it in the
	// order asked for, so tasks inserted meanwhile never shift a page.
	After      bson.ObjectID
	Descending bool
	// Limit is the page size, 1 to MaxTaskSearchLimit.
	Limit int
}

// MaxTaskSearchLimit bounds one page of TaskSearch.
const MaxTaskSearchLimit = 10000

// ParamMatch selects tasks whose parameter at Path (dot-separated, for
// nested objects) equals one of Values. Both the seed-000 field parameters
// and the Disbatch 4.103 field params are matched. Values are strings,
// booleans, int64 or float64; MongoDB compares numbers across their BSON
// types, so int64(5) matches a 32-bit 5 and a double 5.0.
type ParamMatch struct {
	Path   string
	Values []any
}

// Validate checks the path: dot-separated segments, none empty, none
// starting with '$', no NUL.
func (m ParamMatch) Validate() error {
	if len(m.Values) == 0 {
		return fmt.Errorf("parameter %q: no value to match", m.Path)
	}
	for _, seg := range strings.Split(m.Path, ".") {
		if seg == "" || strings.HasPrefix(seg, "$") || strings.ContainsRune(seg, 0) {
			return fmt.Errorf("parameter path %q: want dot-separated names, none empty, none starting with '$'", m.Path)
		}
	}
	return nil
}

// TaskSummary is a task as a listing shows it: the task without the text
// of its output (Stdout.Text and Stderr.Text are empty; Set and FileID are
// as stored), and the output's size in bytes.
type TaskSummary struct {
	schema.Task
	// StdoutBytes and StderrBytes are the output's length: of the inline
	// string, or of the GridFS file. -1 when there is no output (null) or
	// its GridFS file is missing.
	StdoutBytes, StderrBytes int64
}

// TaskSearchResult is one page of a search: the tasks that decoded, one
// error per document that did not (skipped, but counted in the page), and
// whether more tasks follow, in which case Last is the cursor of the next
// page.
type TaskSearchResult struct {
	Tasks     []TaskSummary
	Malformed []error
	More      bool
	Last      bson.ObjectID
}

// Helper fields the search pipeline adds to each document.
const (
	searchStdoutBytes = "__disbatch_stdout_bytes"
	searchStderrBytes = "__disbatch_stderr_bytes"
)

// TaskSearch returns one page of the tasks matching p, without reading
// their output: one aggregation (the output's text is replaced by its
// length on the server) and, when some output lives in GridFS, one read of
// those files' lengths.
func (s *Store) TaskSearch(ctx context.Context, p TaskSearchParams) (TaskSearchResult, error) {
	if p.Limit < 1 || p.Limit > MaxTaskSearchLimit {
		return TaskSearchResult{}, fmt.Errorf("search tasks: limit %d is not within 1..%d", p.Limit, MaxTaskSearchLimit)
	}
	filter, err := taskSearchFilter(p)
	if err != nil {
		return TaskSearchResult{}, err
	}
	dir := 1
	if p.Descending {
		dir = -1
	}
	outputLen := func(field, bytesField string) bson.D {
		isString := bson.D{{Key: "$eq", Value: bson.A{bson.D{{Key: "$type", Value: "$" + field}}, "string"}}}
		return bson.D{
			{Key: bytesField, Value: bson.D{{Key: "$cond", Value: bson.A{isString, bson.D{{Key: "$strLenBytes", Value: "$" + field}}, nil}}}},
			{Key: field, Value: bson.D{{Key: "$cond", Value: bson.A{isString, "", "$" + field}}}},
		}
	}
	cur, err := s.tasks.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: filter}},
		{{Key: "$sort", Value: bson.D{{Key: "_id", Value: dir}}}},
		{{Key: "$limit", Value: int64(p.Limit) + 1}},
		{{Key: "$set", Value: append(outputLen(schema.TaskStdout, searchStdoutBytes), outputLen(schema.TaskStderr, searchStderrBytes)...)}},
	})
	if err != nil {
		return TaskSearchResult{}, fmt.Errorf("search tasks: %w", err)
	}
	docs, err := readAll(ctx, cur)
	if err != nil {
		return TaskSearchResult{}, fmt.Errorf("search tasks: %w", err)
	}
	var res TaskSearchResult
	if len(docs) > p.Limit {
		docs, res.More = docs[:p.Limit], true
	}
	var files []bson.ObjectID
	for _, raw := range docs {
		res.Last, _ = raw.Lookup("_id").ObjectIDOK()
		t, err := schema.DecodeTask(raw)
		if err != nil {
			res.Malformed = append(res.Malformed, err)
			continue
		}
		sum := TaskSummary{Task: t, StdoutBytes: -1, StderrBytes: -1}
		if n, ok := raw.Lookup(searchStdoutBytes).AsInt64OK(); ok {
			sum.StdoutBytes = n
		}
		if n, ok := raw.Lookup(searchStderrBytes).AsInt64OK(); ok {
			sum.StderrBytes = n
		}
		for _, o := range []schema.Output{t.Stdout, t.Stderr} {
			if o.InGridFS() {
				files = append(files, o.FileID)
			}
		}
		res.Tasks = append(res.Tasks, sum)
	}
	if !res.More {
		res.Last = bson.ObjectID{}
	}
	if len(files) == 0 {
		return res, nil
	}
	lengths, err := s.fileLengths(ctx, files)
	if err != nil {
		return TaskSearchResult{}, fmt.Errorf("search tasks: %w", err)
	}
	for i := range res.Tasks {
		t := &res.Tasks[i]
		if t.Stdout.InGridFS() {
			t.StdoutBytes = lengths[t.Stdout.FileID]
		}
		if t.Stderr.InGridFS() {
			t.StderrBytes = lengths[t.Stderr.FileID]
		}
	}
	return res, nil
}

// fileLengths reads the length of GridFS files; a missing file gets -1.
func (s *Store) fileLengths(ctx context.Context, ids []bson.ObjectID) (map[bson.ObjectID]int64, error) {
	out := make(map[bson.ObjectID]int64, len(ids))
	for _, id := range ids {
		out[id] = -1
	}
	cur, err := s.files.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}},
		options.Find().SetProjection(bson.D{{Key: "length", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("read GridFS file lengths: %w", err)
	}
	docs, err := readAll(ctx, cur)
	if err != nil {
		return nil, fmt.Errorf("read GridFS file lengths: %w", err)
	}
	for _, d := range docs {
		id, ok := d.Lookup("_id").ObjectIDOK()
		if !ok {
			continue
		}
		if n, ok := d.Lookup("length").AsInt64OK(); ok {
			out[id] = n
		}
	}
	return out, nil
}

func taskSearchFilter(p TaskSearchParams) (bson.D, error) {
	// The bounds on _id keep to ObjectIds (MongoDB compares within a type)
	// and let the _id index serve the sort.
	var idCond bson.D
	switch {
	case !p.After.IsZero() && p.Descending:
		idCond = bson.D{{Key: "$lt", Value: p.After}}
	case !p.After.IsZero():
		idCond = bson.D{{Key: "$gt", Value: p.After}}
	default:
		idCond = bson.D{{Key: "$gte", Value: bson.ObjectID{}}, {Key: "$lte", Value: maxObjectID}}
	}
	if p.IDs != nil {
		idCond = append(idCond, bson.E{Key: "$in", Value: p.IDs})
	}
	filter := bson.D{{Key: "_id", Value: idCond}}
	if p.Queue != nil {
		filter = append(filter, bson.E{Key: schema.TaskQueue, Value: *p.Queue})
	}
	if len(p.Statuses) > 0 {
		in := make(bson.A, len(p.Statuses))
		for i, st := range p.Statuses {
			in[i] = int32(st)
		}
		filter = append(filter, bson.E{Key: schema.TaskStatus, Value: bson.D{{Key: "$in", Value: in}}})
	}
	if p.Reason != "" {
		filter = append(filter, bson.E{Key: schema.TaskReason, Value: p.Reason})
	}
	if p.Node != "" {
		filter = append(filter, bson.E{Key: schema.TaskNode, Value: p.Node})
	}
	var ctime bson.D
	if !p.CreatedAfter.IsZero() {
		ctime = append(ctime, bson.E{Key: "$gt", Value: p.CreatedAfter})
	}
	if !p.CreatedBefore.IsZero() {
		ctime = append(ctime, bson.E{Key: "$lt", Value: p.CreatedBefore})
	}
	if ctime != nil {
		filter = append(filter, bson.E{Key: schema.TaskCTime, Value: ctime})
	}
	var and bson.A
	for _, m := range p.Params {
		if err := m.Validate(); err != nil {
			return nil, fmt.Errorf("search tasks: %w", err)
		}
		in := bson.D{{Key: "$in", Value: m.Values}}
		and = append(and, bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: schema.TaskParameters + "." + m.Path, Value: in}},
			bson.D{{Key: schema.TaskParams + "." + m.Path, Value: in}},
		}}})
	}
	if and != nil {
		filter = append(filter, bson.E{Key: "$and", Value: and})
	}
	return filter, nil
}

var maxObjectID = bson.ObjectID{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// errNoOutputField is returned for an output name other than stdout and
// stderr.
var errNoOutputField = errors.New("output must be stdout or stderr")
