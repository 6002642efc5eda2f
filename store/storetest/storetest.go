// Package storetest is the conformance suite of the store seam: the
// behaviour every caller relies on, checked against a real MongoDB replica
// set. Run it from a test with a factory that returns a Store over a fresh,
// empty database.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// Factory returns a Store over a fresh database, that database (for raw
// writes the way other tools make them), and lets the test set store
// options.
type Factory func(t *testing.T, opts store.Options) (*store.Store, *mongo.Database)

// Run runs the whole suite.
func Run(t *testing.T, newStore Factory) {
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, Factory)
	}{
		{"IndexesEnsure", testIndexesEnsure},
		{"IndexesEnsureBesidePerlIndexes", testIndexesEnsureBesidePerl},
		{"QueueCreateGet", testQueueCreateGet},
		{"QueueCreateValidates", testQueueCreateValidates},
		{"QueueListReportsMalformed", testQueueListMalformed},
		{"QueueUpdateKeepsUnknownFields", testQueueUpdate},
		{"QueueDelete", testQueueDelete},
		{"QueueCountsGet", testQueueCounts},
		{"CountFailedRecountAndApply", testCountFailed},
		{"QueueRecountOfSomeQueues", testQueueRecountOfSomeQueues},
		{"QueueRecountReadsTheIndexAlone", testQueueRecountReadsTheIndexAlone},
		{"CountersAdvanceAsEachWould", testCountersAdvanceAsEachWould},
		{"CountersAdvanceComparesEachQueuesPosition", testCountersAdvance},
		{"TaskInsertManySeedShape", testTaskInsertMany},
		{"TaskInsertManyOwnControlsAtomic", testTaskInsertManyOwnControlsAtomic},
		{"TaskClaimOrder", testTaskClaimOrder},
		{"TaskClaimPriority", testTaskClaimPriority},
		{"TaskClaimPerlUnclaimed", testTaskClaimPerl},
		{"TaskClaimConcurrentOnce", testTaskClaimConcurrent},
		{"TaskClaimManyOrderAndGuard", testTaskClaimMany},
		{"TaskClaimManyConcurrentOnce", testTaskClaimManyConcurrent},
		{"TaskClaimManySpread", testTaskClaimManySpread},
		{"TaskClaimManyPrefer", testTaskClaimManyPrefer},
		{"TaskClaimSkipNullNode", testTaskClaimSkipNullNode},
		{"TaskClaimFrom", testTaskClaimFrom},
		{"TaskClaimManyPassesExpired", testTaskClaimManyPassesExpired},
		{"TaskClaimManyReadsCandidatesFromTheIndex", testTaskClaimManyCandidatesFromTheIndex},
		{"TaskClaimManyReadsInOneReplyEach", testTaskClaimManyOneReplyPerRead},
		{"TaskClaimManySpreadConcurrentOnce", testTaskClaimManySpreadConcurrent},
		{"TaskClaimCapped", testTaskClaimCapped},
		{"TaskClaimCappedCounts4103Claims", testTaskClaimCappedCounts4103Claims},
		{"TaskClaimCappedConcurrentNeverAboveTheCap", testTaskClaimCappedConcurrent},
		{"AdmissionsSweep", testAdmissionsSweep},
		{"NodeSessionsKillAbortsAnOpenTransaction", testNodeSessionsKillAbortsAnOpenTransaction},
		{"ForNodeRecordsItsSessions", testForNodeRecordsItsSessions},
		{"ThreadsMirrorsTheCap", testThreadsMirrorsTheCap},
		{"ContinuousCreateOnePerInterval", testContinuousCreate},
		{"ContinuousAtTheGivenMoment", testContinuousAtTheGivenMoment},
		{"ContinuousCreatedAfterTheCount", testContinuousCreatedAfterTheCount},
		{"ContinuousIntervalShortened", testContinuousIntervalShortened},
		{"ThenCreateExactlyOnce", testThenCreateExactlyOnce},
		{"ThenFollowsItsQueue", testThenFollowsItsQueue},
		{"TaskGuardedTransitions", testTaskGuarded},
		{"TaskStartFinishManyGuardEach", testTaskStartFinishMany},
		{"TaskFinishGuardedByAttempt", testTaskFinishGuardedByAttempt},
		{"TaskListClaimedAndUnstart", testTaskListClaimedUnstart},
		{"TaskClaimStraightIntoRunning", testTaskClaimStart},
		{"TaskFinishGridFS", testTaskFinishGridFS},
		{"TaskFinishTooLargeFallsBackToGridFS", testTaskFinishTooLarge},
		{"TaskFinishExtra", testTaskFinishExtra},
		{"TaskFinishManyAsOneWritesWhatEachWould", testTaskFinishManyAsOne},
		{"TaskFinishExtraMixedoutNeverTooLarge", testTaskFinishExtraTooLarge},
		{"TaskRetryDelayByServerClock", testTaskRetryDelayByServerClock},
		{"TaskFinishNearlyFullDocument", testTaskFinishNearlyFullDocument},
		{"TaskFinishOutputThatDoesNotFit", testTaskFinishOutputThatDoesNotFit},
		{"TaskOutputReadBinaryChunks", testTaskOutputBinary},
		{"TaskListFiltersAndMalformed", testTaskList},
		{"NodeUpsertKeepsOperatorFields", testNodeUpsert},
		{"NodeDrainAndList", testNodeDrainList},
		{"NodesDeadRecover", testNodesDeadRecover},
		{"NodesDeadRecoverStoppedLeavingTasks", testNodesDeadRecoverStoppedLeavingTasks},
		{"NodesDeadRecoverConcurrentOnce", testNodesDeadRecoverConcurrent},
		{"ConfigGet", testConfigGet},
		{"TaskFail", testTaskFail},
		{"TaskOrphanNodeAndStale", testTaskOrphan},
		{"StreamToken", testStreamToken},
		{"LeaseAcquireRenewRelease", testLeaseAcquireRenewRelease},
		{"LeaseAcquireConcurrentOneOwner", testLeaseAcquireConcurrentOneOwner},
		{"LeaseSession", testLeaseSession},
		{"LeaseAcquireEndsAnAbandonedTransaction", testLeaseAcquireEndsAnAbandonedTransaction},
		{"QueueCreateConcurrentOneWins", testQueueCreateConcurrentOneWins},
		{"IndexesEnsureBesideDuplicateNames", testIndexesEnsureBesideDuplicateNames},
		{"ReportInsert", testReportInsert},
		{"OutputAlways", testOutputAlways},
		{"NodesDeadRecoverForeign", testNodesDeadRecoverForeign},
		{"DocumentsByRef", testDocumentsByRef},
		{"TaskRunningCountsReadsTheIndexOnly", testTaskRunningCountsReadsTheIndexOnly},
		{"NodeDocsAndBalance", testNodeDocsAndBalance},
		{"StreamWakeups", testStreamWakeups},
		{"StreamCountersCarryPreImages", testStreamCountersCarryPreImages},
		{"StreamOwnWritesSayWhereTheTaskStood", testStreamOwnWritesSayWhereTheTaskStood},
		{"StreamEveryOwnTransitionSaysWhereTheTaskStood", testStreamEveryOwnTransitionSaysWhereTheTaskStood},
		{"TasksPreImagesSwitch", testTasksPreImagesSwitch},
		{"RecoveryWritesSurviveAMalformedTask", testRecoveryWritesSurviveAMalformedTask},
		{"StreamTransitions", testStreamTransitions},
		{"StreamCheckpointAndPositions", testStreamCheckpointAndPositions},
		{"StreamLostPositionFollowsThePresent", testStreamLostPositionFollowsThePresent},
		{"StreamBatches", testStreamBatches},
		{"StreamPaced", testStreamPaced},
		{"StreamDropDatabaseThenGoesOn", testStreamDropDatabaseThenGoesOn},
		{"StreamCloseKillsTheCursor", testStreamCloseKillsTheCursor},
		{"TaskSearch", testTaskSearch},
		{"TaskOutputOpen", testTaskOutputOpen},
		{"QueueModify", testQueueModify},
		{"TaskKill", testTaskKill},
		{"TaskCancel", testTaskCancel},
		{"TaskRetryByIDs", testTaskRetryByIDs},
		{"TaskRetryManyOrphans", testTaskRetryManyOrphans},
		{"TaskTimers", testTaskTimers},
		{"DeadNodeSettlesKillsAndRerunsOrphans", testDeadNodeSettlesKillsAndRerunsOrphans},
		{"TaskGraphInsert", testTaskGraphInsert},
		{"TaskGraphSettleWaitingReadAhead", testTaskGraphSettleWaitingReadAhead},
		{"TaskGraphUnblock", testTaskGraphUnblock},
		{"TaskGraphParentFailed", testTaskGraphParentFailed},
		{"TaskGraphRetryReblocks", testTaskGraphRetryReblocks},
		{"TaskGraphRetryWaitsWhateverThePaging", testTaskGraphRetryWaitsWhateverThePaging},
		{"TaskGraphSettleAfterARetry", testTaskGraphSettleAfterARetry},
		{"NotBeforeByTheServersClock", testNotBeforeByTheServersClock},
		{"TaskGraphEndUnrun", testTaskGraphEndUnrun},
		{"TaskGraphInsertRefuses", testTaskGraphInsertRefuses},
		{"TaskGraphInsertAllOrNothing", testTaskGraphInsertAllOrNothing},
		{"TaskGraphSweep", testTaskGraphSweep},
		{"TaskGraphGet", testTaskGraphGet},
		{"StreamLeader", testStreamLeader},
		{"StreamLeaderWithoutEnds", testStreamLeaderWithoutEnds},
		{"StreamCountersWithLeader", testStreamCountersWithLeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newStore)
		})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func ptr[T any](v T) *T { return &v }

func rawDoc(t *testing.T, db *mongo.Database, coll string, filter any) bson.Raw {
	t.Helper()
	raw, err := db.Collection(coll).FindOne(context.Background(), filter).Raw()
	require.NoError(t, err)
	return raw
}

func newQueue(t *testing.T, s *store.Store, name string, sort schema.Sort) schema.Queue {
	t.Helper()
	q, err := s.QueueCreate(ctxT(t), store.QueueCreateParams{Name: name, Constructor: "Disbatch::Plugin::Demo", MaxThreads: ptr(1), Sort: sort})
	require.NoError(t, err)
	return q
}

