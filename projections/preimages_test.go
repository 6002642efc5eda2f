package projections_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/projections"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// preImagesOn reads the tasks collection's changeStreamPreAndPostImages.
func preImagesOn(t *testing.T, s *store.Store) bool {
	t.Helper()
	on, err := s.TasksPreImages(context.Background())
	require.NoError(t, err)
	return on
}

// TestPreImagesOnlyWhileAnotherProgramWrites: a term starts with pre-images
// on; after PreImagesIdle of our own claims and finishes alone (which say
// where their task stood) they go off, and the counters stay exact; a
// change by another program turns them on again, and the counters stay
// exact through it. The projector is Steady (a benchmark's drain may
// start) only once its stream follows without them.
func TestPreImagesOnlyWhileAnotherProgramWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := mongotest.Database(t)
	s := store.New(db, store.Options{})
	q := newQueue(t, db, "q", 0, true)
	logs := &logBuf{}
	svc := projections.New(projections.Config{Node: "n1", Store: s, LeaseTTL: 2 * time.Second, PreImagesIdle: 300 * time.Millisecond, Logger: logger(logs)})
	require.NoError(t, svc.Start(ctx))
	t.Cleanup(svc.Stop)
	require.Eventually(t, func() bool { return svc.Stats().Leader }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return svc.Stats().PreImages && preImagesOn(t, s) }, 10*time.Second, 10*time.Millisecond, "a term starts with them on")
	require.False(t, svc.Stats().Steady, "not steady while pre-images are on")

	// Our writes alone: claims straight into running, and their finishes.
	ours := func(n int) {
		t.Helper()
		insertBurst(t, db, q, 0, n, func(int) any { return -2 })
		for {
			won, err := s.TaskClaimMany(ctx, store.TaskClaimManyParams{Queue: q, Node: "n1", Sort: schema.SortFIFO, Limit: 3, Start: true})
			require.NoError(t, err)
			if len(won.Tasks) == 0 {
				return
			}
			var fin []store.TaskFinishParams
			for i, task := range won.Tasks {
				fin = append(fin, store.TaskFinishParams{ID: task.ID, Node: "n1", Status: schema.Status(1 + i%2)})
			}
			for _, err := range s.TaskFinishMany(ctx, fin) {
				require.NoError(t, err)
			}
		}
	}
	require.Eventually(t, func() bool {
		ours(2)
		return !svc.Stats().PreImages
	}, 10*time.Second, 100*time.Millisecond, "pre-images never went off")
	require.False(t, preImagesOn(t, s))
	require.Eventually(t, func() bool { return svc.Stats().Steady }, 10*time.Second, 10*time.Millisecond, "steady once the stream follows without them")
	ours(7)
	requireExact(t, s, 10*time.Second)
	require.Zero(t, svc.Stats().DriftQueues, "no drift")

	// Another program fails a queued task and requeues a finished one.
	ids := insertBurst(t, db, q, 0, 2, func(int) any { return -2 })
	tasks := db.Collection(schema.CollTasks)
	_, err := tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[0]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 2}}}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return svc.Stats().PreImages && preImagesOn(t, s) }, 10*time.Second, 10*time.Millisecond,
		"another program's change turns them on")
	require.Eventually(t, func() bool { return !svc.Stats().Steady }, 10*time.Second, 10*time.Millisecond, "not steady once they are on again")
	_, err = tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[1]}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 1}}}})
	require.NoError(t, err)
	requireExact(t, s, 10*time.Second)
	require.Zero(t, svc.Stats().DriftQueues, "no drift")

	// Our writes alone again: off again.
	require.Eventually(t, func() bool {
		ours(2)
		return !svc.Stats().PreImages
	}, 10*time.Second, 100*time.Millisecond, "pre-images never went off again")
	require.Eventually(t, func() bool { return svc.Stats().Steady }, 10*time.Second, 10*time.Millisecond, "steady again")
	requireExact(t, s, 10*time.Second)
	require.Contains(t, logs.String(), "task pre-images turned off")
	svc.Stop()
	require.False(t, svc.Stats().Steady, "a projector that no longer leads is not steady")
}

// preImagesHeld is a store whose pre-images switch waits for its caller's
// context to end, as a switch in flight when the node stops does.
type preImagesHeld struct {
	*store.Store
	entered chan struct{}
}

func (s *preImagesHeld) TasksPreImagesSet(ctx context.Context, _ bool) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return fmt.Errorf("read the tasks collection's options: %w", ctx.Err())
}

