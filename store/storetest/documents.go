package storetest

import (
	"crypto/md5"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// The store's side of the Disbatch 4.103 HTTP routes.

func testQueueCreateConcurrentOneWins(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx, schema.CollQueues), "the queues' indexes only, as disbatch-web makes them")
	keys, err := s.TaskIndexKeys(ctx)
	require.NoError(t, err)
	require.Empty(t, keys, "no index of tasks was made")
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.QueueCreate(ctx, store.QueueCreateParams{Name: "same", Constructor: "Disbatch::Plugin::Demo"})
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
	docs, err := s.QueueDocs(ctx)
	require.NoError(t, err)
	require.Len(t, docs, 1)
}

func testIndexesEnsureBesideDuplicateNames(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	_, err := db.Collection(schema.CollQueues).InsertMany(ctx, []any{bson.D{{Key: "name", Value: "twice"}}, bson.D{{Key: "name", Value: "twice"}}})
	require.NoError(t, err)
	err = s.IndexesEnsure(ctx)
	var ue *store.UniquenessError
	require.ErrorAs(t, err, &ue, "duplicate names leave the name index out, and say so")
	require.Len(t, ue.Indexes, 1)
	require.Equal(t, schema.CollQueues, ue.Indexes[0].Collection)
	require.ErrorContains(t, err, "duplicate queue names")
	want, err := bson.Marshal(bson.D{{Key: "name", Value: 1}})
	require.NoError(t, err)
	_, ok := indexKeys(t, db, schema.CollQueues)[bson.Raw(want).String()]
	require.False(t, ok, "no name_1 without uniqueness: Disbatch 4.103's ensure_indexes would die on it")
	// The other indexes are there: a node works.
	_, ok = indexKeys(t, db, schema.CollNodes)[mustKey(t, bson.D{{Key: "node", Value: 1}})]
	require.True(t, ok, "the other indexes are made")
	// Once the duplicate is gone, the next start makes it, unique.
	_, err = db.Collection(schema.CollQueues).DeleteOne(ctx, bson.D{{Key: "name", Value: "twice"}})
	require.NoError(t, err)
	require.NoError(t, s.IndexesEnsure(ctx))
	spec, ok := indexKeys(t, db, schema.CollQueues)[bson.Raw(want).String()]
	require.True(t, ok)
	unique, _ := spec.Lookup("unique").BooleanOK()
	require.True(t, unique)
	require.Equal(t, "name_1", spec.Lookup("name").StringValue(), "the name 4.103 gives it")
}

func mustKey(t *testing.T, keys bson.D) string {
	t.Helper()
	b, err := bson.Marshal(keys)
	require.NoError(t, err)
	return bson.Raw(b).String()
}