func insertTasks(t *testing.T, s *store.Store, q bson.ObjectID, n int) []bson.ObjectID {
	t.Helper()
	params := make([]bson.Raw, n)
	for i := range params {
		b, err := bson.Marshal(bson.D{{Key: "i", Value: i}})
		require.NoError(t, err)
		params[i] = b
	}
	ids, err := s.TaskInsertMany(ctxT(t), store.TaskInsertManyParams{Queue: q, Parameters: params})
	require.NoError(t, err)
	require.Len(t, ids, n)
	return ids
}

func indexKeys(t *testing.T, db *mongo.Database, coll string) map[string]bson.Raw {
	t.Helper()
	cur, err := db.Collection(coll).Indexes().List(context.Background())
	require.NoError(t, err)
	var specs []bson.Raw
	require.NoError(t, cur.All(context.Background(), &specs))
	out := map[string]bson.Raw{}
	for _, s := range specs {
		out[s.Lookup("key").String()] = s
	}
	return out
}

func testIndexesEnsure(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	require.NoError(t, s.IndexesEnsure(ctx))
	require.NoError(t, s.IndexesEnsure(ctx), "second call must be a no-op")
	for _, ix := range store.Indexes {
		keys := indexKeys(t, db, ix.Collection)
		want, err := bson.Marshal(ix.Keys)
		require.NoError(t, err)
		spec, ok := keys[bson.Raw(want).String()]
		require.True(t, ok, "index %v on %s missing; have %v", ix.Keys, ix.Collection, keys)
		unique, _ := spec.Lookup("unique").BooleanOK()
		require.Equal(t, ix.Unique, unique, "unique flag of %v", ix.Keys)
	}
	// The claim uses the claim index, not a collection scan.
	q := newQueue(t, s, "explain", schema.SortFIFO)
	insertTasks(t, s, q.ID, 3)
	var plan bson.Raw
	require.NoError(t, db.RunCommand(ctx, bson.D{{Key: "explain", Value: bson.D{
		{Key: "findAndModify", Value: "tasks"},
		{Key: "query", Value: bson.D{{Key: "node", Value: bson.D{{Key: "$in", Value: bson.A{-1, nil}}}}, {Key: "status", Value: -2}, {Key: "queue", Value: q.ID}}},
		{Key: "sort", Value: bson.D{{Key: "_id", Value: 1}}},
		{Key: "update", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -1}}}}},
	}}}).Decode(&plan))
	require.Contains(t, plan.String(), "node_1_status_1_queue_1__id_1")
	require.NotContains(t, plan.String(), "COLLSCAN")
}

func testIndexesEnsureBesidePerl(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	// What Disbatch 4.103's ensure_indexes creates: other names, other options.
	_, err := db.Collection("queues").Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "name", Value: 1}}, Options: options.Index().SetUnique(true)})
	require.NoError(t, err)
	_, err = db.Collection("tasks").Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: bson.D{{Key: "node", Value: 1}, {Key: "status", Value: 1}, {Key: "queue", Value: 1}}},
		{Keys: bson.D{{Key: "node", Value: 1}, {Key: "status", Value: 1}, {Key: "queue", Value: 1}, {Key: "_id", Value: 1}}, Options: options.Index().SetName("perl_claim")},
		{Keys: bson.D{{Key: "queue", Value: 1}, {Key: "status", Value: 1}}},
		// The delayed tasks' index before task graphs, on a database of an
		// earlier version: left alone.
		{Keys: bson.D{{Key: "not_before", Value: 1}}, Options: options.Index().SetPartialFilterExpression(bson.D{{Key: "status", Value: -4}})},
	})
	require.NoError(t, err)
	_, err = db.Collection("tasks.chunks").Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: "files_id", Value: 1}, {Key: "n", Value: 1}}, Options: options.Index().SetUnique(true).SetName("chunks")})
	require.NoError(t, err)
	require.NoError(t, s.IndexesEnsure(ctx))
	keys := indexKeys(t, db, "tasks")
	require.Len(t, keys, 12, "_id, the three Perl indexes, our reaper index, the two partial timer indexes and the older one, and the partial parents, admitted, then_pending and priority indexes: %v", keys)
	require.Len(t, indexKeys(t, db, "queues"), 2)
}

func testQueueCreateGet(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q, err := s.QueueCreate(ctx, store.QueueCreateParams{Name: "demo", Constructor: "Disbatch::Plugin::Demo", MaxThreads: ptr(3), Sort: schema.SortLIFO})
	require.NoError(t, err)
	require.Equal(t, 3, *q.MaxThreads)

	raw := rawDoc(t, db, "queues", bson.D{{Key: "_id", Value: q.ID}})
	// Both dialects, so a Disbatch 4.103 node runs it too; counters left for the node.
	require.Equal(t, "Disbatch::Plugin::Demo", raw.Lookup("constructor").StringValue())
	require.Equal(t, "Disbatch::Plugin::Demo", raw.Lookup("plugin").StringValue())
	require.Equal(t, int64(3), raw.Lookup("maxthreads").AsInt64())
	require.Equal(t, int64(3), raw.Lookup("threads").AsInt64())
	require.Equal(t, "lifo", raw.Lookup("sort").StringValue())
	_, err = raw.LookupErr("count_todo")
	require.Error(t, err)

	byName, err := s.QueueGet(ctx, store.QueueGetParams{Ref: "demo"})
	require.NoError(t, err)
	require.Equal(t, q.ID, byName.ID)
	byID, err := s.QueueGet(ctx, store.QueueGetParams{Ref: q.ID.Hex()})
	require.NoError(t, err)
	require.Equal(t, "demo", byID.Name)
	_, err = s.QueueGet(ctx, store.QueueGetParams{Ref: "nope"})
	require.ErrorIs(t, err, store.ErrNotFound)

	_, err = s.QueueCreate(ctx, store.QueueCreateParams{Name: "demo", Constructor: "X"})
	require.ErrorIs(t, err, store.ErrQueueExists)

	nullQ, err := s.QueueCreate(ctx, store.QueueCreateParams{Name: "nothreads", Constructor: "X"})
	require.NoError(t, err)
	require.Nil(t, nullQ.MaxThreads)
	require.Equal(t, bson.TypeNull, rawDoc(t, db, "queues", bson.D{{Key: "_id", Value: nullQ.ID}}).Lookup("maxthreads").Type)
}

func testQueueCreateValidates(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	for _, tc := range []struct {
		p    store.QueueCreateParams
		want string
	}{
		{store.QueueCreateParams{Constructor: "C"}, "queue name is required"},
		{store.QueueCreateParams{Name: " q", Constructor: "C"}, "white space"},
		{store.QueueCreateParams{Name: "571f8951b75bf335634ec271", Constructor: "C"}, "looks like an ObjectId"},
		{store.QueueCreateParams{Name: "q"}, "constructor is required"},
		{store.QueueCreateParams{Name: "q", Constructor: "C", MaxThreads: ptr(-1)}, "non-negative"},
		{store.QueueCreateParams{Name: "q", Constructor: "C", Sort: "random"}, "fifo, lifo, priority or default"},
	} {
		_, err := s.QueueCreate(ctx, tc.p)
		require.ErrorContains(t, err, tc.want)
	}
	n, err := db.Collection("queues").CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Zero(t, n, "nothing written for invalid queues")
}

func testQueueListMalformed(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	newQueue(t, s, "good", "")
	_, err := db.Collection("queues").InsertMany(ctx, []any{
		bson.D{{Key: "name", Value: "perl"}, {Key: "plugin", Value: "P"}, {Key: "threads", Value: 2.0}},
		bson.D{{Key: "name", Value: "broken"}, {Key: "maxthreads", Value: "ten"}, {Key: "constructor", Value: "C"}},
	})
	require.NoError(t, err)
	res, err := s.QueueList(ctx)
	require.NoError(t, err)
	require.Len(t, res.Queues, 2)
	require.Equal(t, "good", res.Queues[0].Name)
	require.Equal(t, "perl", res.Queues[1].Name)
	require.Equal(t, "P", res.Queues[1].Constructor)
	require.Equal(t, 2, *res.Queues[1].MaxThreads)
	require.Len(t, res.Malformed, 1)
	require.ErrorContains(t, res.Malformed[0], `field "maxthreads": want an integer, got string "ten"`)
}

func testQueueUpdate(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	id := bson.NewObjectID()
	_, err := db.Collection("queues").InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "name", Value: "q"}, {Key: "plugin", Value: "P"}, {Key: "threads", Value: 1}, {Key: "custom", Value: "keep me"}})
	require.NoError(t, err)
	newQueue(t, s, "other", "")

	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: id, SetMaxThreads: true, MaxThreads: ptr(7), Sort: ptr(schema.SortFIFO), NodesPin: &[]string{"a", "b"}}))
	raw := rawDoc(t, db, "queues", bson.D{{Key: "_id", Value: id}})
	require.Equal(t, "keep me", raw.Lookup("custom").StringValue())
	require.Equal(t, int64(7), raw.Lookup("maxthreads").AsInt64())
	require.Equal(t, int64(7), raw.Lookup("threads").AsInt64())
	q, err := schema.DecodeQueue(raw)
	require.NoError(t, err)
	require.Empty(t, q.Warnings)
	require.Equal(t, []string{"a", "b"}, q.NodesPin)

	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: id, SetMaxThreads: true, NodesPin: &[]string{}}))
	raw = rawDoc(t, db, "queues", bson.D{{Key: "_id", Value: id}})
	require.Equal(t, bson.TypeNull, raw.Lookup("maxthreads").Type)
	_, err = raw.LookupErr("nodes_pin")
	require.Error(t, err, "empty list removes nodes_pin")

	// QueueBalance's hold is replaced by an operator's cap (in 4.103 the
	// hold was threads 0, which setting threads undid); a rename keeps it.
	require.NoError(t, s.QueueBalanceSet(ctx, id, 0))
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: id, Name: ptr("renamed")}))
	require.True(t, rawDoc(t, db, "queues", bson.D{{Key: "_id", Value: id}}).Lookup("balance_hold").Boolean(), "held")
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: id, MaxRunning: ptr(3)}))
	_, err = rawDoc(t, db, "queues", bson.D{{Key: "_id", Value: id}}).LookupErr("balance_hold")
	require.Error(t, err, "an operator's max_running leaves the queue held by QueueBalance")
	require.NoError(t, s.QueueBalanceSet(ctx, id, 0))
	require.NoError(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: id, SetMaxThreads: true, MaxThreads: ptr(4)}))
	_, err = rawDoc(t, db, "queues", bson.D{{Key: "_id", Value: id}}).LookupErr("balance_hold")
	require.Error(t, err, "an operator's maxthreads leaves the queue held by QueueBalance")

	require.ErrorIs(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: id, Name: ptr("other")}), store.ErrQueueExists)
	require.ErrorIs(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: bson.NewObjectID(), Name: ptr("x")}), store.ErrNotFound)
	require.ErrorContains(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: id, SetMaxThreads: true, MaxThreads: ptr(-2)}), "non-negative")
	require.ErrorContains(t, s.QueueUpdate(ctx, store.QueueUpdateParams{ID: id}), "nothing to update")
}