// TestStopDuringAPreImagesSwitchIsNoFailure: a switch cut short because
// the term ends (Stop) is not reported as a failure to retry: an operator
// stopping a node must not read a warning about pre-images.
func TestStopDuringAPreImagesSwitchIsNoFailure(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	held := &preImagesHeld{Store: store.New(db, store.Options{}), entered: make(chan struct{}, 1)}
	logs := &logBuf{}
	svc := projections.New(projections.Config{Node: "n1", Store: held, LeaseTTL: 2 * time.Second, Logger: logger(logs)})
	require.NoError(t, svc.Start(context.Background()))
	select {
	case <-held.entered: // a term starts by turning them on
	case <-time.After(10 * time.Second):
		svc.Stop()
		t.Fatalf("the projector never switched pre-images; log:\n%s", logs.String())
	}
	svc.Stop()
	require.Contains(t, logs.String(), "projector lease acquired", "the switch was the term's")
	require.NotContains(t, logs.String(), "cannot turn change stream pre-images")
}

// started starts the projector of node n1 on st (cfg's other fields, a
// lease of 2 s) and stops it when the test ends.
func started(t *testing.T, st projections.Store, cfg projections.Config) *projections.Service {
	t.Helper()
	cfg.Node, cfg.Store, cfg.LeaseTTL = "n1", st, 2*time.Second
	svc := projections.New(cfg)
	require.NoError(t, svc.Start(context.Background()))
	t.Cleanup(svc.Stop)
	return svc
}

// gate holds a test store's call until it is opened.
type gate struct {
	entered chan struct{} // a call came (1 slot)
	release chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 1), release: make(chan struct{})} }

// pass says a call came, then waits until the gate is open or ctx ends.
func (g *gate) pass(ctx context.Context) error {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// open lets every call through, now and later.
func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// recountHeld is a store whose recounts at a stream position (a
// reconcile's, not a restart's) wait at its gate.
type recountHeld struct {
	*store.Store
	g *gate
}

func (s *recountHeld) QueueRecount(ctx context.Context, p store.QueueRecountParams) (store.Recount, error) {
	if p.At != nil {
		if err := s.g.pass(ctx); err != nil {
			return store.Recount{}, err
		}
	}
	return s.Store.QueueRecount(ctx, p)
}

// TestSteadyOnlyOnceCaughtUpAndReconciled: a term is not Steady while its
// reconcile on catching up runs, even with its stream already following
// without pre-images; it is once that reconcile is done.
func TestSteadyOnlyOnceCaughtUpAndReconciled(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	s := &recountHeld{Store: store.New(db, store.Options{}), g: newGate()}
	newQueue(t, db, "q", 0, true)
	svc := started(t, s, projections.Config{PreImagesIdle: time.Nanosecond})
	t.Cleanup(s.g.open) // before Stop
	select {
	case <-s.g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the term never reconciled on catching up")
	}
	require.Eventually(t, func() bool { return !preImagesOn(t, s.Store) }, 10*time.Second, 10*time.Millisecond, "pre-images off at the first batch")
	require.Never(t, func() bool { return svc.Stats().Steady }, 300*time.Millisecond, 10*time.Millisecond, "not steady while the reconcile runs")
	s.g.open()
	require.Eventually(t, func() bool { return svc.Stats().Steady }, 10*time.Second, 10*time.Millisecond, "steady once it is done")
}

// recountsSeen is a store that records the recounts at a stream position
// (the reconcile on catching up, its retries, the later ones): when each
// came (tries) and what it asked (asked). The first fails of them fail.
type recountsSeen struct {
	*store.Store
	fails int
	mu    sync.Mutex
	tries []time.Time
	asked []store.QueueRecountParams
}

func (s *recountsSeen) QueueRecount(ctx context.Context, p store.QueueRecountParams) (store.Recount, error) {
	if p.At != nil {
		s.mu.Lock()
		s.tries = append(s.tries, time.Now())
		s.asked = append(s.asked, p)
		fail := len(s.tries) <= s.fails
		s.mu.Unlock()
		if fail {
			return store.Recount{}, errors.New("connection reset (a test's)")
		}
	}
	return s.Store.QueueRecount(ctx, p)
}

func (s *recountsSeen) triesSoFar() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.tries)
}

func (s *recountsSeen) askedSoFar() []store.QueueRecountParams {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.asked)
}