func testDocumentsByRef(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx))
	q := newQueue(t, s, "refs", schema.SortFIFO)
	other := newQueue(t, s, "other", schema.SortFIFO)

	id, err := s.QueueResolve(ctx, "refs")
	require.NoError(t, err)
	require.Equal(t, q.ID, id)
	id, err = s.QueueResolve(ctx, q.ID.Hex())
	require.NoError(t, err)
	require.Equal(t, q.ID, id)
	_, err = s.QueueResolve(ctx, bson.NewObjectID().Hex())
	require.ErrorIs(t, err, store.ErrNotFound, "a hex id that matches nothing is not tried as a name")

	// QueueSet: both dialects, counts, a taken name.
	w, err := s.QueueSet(ctx, store.QueueSetParams{Ref: "refs", Threads: ptr(3), Plugin: ptr("P")})
	require.NoError(t, err)
	require.Equal(t, store.WriteCounts{Matched: 1, Modified: 1}, w)
	got, err := s.QueueGet(ctx, store.QueueGetParams{Ref: q.ID.Hex()})
	require.NoError(t, err)
	require.Equal(t, 3, *got.MaxThreads)
	require.Equal(t, "P", got.Constructor)
	require.Equal(t, int32(3), got.Raw.Lookup(schema.QueueThreads).Int32())
	require.Equal(t, "P", got.Raw.Lookup(schema.QueuePlugin).StringValue())
	w, err = s.QueueSet(ctx, store.QueueSetParams{Ref: q.ID.Hex(), Threads: ptr(3)})
	require.NoError(t, err)
	require.Equal(t, store.WriteCounts{Matched: 1, Modified: 0}, w)
	w, err = s.QueueSet(ctx, store.QueueSetParams{Ref: "nope", Threads: ptr(3)})
	require.NoError(t, err)
	require.Equal(t, store.WriteCounts{}, w)
	_, err = s.QueueSet(ctx, store.QueueSetParams{Ref: "refs", Name: ptr("other")})
	require.ErrorIs(t, err, store.ErrQueueExists)
	_, err = s.QueueSet(ctx, store.QueueSetParams{Ref: "refs", Name: ptr("refs")})
	require.NoError(t, err, "keeping one's own name is no clash")

	// Running counts read only claimed and running tasks.
	ids := insertTasks(t, s, q.ID, 4)
	insertTasks(t, s, other.ID, 1)
	_, err = db.Collection(schema.CollTasks).UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[0]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -1}}}})
	require.NoError(t, err)
	_, err = db.Collection(schema.CollTasks).UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[1]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 0}}}})
	require.NoError(t, err)
	_, err = db.Collection(schema.CollTasks).UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[2]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 1}}}})
	require.NoError(t, err)
	running, err := s.TaskRunningCounts(ctx)
	require.NoError(t, err)
	require.Equal(t, map[bson.ObjectID]int64{q.ID: 2}, running)
	queued, run, done, err := s.QueueStatusCounts(ctx, q.ID)
	require.NoError(t, err)
	require.Equal(t, [3]int64{1, 2, 1}, [3]int64{queued, run, done})

	// TaskFind and TaskCount take the caller's filter, projection, skip, limit.
	docs, err := s.TaskFind(ctx, store.TaskFindParams{Filter: bson.D{{Key: "queue", Value: q.ID}}, Projection: bson.D{{Key: "status", Value: 1}},
		Sort: bson.D{{Key: "_id", Value: 1}}, Skip: 1, Limit: 2})
	require.NoError(t, err)
	require.Len(t, docs, 2)
	require.Equal(t, ids[1], docs[0].Lookup("_id").ObjectID())
	_, hasQueue := docs[0].Lookup("queue").ObjectIDOK()
	require.False(t, hasQueue, "projected away")
	n, err := s.TaskCount(ctx, bson.D{{Key: "queue", Value: q.ID}}, 0, 0)
	require.NoError(t, err)
	require.Equal(t, int64(4), n)
	keys, err := s.TaskIndexKeys(ctx)
	require.NoError(t, err)
	require.Contains(t, keys, store.TaskIndex{Name: "_id_", Keys: []string{"_id"}})
	require.Contains(t, keys, store.TaskIndex{Name: "queue_1_status_1", Keys: []string{"queue", "status"}})

	// The 4.103 task shape.
	p, err := bson.Marshal(bson.D{{Key: "a", Value: 1}})
	require.NoError(t, err)
	perl, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{p}, Dialect4103: true})
	require.NoError(t, err)
	raw := rawDoc(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: perl[0]}})
	require.Equal(t, bson.TypeNull, raw.Lookup("node").Type)
	require.Equal(t, int32(1), raw.Lookup("params", "a").Int32())
	_, err = raw.LookupErr("parameters")
	require.Error(t, err)

	// Documents of another collection, bounded.
	_, err = db.Collection("users").InsertMany(ctx, []any{bson.D{{Key: "u", Value: 1}, {Key: "x", Value: "a"}}, bson.D{{Key: "u", Value: 2}, {Key: "x", Value: "b"}}})
	require.NoError(t, err)
	us, err := s.DocumentsFind(ctx, store.DocumentsFindParams{Collection: "users", Filter: bson.D{}, Projection: bson.D{{Key: "x", Value: 1}}, Limit: 2})
	require.NoError(t, err)
	require.Len(t, us, 2)
	_, err = s.DocumentsFind(ctx, store.DocumentsFindParams{Collection: "users", Limit: 1})
	require.ErrorIs(t, err, store.ErrTooMany)

	// Delete only the queue document.
	w, err = s.QueueDocDelete(ctx, "refs")
	require.NoError(t, err)
	require.Equal(t, int64(1), w.Deleted)
	n, err = s.TaskCount(ctx, bson.D{{Key: "queue", Value: q.ID}}, 0, 0)
	require.NoError(t, err)
	require.Equal(t, int64(5), n, "the tasks stay")
	w, err = s.QueueDocDelete(ctx, "refs")
	require.NoError(t, err)
	require.Equal(t, int64(0), w.Deleted)
}