func testQueueDelete(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{OutputThreshold: 10})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	keep := newQueue(t, s, "keep", schema.SortFIFO)
	insertTasks(t, s, keep.ID, 2)
	ids := insertTasks(t, s, q.ID, 3)

	_, err := s.QueueDelete(ctx, store.QueueDeleteParams{ID: q.ID})
	require.ErrorIs(t, err, store.ErrUnfinishedTasks)
	require.ErrorContains(t, err, "3 unfinished tasks")

	// Finish one with output in GridFS.
	task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.Equal(t, ids[0], task.ID)
	require.NoError(t, s.TaskStart(ctx, store.TaskTransitionParams{ID: task.ID, Node: "n1"}))
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: schema.StatusSucceeded, Stdout: strings.Repeat("x", 100)}))

	res, err := s.QueueDelete(ctx, store.QueueDeleteParams{ID: q.ID, Force: true})
	require.NoError(t, err)
	require.Equal(t, store.QueueDeleteResult{TasksDeleted: 3, FilesDeleted: 1}, res)
	for coll, want := range map[string]int64{"queues": 1, "tasks": 2, "tasks.files": 0, "tasks.chunks": 0} {
		n, err := db.Collection(coll).CountDocuments(ctx, bson.D{})
		require.NoError(t, err)
		require.Equal(t, want, n, coll)
	}
	_, err = s.QueueDelete(ctx, store.QueueDeleteParams{ID: q.ID, Force: true})
	require.ErrorIs(t, err, store.ErrNotFound)

	// A delete cut short after the queue document went (its tasks left):
	// running it again deletes them, rather than saying not found.
	cut := newQueue(t, s, "cut", schema.SortFIFO)
	insertTasks(t, s, cut.ID, 3)
	_, err = db.Collection("queues").DeleteOne(ctx, bson.D{{Key: "_id", Value: cut.ID}})
	require.NoError(t, err)
	res, err = s.QueueDelete(ctx, store.QueueDeleteParams{ID: cut.ID, Force: true})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.TasksDeleted)
	_, err = s.QueueDelete(ctx, store.QueueDeleteParams{ID: cut.ID, Force: true})
	require.ErrorIs(t, err, store.ErrNotFound, "nothing left")
}

func testQueueCounts(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	a, b := newQueue(t, s, "a", ""), newQueue(t, s, "b", "")
	insertTasks(t, s, a.ID, 5)
	insertTasks(t, s, b.ID, 2)
	_, err := db.Collection("tasks").UpdateMany(ctx, bson.D{{Key: "queue", Value: a.ID}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 1}}}}, options.UpdateMany())
	require.NoError(t, err)
	_, err = db.Collection("tasks").InsertOne(ctx, bson.D{{Key: "queue", Value: a.ID}, {Key: "status", Value: -4}})
	require.NoError(t, err)
	// Failed: 2 however stored; not "2".
	_, err = db.Collection("tasks").InsertMany(ctx, []any{bson.D{{Key: "queue", Value: a.ID}, {Key: "status", Value: int32(2)}},
		bson.D{{Key: "queue", Value: a.ID}, {Key: "status", Value: 2.0}}, bson.D{{Key: "queue", Value: a.ID}, {Key: "status", Value: "2"}}})
	require.NoError(t, err)
	_, err = db.Collection("tasks").InsertOne(ctx, bson.D{{Key: "queue", Value: "not an id"}, {Key: "status", Value: -2}})
	require.NoError(t, err)
	// Running: -1 and 0 however stored; not a missing, null, string,
	// fractional, NaN or array status. To do: NaN (below every number),
	// not an array (above them).
	var odd []any
	for _, st := range []any{int32(-1), int64(0), -1.0, bson.NewDecimal128(0, 0), nil, "0", -0.5, math.NaN()} {
		odd = append(odd, bson.D{{Key: "queue", Value: b.ID}, {Key: "status", Value: st}})
	}
	odd = append(odd, bson.D{{Key: "queue", Value: b.ID}})
	_, err = db.Collection("tasks").InsertMany(ctx, odd)
	require.NoError(t, err)
	want := map[bson.ObjectID]store.QueueCounts{a.ID: {Todo: 1, Total: 9, Failed: 2}, b.ID: {Todo: 10, Total: 11, Running: 4}}
	counts, err := s.QueueCountsGet(ctx)
	require.NoError(t, err)
	require.Equal(t, want, counts, "without the {queue, status} index: sorted by the server")
	// Read from the index alone, which holds a missing status as null.
	require.NoError(t, s.IndexesEnsure(ctx))
	counts, err = s.QueueCountsGet(ctx)
	require.NoError(t, err)
	require.Equal(t, want, counts, "through the {queue, status} index")
	// An array status makes the index multikey: the documents are read.
	_, err = db.Collection("tasks").InsertOne(ctx, bson.D{{Key: "queue", Value: b.ID}, {Key: "status", Value: bson.A{int32(0)}}})
	require.NoError(t, err)
	counts, err = s.QueueCountsGet(ctx)
	require.NoError(t, err)
	require.Equal(t, map[bson.ObjectID]store.QueueCounts{a.ID: {Todo: 1, Total: 9, Failed: 2}, b.ID: {Todo: 10, Total: 12, Running: 4}}, counts, "through a multikey index")
}

// testTaskInsertManyOwnControlsAtomic: tasks with controls of their own
// (a time limit, an expiry, a delay, a priority each) go in one insert,
// each with its own; an atomic insert that fails partway (here a
// duplicate id, last) leaves none of its tasks, where a plain one leaves
// those before the failure.
func testTaskInsertManyOwnControlsAtomic(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	now := time.Now().UTC().Truncate(time.Millisecond)
	controls := []store.TaskInsertControl{
		{Timeout: 5 * time.Second},
		{ExpiresAt: now.Add(time.Hour)},
		{NotBefore: now.Add(time.Hour)},
		{Priority: 7},
	}
	ids, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: make([]bson.Raw, 4), Controls: controls, Atomic: true})
	require.NoError(t, err)
	raws := make([]bson.Raw, 4)
	for i, id := range ids {
		raws[i] = rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: id}})
	}
	require.Equal(t, 5.0, raws[0].Lookup(schema.TaskTimeout).Double())
	require.Equal(t, now.Add(time.Hour), raws[1].Lookup(schema.TaskExpiresAt).Time().UTC())
	require.EqualValues(t, schema.StatusBlocked, raws[2].Lookup("status").Int32(), "its delay")
	require.EqualValues(t, schema.StatusQueued, raws[3].Lookup("status").Int32())
	require.EqualValues(t, 7, raws[3].Lookup(schema.TaskPriority).AsInt64())
	for i := 1; i < 4; i++ {
		_, err := raws[i].LookupErr(schema.TaskTimeout)
		require.Error(t, err, "task %d took another's time limit", i)
	}

	taken := ids[0]
	for _, atomic := range []bool{true, false} {
		fresh := []bson.ObjectID{bson.NewObjectID(), bson.NewObjectID(), taken}
		_, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, IDs: fresh, Parameters: make([]bson.Raw, 3), Atomic: atomic})
		require.Error(t, err, "a duplicate id")
		n, err := db.Collection(schema.CollTasks).CountDocuments(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{fresh[0], fresh[1]}}}}})
		require.NoError(t, err)
		if atomic {
			require.Zero(t, n, "an atomic insert left part of its tasks")
		} else {
			require.EqualValues(t, 2, n, "a plain insert keeps what went in before the failure")
		}
	}
}

func testTaskInsertMany(t *testing.T, newStore Factory) {
	now := time.Date(2026, 11, 22, 3, 4, 5, 678_900_000, time.UTC)
	s, db := newStore(t, store.Options{Now: func() time.Time { return now }})
	q := newQueue(t, s, "q", "")
	ids := insertTasks(t, s, q.ID, 2)
	raw := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: ids[1]}})
	require.Equal(t, q.ID, raw.Lookup("queue").ObjectID())
	require.Equal(t, bson.TypeInt32, raw.Lookup("node").Type)
	require.Equal(t, int32(-1), raw.Lookup("node").Int32())
	require.Equal(t, int32(-2), raw.Lookup("status").Int32())
	require.Equal(t, now.Truncate(time.Millisecond), raw.Lookup("ctime").Time().UTC())
	require.Equal(t, now.Truncate(time.Millisecond), raw.Lookup("mtime").Time().UTC())
	require.Equal(t, bson.TypeNull, raw.Lookup("stdout").Type)
	require.Equal(t, bson.TypeNull, raw.Lookup("stderr").Type)
	require.Equal(t, int64(1), raw.Lookup("parameters", "i").AsInt64())

	// Caller-chosen ids keep submission order for fifo.
	mine := []bson.ObjectID{bson.NewObjectID(), bson.NewObjectID()}
	got, err := s.TaskInsertMany(ctxT(t), store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil, nil}, IDs: mine})
	require.NoError(t, err)
	require.Equal(t, mine, got)
	task, err := s.TaskGet(ctxT(t), mine[0])
	require.NoError(t, err)
	require.Equal(t, 5, len(task.Parameters), "nil parameters become {}")
	_, err = s.TaskGet(ctxT(t), bson.NewObjectID())
	require.ErrorIs(t, err, store.ErrNotFound)

	// Extra fields follow the protocol's on every task; a protocol field
	// cannot be one.
	extra := bson.D{{Key: "chained_from", Value: ids[0]}, {Key: "name", Value: "n"}}
	got, err = s.TaskInsertMany(ctxT(t), store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil, nil}, Extra: extra,
		Control: &store.TaskInsertControl{Timeout: time.Minute}})
	require.NoError(t, err)
	for _, id := range got {
		elems, err := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: id}}).Elements()
		require.NoError(t, err)
		var keys []string
		for _, e := range elems {
			keys = append(keys, e.Key())
		}
		require.Equal(t, []string{"_id", "queue", "ctime", "mtime", "node", "status", "parameters", "stdout", "stderr", "timeout", "chained_from", "name"}, keys)
		require.Equal(t, ids[0], elems[10].Value().ObjectID())
	}
	for _, key := range []string{"status", "not_before", "awaiting_parents", "params"} {
		_, err = s.TaskInsertMany(ctxT(t), store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil}, Extra: bson.D{{Key: key, Value: 1}}})
		require.ErrorContains(t, err, "a field of the task protocol", key)
	}
}