// TestAFailingRecountBacksOff: a reconcile on catching up that fails is
// retried; the tries are spaced (1 s, then 2 s, each within a fifth), not
// made at every batch that caught up (about every 500 ms when idle); and
// the first to succeed makes the term steady.
func TestAFailingRecountBacksOff(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	s := &recountsSeen{Store: store.New(db, store.Options{}), fails: 2}
	newQueue(t, db, "q", 0, true)
	svc := started(t, s, projections.Config{PreImagesIdle: time.Nanosecond})
	require.Eventually(t, func() bool { return svc.Stats().Steady }, 20*time.Second, 10*time.Millisecond, "steady once a retry succeeds")
	tries := s.triesSoFar()
	require.Len(t, tries, 3, "two failures and the success")
	require.GreaterOrEqual(t, tries[1].Sub(tries[0]), 800*time.Millisecond, "the first retry waits about a second")
	require.GreaterOrEqual(t, tries[2].Sub(tries[1]), 1600*time.Millisecond, "the second about two")
	require.EqualValues(t, 2, svc.Stats().RecountFailures, "each failure counted (the metric's source)")
}

// applyHeld is a store whose batches' counter writes wait at its gate.
type applyHeld struct {
	*store.Store
	g *gate
}

func (s *applyHeld) CountersAdvance(ctx context.Context, to store.CounterPosition, adv []store.CounterAdvance) (store.CountersAdvanced, error) {
	if err := s.g.pass(ctx); err != nil {
		return store.CountersAdvanced{}, err
	}
	return s.Store.CountersAdvance(ctx, to, adv)
}

// TestCommittingUntilTheBatchIsInTheStats: while a batch's transaction is
// in flight the stats say Committing and do not count its events yet; once
// it is done they count them and Committing is false. (A reader that sees
// the counters first waits on it for the batch's lags.)
func TestCommittingUntilTheBatchIsInTheStats(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	s := &applyHeld{Store: store.New(db, store.Options{}), g: newGate()}
	q := newQueue(t, db, "q", 0, true)
	svc := started(t, s, projections.Config{})
	t.Cleanup(s.g.open) // before Stop, which waits for the commit
	// Once it reconciled on catching up, its stream is open: the
	// inserts below are its events, not its term's first recount's.
	require.Eventually(t, func() bool { return svc.Stats().Reconciles >= 1 }, 10*time.Second, 10*time.Millisecond)
	insertBurst(t, db, q, 0, 3, func(int) any { return -2 })
	select {
	case <-s.g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no batch was committed")
	}
	st := svc.Stats()
	require.True(t, st.Committing, "a batch's transaction is in flight")
	require.Zero(t, st.Events, "its events are not in the stats yet")
	s.g.open()
	require.Eventually(t, func() bool { st := svc.Stats(); return !st.Committing && st.Events == 3 }, 10*time.Second, 10*time.Millisecond,
		"once committed, the batch is in the stats and nothing is in flight")
}

// TestARecountOfMarkedQueuesReadsThemAlone: once steady, a new queue
// (without counters) is recounted alone: the recount asks for its tasks
// only, not for every task, and its counters come out right while the
// other queue's are left as they are.
func TestARecountOfMarkedQueuesReadsThemAlone(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	s := &recountsSeen{Store: store.New(db, store.Options{})}
	a := newQueue(t, db, "a", 0, true)
	insertBurst(t, db, a, 0, 3, func(int) any { return int32(-2) })
	svc := started(t, s, projections.Config{PreImagesIdle: time.Nanosecond})
	require.Eventually(t, func() bool { return svc.Stats().Steady }, 10*time.Second, 10*time.Millisecond)
	first := s.askedSoFar()
	require.NotEmpty(t, first)
	require.Nil(t, first[0].Queues, "the recount on catching up counts every queue")

	c := newQueue(t, db, "c", 0, false)
	insertBurst(t, db, c, 0, 2, func(int) any { return int32(-2) })
	require.Eventually(t, func() bool {
		got, err := s.Store.QueueCounters(context.Background())
		require.NoError(t, err)
		return got[c].Complete() && *got[c].Todo == 2 && *got[c].Total == 2
	}, 10*time.Second, 10*time.Millisecond, "the new queue's counters")
	later := s.askedSoFar()[len(first):]
	require.NotEmpty(t, later, "the new queue was recounted")
	for _, p := range later {
		require.Equal(t, []bson.ObjectID{c}, p.Queues, "a recount of the new queue alone")
	}
	got, err := s.Store.QueueCounters(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(3), *got[a].Todo)
}
