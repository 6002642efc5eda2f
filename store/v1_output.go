package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// ErrOutputMissing is returned when a task's output names a GridFS file
// that is not there. It is also an ErrNotFound.
var ErrOutputMissing = fmt.Errorf("output file missing from GridFS: %w", ErrNotFound)

// TaskOutputOpenParams name one output of one task.
type TaskOutputOpenParams struct {
	ID bson.ObjectID
	// Name is schema.TaskStdout or schema.TaskStderr.
	Name string
}

// TaskOutput is a task's stdout or stderr, read as a stream. Close it.
type TaskOutput struct {
	// Set is false when the output is null or missing (the task has not
	// finished): then Size is 0 and Read returns io.EOF.
	Set bool
	// InGridFS says the output is a GridFS file, read chunk by chunk.
	InGridFS bool
	// Size is the output's length in bytes.
	Size int64

	r io.Reader
	c *mongo.Cursor
	// For GridFS: the context of the reads, the file, the next chunk
	// expected and the bytes still to come.
	ctx  context.Context
	file bson.ObjectID
	n    int32
	left int64
}

// TaskOutputOpen opens one output of a task for reading: inline text from
// the task document, or a GridFS file (tasks.files, tasks.chunks) read a
// few chunks at a time, so that a large output is never held in memory.
// Only the named output field of the task is read. ErrNotFound when the
// task does not exist, ErrOutputMissing when its GridFS file does not.
// Reads use ctx.
func (s *Store) TaskOutputOpen(ctx context.Context, p TaskOutputOpenParams) (*TaskOutput, error) {
	if p.Name != schema.TaskStdout && p.Name != schema.TaskStderr {
		return nil, fmt.Errorf("open output %q of task %s: %w", p.Name, p.ID.Hex(), errNoOutputField)
	}
	raw, err := s.tasks.FindOne(ctx, bson.D{{Key: "_id", Value: p.ID}}, options.FindOne().SetProjection(bson.D{{Key: p.Name, Value: 1}})).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("task %s: %w", p.ID.Hex(), ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s of task %s: %w", p.Name, p.ID.Hex(), err)
	}
	v, err := raw.LookupErr(p.Name)
	switch {
	case err != nil, v.Type == bson.TypeNull, v.Type == bson.TypeUndefined:
		return &TaskOutput{r: strings.NewReader("")}, nil
	case v.Type == bson.TypeString:
		text := v.StringValue()
		return &TaskOutput{Set: true, Size: int64(len(text)), r: strings.NewReader(text)}, nil
	case v.Type != bson.TypeObjectID:
		return nil, &schema.DecodeError{Collection: schema.CollTasks, ID: `ObjectId("` + p.ID.Hex() + `")`, Field: p.Name,
			Err: fmt.Errorf("want a string, a GridFS ObjectId or null, got %s", schema.Describe(v))}
	}
	file := v.ObjectID()
	fraw, err := s.files.FindOne(ctx, bson.D{{Key: "_id", Value: file}}, options.FindOne().SetProjection(bson.D{{Key: "length", Value: 1}})).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("%s of task %s, GridFS file %s: %w", p.Name, p.ID.Hex(), file.Hex(), ErrOutputMissing)
	}
	if err != nil {
		return nil, fmt.Errorf("read GridFS file %s: %w", file.Hex(), err)
	}
	size, ok := fraw.Lookup("length").AsInt64OK()
	if !ok || size < 0 {
		return nil, fmt.Errorf("GridFS file %s: length is %s, want a non-negative integer", file.Hex(), schema.Describe(fraw.Lookup("length")))
	}
	cur, err := s.chunks.Find(ctx, bson.D{{Key: "files_id", Value: file}},
		options.Find().SetSort(bson.D{{Key: "n", Value: 1}}).SetBatchSize(4))
	if err != nil {
		return nil, fmt.Errorf("read GridFS file %s: %w", file.Hex(), err)
	}
	return &TaskOutput{Set: true, InGridFS: true, Size: size, c: cur, ctx: ctx, file: file, left: size, r: strings.NewReader("")}, nil
}

// Read reads the output. A GridFS file whose chunks are missing, out of
// order or do not add up to its length gives an error, never a silently
// short output.
func (o *TaskOutput) Read(b []byte) (int, error) {
	for {
		n, err := o.r.Read(b)
		if n > 0 || err != io.EOF || o.c == nil {
			return n, err
		}
		if err := o.nextChunk(); err != nil {
			return 0, err
		}
	}
}

func (o *TaskOutput) nextChunk() error {
	if !o.c.Next(o.ctx) {
		if err := o.c.Err(); err != nil {
			return fmt.Errorf("read GridFS file %s: %w", o.file.Hex(), err)
		}
		if o.left != 0 {
			return fmt.Errorf("GridFS file %s: chunk %d missing (%d bytes short)", o.file.Hex(), o.n, o.left)
		}
		o.c.Close(o.ctx)
		o.c = nil
		return nil
	}
	n, _ := o.c.Current.Lookup("n").AsInt64OK()
	if n != int64(o.n) {
		return fmt.Errorf("GridFS file %s: chunk %d missing", o.file.Hex(), o.n)
	}
	var size int64
	switch d := o.c.Current.Lookup("data"); d.Type {
	case bson.TypeString:
		text := d.StringValue()
		size, o.r = int64(len(text)), strings.NewReader(text)
	case bson.TypeBinary:
		_, bin := d.Binary()
		size, o.r = int64(len(bin)), bytes.NewReader(bytes.Clone(bin))
	default:
		return fmt.Errorf("GridFS file %s: chunk %d: data is %s, want a string or binary", o.file.Hex(), n, d.Type)
	}
	if size > o.left {
		return fmt.Errorf("GridFS file %s: chunks hold more than its length %d", o.file.Hex(), o.Size)
	}
	o.left -= size
	o.n++
	return nil
}

// Close releases the cursor of a GridFS file.
func (o *TaskOutput) Close() error {
	if o.c == nil {
		return nil
	}
	err := o.c.Close(context.WithoutCancel(o.ctx))
	o.c = nil
	return err
}