func testTaskClaimOrder(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	for _, sort := range []schema.Sort{schema.SortFIFO, schema.SortLIFO} {
		q := newQueue(t, s, "q-"+string(sort), sort)
		ids := insertTasks(t, s, q.ID, 5)
		var got []bson.ObjectID
		for range ids {
			task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: sort})
			require.NoError(t, err)
			require.Equal(t, schema.StatusClaimed, task.Status)
			require.Equal(t, "n1", task.Node)
			got = append(got, task.ID)
		}
		if sort == schema.SortLIFO {
			for i, j := 0, len(got)-1; i < j; i, j = i+1, j-1 {
				got[i], got[j] = got[j], got[i]
			}
		}
		require.Equal(t, ids, got, string(sort))
		_, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: sort})
		require.ErrorIs(t, err, store.ErrNoTask)
	}
}

func testTaskClaimPerl(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	// As Disbatch 4.103's web API creates them: params, node null.
	res, err := db.Collection("tasks").InsertOne(ctx, bson.D{{Key: "queue", Value: q.ID}, {Key: "status", Value: -2}, {Key: "node", Value: nil},
		{Key: "params", Value: bson.D{{Key: "commands", Value: "a"}}}, {Key: "ctime", Value: time.Now()}, {Key: "mtime", Value: time.Now()}, {Key: "stdout", Value: nil}, {Key: "stderr", Value: nil}, {Key: "extra", Value: 42}})
	require.NoError(t, err)
	task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1"})
	require.NoError(t, err)
	require.Equal(t, res.InsertedID, task.ID)
	require.Equal(t, "a", task.Parameters.Lookup("commands").StringValue())
	require.NoError(t, s.TaskStart(ctx, store.TaskTransitionParams{ID: task.ID, Node: "n1"}))
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: schema.StatusSucceeded, Stdout: "ok"}))
	raw := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: task.ID}})
	require.Equal(t, int64(42), raw.Lookup("extra").AsInt64(), "unknown fields survive claim, start and finish")
	require.Equal(t, "ok", raw.Lookup("stdout").StringValue())
}

func testTaskClaimConcurrent(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 300)
	claimConcurrently(t, 8, 300, func(node string) ([]bson.ObjectID, bool, error) {
		task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: node, Sort: schema.SortFIFO})
		if errors.Is(err, store.ErrNoTask) {
			return nil, true, nil
		}
		return []bson.ObjectID{task.ID}, false, err
	})
}

// claimConcurrently runs claim as node n0..n(workers-1) in parallel until
// each says done, and checks that every one of want tasks was claimed by
// exactly one node.
func claimConcurrently(t *testing.T, workers, want int, claim func(node string) (ids []bson.ObjectID, done bool, err error)) {
	t.Helper()
	var mu sync.Mutex
	seen := map[bson.ObjectID]string{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := fmt.Sprintf("n%d", w)
			for {
				ids, done, err := claim(node)
				if err != nil {
					errs <- err
					return
				}
				if done {
					return
				}
				mu.Lock()
				for _, id := range ids {
					if prev, dup := seen[id]; dup {
						errs <- fmt.Errorf("task %s claimed by %s and %s", id.Hex(), prev, node)
					}
					seen[id] = node
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, seen, want, "every task claimed exactly once")
}

func testTaskGuarded(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 2)
	task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)

	me := store.TaskTransitionParams{ID: task.ID, Node: "n1"}
	other := store.TaskTransitionParams{ID: task.ID, Node: "n2"}
	require.ErrorIs(t, s.TaskStart(ctx, other), store.ErrLostTask, "only the claimer starts it")
	require.ErrorIs(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: 1}), store.ErrLostTask, "not running yet")
	require.NoError(t, s.TaskStart(ctx, me))
	require.NoError(t, s.TaskStart(ctx, me), "a retried start whose first attempt landed is done, not lost")
	require.ErrorIs(t, s.TaskRelease(ctx, me), store.ErrLostTask, "running tasks are not released")
	require.ErrorContains(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: 0}), "not a finished status")

	require.ErrorIs(t, s.TaskStart(ctx, other), store.ErrLostTask, "still not n2's")

	// The reaper (or an operator) takes the task away: n1's result must not land.
	_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: task.ID}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -6}}}})
	require.NoError(t, err)
	require.ErrorIs(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: 1, Stdout: "late"}), store.ErrLostTask)
	got, err := s.TaskGet(ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, schema.StatusOrphaned, got.Status)
	require.False(t, got.Stdout.Set)

	// Release hands a claimed task back to the queue.
	second, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.NoError(t, s.TaskRelease(ctx, store.TaskTransitionParams{ID: second.ID, Node: "n1"}))
	again, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n2", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.Equal(t, second.ID, again.ID)
}

func finishWith(t *testing.T, s *store.Store, q bson.ObjectID, stdout, stderr string) schema.Task {
	t.Helper()
	ctx := ctxT(t)
	task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.NoError(t, s.TaskStart(ctx, store.TaskTransitionParams{ID: task.ID, Node: "n1"}))
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: schema.StatusFailed, Stdout: stdout, Stderr: stderr}))
	got, err := s.TaskGet(ctx, task.ID)
	require.NoError(t, err)
	require.Equal(t, schema.StatusFailed, got.Status)
	return got
}

func testTaskFinishGridFS(t *testing.T, newStore Factory) {
	const threshold = 400 << 10
	s, db := newStore(t, store.Options{OutputThreshold: threshold})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 3)

	small := finishWith(t, s, q.ID, "out", "err")
	require.Equal(t, schema.Output{Text: "out", Set: true}, small.Stdout)
	require.Equal(t, schema.Output{Text: "err", Set: true}, small.Stderr)

	// Over the threshold together: stdout (multi-byte runes across chunk
	// boundaries) goes to GridFS, the small stderr stays inline.
	big := strings.Repeat("é€x", 100<<10) // 600 KiB
	mixed := finishWith(t, s, q.ID, big, "small")
	require.True(t, mixed.Stdout.InGridFS())
	require.Equal(t, "small", mixed.Stderr.Text)
	out, err := s.TaskOutputRead(ctx, mixed.Stdout)
	require.NoError(t, err)
	require.Equal(t, big, out)
	file := rawDoc(t, db, "tasks.files", bson.D{{Key: "_id", Value: mixed.Stdout.FileID}})
	require.Equal(t, "stdout", file.Lookup("filename").StringValue())
	require.Equal(t, mixed.ID, file.Lookup("metadata", "task_id").ObjectID())
	require.Equal(t, int64(len(big)), file.Lookup("length").AsInt64())
	cur, err := db.Collection("tasks.chunks").Find(ctx, bson.D{{Key: "files_id", Value: mixed.Stdout.FileID}})
	require.NoError(t, err)
	var chunks []bson.Raw
	require.NoError(t, cur.All(ctx, &chunks))
	require.Len(t, chunks, 3)
	for _, c := range chunks {
		require.Equal(t, bson.TypeString, c.Lookup("data").Type, "chunk data must be a string, not BinData")
	}

	both := finishWith(t, s, q.ID, big, big)
	require.True(t, both.Stdout.InGridFS())
	require.True(t, both.Stderr.InGridFS())
	errOut, err := s.TaskOutputRead(ctx, both.Stderr)
	require.NoError(t, err)
	require.Equal(t, big, errOut)
	stderrFile := rawDoc(t, db, "tasks.files", bson.D{{Key: "_id", Value: both.Stderr.FileID}})
	require.Equal(t, "stderr", stderrFile.Lookup("filename").StringValue())
}

func testTaskFinishTooLarge(t *testing.T, newStore Factory) {
	// A threshold above what fits in a document: the store must still
	// finish the task, by putting the output in GridFS.
	s, _ := newStore(t, store.Options{OutputThreshold: 64 << 20})
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 1)
	huge := strings.Repeat("y", 17<<20)
	task := finishWith(t, s, q.ID, huge, "e")
	require.True(t, task.Stdout.InGridFS())
	out, err := s.TaskOutputRead(ctxT(t), task.Stdout)
	require.NoError(t, err)
	require.Equal(t, len(huge), len(out))
}

func testTaskOutputBinary(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	fid := bson.NewObjectID()
	_, err := db.Collection("tasks.files").InsertOne(ctx, bson.D{{Key: "_id", Value: fid}, {Key: "filename", Value: "stdout"}})
	require.NoError(t, err)
	_, err = db.Collection("tasks.chunks").InsertMany(ctx, []any{
		bson.D{{Key: "files_id", Value: fid}, {Key: "n", Value: 1}, {Key: "data", Value: bson.Binary{Data: []byte("world")}}},
		bson.D{{Key: "files_id", Value: fid}, {Key: "n", Value: 0}, {Key: "data", Value: "hello "}},
	})
	require.NoError(t, err)
	out, err := s.TaskOutputRead(ctx, schema.Output{FileID: fid, Set: true})
	require.NoError(t, err)
	require.Equal(t, "hello world", out)
	_, err = s.TaskOutputRead(ctx, schema.Output{FileID: bson.NewObjectID(), Set: true})
	require.ErrorIs(t, err, store.ErrNotFound)
}

