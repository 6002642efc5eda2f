package storetest

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// The store's side of the v1 JSON API (web/apiv1).

func testTaskSearch(t *testing.T, newStore Factory) {
	var mu sync.Mutex
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func() { mu.Lock(); defer mu.Unlock(); now = now.Add(time.Hour) }
	s, db := newStore(t, store.Options{Now: clock, OutputThreshold: 64 << 10})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	other := newQueue(t, s, "other", schema.SortFIFO)

	doc := func(d bson.D) bson.Raw {
		b, err := bson.Marshal(d)
		require.NoError(t, err)
		return b
	}
	seed, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{
		doc(bson.D{{Key: "user", Value: "alice"}, {Key: "n", Value: int32(5)}}),
		doc(bson.D{{Key: "user", Value: "bob"}, {Key: "n", Value: 5.0}, {Key: "deep", Value: bson.D{{Key: "k", Value: true}}}}),
	}})
	require.NoError(t, err)
	advance()
	perl, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Dialect4103: true, Parameters: []bson.Raw{
		doc(bson.D{{Key: "user", Value: "alice"}, {Key: "n", Value: "5"}}),
	}})
	require.NoError(t, err)
	advance()
	insertTasks(t, s, other.ID, 2)
	// Finished with inline output, then one with stdout in GridFS.
	done := finishWith(t, s, q.ID, "out", "")
	require.Equal(t, seed[0], done.ID)
	big := strings.Repeat("é", 40<<10) // 80 KiB
	gfs := finishWith(t, s, q.ID, big, "err")
	require.Equal(t, seed[1], gfs.ID)
	require.True(t, gfs.Stdout.InGridFS())
	// Documents other tools may leave: one malformed, one with a string _id.
	bad := bson.NewObjectID()
	_, err = db.Collection(schema.CollTasks).InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: bad}, {Key: "queue", Value: q.ID}, {Key: "status", Value: "weird"}},
		bson.D{{Key: "_id", Value: "by-hand"}, {Key: "queue", Value: q.ID}, {Key: "status", Value: -2}},
	})
	require.NoError(t, err)

	search := func(p store.TaskSearchParams) store.TaskSearchResult {
		t.Helper()
		if p.Limit == 0 {
			p.Limit = 100
		}
		res, err := s.TaskSearch(ctx, p)
		require.NoError(t, err)
		return res
	}
	ids := func(res store.TaskSearchResult) []bson.ObjectID {
		out := []bson.ObjectID{}
		for _, t := range res.Tasks {
			out = append(out, t.ID)
		}
		return out
	}

	all := search(store.TaskSearchParams{Queue: &q.ID})
	require.Equal(t, []bson.ObjectID{seed[0], seed[1], perl[0]}, ids(all), "in _id order; the string _id is never found")
	require.Len(t, all.Malformed, 1)
	require.False(t, all.More)
	require.True(t, all.Last.IsZero())

	// Output sizes, never the text.
	byID := map[bson.ObjectID]store.TaskSummary{}
	for _, t := range all.Tasks {
		byID[t.ID] = t
	}
	require.Equal(t, schema.Output{Set: true}, byID[seed[0]].Stdout)
	require.EqualValues(t, 3, byID[seed[0]].StdoutBytes)
	require.EqualValues(t, 0, byID[seed[0]].StderrBytes)
	require.True(t, byID[seed[1]].Stdout.InGridFS())
	require.EqualValues(t, len(big), byID[seed[1]].StdoutBytes)
	require.EqualValues(t, 3, byID[seed[1]].StderrBytes)
	require.False(t, byID[perl[0]].Stdout.Set)
	require.EqualValues(t, -1, byID[perl[0]].StdoutBytes)
	require.Equal(t, "alice", byID[perl[0]].Parameters.Lookup("user").StringValue())

	// Filters.
	require.Equal(t, []bson.ObjectID{perl[0]}, ids(search(store.TaskSearchParams{Queue: &q.ID, Statuses: []schema.Status{schema.StatusQueued}})))
	require.Equal(t, []bson.ObjectID{seed[0], seed[1]}, ids(search(store.TaskSearchParams{Statuses: []schema.Status{schema.StatusFailed, schema.StatusSucceeded}})))
	require.Equal(t, []bson.ObjectID{seed[0], seed[1]}, ids(search(store.TaskSearchParams{Node: "n1"})))
	require.Empty(t, ids(search(store.TaskSearchParams{Node: "n2"})))
	require.Equal(t, []bson.ObjectID{perl[0]}, ids(search(store.TaskSearchParams{
		CreatedAfter: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), CreatedBefore: time.Date(2026, 3, 1, 13, 30, 0, 0, time.UTC)})),
		"both bounds exclusive")
	require.Equal(t, []bson.ObjectID{seed[0], perl[0]}, ids(search(store.TaskSearchParams{Params: []store.ParamMatch{{Path: "user", Values: []any{"alice"}}}})),
		"parameters and params both match")
	require.Equal(t, []bson.ObjectID{seed[0], seed[1], perl[0]}, ids(search(store.TaskSearchParams{Params: []store.ParamMatch{{Path: "n", Values: []any{"5", int64(5)}}}})),
		"numbers match across BSON types")
	require.Equal(t, []bson.ObjectID{seed[1]}, ids(search(store.TaskSearchParams{Params: []store.ParamMatch{{Path: "deep.k", Values: []any{"true", true}}, {Path: "n", Values: []any{5.0}}}})))
	require.Equal(t, []bson.ObjectID{perl[0]}, ids(search(store.TaskSearchParams{IDs: []bson.ObjectID{perl[0], bson.NewObjectID()}})))
	require.Len(t, search(store.TaskSearchParams{IDs: []bson.ObjectID{bad}}).Malformed, 1)

	// Pages: the cursor is the last _id scanned, malformed ones included.
	p1 := search(store.TaskSearchParams{Queue: &q.ID, Limit: 2})
	require.Equal(t, []bson.ObjectID{seed[0], seed[1]}, ids(p1))
	require.True(t, p1.More)
	require.Equal(t, seed[1], p1.Last)
	p2 := search(store.TaskSearchParams{Queue: &q.ID, Limit: 2, After: p1.Last})
	require.Equal(t, []bson.ObjectID{perl[0]}, ids(p2))
	require.Len(t, p2.Malformed, 1)
	require.False(t, p2.More)
	d1 := search(store.TaskSearchParams{Queue: &q.ID, Limit: 1, Descending: true})
	require.Empty(t, d1.Tasks, "newest first: the malformed one")
	require.Len(t, d1.Malformed, 1)
	require.True(t, d1.More)
	require.Equal(t, bad, d1.Last)
	d2 := search(store.TaskSearchParams{Queue: &q.ID, Limit: 5, Descending: true, After: d1.Last})
	require.Equal(t, []bson.ObjectID{perl[0], seed[1], seed[0]}, ids(d2))

	// A GridFS file that is gone: size -1.
	_, err = db.Collection(schema.CollTasksFiles).DeleteOne(ctx, bson.D{{Key: "_id", Value: gfs.Stdout.FileID}})
	require.NoError(t, err)
	gone := search(store.TaskSearchParams{IDs: []bson.ObjectID{seed[1]}})
	require.EqualValues(t, -1, gone.Tasks[0].StdoutBytes)

	_, err = s.TaskSearch(ctx, store.TaskSearchParams{Limit: 0})
	require.ErrorContains(t, err, "limit")
	_, err = s.TaskSearch(ctx, store.TaskSearchParams{Limit: 1, Params: []store.ParamMatch{{Path: "a.$where", Values: []any{"x"}}}})
	require.ErrorContains(t, err, "'$'")
	_, err = s.TaskSearch(ctx, store.TaskSearchParams{Limit: 1, Params: []store.ParamMatch{{Path: "a..b", Values: []any{"x"}}}})
	require.ErrorContains(t, err, "none empty")
}