func testNodeDocsAndBalance(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	for _, name := range []string{"b", "a"} {
		_, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: name})
		require.NoError(t, err)
	}
	docs, err := s.NodeDocs(ctx)
	require.NoError(t, err)
	require.Len(t, docs, 2)
	require.Equal(t, "a", docs[0].Lookup("node").StringValue())
	a, err := s.NodeDoc(ctx, "a")
	require.NoError(t, err)
	byID, err := s.NodeDoc(ctx, a.Lookup("_id").ObjectID().Hex())
	require.NoError(t, err)
	require.Equal(t, a, byID)
	_, err = s.NodeDoc(ctx, "zz")
	require.ErrorIs(t, err, store.ErrNotFound)
	w, err := s.NodeMaxThreadsSet(ctx, store.NodeMaxThreadsSetParams{Ref: "a", MaxThreads: ptr(5)})
	require.NoError(t, err)
	require.Equal(t, store.WriteCounts{Matched: 1, Modified: 1}, w)
	w, err = s.NodeMaxThreadsSet(ctx, store.NodeMaxThreadsSetParams{Ref: "zz", MaxThreads: ptr(5)})
	require.NoError(t, err)
	require.Equal(t, store.WriteCounts{}, w, "no upsert")
	n, err := s.NodeGet(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, 5, *n.MaxThreads)

	b, err := s.BalanceGet(ctx)
	require.NoError(t, err)
	require.Nil(t, b)
	require.NoError(t, s.BalanceSet(ctx, bson.D{{Key: "queues", Value: bson.A{bson.A{"x"}}}}))
	require.NoError(t, s.BalanceSet(ctx, bson.D{{Key: "disabled", Value: 0}}))
	b, err = s.BalanceGet(ctx)
	require.NoError(t, err)
	require.Equal(t, `[["x"]]`, b.Lookup("queues").String())
	_, err = b.LookupErr("disabled")
	require.NoError(t, err)

	now, err := s.ServerNow(ctx)
	require.NoError(t, err)
	require.False(t, now.IsZero())
}

func testTaskRunningCountsReadsTheIndexOnly(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx))
	var plan bson.Raw
	require.NoError(t, db.RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{
		{Key: "aggregate", Value: "tasks"},
		{Key: "pipeline", Value: bson.A{
			bson.D{{Key: "$match", Value: bson.D{{Key: "status", Value: bson.D{{Key: "$in", Value: bson.A{-1, 0}}}}}}},
			bson.D{{Key: "$project", Value: bson.D{{Key: "_id", Value: 0}, {Key: "queue", Value: 1}}}},
			bson.D{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$queue"}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}},
		}},
		{Key: "cursor", Value: bson.D{}},
	}}}).Decode(&plan))
	require.Contains(t, plan.String(), "status_1_mtime_1_queue_1")
	require.NotContains(t, plan.String(), "FETCH", "covered by the index: no document is read")
}

func testReportInsert(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	id := bson.NewObjectID()
	require.NoError(t, s.ReportInsert(ctx, bson.D{{Key: "task_id", Value: id}, {Key: "status", Value: "SUCCESS"}, {Key: "counter", Value: nil}}))
	var got bson.M
	require.NoError(t, db.Collection(schema.CollReports).FindOne(ctx, bson.D{{Key: "task_id", Value: id}}).Decode(&got))
	require.Equal(t, "SUCCESS", got["status"])
	require.Contains(t, got, "counter", "a null counter is kept, as 4.103's Demo writes it")
	require.Nil(t, got["counter"])
}