func testTaskList(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 5)
	_, err := db.Collection("tasks").InsertOne(ctx, bson.D{{Key: "queue", Value: q.ID}, {Key: "status", Value: "weird"}})
	require.NoError(t, err)
	finishWith(t, s, q.ID, "o", "e")

	all, err := s.TaskList(ctx, store.TaskListParams{Queue: q.ID})
	require.NoError(t, err)
	require.Len(t, all.Tasks, 5)
	require.Len(t, all.Malformed, 1)
	require.ErrorContains(t, all.Malformed[0], `field "status"`)

	queued, err := s.TaskList(ctx, store.TaskListParams{Queue: q.ID, Status: ptr(schema.StatusQueued), Limit: 2, WithoutOutput: true})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{ids[1], ids[2]}, []bson.ObjectID{queued.Tasks[0].ID, queued.Tasks[1].ID})
}

func testNodeUpsert(t *testing.T, newStore Factory) {
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s, db := newStore(t, store.Options{Now: func() time.Time { return clock }})
	ctx := ctxT(t)
	queues := []schema.NodeQueue{{Name: "demo", ID: "571f8951b75bf335634ec271", Constructor: "Disbatch::Plugin::Demo", MaxThreads: ptr(2), TasksTodo: 3, TasksDoing: 1, TasksDone: 4}}
	first, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "n1", Queues: queues})
	require.NoError(t, err)
	require.Nil(t, first.MaxThreads)
	n, err := s.NodeGet(ctx, "n1")
	require.NoError(t, err)
	require.NotNil(t, n.Serves, "serves is written even when empty: serving nothing is known")
	require.Empty(t, n.Serves)
	require.NotNil(t, n.Full)
	require.False(t, n.WakeupStream)

	// The operator caps the node and adds a note.
	_, err = db.Collection("nodes").UpdateOne(ctx, bson.D{{Key: "node", Value: "n1"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "maxthreads", Value: 5}, {Key: "note", Value: "rack 4"}}}})
	require.NoError(t, err)
	clock = clock.Add(time.Second)
	second, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "n1", Queues: queues, Serves: []string{"571f8951b75bf335634ec271"},
		Full: []string{"571f8951b75bf335634ec271"}, WakeupStream: true})
	require.NoError(t, err)
	require.Equal(t, 5, *second.MaxThreads, "the heartbeat reads the operator's cap in the same round trip")

	raw := rawDoc(t, db, "nodes", bson.D{{Key: "node", Value: "n1"}})
	require.Equal(t, int64(5), raw.Lookup("maxthreads").AsInt64())
	require.Equal(t, "rack 4", raw.Lookup("note").StringValue())
	require.WithinDuration(t, time.Now(), raw.Lookup("timestamp").Time(), 5*time.Second, "the timestamp is the server's clock, not the store's")
	entry := raw.Lookup("queues", "0").Document()
	for field, want := range map[string]int64{"tasks_todo": 3, "tasks_doing": 1, "tasks_done": 4, "preemptive": 1, "tasks_backfill": 0, "maxthreads": 2} {
		require.Equal(t, want, entry.Lookup(field).AsInt64(), field)
	}
	require.Equal(t, "571f8951b75bf335634ec271", entry.Lookup("id").StringValue())
	require.Equal(t, "Disbatch::Plugin::Demo", entry.Lookup("constructor").StringValue())

	n, err = s.NodeGet(ctx, "n1")
	require.NoError(t, err)
	require.Equal(t, 5, *n.MaxThreads)
	require.Len(t, n.Queues, 1)
	require.Equal(t, []string{"571f8951b75bf335634ec271"}, n.Serves, "serves_at is the heartbeat's timestamp")
	require.Equal(t, []string{"571f8951b75bf335634ec271"}, n.Full)
	require.True(t, n.WakeupStream)
	count, err := db.Collection("nodes").CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), count)
	_, err = s.NodeGet(ctx, "n2")
	require.ErrorIs(t, err, store.ErrNotFound)
}

func testConfigGet(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	_, err := s.ConfigGet(ctx, "")
	require.ErrorIs(t, err, store.ErrNotFound)

	_, err = db.Collection("config").InsertOne(ctx, bson.D{{Key: "label", Value: "a"}, {Key: "activequeues", Value: bson.A{"q1"}}})
	require.NoError(t, err)
	_, err = s.ConfigGet(ctx, "")
	require.ErrorIs(t, err, store.ErrNotFound, "a labelled document is not for nodes without that label")
	c, err := s.ConfigGet(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, []string{"q1"}, c.ActiveQueues)

	_, err = db.Collection("config").InsertOne(ctx, bson.D{{Key: "label", Value: "b"}, {Key: "active", Value: true}, {Key: "ignorequeues", Value: bson.A{"q2"}}})
	require.NoError(t, err)
	c, err = s.ConfigGet(ctx, "")
	require.NoError(t, err)
	require.Equal(t, "b", c.Label, "the active one")
	c, err = s.ConfigGet(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, "a", c.Label)
	_, err = s.ConfigGet(ctx, "zzz")
	require.ErrorIs(t, err, store.ErrNotFound)

	_, err = db.Collection("config").InsertOne(ctx, bson.D{{Key: "label", Value: "c"}, {Key: "active", Value: true}})
	require.NoError(t, err)
	_, err = s.ConfigGet(ctx, "")
	require.ErrorContains(t, err, "2 documents are marked active: true; keep one")
}

func testTaskFail(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 1)
	task, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1"})
	require.NoError(t, err)
	require.ErrorIs(t, s.TaskFail(ctx, store.TaskFailParams{ID: task.ID, Node: "n2", From: schema.StatusClaimed, Reason: "x"}), store.ErrLostTask)
	require.NoError(t, s.TaskFail(ctx, store.TaskFailParams{ID: task.ID, Node: "n1", From: schema.StatusClaimed, Reason: "bad parameters"}))
	raw := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: task.ID}})
	require.Equal(t, int32(2), raw.Lookup("status").Int32())
	require.Equal(t, "bad parameters", raw.Lookup("stderr").StringValue())
}

func testTaskOrphan(t *testing.T, newStore Factory) {
	now := time.Now()
	s, db := newStore(t, store.Options{Now: func() time.Time { return now }})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 6)
	set := func(id bson.ObjectID, node any, status int, mtime time.Time) {
		_, err := db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "node", Value: node}, {Key: "status", Value: status}, {Key: "mtime", Value: mtime}}}})
		require.NoError(t, err)
	}
	old := now.Add(-10 * time.Minute)
	set(ids[0], "me", -1, now)   // mine, claimed: orphan at start-up
	set(ids[1], "me", 0, now)    // mine, running: orphan at start-up
	set(ids[2], "me", 1, old)    // mine, finished: leave
	set(ids[3], "other", 0, old) // another node running: leave (dead-node detection is elsewhere)
	set(ids[4], "other", -1, old)
	// ids[5] queued: leave
	perl := insertTasks(t, s, q.ID, 1)[0] // claimed by an old writer, epoch-seconds mtime: leave
	set(perl, "perl", -1, time.Time{})
	_, err := db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: perl}}, bson.D{{Key: "$set", Value: bson.D{{Key: "mtime", Value: 1700000000}}}})
	require.NoError(t, err)
	n, err := s.TaskOrphanNode(ctx, store.TaskOrphanNodeParams{Node: "me"})
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	n, err = s.TaskOrphanStale(ctx, store.TaskOrphanStaleParams{OlderThan: 5 * time.Minute})
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "only the claim older than 5 minutes by the server's clock")
	_, err = s.TaskOrphanStale(ctx, store.TaskOrphanStaleParams{})
	require.Error(t, err)
	require.Equal(t, int32(-1), rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: perl}}).Lookup("status").Int32())
	want := []int32{-6, -6, 1, 0, -6, -2}
	for i, id := range ids {
		require.Equal(t, want[i], rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: id}}).Lookup("status").Int32(), "task %d", i)
	}
}

func testStreamToken(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	_, err := s.StreamTokenGet(ctx, "n1")
	require.ErrorIs(t, err, store.ErrNotFound)
	tok, err := bson.Marshal(bson.D{{Key: "_data", Value: "8263A1"}})
	require.NoError(t, err)
	require.NoError(t, s.StreamTokenSave(ctx, "n1", tok))
	tok2, err := bson.Marshal(bson.D{{Key: "_data", Value: "8263A2"}})
	require.NoError(t, err)
	require.NoError(t, s.StreamTokenSave(ctx, "n1", tok2))
	got, err := s.StreamTokenGet(ctx, "n1")
	require.NoError(t, err)
	require.Equal(t, bson.Raw(tok2), got)
}

func testNodeDrainList(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	_, err := s.NodeDrain(ctx, store.NodeDrainParams{Node: "nobody"})
	require.ErrorIs(t, err, store.ErrNotFound)
	_, err = s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "n1", State: schema.NodeStateRunning})
	require.NoError(t, err)
	n, err := s.NodeDrain(ctx, store.NodeDrainParams{Node: "n1"})
	require.NoError(t, err)
	require.True(t, n.Drain)
	before, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "n1", State: schema.NodeStateDraining})
	require.NoError(t, err)
	require.True(t, before.Drain, "the heartbeat reads the drain request")
	require.Equal(t, schema.NodeStateRunning, before.State)
	_, err = db.Collection("nodes").InsertOne(ctx, bson.D{{Key: "node", Value: "bad"}, {Key: "drain", Value: "yes"}})
	require.NoError(t, err)
	list, err := s.NodeList(ctx)
	require.NoError(t, err)
	require.Len(t, list.Nodes, 1)
	require.Equal(t, schema.NodeStateDraining, list.Nodes[0].State)
	require.True(t, list.Nodes[0].Drain, "a heartbeat keeps the request")
	require.Len(t, list.Malformed, 1)
	require.ErrorContains(t, list.Malformed[0], `"drain"`)
	require.WithinDuration(t, time.Now(), list.Now, 5*time.Second)
	// A new run clears the request.
	_, err = s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "n1", State: schema.NodeStateRunning, ClearDrain: true})
	require.NoError(t, err)
	n, err = s.NodeGet(ctx, "n1")
	require.NoError(t, err)
	require.False(t, n.Drain)
}