func testTaskOutputOpen(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{OutputThreshold: 64 << 10})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 3)
	read := func(id bson.ObjectID, name string) (*store.TaskOutput, string) {
		t.Helper()
		o, err := s.TaskOutputOpen(ctx, store.TaskOutputOpenParams{ID: id, Name: name})
		require.NoError(t, err)
		b, err := io.ReadAll(o)
		require.NoError(t, err)
		require.NoError(t, o.Close())
		require.EqualValues(t, len(b), o.Size)
		return o, string(b)
	}

	o, text := read(ids[0], schema.TaskStdout)
	require.False(t, o.Set, "not finished: null")
	require.Empty(t, text)

	finishWith(t, s, q.ID, "inline out", "inline err")
	o, text = read(ids[0], schema.TaskStderr)
	require.True(t, o.Set)
	require.False(t, o.InGridFS)
	require.Equal(t, "inline err", text)

	big := strings.Repeat("ü€x", 200<<10) // 1.2 MiB: several chunks, runes across their edges
	gfs := finishWith(t, s, q.ID, big, "e")
	require.True(t, gfs.Stdout.InGridFS())
	o, text = read(ids[1], schema.TaskStdout)
	require.True(t, o.InGridFS)
	require.Equal(t, big, text)

	// Binary chunks (other GridFS writers), out of order on disk.
	fid := bson.NewObjectID()
	_, err := db.Collection(schema.CollTasksFiles).InsertOne(ctx, bson.D{{Key: "_id", Value: fid}, {Key: "length", Value: int64(11)}})
	require.NoError(t, err)
	_, err = db.Collection(schema.CollTasksChunks).InsertMany(ctx, []any{
		bson.D{{Key: "files_id", Value: fid}, {Key: "n", Value: 1}, {Key: "data", Value: bson.Binary{Data: []byte("world")}}},
		bson.D{{Key: "files_id", Value: fid}, {Key: "n", Value: 0}, {Key: "data", Value: "hello "}},
	})
	require.NoError(t, err)
	_, err = db.Collection(schema.CollTasks).UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[2]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "stderr", Value: fid}, {Key: "stdout", Value: 7}}}})
	require.NoError(t, err)
	_, text = read(ids[2], schema.TaskStderr)
	require.Equal(t, "hello world", text)

	// A chunk missing: an error, never a short output.
	_, err = db.Collection(schema.CollTasksChunks).DeleteOne(ctx, bson.D{{Key: "files_id", Value: fid}, {Key: "n", Value: 1}})
	require.NoError(t, err)
	o, err = s.TaskOutputOpen(ctx, store.TaskOutputOpenParams{ID: ids[2], Name: schema.TaskStderr})
	require.NoError(t, err)
	var buf bytes.Buffer
	_, err = io.Copy(&buf, o)
	require.ErrorContains(t, err, "chunk 1 missing")
	require.NoError(t, o.Close())

	_, err = s.TaskOutputOpen(ctx, store.TaskOutputOpenParams{ID: ids[2], Name: schema.TaskStdout})
	var de *schema.DecodeError
	require.ErrorAs(t, err, &de, "a number is no output")
	require.Equal(t, "stdout", de.Field)

	_, err = db.Collection(schema.CollTasksFiles).DeleteOne(ctx, bson.D{{Key: "_id", Value: fid}})
	require.NoError(t, err)
	_, err = s.TaskOutputOpen(ctx, store.TaskOutputOpenParams{ID: ids[2], Name: schema.TaskStderr})
	require.ErrorIs(t, err, store.ErrOutputMissing)
	require.ErrorIs(t, err, store.ErrNotFound)
	_, err = s.TaskOutputOpen(ctx, store.TaskOutputOpenParams{ID: bson.NewObjectID(), Name: schema.TaskStdout})
	require.ErrorIs(t, err, store.ErrNotFound)
	require.NotErrorIs(t, err, store.ErrOutputMissing)
	_, err = s.TaskOutputOpen(ctx, store.TaskOutputOpenParams{ID: ids[0], Name: "parameters"})
	require.ErrorContains(t, err, "stdout or stderr")
}

