package leadership_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/internal/lifecycle/lifecycletest"
	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/store"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

// terms records the terms the duties saw, across electors.
type terms struct {
	mu      sync.Mutex
	running int
	most    int
	byOwner map[string]int
	epochs  []int64
}

func newTerms() *terms { return &terms{byOwner: map[string]int{}} }

func (ts *terms) duty(ctx context.Context, term leadership.Term) error {
	ts.mu.Lock()
	ts.running++
	ts.most = max(ts.most, ts.running)
	ts.byOwner[term.Lease.Owner]++
	ts.epochs = append(ts.epochs, term.Lease.Epoch)
	ts.mu.Unlock()
	<-ctx.Done()
	ts.mu.Lock()
	ts.running--
	ts.mu.Unlock()
	return nil
}

func (ts *terms) leaders() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.running
}

func leaderOf(es map[string]*leadership.Elector) string {
	who := ""
	for name, e := range es {
		if e.Status().Leader {
			if who != "" {
				return "two leaders: " + who + " and " + name
			}
			who = name
		}
	}
	return who
}

func TestOneLeaderAndAQuickSuccessorOnStop(t *testing.T) {
	t.Parallel()
	s := store.New(mongotest.Database(t), store.Options{})
	// The electors wait on a fake clock; the lease expires by the server's
	// clock a minute after each renewal, far beyond this test's run, so a
	// successor can lead only if Stop released the lease.
	fake := clock.NewFake(time.Now())
	const ttl = time.Minute
	ctx := context.Background()
	ts := newTerms()
	es := map[string]*leadership.Elector{}
	for i := range 3 {
		name := fmt.Sprintf("n%d", i)
		es[name] = leadership.New(leadership.Config{Lease: "leader", Owner: name, Store: s, TTL: ttl, Clock: fake}, ts.duty)
		require.NoError(t, es[name].Start(ctx))
		t.Cleanup(es[name].Stop)
	}
	var first string
	require.Eventually(t, func() bool { first = leaderOf(es); return first != "" }, 10*time.Second, 5*time.Millisecond)
	require.Len(t, first, 2, "%s", first)
	for range 3 { // a few renewals and failed acquires
		require.NoError(t, fake.BlockUntil(ctx, 3)) // two followers' waits and the leader's renewal ticker
		fake.Advance(ttl / 4)
	}
	require.NoError(t, fake.BlockUntil(ctx, 3))
	require.Equal(t, first, leaderOf(es), "the leader changed without a reason")
	require.Equal(t, 1, ts.leaders())

	// Stop releases the lease: a follower takes it at its next attempt.
	es[first].Stop()
	require.NoError(t, fake.BlockUntil(ctx, 2))
	fake.Advance(ttl / 4)
	var second string
	require.Eventually(t, func() bool { second = leaderOf(es); return second != "" }, 10*time.Second, 5*time.Millisecond,
		"no follower took the released lease")
	require.NotEqual(t, first, second)
	// The elector says it leads just before its duty starts: wait for the
	// duty to record its term.
	require.Eventually(t, func() bool {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return len(ts.epochs) >= 2
	}, 10*time.Second, 5*time.Millisecond)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	require.Equal(t, 1, ts.most, "two terms overlapped")
	require.Equal(t, []int64{1, 2}, ts.epochs, "the epoch rises with each new owner")
}

func TestAbandonedLeaseIsTakenAfterItExpires(t *testing.T) {
	t.Parallel()
	s := store.New(mongotest.Database(t), store.Options{})
	ts := newTerms()
	const ttl = 4 * time.Second
	a := leadership.New(leadership.Config{Lease: "leader", Owner: "a", Store: s, TTL: ttl}, ts.duty)
	require.NoError(t, a.Start(context.Background()))
	require.Eventually(t, func() bool { return a.Status().Leader }, 10*time.Second, 5*time.Millisecond)
	b := leadership.New(leadership.Config{Lease: "leader", Owner: "b", Store: s, TTL: ttl}, ts.duty)
	require.NoError(t, b.Start(context.Background()))
	t.Cleanup(b.Stop)
	crashed := time.Now()
	a.Abandon()
	// The last renewal landed at most TTL/4 before the crash: the lease
	// lives at least 3/4 of the TTL after it.
	time.Sleep(ttl / 4)
	require.False(t, b.Status().Leader, "the lease was taken before it expired")
	require.Eventually(t, func() bool { return b.Status().Leader }, 20*time.Second, 10*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(crashed), ttl*3/4)
	require.Equal(t, int64(2), b.Status().Epoch)
}