// setNodeAge moves a node's heartbeat into the past.
func setNodeAge(t *testing.T, db *mongo.Database, node string, age time.Duration) {
	_, err := db.Collection("nodes").UpdateOne(ctxT(t), bson.D{{Key: "node", Value: node}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "timestamp", Value: time.Now().Add(-age)}}}})
	require.NoError(t, err)
}

// testNodesDeadRecoverStoppedLeavingTasks: a node that stopped leaving
// tasks running in its name (its last heartbeat says how many: supervised
// ones left running, results not written) is judged as a silent node is,
// so that its tasks are recovered should it never come back; one that
// stopped leaving none is not. A heartbeat after the stop removes the
// count.
func testNodesDeadRecoverStoppedLeavingTasks(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 2)
	for i, n := range []struct {
		name string
		left int
	}{{"left", 1}, {"clean", 0}} {
		_, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: n.name, State: schema.NodeStateStopped, LeftTasks: n.left})
		require.NoError(t, err)
		_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[i]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "node", Value: n.name}, {Key: "status", Value: 0}}}})
		require.NoError(t, err)
		setNodeAge(t, db, n.name, time.Minute)
	}
	require.EqualValues(t, 1, rawDoc(t, db, "nodes", bson.D{{Key: "node", Value: "left"}}).Lookup(schema.NodeLeftTasks).AsInt64())
	dead, err := s.NodesDeadRecover(ctx, store.NodesDeadRecoverParams{DeadAfter: 30 * time.Second, By: "n1"})
	require.NoError(t, err)
	require.Len(t, dead, 1, "%+v", dead)
	require.Equal(t, "left", dead[0].Node)
	require.Equal(t, int64(1), dead[0].Orphaned)
	require.EqualValues(t, schema.StatusOrphaned, rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: ids[0]}}).Lookup("status").Int32())
	require.EqualValues(t, schema.StatusRunning, rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: ids[1]}}).Lookup("status").Int32(),
		"a node that stopped leaving nothing is not judged")

	_, err = s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "left", State: schema.NodeStateRunning})
	require.NoError(t, err)
	_, err = rawDoc(t, db, "nodes", bson.D{{Key: "node", Value: "left"}}).LookupErr(schema.NodeLeftTasks)
	require.Error(t, err, "a heartbeat after the stop keeps the count")
}

func testNodesDeadRecover(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 6)
	for _, n := range []string{"dead", "alive", "stopped"} {
		_, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: n, State: schema.NodeStateRunning})
		require.NoError(t, err)
	}
	_, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "stopped", State: schema.NodeStateStopped})
	require.NoError(t, err)
	_, err = db.Collection("nodes").InsertOne(ctx, bson.D{{Key: "node", Value: "perl-epoch"}, {Key: "timestamp", Value: 1700000000}})
	require.NoError(t, err)
	set := func(id bson.ObjectID, node string, status int) {
		_, err := db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "node", Value: node}, {Key: "status", Value: status}}}})
		require.NoError(t, err)
	}
	set(ids[0], "dead", -1)
	set(ids[1], "dead", 0)
	set(ids[2], "dead", 1)
	set(ids[3], "alive", 0)
	set(ids[4], "perl-epoch", 0)
	set(ids[5], "stopped", 0)
	setNodeAge(t, db, "dead", time.Minute)
	setNodeAge(t, db, "alive", 2*time.Second)
	setNodeAge(t, db, "stopped", time.Minute)
	// The dead node died inside a transaction that holds its claimed task,
	// which the recovery writes: its recorded session is killed first.
	sess, err := db.Client().StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	require.NoError(t, sess.StartTransaction())
	_, err = db.Collection("tasks").UpdateOne(mongo.NewSessionContext(ctx, sess), bson.D{{Key: "_id", Value: ids[0]}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "left_open", Value: true}}}})
	require.NoError(t, err)
	_, err = db.Collection(store.CollSessions).InsertOne(ctx, bson.D{{Key: "_id", Value: sess.ID().Lookup("id")},
		{Key: "lsid", Value: sess.ID()}, {Key: "node", Value: "dead"}, {Key: "ctime", Value: time.Now()}})
	require.NoError(t, err)

	rctx, cancel := context.WithTimeout(ctx, 20*time.Second) // not the server's 60 s transaction lifetime
	defer cancel()
	dead, err := s.NodesDeadRecover(rctx, store.NodesDeadRecoverParams{DeadAfter: 30 * time.Second, By: "alive"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "dead", dead[0].Node)
	require.Equal(t, 1, dead[0].Sessions)
	require.NoError(t, dead[0].SessionsErr)
	require.Equal(t, int64(1), dead[0].Requeued)
	require.Equal(t, int64(1), dead[0].Orphaned)
	require.WithinDuration(t, time.Now().Add(-time.Minute), dead[0].Since, 5*time.Second)

	status := func(id bson.ObjectID) (any, int32) {
		raw := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: id}})
		node := raw.Lookup("node")
		var n any
		if v, ok := node.StringValueOK(); ok {
			n = v
		} else {
			n = node.AsInt64()
		}
		return n, raw.Lookup("status").Int32()
	}
	for i, want := range []struct {
		node   any
		status int32
	}{{int64(-1), -2}, {"dead", -6}, {"dead", 1}, {"alive", 0}, {"perl-epoch", 0}, {"stopped", 0}} {
		node, st := status(ids[i])
		require.Equal(t, want.node, node, "task %d", i)
		require.Equal(t, want.status, st, "task %d", i)
	}
	d, err := s.NodeGet(ctx, "dead")
	require.NoError(t, err)
	require.True(t, d.Dead)
	require.Equal(t, "alive", d.DeadBy)
	require.WithinDuration(t, time.Now(), d.DeadAt, 5*time.Second)

	// Already dead: not again.
	again, err := s.NodesDeadRecover(ctx, store.NodesDeadRecoverParams{DeadAfter: 30 * time.Second, By: "alive"})
	require.NoError(t, err)
	require.Empty(t, again)

	// The node comes back: its heartbeat says it was declared dead and
	// clears the mark.
	before, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "dead", State: schema.NodeStateRunning})
	require.NoError(t, err)
	require.True(t, before.Dead)
	require.Equal(t, "alive", before.DeadBy)
	d, err = s.NodeGet(ctx, "dead")
	require.NoError(t, err)
	require.False(t, d.Dead)
	require.True(t, d.DeadAt.IsZero())

	_, err = s.NodesDeadRecover(ctx, store.NodesDeadRecoverParams{})
	require.Error(t, err)
}

func testNodesDeadRecoverConcurrent(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 40)
	_, err := s.NodeUpsert(ctx, store.NodeUpsertParams{Node: "gone"})
	require.NoError(t, err)
	for i, id := range ids {
		_, err := db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "node", Value: "gone"}, {Key: "status", Value: -(i % 2)}}}})
		require.NoError(t, err)
	}
	setNodeAge(t, db, "gone", time.Minute)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var requeued, orphaned, declared int64
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dead, err := s.NodesDeadRecover(ctx, store.NodesDeadRecoverParams{DeadAfter: 10 * time.Second, By: fmt.Sprintf("live%d", i)})
			assert.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			for _, d := range dead {
				declared++
				requeued += d.Requeued
				orphaned += d.Orphaned
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(1), declared, "one live node declares it dead")
	require.Equal(t, int64(20), requeued)
	require.Equal(t, int64(20), orphaned)
}

func testTaskClaimMany(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	for _, sort := range []schema.Sort{schema.SortFIFO, schema.SortLIFO} {
		q := newQueue(t, s, "q-"+string(sort), sort)
		ids := insertTasks(t, s, q.ID, 10)
		// One is taken by another node, one is a Disbatch 4.103 task (node
		// null), one is malformed.
		_, err := db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[1]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "node", Value: "other"}, {Key: "status", Value: -1}}}})
		require.NoError(t, err)
		_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[2]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "node", Value: nil}}}})
		require.NoError(t, err)
		_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[3]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "parameters", Value: "not a document"}}}})
		require.NoError(t, err)
		want := append([]bson.ObjectID{ids[0]}, ids[2:]...)
		if sort == schema.SortLIFO {
			want = nil
			for i := len(ids) - 1; i >= 0; i-- {
				if i != 1 {
					want = append(want, ids[i])
				}
			}
		}
		res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: sort, Limit: 4})
		require.NoError(t, err)
		require.False(t, res.Short, "the queue held more than asked")
		var got []bson.ObjectID
		for _, task := range res.Tasks {
			require.Equal(t, schema.StatusClaimed, task.Status)
			require.Equal(t, "n1", task.Node)
			got = append(got, task.ID)
		}
		for _, m := range res.Malformed {
			got = append(got, m.ID)
		}
		require.ElementsMatch(t, want[:4], got, "the first 4 claimable in %s order", sort)
		if sort == schema.SortFIFO {
			require.Len(t, res.Malformed, 1)
			require.Equal(t, ids[3], res.Malformed[0].ID)
			require.ErrorContains(t, res.Errors[0], `"parameters"`)
		}
		rest, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n2", Sort: sort, Limit: 100})
		require.NoError(t, err)
		require.Len(t, rest.Tasks, len(want)-4-len(rest.Malformed))
		require.True(t, rest.Short, "the queue held fewer than asked")
		for _, task := range rest.Tasks {
			require.Equal(t, "n2", task.Node)
		}
		empty, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: sort, Limit: 4})
		require.NoError(t, err)
		require.Empty(t, empty.Tasks)
		require.True(t, empty.Short)
		require.Equal(t, "other", rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: ids[1]}}).Lookup("node").StringValue(), "another node's claim is left alone")
	}
	_, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: bson.NewObjectID(), Node: "n1", Limit: 0})
	require.ErrorContains(t, err, "limit 0")
}

