package queuebalance_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/queuebalance"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

// TestPassAppliesTheBalanceDocument: the leader's pass caps the listed
// queues through max_running (and threads, for 4.103 nodes), holds them
// at 0, honours disabled, and writes the status /monitoring reports.
func TestPassAppliesTheBalanceDocument(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := withQueues(t, "a", "b", "other")
	// 10 queued each, and the counters as the projector keeps them.
	queued(t, s, "a", 10)
	queued(t, s, "b", 10)
	_, err := db.Collection(schema.CollQueues).UpdateMany(ctx, bson.D{}, bson.D{{Key: "$set", Value: bson.D{
		{Key: "count_todo", Value: 10}, {Key: "count_total", Value: 10}, {Key: "count_running", Value: 0}, {Key: "count_failed", Value: 0}}}})
	require.NoError(t, err)
	require.NoError(t, s.BalanceSet(ctx, bson.D{{Key: "max_tasks", Value: bson.D{{Key: "* 00:00", Value: 6}}}, {Key: "queues", Value: bson.A{bson.A{"a", "b"}}}}))

	clk := clock.NewFake(time.Date(2026, 11, 23, 12, 0, 0, 0, time.Local))
	b := queuebalance.New(queuebalance.Config{Store: s, Clock: clk})
	queue := func(name string) bson.M {
		var q bson.M
		require.NoError(t, db.Collection(schema.CollQueues).FindOne(ctx, bson.D{{Key: "name", Value: name}}).Decode(&q))
		return q
	}
	balance := func() bson.M {
		var d bson.M
		require.NoError(t, db.Collection(store.CollBalance).FindOne(ctx, bson.D{}).Decode(&d))
		return d
	}

	b.Pass(ctx)
	for _, n := range []string{"a", "b"} {
		q := queue(n)
		require.EqualValues(t, 3, q["max_running"], n)
		require.EqualValues(t, 3, q["threads"], "%s: 4.103 nodes read threads", n)
	}
	require.NotContains(t, queue("other"), "max_running", "queues the document does not list are left alone")
	d := balance()
	require.Equal(t, "OK", d["status"])
	require.Equal(t, "QueueBalance is running", d["message"])
	require.EqualValues(t, clk.Now().Unix(), d["timestamp"])

	// A cap of 0 holds the queues (max_running 0 would mean no cap).
	require.NoError(t, s.BalanceSet(ctx, bson.D{{Key: "max_tasks", Value: bson.D{{Key: "* 00:00", Value: 0}}}}))
	b.Pass(ctx)
	for _, n := range []string{"a", "b"} {
		q := queue(n)
		require.Equal(t, true, q["balance_hold"], n)
		require.EqualValues(t, 0, q["threads"], n)
	}
	qs, err := s.QueueList(ctx)
	require.NoError(t, err)
	for _, q := range qs.Queues {
		require.Equal(t, q.Name != "other", q.Sched.BalanceHold, q.Name)
	}
	// And released again.
	require.NoError(t, s.BalanceSet(ctx, bson.D{{Key: "max_tasks", Value: bson.D{{Key: "* 00:00", Value: 4}}}}))
	b.Pass(ctx)
	require.NotContains(t, queue("a"), "balance_hold")
	require.EqualValues(t, 2, queue("a")["max_running"])

	// Disabled until later: nothing changes, and the status says so.
	until := clk.Now().Add(time.Hour)
	require.NoError(t, s.BalanceSet(ctx, bson.D{{Key: "disabled", Value: until.Unix()}, {Key: "max_tasks", Value: bson.D{{Key: "* 00:00", Value: 8}}}}))
	b.Pass(ctx)
	require.EqualValues(t, 2, queue("a")["max_running"])
	require.True(t, strings.HasPrefix(balance()["message"].(string), "QueueBalance disabled until "))
	// Once past, cleared, and applied.
	clk.Advance(2 * time.Hour)
	b.Pass(ctx)
	require.EqualValues(t, 4, queue("a")["max_running"])
	require.Nil(t, balance()["disabled"])

	// A document it cannot use: CRITICAL, with why.
	require.NoError(t, s.BalanceSet(ctx, bson.D{{Key: "queues", Value: "a,b"}}))
	b.Pass(ctx)
	d = balance()
	require.Equal(t, "CRITICAL", d["status"])
	require.Contains(t, d["message"], "QueueBalance: queues")
}

// queued inserts n tasks that may run now (status -2) into the queue name.
func queued(t *testing.T, s *store.Store, name string, n int) []bson.ObjectID {
	t.Helper()
	q, err := s.QueueGet(context.Background(), store.QueueGetParams{Ref: name})
	require.NoError(t, err)
	params := make([]bson.Raw, n)
	for i := range params {
		params[i] = bson.Raw{5, 0, 0, 0, 0}
	}
	ids, err := s.TaskInsertMany(context.Background(), store.TaskInsertManyParams{Queue: q.ID, Parameters: params})
	require.NoError(t, err)
	return ids
}

