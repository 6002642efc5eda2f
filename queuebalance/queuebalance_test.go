package queuebalance_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

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
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	one := 1
	for _, name := range []string{"a", "b", "other"} {
		_, err := s.QueueCreate(ctx, store.QueueCreateParams{Name: name, Constructor: "Disbatch::Plugin::Demo", MaxThreads: &one})
		require.NoError(t, err)
	}
	// Counters as the projector keeps them: 10 queued each.
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
