// Package leadership elects one holder of a named lease among the nodes and
// runs that holder's duties for as long as it holds it: the work that
// exactly one node of the cluster must do.
//
// The lease is a document of disbatch_leases (store.LeaseAcquire). It
// expires by the server's clock ($$NOW), so the nodes' clocks never matter,
// and it carries an epoch that rises whenever the owner changes: a duty
// that writes under the lease guards its writes with the epoch (the fence),
// so a deposed leader's late write cannot land.
//
// An Elector tries to acquire its lease every TTL/4. Holding it starts a
// term: every duty runs in its own goroutine with a context that ends with
// the term, and the lease is renewed every TTL/4. The term ends when a
// renewal finds the lease taken, when no renewal has landed for 3/4 of the
// TTL (the lease may expire before the next one lands, so the holder steps
// back before anyone else may take it), when a duty returns an error (the
// elector stands again TTL/4 later, and being still the owner it gets the
// lease back at the same epoch, with the state a duty checkpointed in it),
// or at Stop, which releases the lease so that a successor takes over at
// once instead of after the TTL.
//
// The leases of this project: "projector" (the counter projector, package
// projections; nodes with --no-projector do not stand) and "leader" (the
// cluster-wide duties of the nodes: the stale-claim sweep and dead-node
// recovery of package reaper).
package leadership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/store"
)

// Store is what an Elector needs.
type Store interface {
	LeaseAcquire(ctx context.Context, p store.LeaseAcquireParams) (store.Lease, error)
	LeaseRenew(ctx context.Context, ref store.LeaseRef, ttl time.Duration) error
	LeaseRelease(ctx context.Context, ref store.LeaseRef) error
}

// DefaultTTL is a lease's default time to live.
const DefaultTTL = 10 * time.Second

// Term is one tenure of the lease.
type Term struct {
	// Lease is the lease as acquired: its epoch and what a duty
	// checkpointed in it.
	Lease store.Lease
}

// Ref is the lease at this term's epoch: the fence for guarded writes.
func (t Term) Ref() store.LeaseRef {
	return store.LeaseRef{Name: t.Lease.Name, Owner: t.Lease.Owner, Epoch: t.Lease.Epoch}
}

// Duty is work for the leader. It runs while the elector holds the lease
// and must return when ctx ends. Returning an error ends the term for
// every duty (the elector stands again at once); returning nil early just
// ends this duty for the term.
type Duty func(ctx context.Context, term Term) error

// Config configures an Elector.
type Config struct {
	// Lease is the lease's name, Owner this node's name.
	Lease string
	Owner string
	Store Store
	// TTL is how long the lease lasts without renewal (default DefaultTTL).
	TTL time.Duration
	// Yield, when set, is asked before each try for the lease: while it
	// says yes the elector tries once a TTL instead of every TTL/4 (the
	// node it yields to may never take the lease). The projector yields
	// to the leader's node, whose leader duties then share its stream.
	Yield func() bool
	// First, when set, is waited on before the first try (it returns by
	// ctx's end): the projector waits there for the leader's elector's
	// first try (Elector.Tried), so that of nodes started together the
	// one that takes the leader's lease takes the projector's too.
	First  func(ctx context.Context)
	Clock  clock.Clock
	Logger *slog.Logger
}

// Status is the elector's view of the lease.
type Status struct {
	Leader bool
	// Elsewhere: another node held the lease at this elector's last try.
	Elsewhere bool
	Epoch     int64 // the epoch of the current or last term
	Terms     int64 // terms held since start
}

// Elector stands for one lease and runs its duties while it holds it.
type Elector struct {
	lifecycle.Base
	cfg    Config
	duties []Duty
	clock  clock.Clock
	log    *slog.Logger

	mu      sync.Mutex
	status  Status
	abandon bool
	tried   chan struct{} // closed once the first try is over
}

// New returns an elector for cfg's lease with its duties; nothing runs
// until Start.
func New(cfg Config, duties ...Duty) *Elector {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Elector{cfg: cfg, duties: duties, clock: clock.Or(cfg.Clock),
		log: cfg.Logger.With("component", "leadership", "lease", cfg.Lease), tried: make(chan struct{})}
}

// Tried is closed once the elector's first try for the lease is over,
// whatever its outcome (Status says it).
func (e *Elector) Tried() <-chan struct{} { return e.tried }

// Start begins standing for the lease; it returns at once.
func (e *Elector) Start(ctx context.Context) error {
	return e.Base.Start(ctx, func(_ context.Context, run *lifecycle.Run) error {
		e.mu.Lock()
		e.abandon = false
		e.mu.Unlock()
		run.Go(e.stand)
		return nil
	})
}

// Abandon stops like a crashed process: the lease is not released, so a
// successor waits for it to expire. For tests of failover.
func (e *Elector) Abandon() {
	e.mu.Lock()
	e.abandon = true
	e.mu.Unlock()
	e.Stop()
}

// Status returns whether this elector leads now, and its epoch.
func (e *Elector) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.status
}

func (e *Elector) setLeader(on bool, epoch int64) {
	e.mu.Lock()
	e.status.Leader, e.status.Epoch = on, epoch
	if on {
		e.status.Terms++
	}
	e.mu.Unlock()
}