// testTaskClaimSkipNullNode: SkipNullNode leaves tasks with node null or
// none (Disbatch 4.103's unclaimed) alone, the claim without it takes
// them in their turn, and NullNode counts them among the candidates.
func testTaskClaimSkipNullNode(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 6)
	_, err := db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[1]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "node", Value: nil}}}})
	require.NoError(t, err)
	_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[2]}}, bson.D{{Key: "$unset", Value: bson.D{{Key: "node", Value: ""}}}})
	require.NoError(t, err)
	_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[5]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "node", Value: nil}}}})
	require.NoError(t, err)

	res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{ids[0]}, claimedIDs(res))
	require.Zero(t, res.NullNode, "the one candidate had node -1")

	res, err = s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 1, SkipNullNode: true})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{ids[3]}, claimedIDs(res), "node -1 only: ids[1] and ids[2] are passed")
	require.Zero(t, res.NullNode)
	one, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, SkipNullNode: true})
	require.NoError(t, err)
	require.Equal(t, ids[4], one.ID)
	_, err = s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, SkipNullNode: true})
	require.ErrorIs(t, err, store.ErrNoTask, "only tasks with node null or none are left")
	res, err = s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 4, SkipNullNode: true})
	require.NoError(t, err)
	require.Empty(t, res.Tasks)

	res, err = s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{ids[1], ids[2]}, claimedIDs(res), "null and none, in their order")
	require.Equal(t, 2, res.NullNode)
	one, err = s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.Equal(t, ids[5], one.ID)
	require.Equal(t, "n1", one.Node)
}

// testTaskClaimManyPassesExpired: a batched claim never takes a task past
// its expires_at, with or without node null, and passes such tasks at the
// head of the queue to claim the ones behind them.
func testTaskClaimManyPassesExpired(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 8)
	expired := []bson.ObjectID{ids[0], ids[1], ids[4]}
	_, err := db.Collection("tasks").UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: expired}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "expires_at", Value: time.Now().Add(-time.Second)}}}})
	require.NoError(t, err)

	res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 2, SkipNullNode: true})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{ids[2], ids[3]}, claimedIDs(res), "the two expired at the head are passed")
	require.False(t, res.Lost)
	res, err = s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 2})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{ids[5], ids[6]}, claimedIDs(res), "with node null looked for too")
	res, err = s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 4, SkipNullNode: true})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{ids[7]}, claimedIDs(res))
	res, err = s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 4, SkipNullNode: true})
	require.NoError(t, err)
	require.Empty(t, res.Tasks, "only expired tasks are left")
	require.False(t, res.Lost, "a queue holding only expired tasks is empty, not lost")
	for _, id := range expired {
		raw := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: id}})
		require.Equal(t, int64(schema.StatusQueued), raw.Lookup("status").AsInt64(), "task %s", id.Hex())
		require.Equal(t, int64(schema.Unclaimed), raw.Lookup("node").AsInt64(), "task %s", id.Hex())
	}
}

// testTaskClaimManyCandidatesFromTheIndex: a batched claim that looks
// for node -1 only reads its candidates from the claim index, without
// fetching a document (the database profiler's docsExamined), however
// many it reads for the few it takes (Spread); the update then examines
// only those.
func testTaskClaimManyCandidatesFromTheIndex(t *testing.T, newStore Factory) {
	ctx := ctxT(t)
	s, db, q := indexedQueue(ctx, t, newStore, 80)
	// The head of the queue claimed, as in a drain: MongoDB then plans
	// the read on the claim index rather than on _id.
	_, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n0", Sort: schema.SortFIFO, Limit: 40, SkipNullNode: true})
	require.NoError(t, err)
	profileAll(ctx, t, db)
	res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 4, Spread: 8, SkipNullNode: true})
	require.NoError(t, err)
	require.Len(t, res.Tasks, 4)
	cur, err := db.Collection("system.profile").Find(ctx, bson.D{{Key: "ns", Value: db.Name() + ".tasks"}, {Key: "op", Value: bson.D{{Key: "$in", Value: bson.A{"query", "update"}}}}},
		options.Find().SetSort(bson.D{{Key: "$natural", Value: 1}})) // the order they ran: ts has milliseconds
	require.NoError(t, err)
	var ops []struct {
		Op           string `bson:"op"`
		KeysExamined int    `bson:"keysExamined"`
		DocsExamined int    `bson:"docsExamined"`
		PlanSummary  string `bson:"planSummary"`
	}
	require.NoError(t, cur.All(ctx, &ops))
	require.GreaterOrEqual(t, len(ops), 3, "the candidates' read, the update, the read-back")
	require.Equal(t, "query", ops[0].Op)
	require.GreaterOrEqual(t, ops[0].KeysExamined, 32, "Limit x Spread candidates read")
	require.Zero(t, ops[0].DocsExamined, "the candidates are read from the index alone: %s", ops[0].PlanSummary)
	require.Equal(t, "update", ops[1].Op)
	require.Equal(t, 4, ops[1].DocsExamined, "the update examines the tasks it claims")
}

// testTaskClaimManyOneReplyPerRead: a batched claim is three round trips
// however many tasks it reads: its candidates and its read-back come in
// one reply each, never followed by a getMore (the server's first reply
// holds 101 documents unless told), so a contended queue's spread read of
// up to MaxClaimBatch candidates, or a batch above 101, costs no fourth.
func testTaskClaimManyOneReplyPerRead(t *testing.T, newStore Factory) {
	for _, c := range []struct {
		name          string
		limit, spread int
	}{{"a spread read of 256", 40, 8}, {"a batch of 200", 200, 1}} {
		t.Run(c.name, func(t *testing.T) {
			// A database each: the profiler holds only this claim's
			// operations on tasks, in the order they ran ($natural).
			ctx := ctxT(t)
			s, db, q := indexedQueue(ctx, t, newStore, 300)
			profileAll(ctx, t, db)
			res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: c.limit, Spread: c.spread, SkipNullNode: true})
			require.NoError(t, err)
			require.Len(t, res.Tasks, c.limit)
			cur, err := db.Collection("system.profile").Find(ctx, bson.D{{Key: "ns", Value: db.Name() + ".tasks"}},
				options.Find().SetSort(bson.D{{Key: "$natural", Value: 1}}))
			require.NoError(t, err)
			var ops []struct {
				Op        string `bson:"op"`
				NReturned int    `bson:"nreturned"`
			}
			require.NoError(t, cur.All(ctx, &ops))
			var names []string
			for _, op := range ops {
				names = append(names, op.Op)
			}
			require.Equal(t, []string{"query", "update", "query"}, names, "the candidates, the claim, the read-back")
			require.Equal(t, min(c.limit*c.spread, store.MaxClaimBatch), ops[0].NReturned, "every candidate in the first reply")
			require.Equal(t, c.limit, ops[2].NReturned, "every task claimed in the first reply")
		})
	}
}

// indexedQueue is a store with its indexes and a fifo queue of n tasks.
func indexedQueue(ctx context.Context, t *testing.T, newStore Factory, n int) (*store.Store, *mongo.Database, schema.Queue) {
	t.Helper()
	s, db := newStore(t, store.Options{})
	require.NoError(t, s.IndexesEnsure(ctx))
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, n)
	return s, db, q
}

// profileAll has the database profiler record every operation on db
// until the test ends.
func profileAll(ctx context.Context, t *testing.T, db *mongo.Database) {
	t.Helper()
	require.NoError(t, db.RunCommand(ctx, bson.D{{Key: "profile", Value: 2}}).Err())
	t.Cleanup(func() { _ = db.RunCommand(context.Background(), bson.D{{Key: "profile", Value: 0}}).Err() })
}

// testTaskClaimFrom: From bounds a fifo claim below by _id (a lifo one
// not), and First is the first candidate a fifo batch read.
func testTaskClaimFrom(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "fifo", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 8)

	res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 2, From: ids[3]})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{ids[3], ids[4]}, claimedIDs(res), "from ids[3] on")
	require.Equal(t, ids[3], res.First)
	one, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, From: ids[4]})
	require.NoError(t, err)
	require.Equal(t, ids[5], one.ID, "the first queued at or after ids[4]")
	res, err = s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 8})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{ids[0], ids[1], ids[2], ids[6], ids[7]}, claimedIDs(res), "no bound: from the head")
	require.Equal(t, ids[0], res.First)
	res, err = s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 8})
	require.NoError(t, err)
	require.Empty(t, res.Tasks)
	require.Zero(t, res.First, "nothing read")

	lifo := newQueue(t, s, "lifo", schema.SortLIFO)
	lids := insertTasks(t, s, lifo.ID, 3)
	res, err = s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: lifo.ID, Node: "n1", Sort: schema.SortLIFO, Limit: 3, From: lids[2]})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{lids[2], lids[1], lids[0]}, claimedIDs(res), "lifo: no bound")
	require.Zero(t, res.First, "lifo: none reported")
}

func testTaskClaimManyConcurrent(t *testing.T, newStore Factory) {
	claimManyConcurrently(t, newStore, 32, 0)
}

// claimManyConcurrently has 4 claimers take 1000 tasks with batched claims
// of limit (spread) and checks each is claimed once.
func claimManyConcurrently(t *testing.T, newStore Factory, limit, spread int) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 1000)
	claimConcurrently(t, 4, 1000, func(node string) ([]bson.ObjectID, bool, error) {
		res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: node, Sort: schema.SortFIFO, Limit: limit, Spread: spread})
		if err != nil {
			return nil, false, err
		}
		if len(res.Tasks) == 0 {
			// Empty, or others won every candidate three times.
			n, err := db.Collection("tasks").CountDocuments(ctx, bson.D{{Key: "status", Value: -2}})
			return nil, n == 0, err
		}
		ids := make([]bson.ObjectID, len(res.Tasks))
		for i, task := range res.Tasks {
			ids[i] = task.ID
		}
		return ids, false, nil
	})
}

