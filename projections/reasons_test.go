package projections_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/store"
)

// advanceOnceFailing fails one CountersAdvance on cue.
type advanceOnceFailing struct {
	*store.Store
	fail atomic.Bool
}

func (f *advanceOnceFailing) CountersAdvance(ctx context.Context, to store.CounterPosition, adv []store.CounterAdvance) (store.CountersAdvanced, error) {
	if f.fail.CompareAndSwap(true, false) {
		return store.CountersAdvanced{}, errors.New("counters write failed (on cue)")
	}
	return f.Store.CountersAdvance(ctx, to, adv)
}

// TestReasonsAndEventsAreCountedOnceAcrossTerms: a term ends (here a counters
// write fails, which ends it) and the next one, on the same node, reads
// again what came after the last checkpoint. The counters skip what they
// hold; so do the reasons and the events (disbatch_task_reasons_total and
// disbatch_projection_events_total counted them again, and a lease
// handover did the same across two nodes).
func TestReasonsAndEventsAreCountedOnceAcrossTerms(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	s := &advanceOnceFailing{Store: store.New(db, store.Options{})}
	logs := &logBuf{}
	q := newQueue(t, db, "q", 0, true)
	svc := projections.New(projections.Config{Node: "only", Store: s, LeaseTTL: 2 * time.Second, Logger: logger(logs)})
	require.NoError(t, svc.Start(ctx))
	t.Cleanup(svc.Stop)
	require.Eventually(t, func() bool { return svc.Stats().Leader }, 10*time.Second, 10*time.Millisecond)
	// Some events applied, and a checkpoint written after them.
	checkpoint := func() string {
		l, err := s.LeaseGet(ctx, projections.LeaseName)
		require.NoError(t, err)
		return l.Checkpoint.String()
	}
	before, i := checkpoint(), 0
	require.Eventually(t, func() bool {
		insertBurst(t, db, q, i, 1, func(int) any { return -2 })
		i++
		return checkpoint() != before
	}, 10*time.Second, 100*time.Millisecond)
	ids := insertBurst(t, db, q, 1000, 5, func(int) any { return -2 })
	_, err := db.Collection("tasks").UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 2}, {Key: "reason", Value: "cancelled"}}}})
	require.NoError(t, err)
	key := projections.ReasonKey{Queue: q, Reason: "cancelled"}
	require.Eventually(t, func() bool { return svc.Stats().Reasons[key] == 5 }, 10*time.Second, 2*time.Millisecond)
	events := svc.Stats().Events

	s.fail.Store(true)
	insertBurst(t, db, q, 2000, 1, func(int) any { return -2 })
	require.Eventually(t, func() bool { return !s.fail.Load() }, 10*time.Second, 2*time.Millisecond, "the write never failed")
	require.Eventually(t, func() bool { return svc.Stats().Leader }, 20*time.Second, 10*time.Millisecond)
	// Exact with one more task: the new term has read past the events it
	// read again.
	insertBurst(t, db, q, 3000, 1, func(int) any { return -2 })
	requireExact(t, s.Store, 10*time.Second)
	require.EqualValues(t, 5, svc.Stats().Reasons[key], "5 cancels written; logs:\n%s", logs)
	// Nor are the events: two tasks were inserted since (the first
	// batch's, which failed, and the last), whatever the new term read.
	// (A batch's stats are recorded just after its counters commit.)
	require.Eventually(t, func() bool { return svc.Stats().Events-events >= 2 }, 10*time.Second, 2*time.Millisecond)
	require.EqualValues(t, 2, svc.Stats().Events-events, "events applied since the cancels; logs:\n%s", logs)
}
