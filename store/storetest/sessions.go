package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func sessionRecords(t *testing.T, db *mongo.Database, node string) int64 {
	t.Helper()
	n, err := db.Collection(store.CollSessions).CountDocuments(ctxT(t), bson.D{{Key: "node", Value: node}})
	require.NoError(t, err)
	return n
}

// testNodeSessionsKillAbortsAnOpenTransaction: a transaction left open by
// a process killed in its middle holds its write locks until the server's
// transaction lifetime (60 s); killing the sessions recorded under the
// node aborts it at once, frees the lock and forgets the records.
func testNodeSessionsKillAbortsAnOpenTransaction(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)

	// The dead process's transaction, in a session recorded as ForNode's
	// stores record theirs, holding the queue document.
	sess, err := db.Client().StartSession()
	require.NoError(t, err)
	defer sess.EndSession(ctx)
	require.NoError(t, sess.StartTransaction())
	_, err = db.Collection(schema.CollQueues).UpdateOne(mongo.NewSessionContext(ctx, sess),
		bson.D{{Key: "_id", Value: q.ID}}, bson.D{{Key: "$set", Value: bson.D{{Key: "left_open", Value: true}}}})
	require.NoError(t, err)
	_, err = db.Collection(store.CollSessions).InsertOne(ctx, bson.D{{Key: "_id", Value: sess.ID().Lookup("id")},
		{Key: "lsid", Value: sess.ID()}, {Key: "node", Value: "crashed"}, {Key: "ctime", Value: time.Now()}})
	require.NoError(t, err)

	write := func(timeout time.Duration) error {
		wctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := db.Collection(schema.CollQueues).UpdateOne(wctx, bson.D{{Key: "_id", Value: q.ID}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "other", Value: true}}}})
		return err
	}
	require.Error(t, write(500*time.Millisecond), "the open transaction holds the queue document")

	k, err := s.NodeSessionsKill(ctx, "other node")
	require.NoError(t, err)
	require.Zero(t, k, "another node's sessions are left alone")
	k, err = s.NodeSessionsKill(ctx, "crashed")
	require.NoError(t, err)
	require.Equal(t, 1, k)
	require.NoError(t, write(5*time.Second), "the lock is free")
	_, err = rawDoc(t, db, schema.CollQueues, bson.D{{Key: "_id", Value: q.ID}}).LookupErr("left_open")
	require.Error(t, err, "the transaction's write was aborted")
	require.Equal(t, int64(1), sessionRecords(t, db, "crashed"), "the leader's kill keeps the record: the node may be alive")

	// The node's next start kills them again and forgets them.
	k, err = s.NodeSessionsKillForget(ctx, "crashed")
	require.NoError(t, err)
	require.Equal(t, 1, k)
	require.Zero(t, sessionRecords(t, db, "crashed"), "the records are gone")
	k, err = s.NodeSessionsKillForget(ctx, "crashed")
	require.NoError(t, err)
	require.Zero(t, k, "a second kill finds nothing")
}

// testForNodeRecordsItsSessions: a node's store records the session of
// its first transaction, reuses it, keeps using it after the leader killed
// it (the node was wrongly found dead), and forgets it when the node ends
// its sessions.
func testForNodeRecordsItsSessions(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "capped", schema.SortFIFO)
	insertTasks(t, s, q.ID, 10)
	ns := s.ForNode("n1")
	claim := func() error {
		_, err := ns.TaskClaimCapped(ctx, store.TaskClaimCappedParams{Queue: q.ID, Node: "n1", Limit: 1, Max: 100})
		return err
	}
	records := func() []any {
		var ids []any
		cur, err := db.Collection(store.CollSessions).Find(ctx, bson.D{{Key: "node", Value: "n1"}})
		require.NoError(t, err)
		var docs []bson.Raw
		require.NoError(t, cur.All(ctx, &docs))
		for _, d := range docs {
			ids = append(ids, d.Lookup("_id").String())
		}
		return ids
	}
	require.Empty(t, records())
	require.NoError(t, claim())
	first := records()
	require.Len(t, first, 1, "recorded before its transaction")
	require.NoError(t, claim())
	require.Equal(t, first, records(), "the same session, reused")
	require.Zero(t, sessionRecords(t, db, ""), "the plain store records nothing")

	// Found dead while alive: its session is killed, and stays recorded.
	// The node's transactions still work (at most the one in the killed
	// session fails, and a failed session is ended for a new one), and
	// every session it uses is recorded.
	k, err := s.NodeSessionsKill(ctx, "n1")
	require.NoError(t, err)
	require.Equal(t, 1, k)
	var errs int
	for range 3 {
		if claim() != nil {
			errs++
		}
	}
	require.LessOrEqual(t, errs, 1, "at most the claim in the killed session fails")
	require.Len(t, records(), 1, "the session in use is recorded")

	used := records()
	ns.EndSessions(ctx)
	require.Empty(t, records(), "ended and forgotten")
	requireIDsNotReused(t, db, used...)
	require.NoError(t, claim(), "a transaction after the end still runs")
	require.Empty(t, records(), "in a session ended at once")
	ns.OpenSessions()
	require.NoError(t, claim())
	require.Len(t, records(), 1, "pooled again after OpenSessions")
	ns.EndSessions(ctx)
}

// requireIDsNotReused fails when the driver hands out one of ids (as the
// String of an lsid's id) to a new session: a recorded session's id must
// never go back to its pool, since a kill that read the record may still
// come. The driver's pool gives out the session returned last first, so
// an id given back just now is among the first few.
func requireIDsNotReused(t *testing.T, db *mongo.Database, ids ...any) {
	t.Helper()
	var held []*mongo.Session
	defer func() {
		for _, sess := range held {
			sess.EndSession(context.Background())
		}
	}()
	for range 32 {
		sess, err := db.Client().StartSession()
		require.NoError(t, err)
		held = append(held, sess)
		require.NotContains(t, ids, sess.ID().Lookup("id").String(), "a retired session's id was given to a new session")
	}
}