// flaky fails renewals on demand.
type flaky struct {
	*store.Store
	failRenew atomic.Bool
	// hangRenew: renewals wait for their timeout, as in a failover.
	hangRenew atomic.Bool
	renewed   atomic.Int64
}

func (f *flaky) LeaseRenew(ctx context.Context, ref store.LeaseRef, ttl time.Duration) error {
	if f.hangRenew.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	if f.failRenew.Load() {
		return errors.New("test: MongoDB does not answer")
	}
	err := f.Store.LeaseRenew(ctx, ref, ttl)
	f.renewed.Add(1)
	return err
}

func TestLeaderStepsBackWhenItCannotRenew(t *testing.T) {
	t.Parallel()
	st := &flaky{Store: store.New(mongotest.Database(t), store.Options{})}
	fake := clock.NewFake(time.Now())
	const ttl = 8 * time.Second
	ts := newTerms()
	e := leadership.New(leadership.Config{Lease: "leader", Owner: "a", Store: st, TTL: ttl, Clock: fake}, ts.duty)
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(e.Stop)
	require.Eventually(t, func() bool { return e.Status().Leader && ts.leaders() == 1 }, 10*time.Second, 5*time.Millisecond)

	// Renewals land: leadership holds however much time passes.
	for range 8 {
		before := st.renewed.Load()
		fake.Advance(ttl / 4)
		require.Eventually(t, func() bool { return st.renewed.Load() > before }, 10*time.Second, time.Millisecond)
	}
	require.True(t, e.Status().Leader)
	time.Sleep(20 * time.Millisecond) // the last renewal's bookkeeping

	// Renewals fail: it leads on until 3/4 of the TTL passed without one,
	// then steps back (its duty ends), before the lease could expire, and
	// before the next renewal's turn: its watchdog, not a renewal, says so.
	st.failRenew.Store(true)
	fake.Advance(ttl / 4)
	fake.Advance(ttl / 4)
	fake.Advance(ttl / 4)
	time.Sleep(50 * time.Millisecond)
	require.True(t, e.Status().Leader, "stepped back before 3/4 of the TTL")
	require.Equal(t, 1, ts.leaders())
	fake.Advance(ttl / 10)
	require.Eventually(t, func() bool { return !e.Status().Leader && ts.leaders() == 0 }, 10*time.Second, time.Millisecond,
		"still leading past 3/4 of the TTL without a renewal")

	// MongoDB answers again: it stands and, the lease being still its own,
	// gets it back at the same epoch.
	st.failRenew.Store(false)
	require.NoError(t, fake.BlockUntil(context.Background(), 1)) // the wait before standing again
	fake.Advance(ttl / 4)
	require.Eventually(t, func() bool { return e.Status().Leader }, 10*time.Second, time.Millisecond)
	require.Equal(t, int64(1), e.Status().Epoch)
	require.Equal(t, int64(2), e.Status().Terms)
}

