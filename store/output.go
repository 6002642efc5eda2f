package store

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// gridChunkSize is GridFS's customary chunk size, as Disbatch 4 uses.
const gridChunkSize = 255 * 1024

// outputWrite stores text as a GridFS file in tasks.files/tasks.chunks the
// way seed 000 and Disbatch 4 do: filename stdout or stderr,
// metadata.task_id, and chunk data stored as BSON strings (not BinData).
// Chunks are cut on UTF-8 boundaries so each is a valid string. The chunks
// are written before the files document, so a file is never visible half
// written.
func (s *Store) outputWrite(ctx context.Context, taskID bson.ObjectID, filename, text string) (bson.ObjectID, error) {
	text = validUTF8(text)
	id := bson.NewObjectID()
	var chunks []any
	for n, rest := 0, text; len(rest) > 0; n++ {
		cut := min(gridChunkSize, len(rest))
		for cut < len(rest) && !utf8.RuneStart(rest[cut]) {
			cut--
		}
		chunks = append(chunks, bson.D{{Key: "files_id", Value: id}, {Key: "n", Value: int32(n)}, {Key: "data", Value: rest[:cut]}})
		rest = rest[cut:]
		if len(chunks) == 32 || len(rest) == 0 {
			if _, err := s.chunks.InsertMany(ctx, chunks); err != nil {
				return id, fmt.Errorf("write %s of task %s to GridFS: %w", filename, taskID.Hex(), err)
			}
			chunks = chunks[:0]
		}
	}
	file := bson.D{
		{Key: "_id", Value: id},
		{Key: "filename", Value: filename},
		{Key: "chunkSize", Value: int32(gridChunkSize)},
		{Key: "length", Value: int64(len(text))},
		// As 4.103's put_gfs: readers that check it (its get_gfs does
		// not, older GridFS clients do) find it.
		{Key: "md5", Value: fmt.Sprintf("%x", md5.Sum([]byte(text)))},
		{Key: "uploadDate", Value: s.nowMS()},
		{Key: "metadata", Value: bson.D{{Key: "task_id", Value: taskID}}},
	}
	if _, err := s.files.InsertOne(ctx, file); err != nil {
		return id, fmt.Errorf("write %s of task %s to GridFS: %w", filename, taskID.Hex(), err)
	}
	return id, nil
}

// outputDelete removes the GridFS files matching filter and their chunks.
func (s *Store) outputDelete(ctx context.Context, filter bson.D) (int64, error) {
	var ids []any
	if err := s.files.Distinct(ctx, "_id", filter).Decode(&ids); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if _, err := s.chunks.DeleteMany(ctx, bson.D{{Key: "files_id", Value: bson.D{{Key: "$in", Value: ids}}}}); err != nil {
		return 0, err
	}
	res, err := s.files.DeleteMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		return 0, err
	}
	return res.DeletedCount, nil
}

// TaskOutputRead returns a task's stdout or stderr, reading GridFS when the
// output lives there. Chunk data may be a string (Disbatch 4) or binary
// (other GridFS writers).
func (s *Store) TaskOutputRead(ctx context.Context, o schema.Output) (string, error) {
	if !o.InGridFS() {
		return o.Text, nil
	}
	if err := s.files.FindOne(ctx, bson.D{{Key: "_id", Value: o.FileID}}).Err(); err != nil {
		if errors.Is(err, mongo.ErrNoDocuments) {
			return "", fmt.Errorf("GridFS file %s: %w", o.FileID.Hex(), ErrNotFound)
		}
		return "", fmt.Errorf("read GridFS file %s: %w", o.FileID.Hex(), err)
	}
	cur, err := s.chunks.Find(ctx, bson.D{{Key: "files_id", Value: o.FileID}}, options.Find().SetSort(bson.D{{Key: "n", Value: 1}}))
	if err != nil {
		return "", fmt.Errorf("read GridFS file %s: %w", o.FileID.Hex(), err)
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	var b strings.Builder
	for want := int32(0); r.Next(); want++ {
		n, _ := cur.Current.Lookup("n").AsInt64OK()
		if int32(n) != want {
			return "", fmt.Errorf("GridFS file %s: chunk %d missing", o.FileID.Hex(), want)
		}
		d := cur.Current.Lookup("data")
		switch d.Type {
		case bson.TypeString:
			b.WriteString(d.StringValue())
		case bson.TypeBinary:
			_, data := d.Binary()
			b.Write(data)
		default:
			return "", fmt.Errorf("GridFS file %s: chunk %d: data is %s, want a string or binary", o.FileID.Hex(), n, d.Type)
		}
	}
	return b.String(), r.Err()
}

// validUTF8 replaces invalid bytes: BSON strings must be UTF-8.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