// stand acquires the lease whenever it can and leads while it holds it.
func (e *Elector) stand(ctx context.Context) {
	every := e.cfg.TTL / 4
	var yielding time.Time // since when Yield has said yes, in a row
	if e.cfg.First != nil {
		e.cfg.First(ctx)
		if ctx.Err() != nil {
			return
		}
	}
	for {
		if e.cfg.Yield != nil && e.cfg.Yield() {
			if yielding.IsZero() {
				yielding = e.clock.Now()
			}
			if e.clock.Since(yielding) < e.cfg.TTL {
				select {
				case <-ctx.Done():
					return
				case <-e.clock.After(every):
				}
				continue
			}
		}
		yielding = time.Time{} // a try: a new window of yielding after it
		// Stop waits for an acquire in flight rather than cancelling it:
		// a cancelled one may still take the lease on the server, with
		// nobody left to release it (no leader for a TTL). One that
		// succeeds after Stop is released below.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(e.cfg.TTL, 5*time.Second))
		lease, err := e.cfg.Store.LeaseAcquire(actx, store.LeaseAcquireParams{Name: e.cfg.Lease, Owner: e.cfg.Owner, TTL: e.cfg.TTL})
		cancel()
		e.mu.Lock()
		e.status.Elsewhere = errors.Is(err, store.ErrLeaseHeld)
		select {
		case <-e.tried:
		default:
			close(e.tried)
		}
		e.mu.Unlock()
		switch {
		case err == nil && ctx.Err() != nil:
			e.release(lease)
			return
		case err == nil:
			e.log.Info("lease acquired: leading", "epoch", lease.Epoch)
			e.setLeader(true, lease.Epoch)
			err = e.lead(ctx, Term{Lease: lease})
			e.setLeader(false, lease.Epoch)
			if ctx.Err() != nil {
				e.release(lease)
				return
			}
			e.log.Warn("leadership ended: standing again", "epoch", lease.Epoch, "error", err)
		case errors.Is(err, store.ErrLeaseHeld):
		case ctx.Err() == nil:
			e.log.Warn("lease: cannot acquire", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-e.clock.After(every):
		}
	}
}

// lead runs one term: the renewals and the duties, until one of them ends
// it or ctx ends.
func (e *Elector) lead(ctx context.Context, term Term) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.renew(ctx, term, cancel)
	}()
	for _, duty := range e.duties {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := duty(ctx, term); err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("a duty failed: %w", err))
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, lifecycle.ErrStopped) {
		return cause
	}
	return nil
}

// renew extends the lease every TTL/4 and ends the term when it is lost or
// when no renewal sent within 3/4 of the TTL has landed. A watchdog checks
// that every TTL/20, apart from the renewals: a renewal that hangs for its
// whole timeout (a failover, a partition) would otherwise put the check
// off until the lease had expired, when a successor may already lead.
// The time counted from is a landed renewal's sending, not its answer:
// the server set the lease's expiry after it was sent.
func (e *Elector) renew(ctx context.Context, term Term, end context.CancelCauseFunc) {
	var mu sync.Mutex
	last := e.clock.Now() // about when the lease was taken
	limit := e.cfg.TTL * 3 / 4
	silent := func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return e.clock.Since(last)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		lifecycle.Every(ctx, e.clock, max(e.cfg.TTL/20, time.Millisecond), func(context.Context) {
			if s := silent(); s > limit {
				// The lease may expire before a renewal lands: step back.
				end(fmt.Errorf("cannot renew the lease: none landed of those sent in the last %s", s.Round(time.Millisecond)))
			}
		})
	}()
	lifecycle.Every(ctx, e.clock, e.cfg.TTL/4, func(ctx context.Context) {
		sent := e.clock.Now()
		// Not cancelled by Stop: a cancelled renewal may still land on the
		// server after the release and hold the lease for another TTL.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.TTL/4)
		err := e.cfg.Store.LeaseRenew(rctx, term.Ref(), e.cfg.TTL)
		rcancel()
		switch {
		case err == nil:
			mu.Lock()
			if sent.After(last) {
				last = sent
			}
			mu.Unlock()
		case errors.Is(err, store.ErrLeaseLost):
			end(err) // ends ctx, and so the loops
		case ctx.Err() != nil:
		case silent() > limit:
			end(fmt.Errorf("cannot renew the lease: %w", err))
		}
	})
	wg.Wait()
}

// release lets the lease expire now, with a context Stop did not cancel,
// unless the elector was abandoned.
func (e *Elector) release(lease store.Lease) {
	e.mu.Lock()
	abandon := e.abandon
	e.mu.Unlock()
	if abandon {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.cfg.Store.LeaseRelease(ctx, store.LeaseRef{Name: lease.Name, Owner: lease.Owner, Epoch: lease.Epoch}); err != nil {
		e.log.Warn("release lease", "error", err)
		return
	}
	e.log.Info("lease released", "epoch", lease.Epoch)
}

// Periodic is what the duties that sweep once a tick share: their period,
// clock and logger, defaulted (1 s, the real clock, a logger that
// discards) and the logger naming the component.
type Periodic struct {
	Tick  time.Duration
	Clock clock.Clock
	Log   *slog.Logger
}

// NewPeriodic fills in the defaults.
func NewPeriodic(tick time.Duration, c clock.Clock, log *slog.Logger, component string) Periodic {
	if tick <= 0 {
		tick = time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return Periodic{Tick: tick, Clock: clock.Or(c), Log: log.With("component", component)}
}

// Duty runs pass at once, then every Tick, until the term ends.
func (p Periodic) Duty(pass func(ctx context.Context)) Duty { return Every(p.Clock, p.Tick, pass) }

// Every is a duty that runs pass at once and then every period (on c)
// until the term ends: the shape of the leader's sweeps.
func Every(c clock.Clock, period time.Duration, pass func(ctx context.Context)) Duty {
	return func(ctx context.Context, _ Term) error {
		t := clock.Or(c).NewTicker(period)
		defer t.Stop()
		for {
			pass(ctx)
			select {
			case <-ctx.Done():
				return nil
			case <-t.C():
			}
		}
	}
}