func testQueueModify(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx))
	id := bson.NewObjectID()
	_, err := db.Collection(schema.CollQueues).InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "name", Value: "q"}, {Key: "plugin", Value: "P"}, {Key: "threads", Value: 1}, {Key: "custom", Value: "keep me"}})
	require.NoError(t, err)
	newQueue(t, s, "other", "")

	q, err := s.QueueModify(ctx, store.QueueUpdateParams{ID: id, Name: ptr("renamed"), Constructor: ptr("C"), SetMaxThreads: true, MaxThreads: ptr(7),
		Sort: ptr(schema.SortLIFO), NodesPin: &[]string{"a"}, NodesIgnore: &[]string{"b", "c"}})
	require.NoError(t, err)
	require.Equal(t, "renamed", q.Name)
	require.Equal(t, "C", q.Constructor)
	require.Equal(t, 7, *q.MaxThreads)
	require.Equal(t, schema.SortLIFO, q.Sort)
	require.Equal(t, []string{"a"}, q.NodesPin)
	require.Equal(t, []string{"b", "c"}, q.NodesIgnore)
	require.Empty(t, q.Warnings, "both dialects in step")
	raw := rawDoc(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: id}})
	require.Equal(t, "keep me", raw.Lookup("custom").StringValue())
	require.Equal(t, "C", raw.Lookup("plugin").StringValue())
	require.EqualValues(t, 7, raw.Lookup("threads").AsInt64())

	q, err = s.QueueModify(ctx, store.QueueUpdateParams{ID: id, SetMaxThreads: true, NodesPin: &[]string{}, Sort: ptr(schema.Sort(""))})
	require.NoError(t, err)
	require.Nil(t, q.MaxThreads)
	require.Nil(t, q.NodesPin)
	require.Equal(t, schema.SortDefault, q.Sort)
	require.Equal(t, "renamed", q.Name, "fields not named stay")

	_, err = s.QueueModify(ctx, store.QueueUpdateParams{ID: id, Name: ptr("other")})
	require.ErrorIs(t, err, store.ErrQueueExists)
	_, err = s.QueueModify(ctx, store.QueueUpdateParams{ID: id, Name: ptr("renamed")})
	require.NoError(t, err, "a queue keeps its own name")
	_, err = s.QueueModify(ctx, store.QueueUpdateParams{ID: bson.NewObjectID(), Sort: ptr(schema.SortFIFO)})
	require.ErrorIs(t, err, store.ErrNotFound)
	for _, p := range []store.QueueUpdateParams{
		{ID: id},
		{ID: id, Name: ptr(" padded")},
		{ID: id, Constructor: ptr(" ")},
		{ID: id, SetMaxThreads: true, MaxThreads: ptr(-1)},
		{ID: id, Sort: ptr(schema.Sort("random"))},
	} {
		_, err = s.QueueModify(ctx, p)
		require.Error(t, err, "%+v", p)
		require.NotErrorIs(t, err, store.ErrNotFound)
	}

	// Concurrent renames of two queues to one free name: one wins.
	third := newQueue(t, s, "third", "")
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, qid := range []bson.ObjectID{id, third.ID} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.QueueModify(ctx, store.QueueUpdateParams{ID: qid, Name: ptr("contested")})
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
			continue
		}
		require.ErrorIs(t, err, store.ErrQueueExists)
	}
	require.Equal(t, 1, won)
}