// A spread claim takes Limit tasks from the first Limit x Spread, in claim
// order, not always the first Limit; with fewer queued it takes them all.
func testTaskClaimManySpread(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 100)
	rank := map[bson.ObjectID]int{}
	for i, id := range ids {
		rank[id] = i
	}
	queued := slices.Clone(ids) // still queued, oldest first
	notFirst := false
	for range 5 {
		res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 4, Spread: 3})
		require.NoError(t, err)
		require.Len(t, res.Tasks, 4)
		window := queued[:12]
		last := -1
		for i, task := range res.Tasks {
			require.Contains(t, window, task.ID, "within the 12 oldest still queued")
			r := rank[task.ID]
			require.Greater(t, r, last, "in claim order")
			last = r
			if task.ID != queued[i] {
				notFirst = true
			}
		}
		for _, task := range res.Tasks {
			queued = slices.DeleteFunc(queued, func(id bson.ObjectID) bool { return id == task.ID })
		}
	}
	require.True(t, notFirst, "five spread claims all took exactly the oldest tasks")

	q2 := newQueue(t, s, "few", schema.SortFIFO)
	few := insertTasks(t, s, q2.ID, 3)
	res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q2.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 4, Spread: 8})
	require.NoError(t, err)
	got := make([]bson.ObjectID, len(res.Tasks))
	for i, task := range res.Tasks {
		got[i] = task.ID
	}
	require.Equal(t, few, got, "all three, in order")

	// A priority queue is never spread: higher first, whatever the spread
	// asked (a contended claimer's doubling of it would otherwise take
	// tasks of no priority while priority-9 ones wait).
	pq := newQueue(t, s, "prio", schema.SortPriority)
	high := map[bson.ObjectID]bool{}
	for range 4 {
		ids, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: pq.ID, Parameters: []bson.Raw{nil}, Control: &store.TaskInsertControl{Priority: 9}})
		require.NoError(t, err)
		high[ids[0]] = true
	}
	insertTasks(t, s, pq.ID, 28)
	res, err = s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: pq.ID, Node: "n1", Sort: schema.SortPriority, Limit: 4, Spread: 8})
	require.NoError(t, err)
	require.Len(t, res.Tasks, 4)
	for _, task := range res.Tasks {
		require.True(t, high[task.ID], "a spread priority claim took a task of lower priority")
	}
}

// A spread claim with Prefer takes the first Limit candidates it prefers,
// in claim order; short of them, it takes the ones it prefers and others
// of the window to make up Limit.
func testTaskClaimManyPrefer(t *testing.T, newStore Factory) {
	s, _ := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 24)
	prefer := func(id bson.ObjectID) bool { return slices.Index(ids, id)%2 == 1 } // the odd ones
	res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 4, Spread: 4, Prefer: prefer})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{ids[1], ids[3], ids[5], ids[7]}, claimedIDs(res), "the first four it prefers")

	// Still queued, oldest first: 0 2 4 6 8 9 10 ... The window of 16 ends
	// at ids[19]; it prefers ids[9] and ids[23] (beyond the window) only.
	only := func(id bson.ObjectID) bool { return id == ids[9] || id == ids[23] }
	res, err = s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 4, Spread: 4, Prefer: only})
	require.NoError(t, err)
	got := claimedIDs(res)
	require.Len(t, got, 4)
	require.Contains(t, got, ids[9], "the one it prefers within the window")
	require.True(t, slices.IsSortedFunc(got, func(a, b bson.ObjectID) int { return strings.Compare(a.Hex(), b.Hex()) }), "in claim order: %v", got)
	window := append([]bson.ObjectID{ids[0], ids[2], ids[4], ids[6], ids[8]}, ids[9:20]...)
	for _, id := range got {
		require.Contains(t, window, id, "the others from the window of 16")
	}
}

// Spread claims by concurrent nodes still claim each task once.
func testTaskClaimManySpreadConcurrent(t *testing.T, newStore Factory) {
	claimManyConcurrently(t, newStore, 16, 4)
}

func testTaskStartFinishMany(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{OutputThreshold: 1 << 20})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 5)
	res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 5})
	require.NoError(t, err)
	require.Len(t, res.Tasks, 5)
	var ps []store.TaskTransitionParams
	for _, task := range res.Tasks {
		ps = append(ps, store.TaskTransitionParams{ID: task.ID, Node: "n1"})
	}
	// Task 1 is taken away before it starts; task 2 already started (an
	// earlier attempt landed).
	_, err = db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: ps[1].ID}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -6}}}})
	require.NoError(t, err)
	require.NoError(t, s.TaskStart(ctx, ps[2]))
	errs := s.TaskStartMany(ctx, ps)
	require.Len(t, errs, 5)
	for i, err := range errs {
		if i == 1 {
			require.ErrorIs(t, err, store.ErrLostTask)
			continue
		}
		require.NoError(t, err, "task %d", i)
	}
	big := strings.Repeat("x", 200<<10) // over threshold/16: written alone
	fs := []store.TaskFinishParams{
		{ID: ps[0].ID, Node: "n1", Status: schema.StatusSucceeded, Stdout: "zero"},
		{ID: ps[1].ID, Node: "n1", Status: schema.StatusSucceeded, Stdout: "lost"},
		{ID: ps[2].ID, Node: "n1", Status: schema.StatusFailed, Stderr: "two"},
		{ID: ps[3].ID, Node: "n1", Status: schema.StatusSucceeded, Stdout: big},
		{ID: ps[4].ID, Node: "n2", Status: schema.StatusSucceeded, Stdout: "not n2's"},
	}
	errs = s.TaskFinishMany(ctx, fs)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], store.ErrLostTask)
	require.NoError(t, errs[2])
	require.NoError(t, errs[3])
	require.ErrorIs(t, errs[4], store.ErrLostTask)
	for i, want := range []struct {
		status int32
		stdout string
	}{{1, "zero"}, {-6, ""}, {2, ""}, {1, big}, {0, ""}} {
		got, err := s.TaskGet(ctx, fs[i].ID)
		require.NoError(t, err)
		require.Equal(t, want.status, int32(got.Status), "task %d", i)
		if want.stdout != "" {
			require.Equal(t, want.stdout, got.Stdout.Text, "task %d", i)
		}
	}
	require.Equal(t, "two", rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: fs[2].ID}}).Lookup("stderr").StringValue())
}

func testTaskListClaimedUnstart(t *testing.T, newStore Factory) {
	now := time.Now()
	s, _ := newStore(t, store.Options{Now: func() time.Time { return now }})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 3)
	old, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	now = now.Add(time.Minute)
	recent, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	_, err = s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n2", Sort: schema.SortFIFO})
	require.NoError(t, err)
	ids, err := s.TaskListClaimed(ctx, store.TaskListClaimedParams{Node: "n1", ClaimedFor: 30 * time.Second})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{old.ID}, ids, "only n1's claims older than the cut")

	// In _id order, a page at a time after After.
	now = now.Add(time.Minute)
	more := insertTasks(t, s, q.ID, 3)
	for range more {
		_, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO})
		require.NoError(t, err)
	}
	now = now.Add(time.Minute)
	all := append([]bson.ObjectID{old.ID, recent.ID}, more...)
	first, err := s.TaskListClaimed(ctx, store.TaskListClaimedParams{Node: "n1", ClaimedFor: 30 * time.Second, Limit: 3})
	require.NoError(t, err)
	require.Equal(t, all[:3], first)
	rest, err := s.TaskListClaimed(ctx, store.TaskListClaimedParams{Node: "n1", ClaimedFor: 30 * time.Second, Limit: 3, After: first[2]})
	require.NoError(t, err)
	require.Equal(t, all[3:], rest)

	me := store.TaskTransitionParams{ID: recent.ID, Node: "n1"}
	require.ErrorIs(t, s.TaskUnstart(ctx, me), store.ErrLostTask, "not running")
	require.NoError(t, s.TaskStart(ctx, me))
	require.NoError(t, s.TaskUnstart(ctx, me))
	got, err := s.TaskGet(ctx, recent.ID)
	require.NoError(t, err)
	require.Equal(t, schema.StatusQueued, got.Status)
	require.Equal(t, "", got.Node, "node -1: unclaimed")
}

// testTaskClaimStart: a claim with Start takes tasks straight to status 0
// (one write, no -1), clears a reason left by an earlier attempt as the
// start does, still claims a task whose kill was requested before it was
// requeued (its runner starts it killed), and is listed, old enough, by
// TaskListClaimed with Running; its tasks go back with TaskUnstart.
func testTaskClaimStart(t *testing.T, newStore Factory) {
	now := time.Now()
	s, db := newStore(t, store.Options{Now: func() time.Time { return now }})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	ids := insertTasks(t, s, q.ID, 5)
	_, err := db.Collection("tasks").UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[1]}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: schema.TaskReason, Value: schema.ReasonRetrying}, {Key: schema.TaskKill, Value: bson.D{{Key: "node", Value: "gone"}, {Key: "by", Value: "ops"}}}}}})
	require.NoError(t, err)

	one, err := s.TaskClaim(ctx, store.TaskClaimParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Start: true})
	require.NoError(t, err)
	require.Equal(t, ids[0], one.ID)
	require.Equal(t, schema.StatusRunning, one.Status)
	now = now.Add(time.Minute)
	res, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q.ID, Node: "n1", Sort: schema.SortFIFO, Limit: 3, Start: true})
	require.NoError(t, err)
	require.Len(t, res.Tasks, 3)
	for i, task := range res.Tasks {
		require.Equal(t, ids[i+1], task.ID, "claim order")
		require.Equal(t, schema.StatusRunning, task.Status)
		doc := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: task.ID}})
		require.Equal(t, int32(0), doc.Lookup("status").Int32())
		_, hasReason := doc.Lookup(schema.TaskReason).StringValueOK()
		require.False(t, hasReason, "the start's $unset of the reason")
	}
	require.NotNil(t, res.Tasks[0].Control.Kill, "a kill requested before the requeue comes with the task")

	// Only claims older than the cut, only in status 0 with Running.
	ids0, err := s.TaskListClaimed(ctx, store.TaskListClaimedParams{Node: "n1", Running: true, ClaimedFor: 30 * time.Second})
	require.NoError(t, err)
	require.Equal(t, []bson.ObjectID{one.ID}, ids0)
	none, err := s.TaskListClaimed(ctx, store.TaskListClaimedParams{Node: "n1", ClaimedFor: 30 * time.Second})
	require.NoError(t, err)
	require.Empty(t, none, "nothing in -1")
	require.NoError(t, s.TaskUnstart(ctx, store.TaskTransitionParams{ID: one.ID, Node: "n1"}))
	back, err := s.TaskGet(ctx, one.ID)
	require.NoError(t, err)
	require.Equal(t, schema.StatusQueued, back.Status)
}