// TestLeaderStepsBackWhileARenewalHangs: a renewal that hangs for its
// whole timeout (TTL/4 of real time here) does not put off the step back:
// 3/4 of the TTL after the last renewal that landed, the term ends, while
// the renewal still hangs.
func TestLeaderStepsBackWhileARenewalHangs(t *testing.T) {
	t.Parallel()
	st := &flaky{Store: store.New(mongotest.Database(t), store.Options{})}
	fake := clock.NewFake(time.Now())
	const ttl = 8 * time.Second // a renewal hangs 2 s of real time
	ts := newTerms()
	e := leadership.New(leadership.Config{Lease: "leader", Owner: "a", Store: st, TTL: ttl, Clock: fake}, ts.duty)
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(func() { st.hangRenew.Store(false); e.Stop() })
	require.Eventually(t, func() bool { return e.Status().Leader && ts.leaders() == 1 }, 10*time.Second, 5*time.Millisecond)

	st.hangRenew.Store(true)
	fake.Advance(ttl / 4) // a renewal goes out, and hangs
	time.Sleep(20 * time.Millisecond)
	for range 14 { // to 3/4 of the TTL and a little more, in steps
		fake.Advance(ttl / 24)
		time.Sleep(5 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return ts.leaders() == 0 }, 5*time.Second, time.Millisecond,
		"still leading past 3/4 of the TTL while a renewal hung")
}

// holding holds one renewal, on demand, until its ctx ends or a second
// passed, then renews.
type holding struct {
	*store.Store
	hold      atomic.Bool
	inRenew   chan struct{}
	cancelled atomic.Bool
}

func (h *holding) LeaseRenew(ctx context.Context, ref store.LeaseRef, ttl time.Duration) error {
	if h.hold.CompareAndSwap(true, false) {
		h.inRenew <- struct{}{}
		select {
		case <-ctx.Done():
			h.cancelled.Store(true)
		case <-time.After(time.Second):
		}
	}
	return h.Store.LeaseRenew(ctx, ref, ttl)
}

// TestStopWaitsForARenewalInFlight: a renewal that Stop cancelled could
// still land on the server after the release and hold the lease for
// another TTL, with nobody leading.
func TestStopWaitsForARenewalInFlight(t *testing.T) {
	t.Parallel()
	st := &holding{Store: store.New(mongotest.Database(t), store.Options{}), inRenew: make(chan struct{}, 1)}
	fake := clock.NewFake(time.Now())
	const ttl = 20 * time.Second // a renewal's timeout is TTL/4: 4 s over the hold
	ts := newTerms()
	e := leadership.New(leadership.Config{Lease: "leader", Owner: "a", Store: st, TTL: ttl, Clock: fake}, ts.duty)
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(e.Stop)
	require.Eventually(t, func() bool { return e.Status().Leader && ts.leaders() == 1 }, 10*time.Second, 5*time.Millisecond)
	st.hold.Store(true)
	fake.Advance(ttl / 4)
	select {
	case <-st.inRenew:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal after a quarter of the TTL")
	}
	e.Stop()
	require.False(t, st.cancelled.Load(), "Stop cancelled the renewal in flight")
	// Released after the renewal landed: another owner takes it at once.
	_, err := st.LeaseAcquire(context.Background(), store.LeaseAcquireParams{Name: "leader", Owner: "b", TTL: ttl})
	require.NoError(t, err, "the lease was not free after Stop")
}

func TestDutyErrorEndsTheTermForEveryDuty(t *testing.T) {
	t.Parallel()
	s := store.New(mongotest.Database(t), store.Options{})
	ts := newTerms()
	var calls atomic.Int64
	failing := func(ctx context.Context, term leadership.Term) error {
		if calls.Add(1) == 1 {
			return errors.New("test: the duty failed")
		}
		<-ctx.Done()
		return nil
	}
	e := leadership.New(leadership.Config{Lease: "leader", Owner: "a", Store: s, TTL: 400 * time.Millisecond}, ts.duty, failing)
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(e.Stop)
	require.Eventually(t, func() bool { return calls.Load() == 2 && ts.leaders() == 1 }, 10*time.Second, 5*time.Millisecond)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	require.Equal(t, []int64{1, 1}, ts.epochs, "both terms at the same epoch: the owner did not change")
	require.Equal(t, int64(2), e.Status().Terms)
}