// testOutputAlways: with OutputAlways every output goes to GridFS, as
// Disbatch 4.103 writes it with gfs set to anything but "auto" or false.
func testOutputAlways(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{OutputThreshold: store.OutputAlways})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 1)
	task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.NoError(t, s.TaskStart(ctx, store.TaskTransitionParams{ID: task.ID, Node: "n1"}))
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: schema.StatusSucceeded, Stdout: "hi\n"}))
	raw, err := db.Collection(schema.CollTasks).FindOne(ctx, bson.D{{Key: "_id", Value: task.ID}}).Raw()
	require.NoError(t, err)
	require.Equal(t, bson.TypeObjectID, raw.Lookup(schema.TaskStdout).Type, "a 3-byte stdout in GridFS")
	require.Equal(t, bson.TypeObjectID, raw.Lookup(schema.TaskStderr).Type, "an empty stderr too, as a file without chunks")
	require.True(t, raw.Lookup(schema.TaskComplete).Boolean(), "complete: true, as 4.103's task_runner writes it")
	file, err := db.Collection(schema.CollTasksFiles).FindOne(ctx, bson.D{{Key: "_id", Value: raw.Lookup(schema.TaskStdout).ObjectID()}}).Raw()
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%x", md5.Sum([]byte("hi\n"))), file.Lookup("md5").StringValue())
	require.Equal(t, "stdout", file.Lookup("filename").StringValue())
	require.Equal(t, task.ID, file.Lookup("metadata", "task_id").ObjectID())
	// A retry makes it incomplete again.
	_, err = s.TaskRetry(ctx, store.TaskRetryParams{Target: store.TaskTarget{IDs: []bson.ObjectID{task.ID}}, By: "op"})
	require.NoError(t, err)
	raw, err = db.Collection(schema.CollTasks).FindOne(ctx, bson.D{{Key: "_id", Value: task.ID}}).Raw()
	require.NoError(t, err)
	_, err = raw.LookupErr(schema.TaskComplete)
	require.Error(t, err, "a retried task is not complete")
	out, err := s.TaskOutputOpen(ctx, store.TaskOutputOpenParams{ID: task.ID, Name: schema.TaskStdout})
	require.NoError(t, err)
	defer out.Close()
	b, err := io.ReadAll(out)
	require.NoError(t, err)
	require.Equal(t, "hi\n", string(b))
}

// testNodesDeadRecoverForeign: a silent Disbatch 4.103 node (a document of
// node and timestamp only) gets its claimed tasks requeued, but its
// running ones are left to its task_runners (they outlive their
// disbatchd, and drop their result if the task changed), and its document
// is not marked dead (it rewrites the whole document, keeping the mark).
func testNodesDeadRecoverForeign(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 4)
	_, err := db.Collection(schema.CollNodes).InsertOne(ctx, bson.D{{Key: "node", Value: "perl-host"}, {Key: "timestamp", Value: time.Now().Add(-time.Hour)}})
	require.NoError(t, err)
	for i, id := range ids {
		_, err := db.Collection(schema.CollTasks).UpdateOne(ctx, bson.D{{Key: "_id", Value: id}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "node", Value: "perl-host"}, {Key: "status", Value: -(i % 2)}}}})
		require.NoError(t, err)
	}
	dead, err := s.NodesDeadRecover(ctx, store.NodesDeadRecoverParams{DeadAfter: time.Minute, By: "go-1"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.True(t, dead[0].Foreign)
	require.Equal(t, "perl-host", dead[0].Node)
	require.EqualValues(t, 2, dead[0].Requeued)
	require.EqualValues(t, 2, dead[0].LeftRunning)
	for i, id := range ids {
		raw, err := db.Collection(schema.CollTasks).FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Raw()
		require.NoError(t, err)
		if i%2 == 0 {
			require.EqualValues(t, 0, raw.Lookup("status").AsInt64(), "running: left to its task_runner")
			require.Equal(t, "perl-host", raw.Lookup("node").StringValue())
		} else {
			require.EqualValues(t, -2, raw.Lookup("status").AsInt64(), "claimed, never started: queued again")
		}
	}
	raw, err := db.Collection(schema.CollNodes).FindOne(ctx, bson.D{{Key: "node", Value: "perl-host"}}).Raw()
	require.NoError(t, err)
	_, err = raw.LookupErr("dead")
	require.Error(t, err, "not marked dead")
	dead, err = s.NodesDeadRecover(ctx, store.NodesDeadRecoverParams{DeadAfter: time.Minute, By: "go-1"})
	require.NoError(t, err)
	require.Empty(t, dead, "nothing more to requeue: nothing reported")
}