// TestPassGivesCapsToTasksThatMayRun: a later group's tasks held (a
// delay, parents to wait for) or orphaned take none of the default
// group's share (4.103 counted every status <= -2: the default group was
// held while the later group could run nothing); its running tasks do.
func TestPassGivesCapsToTasksThatMayRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := withQueues(t, "default", "oneoff")
	queued(t, s, "default", 20)
	later := queued(t, s, "oneoff", 50)
	_, err := db.Collection(schema.CollTasks).UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: later[:40]}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -4}, {Key: "not_before", Value: time.Now().Add(24 * time.Hour)}}}})
	require.NoError(t, err)
	_, err = db.Collection(schema.CollTasks).UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: later[40:47]}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: -6}}}})
	require.NoError(t, err)
	_, err = db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "name", Value: "oneoff"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "count_running", Value: 2}}}})
	require.NoError(t, err)
	require.NoError(t, s.BalanceSet(ctx, bson.D{{Key: "max_tasks", Value: bson.D{{Key: "* 00:00", Value: 10}}}, {Key: "queues", Value: bson.A{bson.A{"default"}, bson.A{"oneoff"}}}}))
	queuebalance.New(queuebalance.Config{Store: s}).Pass(ctx)
	got := map[string]int{}
	qs, err := s.QueueList(ctx)
	require.NoError(t, err)
	for _, q := range qs.Queues {
		require.False(t, q.Sched.BalanceHold, q.Name)
		got[q.Name] = q.Sched.MaxRunning
	}
	require.Equal(t, map[string]int{"default": 5, "oneoff": 5}, got, "oneoff: 3 queued and 2 running")
}

// TestPassPutsThreadsBack: threads, which 4.103's nodes read as the cap,
// written since by a 4.103 web or node, is written again to the cap, held
// or not.
func TestPassPutsThreadsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := withQueues(t, "held", "capped")
	queued(t, s, "capped", 10)
	require.NoError(t, s.BalanceSet(ctx, bson.D{{Key: "max_tasks", Value: bson.D{{Key: "* 00:00", Value: 3}}}, {Key: "queues", Value: bson.A{bson.A{"capped", "held"}}}}))
	b := queuebalance.New(queuebalance.Config{Store: s})
	b.Pass(ctx)
	threads := func(name string) any {
		var q bson.M
		require.NoError(t, db.Collection(schema.CollQueues).FindOne(ctx, bson.D{{Key: "name", Value: name}}).Decode(&q))
		return q["threads"]
	}
	require.EqualValues(t, 0, threads("held"))
	require.EqualValues(t, 3, threads("capped"))
	// What 4.103's update-queue writes, and what a 4.103 node writes when
	// its plugin fails to load.
	_, err := db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "name", Value: "held"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "threads", Value: 8}}}})
	require.NoError(t, err)
	_, err = db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "name", Value: "capped"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "threads", Value: 0}}}})
	require.NoError(t, err)
	b.Pass(ctx)
	require.EqualValues(t, 0, threads("held"))
	require.EqualValues(t, 3, threads("capped"))
}

// TestPassMakesAnEmptyBalanceDocument: with no balance document, a pass
// makes an empty one, as 4.103's queuebalanced does, and says it runs and
// caps nothing (it wrote no status: /monitoring said "unknown status").
func TestPassMakesAnEmptyBalanceDocument(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	queuebalance.New(queuebalance.Config{Store: s}).Pass(ctx)
	raw, err := s.BalanceGet(ctx)
	require.NoError(t, err)
	require.NotNil(t, raw)
	require.Equal(t, "{}", raw.Lookup("max_tasks").String())
	require.Equal(t, "[]", raw.Lookup("queues").String())
	require.Equal(t, "OK", raw.Lookup("status").StringValue())
	require.Equal(t, "QueueBalance is running; the balance document lists no queues and no max_tasks", raw.Lookup("message").StringValue())

	// Queues but no max_tasks: CRITICAL, as before (it would leave the
	// caps of earlier passes in place while saying it caps nothing).
	require.NoError(t, s.BalanceSet(ctx, bson.D{{Key: "queues", Value: bson.A{bson.A{"a"}}}}))
	queuebalance.New(queuebalance.Config{Store: s}).Pass(ctx)
	raw, err = s.BalanceGet(ctx)
	require.NoError(t, err)
	require.Equal(t, "CRITICAL", raw.Lookup("status").StringValue())
	require.Contains(t, raw.Lookup("message").StringValue(), "max_tasks has no entries")
}

// TestPassNeverMakesTheBalanceDocumentOverAnOperators: the empty document
// is made only where there is none, even when an operator's lands between
// the pass's read and its write (it was a $set: it wiped max_tasks and
// queues); and not at all while pretending.
func TestPassNeverMakesTheBalanceDocumentOverAnOperators(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	queuebalance.New(queuebalance.Config{Store: s, Pretend: true}).Pass(ctx)
	raw, err := s.BalanceGet(ctx)
	require.NoError(t, err)
	require.Nil(t, raw, "pretend writes nothing")
	racing := &operatorFirst{Store: s}
	queuebalance.New(queuebalance.Config{Store: racing}).Pass(ctx)
	raw, err = s.BalanceGet(ctx)
	require.NoError(t, err)
	require.Equal(t, `{"* 00:00": {"$numberInt":"5"}}`, raw.Lookup("max_tasks").String(), "the operator's")
	n, err := db.Collection(store.CollBalance).CountDocuments(ctx, bson.D{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

// operatorFirst is the store, but an operator's balance document lands
// just before the pass makes the empty one.
type operatorFirst struct{ *store.Store }

func (o *operatorFirst) BalanceCreate(ctx context.Context, fields bson.D) error {
	if err := o.Store.BalanceSet(ctx, bson.D{{Key: "max_tasks", Value: bson.D{{Key: "* 00:00", Value: 5}}}, {Key: "queues", Value: bson.A{}}}); err != nil {
		return err
	}
	return o.Store.BalanceCreate(ctx, fields)
}

// withQueues is a database with these queues (Demo, maxthreads 1), and a
// store on it.
func withQueues(t *testing.T, names ...string) (*mongo.Database, *store.Store) {
	t.Helper()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	one := 1
	for _, name := range names {
		_, err := s.QueueCreate(context.Background(), store.QueueCreateParams{Name: name, Constructor: "Disbatch::Plugin::Demo", MaxThreads: &one})
		require.NoError(t, err)
	}
	return db, s
}