func TestElectorLifecycle(t *testing.T) {
	// Not parallel: goleak.
	s := store.New(mongotest.Database(t), store.Options{})
	n := 0
	lifecycletest.Check(t, func(t *testing.T) lifecycle.Service {
		n++
		return leadership.New(leadership.Config{Lease: fmt.Sprintf("l%d", n), Owner: "a", Store: s, TTL: time.Second},
			func(ctx context.Context, _ leadership.Term) error { <-ctx.Done(); return nil })
	}, lifecycletest.Options{IgnoreGoroutines: mongotest.ClientGoroutines()})
}

// TestEveryRunsAtOnceThenEachPeriod: the sweep duty's shape.
func TestEveryRunsAtOnceThenEachPeriod(t *testing.T) {
	t.Parallel()
	fake := clock.NewFake(time.Now())
	passes := make(chan struct{}, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- leadership.Every(fake, time.Second, func(context.Context) { passes <- struct{}{} })(ctx, leadership.Term{})
	}()
	<-passes // at once
	require.NoError(t, fake.BlockUntil(ctx, 1))
	require.Empty(t, passes, "not before the period")
	fake.Advance(time.Second)
	<-passes
	cancel()
	require.NoError(t, <-done)
}

// TestYieldLeavesAFreeLeaseForATTL: an elector whose Yield says yes does
// not take a free lease until it has yielded a TTL; one that finds the
// lease held says so (Status.Elsewhere), the holder does not.
func TestYieldLeavesAFreeLeaseForATTL(t *testing.T) {
	t.Parallel()
	s := store.New(mongotest.Database(t), store.Options{})
	fake := clock.NewFake(time.Now())
	const ttl = time.Minute
	ctx := context.Background()
	ts := newTerms()
	var yield atomic.Bool
	yield.Store(true)
	y := leadership.New(leadership.Config{Lease: "projector", Owner: "y", Store: s, TTL: ttl, Clock: fake, Yield: yield.Load}, ts.duty)
	require.NoError(t, y.Start(ctx))
	t.Cleanup(y.Stop)
	for range 4 {
		// Blocked on the clock: it decided, and a free lease it took
		// would show.
		require.NoError(t, fake.BlockUntil(ctx, 1))
		require.False(t, y.Status().Leader, "it took a lease it yields")
		fake.Advance(ttl / 4)
	}
	require.Eventually(t, func() bool { return y.Status().Leader }, 10*time.Second, 5*time.Millisecond, "it yielded a free lease for more than a TTL")
	require.False(t, y.Status().Elsewhere)

	o := leadership.New(leadership.Config{Lease: "projector", Owner: "o", Store: s, TTL: ttl, Clock: fake}, ts.duty)
	require.NoError(t, o.Start(ctx))
	t.Cleanup(o.Stop)
	require.Eventually(t, func() bool { return o.Status().Elsewhere }, 10*time.Second, 5*time.Millisecond, "the other does not say the lease is held elsewhere")
	require.False(t, o.Status().Leader)
}

// TestFirstIsWaitedOnBeforeTheFirstTry: an elector with First tries for
// its lease only once First returned; Tried is closed after its first try.
func TestFirstIsWaitedOnBeforeTheFirstTry(t *testing.T) {
	t.Parallel()
	s := store.New(mongotest.Database(t), store.Options{})
	ts := newTerms()
	release := make(chan struct{})
	e := leadership.New(leadership.Config{Lease: "projector", Owner: "e", Store: s, TTL: time.Minute,
		First: func(ctx context.Context) {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}}, ts.duty)
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(e.Stop)
	time.Sleep(200 * time.Millisecond)
	require.False(t, e.Status().Leader, "it tried before First returned")
	select {
	case <-e.Tried():
		t.Fatal("Tried closed before any try")
	default:
	}
	close(release)
	select {
	case <-e.Tried():
	case <-time.After(10 * time.Second):
		t.Fatal("Tried not closed after the first try")
	}
	require.Eventually(t, func() bool { return e.Status().Leader }, 10*time.Second, 5*time.Millisecond)
}
