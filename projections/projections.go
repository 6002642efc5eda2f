package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/leadership"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// LeaseName is the projector's lease.
const LeaseName = "projector"

// Store is what the projector needs.
type Store interface {
	leadership.Store
	CountersSet(ctx context.Context, p store.CountersSetParams) error
	CountersAdvance(ctx context.Context, to store.CounterPosition, adv []store.CounterAdvance) (store.CountersAdvanced, error)
	LeaseCheckpoint(ctx context.Context, ref store.LeaseRef, checkpoint bson.Raw, at bson.Timestamp) error
	QueueRecount(ctx context.Context, p store.QueueRecountParams) (store.Recount, error)
	QueueCounters(ctx context.Context) (map[bson.ObjectID]store.StoredCounters, error)
	TasksPreImagesSet(ctx context.Context, on bool) error
	LeaseSessionStart(ctx context.Context, ref store.LeaseRef) (*store.LeaseSession, error)
	StreamOpen(ctx context.Context, p store.StreamParams) (*store.StreamReader, error)
}

// Config configures a Service.
type Config struct {
	Node  string
	Store Store
	// LeaseTTL is how long the lease lasts without renewal (default 10 s);
	// it is renewed every LeaseTTL/4 and followers try every LeaseTTL/4.
	LeaseTTL time.Duration
	// ReconcileEvery is the periodic recount (default 10 minutes).
	ReconcileEvery time.Duration
	// MaxBatch and MaxBatchWait bound a batch (default 1000 events, 20 ms:
	// the window is most of the lag, and 50 ms did not raise throughput).
	// MaxBatchWait also paces the stream: the server is asked for events
	// at most that often (at once after a full reply).
	MaxBatch     int
	MaxBatchWait time.Duration
	// PreImagesIdle is how long pre-images stay on after the last change
	// another program made (default DefaultPreImagesIdle): see "Old
	// status: pre-images" in the package documentation.
	PreImagesIdle time.Duration
	// LagWindow is how many of the latest events' lags Stats.LagP50 and
	// LagP99 summarise (default DefaultLagWindow). A benchmark that wants
	// a whole drain's sets it above the drain's events.
	LagWindow int
	// Rider, when set, follows the projector's stream while this
	// projector leads: the stream carries StreamLeader's events too
	// (store.StreamParams.Leader), and every batch read is handed to it.
	// The node's leader duties read it instead of a stream of their own
	// when the node holds both leases (docs/architecture.md, "One stream
	// for the projector and the leader").
	Rider Rider
	// Yield, when set, is asked before each try for the lease: while it
	// says yes the projector tries once a LeaseTTL instead of every
	// LeaseTTL/4, leaving a free lease to the node it yields to
	// (leadership.Config.Yield).
	Yield func() bool
	// First, when set, is waited on before the first try for the lease
	// (leadership.Config.First).
	First  func(ctx context.Context)
	Clock  clock.Clock
	Logger *slog.Logger
}

// Rider follows the projector's stream (Config.Rider). Its methods are
// called from the projector's goroutine and must not block.
type Rider interface {
	// Board: a stream starts (a term's first, or one reopened); what
	// follows continues no batch handed before.
	Board()
	// Ride hands over the next batch read, whole: store.LeaderMatch
	// picks out the leader's events.
	Ride(b store.StreamBatch)
	// Alight: the term's stream has ended.
	Alight()
}

// checkpointEvery is how often the lease's checkpoint is written while
// batches are applied: a round trip of its own, so not one a batch. A
// successor resumes from it and skips what each queue's position says its
// counters hold.
const checkpointEvery = time.Second

// DefaultLagWindow is Config.LagWindow's default.
const DefaultLagWindow = 8192

// LagMaxAge is how long a lag counts in Stats.LagP50 and LagP99: a lag
// recorded longer ago is left out, so that a slow spell (a new term's
// catch-up) stops counting once it is over, however few events come
// after it (a quiet cluster kept a new term's catch-up lags for hours).
const LagMaxAge = 5 * time.Minute

// DefaultPreImagesIdle is Config.PreImagesIdle's default.
const DefaultPreImagesIdle = 10 * time.Minute

// Stats are counters for metrics and tests.
type Stats struct {
	Leader     bool
	Epoch      int64
	Events     int64 // events applied (while leader), each once: not those a new term reads again
	Batches    int64
	Reconciles int64
	// PreImages: this node's projector keeps pre-images on (it leads, and
	// another program changed a task within Config.PreImagesIdle).
	PreImages bool
	// Steady: this node leads, its term has caught up with the stream
	// and reconciled, and the stream it follows was opened without
	// pre-images, as it stays while only our nodes write (a cluster that
	// has run PreImagesIdle). Benchmarks start a drain then.
	Steady bool
	// Committing: a batch's counter write is in flight. Its counters may
	// already be read while its events and lags are not yet in these
	// stats: a reader that saw the counters waits until it is false.
	Committing bool
	// DriftQueues counts queues whose counters differed from a recount
	// (not counting counters that were missing).
	DriftQueues int64
	// RecountFailures counts recounts, or their repairs, that failed (each
	// retried after a backoff).
	RecountFailures int64
	// LagP50 and LagP99 summarise the lags of the latest LagWindow
	// events recorded within LagMaxAge (0 when there are none).
	LagP50 time.Duration
	LagP99 time.Duration
	// Reasons counts the reasons written on tasks (why a task ended or is
	// held: cancelled, killed, timeout, retrying, orphaned, ...), by queue,
	// whoever wrote them (a node, the CLI, the web API, another program),
	// in the events this node applied while it led. Events a recount
	// covered instead (a lost stream position) are not in it.
	Reasons map[ReasonKey]int64
}

// ReasonKey is a queue and a reason.
type ReasonKey struct {
	Queue  bson.ObjectID
	Reason string
}

// Service stands for the projector's lease among the nodes and, while this
// node holds it, applies the projection. Start it, Stop it.
type Service struct {
	lifecycle.Base
	cfg     Config
	log     *slog.Logger
	clock   clock.Clock
	elector *leadership.Elector

	mu      sync.Mutex
	stats   Stats
	lags    []lagAt // ring of the latest Config.LagWindow lags
	lagI    int
	lagsNew bool      // lags came since Stats last summarised them
	lagsAt  time.Time // when Stats last summarised them
}

// lagAt is one event's lag and when it was recorded.
type lagAt struct {
	lag time.Duration
	at  time.Time
}

// New returns a service; nothing runs until Start.
func New(cfg Config) *Service {
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = leadership.DefaultTTL
	}
	if cfg.ReconcileEvery <= 0 {
		cfg.ReconcileEvery = 10 * time.Minute
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1000
	}
	if cfg.PreImagesIdle <= 0 {
		cfg.PreImagesIdle = DefaultPreImagesIdle
	}
	if cfg.MaxBatchWait <= 0 {
		cfg.MaxBatchWait = 20 * time.Millisecond
	}
	if cfg.LagWindow <= 0 {
		cfg.LagWindow = DefaultLagWindow
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, log: cfg.Logger.With("component", "projector"), clock: clock.Or(cfg.Clock), lags: make([]lagAt, 0, min(cfg.LagWindow, DefaultLagWindow))}
	s.elector = leadership.New(leadership.Config{
		Lease: LeaseName, Owner: cfg.Node, Store: cfg.Store, TTL: cfg.LeaseTTL, Yield: cfg.Yield, First: cfg.First, Clock: cfg.Clock, Logger: cfg.Logger,
	}, s.lead)
	return s
}

// Start starts standing for the lease.
func (s *Service) Start(ctx context.Context) error {
	return s.Base.Start(ctx, func(ctx context.Context, run *lifecycle.Run) error {
		if err := s.elector.Start(ctx); err != nil {
			return err
		}
		// Stop releases the lease, so that another node takes over at once.
		run.Cleanup(s.elector.Stop)
		return nil
	})
}

// Stats returns the counters.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Reasons = maps.Clone(s.stats.Reasons)
	status := s.elector.Status()
	st.Leader, st.Epoch = status.Leader, status.Epoch
	if now := s.clock.Now(); s.lagsNew || now.Sub(s.lagsAt) >= time.Second {
		// Sorted only when lags came since, or some may have aged out: a
		// benchmark polls the stats every few milliseconds, with up to
		// hundreds of thousands kept.
		sorted := make([]time.Duration, 0, len(s.lags))
		for _, l := range s.lags {
			if now.Sub(l.at) <= LagMaxAge {
				sorted = append(sorted, l.lag)
			}
		}
		slices.Sort(sorted)
		s.stats.LagP50, s.stats.LagP99 = 0, 0
		if n := len(sorted); n > 0 {
			s.stats.LagP50, s.stats.LagP99 = sorted[n*50/100], sorted[min(n-1, n*99/100)]
		}
		s.lagsNew, s.lagsAt = false, now
	}
	st.LagP50, st.LagP99 = s.stats.LagP50, s.stats.LagP99
	return st
}

// lead is the projector's duty: one term of leadership.
func (s *Service) lead(ctx context.Context, term leadership.Term) error {
	s.log.Info("projector lease acquired: applying counter projections", "epoch", term.Lease.Epoch)
	// The term's transactions run in one session recorded in the lease: a
	// successor ends one this node leaves open if it dies mid-commit.
	sess, err := s.cfg.Store.LeaseSessionStart(ctx, term.Ref())
	if err != nil {
		return err
	}
	defer sess.End(context.Background())
	defer s.flag(&s.stats.PreImages, false) // no longer this node's to say
	defer s.flag(&s.stats.Steady, false)
	if s.cfg.Rider != nil {
		defer s.cfg.Rider.Alight()
	}
	p := &projector{s: s, ref: term.Ref(), sess: sess, token: term.Lease.Checkpoint, at: term.Lease.CheckpointTime,
		applied: map[bson.ObjectID]*store.CounterPosition{}}
	p.marksCleared()
	err = p.run(ctx)
	if errors.Is(err, store.ErrLeaseLost) {
		s.log.Warn("projector lease lost", "epoch", term.Lease.Epoch, "error", err)
	}
	return err
}

// commit runs a recount's counter transaction (store.CountersSet). It is
// never interrupted by Stop:
// a transaction cancelled while one of its operations still runs on the
// server may fail to abort and then holds its locks (the lease, the queues)
// until the server's transaction lifetime limit. Stop waits for it instead;
// the fence makes a late commit harmless.
func (s *Service) commit(ctx context.Context, p store.CountersSetParams) error {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return s.cfg.Store.CountersSet(tctx, p)
}

// flag records one of the stats' flags (PreImages, Steady, Committing).
func (s *Service) flag(field *bool, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*field = on
}

// recorded adds a committed batch to the stats.
func (s *Service) recorded(lags []time.Duration, events int, reasons map[ReasonKey]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Events += int64(events)
	s.stats.Batches++
	for k, n := range reasons {
		if s.stats.Reasons == nil {
			s.stats.Reasons = map[ReasonKey]int64{}
		}
		s.stats.Reasons[k] += n
	}
	s.lagsNew = s.lagsNew || len(lags) > 0
	now := s.clock.Now()
	for _, l := range lags {
		if len(s.lags) < s.cfg.LagWindow {
			s.lags = append(s.lags, lagAt{l, now}) // grows to the window as lags come
		} else {
			s.lags[s.lagI] = lagAt{l, now}
			s.lagI = (s.lagI + 1) % len(s.lags)
		}
	}
}

// projector is one term of leadership.
type projector struct {
	s    *Service
	ref  store.LeaseRef
	sess *store.LeaseSession

	token bson.Raw       // resume token of the last applied position
	at    bson.Timestamp // cluster time of the last applied event
	// applied: how far each queue's counters go in the stream, as this
	// term last knew it (read when the term starts, moved by each batch and
	// recount): CountersAdvance's compare, and the events at or before it
	// are in the counters already (an earlier term applied them).
	applied map[bson.ObjectID]*store.CounterPosition
	// lastCheckpoint: when the lease's checkpoint was last written;
	// checkpointing: the result of the one in flight, nil when none.
	lastCheckpoint time.Time
	checkpointing  chan error
	// recount: queues to recount at the next boundary; full: all of them.
	recount map[bson.ObjectID]bool
	// held: queues another term moved, left out of the batches until
	// their recount sets them (a subset of recount). Their counters hold
	// that term's position, which this term has not applied up to: a
	// batch advanced from it would claim events it never added.
	held map[bson.ObjectID]bool
	full bool
	// unknown: an event could not be applied (no pre-image), so the next
	// reconcile's differences are expected, not drift.
	unknown       bool
	lastReconcile time.Time
	lastCommit    time.Time
	// retry spaces the tries of a failing recount; retryAt: the next
	// one (zero when the last one did not fail).
	retry   backoff.BackOff
	retryAt time.Time
	// bg: the recount of every queue read in the background, the
	// term's catch-up recount or a periodic one (nil: none).
	bg *background
	// preImages: pre-images are on (as this term last set them); foreign:
	// the batch being applied holds a change another program made;
	// lastForeign: when the last such batch was applied.
	preImages   bool
	foreign     bool
	foreignWhat string // the batch's first such change, for the log
	lastForeign time.Time
	lastSet     time.Time
	failedAt    time.Time // the last failed switch: the next waits a minute

	plain bool // the stream followed was opened without pre-images
	// reconciled: the term caught up and has recounted every queue
	// since; until then that recount (its catch-up) is due.
	reconciled bool
}

// steady records Stats.Steady: the term caught up and reconciled, and
// follows its stream without pre-images.
func (p *projector) steady() { p.s.flag(&p.s.stats.Steady, p.plain && p.reconciled) }

// run follows the stream from the checkpoint (or recounts and starts now)
// and applies batches until ctx ends.
func (p *projector) run(ctx context.Context) error {
	clk := p.s.clock
	p.lastCommit, p.lastReconcile = clk.Now(), clk.Now()
	// A term starts with pre-images on: it has not yet seen whether
	// another program writes. Off after PreImagesIdle of our writes alone.
	p.lastForeign = clk.Now()
	p.setPreImages(ctx, true, "a term starts with them on")
	caughtUp := false
	p.retry = recountRetry()
	stored, err := p.s.cfg.Store.QueueCounters(ctx)
	if err != nil {
		return err
	}
	for q, c := range stored {
		p.applied[q] = c.Applied
	}
	first, err := p.open(ctx)
	if err != nil {
		return err
	}
	r := startPrefetch(ctx, first)
	defer func() { r.Close() }()
	defer func() { _ = p.checkpointed(true) }() // one round trip at most
	defer func() { p.bg.stop() }()
	for ctx.Err() == nil {
		b, err := r.Next(ctx)
		if err != nil {
			return nil // ctx ended
		}
		if rider := p.s.cfg.Rider; rider != nil {
			rider.Ride(b)
			b.Events = store.OnlyEvents(b.Events, store.CountersMatch) // the rider's alone dropped
		}
		if b.Lost != "" {
			p.s.log.Warn("projector position lost (no longer in the oplog, or cannot be from this deployment): recounting", "why", b.Lost)
			r.Close()
			next, err := p.restart(ctx)
			if err != nil {
				return err
			}
			// A recount at the present, as good as the reconcile on
			// catching up once the term has caught up.
			p.reconciled = caughtUp
			p.steady()
			r = startPrefetch(ctx, next)
			continue
		}
		if len(b.Events) > 0 || (b.Token != nil && clk.Since(p.lastCommit) > 10*time.Second && string(b.Token) != string(p.token)) {
			if err := p.apply(ctx, b.Events, b.Token); err != nil {
				if errors.Is(err, store.ErrLeaseLost) || ctx.Err() != nil {
					return err
				}
				return fmt.Errorf("apply a batch: %w", err) // the next term resumes from the checkpoint
			}
		}
		if p.switchPreImages(ctx) {
			// Ask for pre-images, or stop asking, from the position
			// reached.
			r.Close()
			next, err := p.open(ctx)
			if err != nil {
				return err
			}
			r = startPrefetch(ctx, next)
		}
		if b.CaughtUp {
			caughtUp = true
		}
		if err := p.backgroundDone(ctx); err != nil {
			return err
		}
		onCatchUp := caughtUp && !p.reconciled && p.bg == nil
		periodic := p.bg == nil && clk.Since(p.lastReconcile) > p.s.cfg.ReconcileEvery
		// A recount waits for a batch that held all there was: a reply
		// cut short by MaxBatch can end inside a transaction (its events
		// share one moment), and a recount at that moment would hold the
		// whole of it where the counters hold part, and call the
		// difference drift. While the projector is behind, its recounts
		// wait; after a failed one, the backoff's wait too.
		may := b.CaughtUp && !clk.Now().Before(p.retryAt)
		if may && p.bg == nil && (periodic || onCatchUp) && !p.full && len(p.recount) == 0 {
			// Nothing known to need it (no queue marked, no event it
			// could not place): the batches go on while it reads, the
			// term's catch-up recount as the periodic one.
			p.startBackground(ctx)
			periodic, onCatchUp = false, false
		}
		if may && (onCatchUp || periodic || p.full || len(p.recount) > 0) {
			if onCatchUp || periodic {
				p.full = true // every queue
			}
			full := p.full
			err := p.reconcile(ctx)
			if err == nil || errors.Is(err, errReposition) {
				if full || err != nil {
					// Every queue recounted (a repositioned stream
					// recounts every queue at the present): the term
					// has reconciled once caught up.
					p.reconciled = caughtUp
					p.steady()
				}
				p.recounted()
			}
			switch {
			case errors.Is(err, errReposition):
				// Counters now describe a later moment than the stream:
				// restart the stream just after it.
				r.Close()
				next, err := p.open(ctx)
				if err != nil {
					return err
				}
				r = startPrefetch(ctx, next)
			case errors.Is(err, store.ErrLeaseLost) || ctx.Err() != nil:
				return err
			case err != nil:
				p.backOff("reconcile", err)
				p.lastReconcile = clk.Now()
			}
		}
	}
	return nil
}

// backOff spaces the next recount after what failed with err, and says
// when it comes.
func (p *projector) backOff(what string, err error) {
	wait := p.retry.NextBackOff()
	p.retryAt = p.s.clock.Now().Add(wait)
	p.s.log.Warn(what+" failed; retrying later", "error", err, "retry_in", wait.Round(time.Millisecond))
	p.s.mu.Lock()
	p.s.stats.RecountFailures++
	p.s.mu.Unlock()
}

// recounted ends the backoff after a recount that succeeded.
func (p *projector) recounted() {
	p.retry.Reset()
	p.retryAt = time.Time{}
}

// open follows the stream from the checkpoint: after its token, or just
// after its time. Without either it recounts every queue at the present,
// sets the counters, and starts just after that moment (as it does when
// the first batch says the checkpoint is lost).
func (p *projector) open(ctx context.Context) (*store.StreamReader, error) {
	if p.token == nil && p.at.IsZero() {
		return p.restart(ctx)
	}
	return p.reader(ctx, store.Position{Token: p.token, Time: p.at})
}

func (p *projector) reader(ctx context.Context, from store.Position) (*store.StreamReader, error) {
	r, err := p.s.cfg.Store.StreamOpen(ctx, store.StreamParams{
		Profile: store.StreamCounters, Name: "projector", From: from, NoPreImages: !p.preImages, Leader: p.s.cfg.Rider != nil,
		MaxAwait: 500 * time.Millisecond, MaxBatch: p.s.cfg.MaxBatch, BatchWait: p.s.cfg.MaxBatchWait, Pace: p.s.cfg.MaxBatchWait,
		Logger: p.s.log, // paced in real time
	})
	if err == nil && p.s.cfg.Rider != nil {
		p.s.cfg.Rider.Board()
	}
	p.plain = err == nil && !p.preImages
	p.steady()
	return r, err
}

// restart recounts every queue at the present, sets the counters, and
// opens the stream just after that moment.
func (p *projector) restart(ctx context.Context) (*store.StreamReader, error) {
	p.plain = false // no stream until the recount is done
	p.steady()
	p.bg.spoil()
	rc, err := p.s.cfg.Store.QueueRecount(ctx, store.QueueRecountParams{})
	if err != nil {
		return nil, err
	}
	p.token, p.at = nil, rc.At
	// Every queue is set, its position with it: a position kept from
	// before (of a history this stream no longer follows) must not skip
	// what comes.
	if err := p.repair(ctx, rc, false, true); err != nil {
		return nil, err
	}
	r, err := p.reader(ctx, store.Position{Time: rc.At})
	if err != nil {
		return nil, err
	}
	p.marksCleared()
	return r, nil
}

// apply folds a batch into per-queue deltas and adds them to the queues'
// counters in one round trip, each queue's compared on its position
// (store.CountersAdvance), then starts writing the lease's checkpoint if
// the last is checkpointEvery old and no recount is pending. A term that
// starts from an older checkpoint skips, queue by queue, what the counters
// already hold (applied).
func (p *projector) apply(ctx context.Context, batch []store.ChangeEvent, token bson.Raw) error {
	// The last checkpoint's outcome first: a term that lost its lease
	// writes nothing more.
	if err := p.checkpointed(false); err != nil {
		return err
	}
	deltas := map[bson.ObjectID]*store.QueueCounts{}
	reasons := map[ReasonKey]int64{}
	at := p.at
	var walls []time.Time
	fresh := 0 // the events an earlier term did not apply
	for _, ev := range batch {
		if !ev.ClusterTime.IsZero() {
			at = ev.ClusterTime
		}
		if !p.readAgain(ev, at) {
			fresh++
			if !ev.WallTime.IsZero() {
				// A re-read event's age is the handover's, not a lag
				// of the counters: an earlier term applied it.
				walls = append(walls, ev.WallTime)
			}
		}
		p.fold(ev, at, deltas)
		countReason(ev, reasons, func(q bson.ObjectID) bool { return p.covers(q, at, ev) })
	}
	adv := make([]store.CounterAdvance, 0, len(deltas))
	for q, d := range deltas {
		if p.held[q] {
			delete(deltas, q) // its recount counts these events
			continue
		}
		if *d != (store.QueueCounts{}) {
			adv = append(adv, store.CounterAdvance{Delta: store.CounterDelta{Queue: q, Todo: d.Todo, Total: d.Total, Running: d.Running, Failed: d.Failed}, From: p.applied[q]})
		}
	}
	p.s.flag(&p.s.stats.Committing, true)
	defer p.s.flag(&p.s.stats.Committing, false) // once recorded
	if len(adv) > 0 {
		to := store.CounterPosition{Time: at, Token: batch[len(batch)-1].Place()}
		res, err := p.s.cfg.Store.CountersAdvance(ctx, to, adv)
		if err != nil {
			return err
		}
		for _, a := range adv {
			p.applied[a.Delta.Queue] = &to
		}
		for q, pos := range res.Moved {
			// Another term (a deposed projector, or this one's successor)
			// moved this queue's counters: take its position, and recount
			// the queue at this batch's end, which the recount fences by
			// the lease (a deposed projector's recount fails, and its term
			// ends). The difference it finds is expected, not drift. Until
			// then the queue is held out of the batches: its position may
			// lie inside this batch, whose events for it were not added,
			// and the next batch would advance it from there without them.
			p.movedByAnother(q, pos)
		}
		for _, q := range res.Missing {
			delete(p.applied, q)
			p.recount[q] = true
		}
		p.bg.advanced(deltas, res)
	}
	// Not past a batch whose queues are still to be recounted (another
	// term moved them, or they lack counters): a successor resuming after
	// it would never read their events again. The recount's transaction
	// writes the checkpoint with its sets.
	if token != nil && len(p.recount) == 0 && !p.full && p.checkpointing == nil && p.s.clock.Since(p.lastCheckpoint) >= checkpointEvery {
		p.checkpoint(ctx, token, at)
	}
	now := p.s.clock.Now()
	lags := make([]time.Duration, len(walls))
	for i, w := range walls {
		lags[i] = now.Sub(w)
	}
	p.s.recorded(lags, fresh, reasons)
	p.token, p.at, p.lastCommit = token, at, now
	return nil
}

// movedByAnother marks queue q, whose counters another term moved to pos,
// for a recount between batches and holds it out of the batches until
// then. The recount is fenced by the lease: a deposed term's fails, and
// the term ends. Its difference is another term's progress, not drift.
func (p *projector) movedByAnother(q bson.ObjectID, pos *store.CounterPosition) {
	p.s.log.Warn("queue counters moved by another projector term: recounting the queue", "queue", q.Hex())
	p.applied[q], p.recount[q], p.held[q], p.unknown = pos, true, true, true
}

// checkpoint writes the lease's checkpoint in the background, off the
// batches' path: a round trip of its own, majority-acknowledged, that held
// one batch a second back. At most one is in flight; the lease found lost
// ends the term before the next batch is written (a deposed term may have
// written one batch more meanwhile, which each queue's position fences).
// Another failure is logged, and the next checkpoint, a period later,
// tries again: until then a successor resumes from the last one written,
// which only re-reads events the queues' positions already cover.
func (p *projector) checkpoint(ctx context.Context, token bson.Raw, at bson.Timestamp) {
	done := make(chan error, 1)
	p.checkpointing, p.lastCheckpoint = done, p.s.clock.Now()
	go func() {
		if err := p.s.cfg.Store.LeaseCheckpoint(ctx, p.ref, token, at); err != nil {
			done <- fmt.Errorf("write the checkpoint: %w", err)
			return
		}
		done <- nil
	}()
}

// checkpointed collects the checkpoint in flight, if any: with wait, once
// it is written; without, only if it already is.
func (p *projector) checkpointed(wait bool) error {
	if p.checkpointing == nil {
		return nil
	}
	var err error
	if wait {
		err = <-p.checkpointing
	} else {
		select {
		case err = <-p.checkpointing:
		default:
			return nil
		}
	}
	p.checkpointing = nil
	if err != nil && !errors.Is(err, store.ErrLeaseLost) {
		p.s.log.Warn("projector checkpoint not written: the next one tries again", "error", err)
		return nil
	}
	return err
}

// switchPreImages turns pre-images on after a batch that held another
// program's change, and off once none came for Config.PreImagesIdle. It
// says whether they changed: the stream is then to be reopened, asking
// for them or not.
func (p *projector) switchPreImages(ctx context.Context) (changed bool) {
	was := p.preImages
	defer func() { changed = p.preImages != was }()
	now := p.s.clock.Now()
	if p.foreign {
		p.lastForeign = now
	}
	if !p.failedAt.IsZero() && now.Sub(p.failedAt) < time.Minute {
		return
	}
	switch {
	case p.foreign:
		p.foreign = false
		if !p.preImages {
			p.setPreImages(ctx, true, "a change that does not say where its task stood (another program's): "+p.foreignWhat)
		}
		p.foreignWhat = ""
	case now.Sub(p.lastForeign) >= p.s.cfg.PreImagesIdle && (p.preImages || now.Sub(p.lastSet) >= p.s.cfg.PreImagesIdle):
		// Said again every PreImagesIdle: another program (disbatch-web
		// at its start) may have turned them on.
		p.setPreImages(ctx, false, "no other program changed a task for "+p.s.cfg.PreImagesIdle.String())
	}
	return false // set by the deferred comparison
}

// setPreImages turns pre-images on or off. A failure is logged and tried
// again after the next batch: counters stay exact either way (an event
// without its old state is recounted), only the cost differs.
func (p *projector) setPreImages(ctx context.Context, on bool, why string) {
	if on {
		p.plain = false // until the stream is reopened without them
		p.steady()
	}
	if err := p.s.cfg.Store.TasksPreImagesSet(ctx, on); err != nil {
		if ctx.Err() != nil {
			return // the term is ending (Stop, a lost lease): no failure to report
		}
		p.failedAt = p.s.clock.Now()
		p.s.log.Warn("cannot turn change stream pre-images on or off for tasks; trying again in a minute", "on", on, "error", err)
		return
	}
	p.failedAt = time.Time{}
	changed := p.preImages != on || p.lastSet.IsZero()
	p.preImages, p.lastSet = on, p.s.clock.Now()
	p.s.flag(&p.s.stats.PreImages, on)
	if changed {
		p.s.log.Info("task pre-images turned "+map[bool]string{true: "on", false: "off"}[on], "why", why)
	}
}

// foreign says whether ev is a change of a task that another program made
// (every write of ours that moves a task writes schema.TaskPrior; the
// store's conformance suite holds it to that): one whose old state only a
// pre-image gives.
func foreign(ev store.ChangeEvent) bool {
	if ev.Coll != schema.CollTasks {
		return false
	}
	switch ev.Op {
	case "replace", "delete":
		return true
	case "update":
		return !ev.Prior
	}
	return false
}

// fold adds one event's effect to deltas.
func (p *projector) fold(ev store.ChangeEvent, at bson.Timestamp, deltas map[bson.ObjectID]*store.QueueCounts) {
	if foreign(ev) {
		if !p.foreign {
			p.foreignWhat = ev.Op + " of task " + ev.ID.String()
		}
		p.foreign = true
	}
	switch ev.Op {
	case "dropDatabase", "invalidate", "drop", "rename":
		p.full = true
		return
	}
	if ev.Coll == schema.CollQueues {
		if id, ok := ev.ID.ObjectIDOK(); ok {
			p.recount[id] = true // a new queue gets its counters by a recount
		}
		return
	}
	add := func(q bson.RawValue, status bson.RawValue, sign int64) {
		id, ok := q.ObjectIDOK()
		if !ok {
			return // a task with no (valid) queue counts nowhere
		}
		if p.covers(id, at, ev) {
			return // already in its counters: an earlier term applied it
		}
		d := deltas[id]
		if d == nil {
			d = &store.QueueCounts{}
			deltas[id] = d
		}
		d.Add(status, sign)
	}
	after, before := ev.Doc, ev.Before
	if ev.Op != "insert" && before == nil {
		p.full, p.unknown = true, true // no pre-image: the old state is unknown
		return
	}
	switch ev.Op {
	case "insert":
		add(after.Lookup(schema.TaskQueue), after.Lookup(schema.TaskStatus), +1)
	case "replace":
		add(before.Lookup(schema.TaskQueue), before.Lookup(schema.TaskStatus), -1)
		add(after.Lookup(schema.TaskQueue), after.Lookup(schema.TaskStatus), +1)
	case "delete":
		add(before.Lookup(schema.TaskQueue), before.Lookup(schema.TaskStatus), -1)
	case "update":
		oldQ, oldS := before.Lookup(schema.TaskQueue), before.Lookup(schema.TaskStatus)
		newQ, newS := oldQ, oldS
		if v, err := ev.Updated.LookupErr(schema.TaskQueue); err == nil {
			newQ = v
		}
		if v, err := ev.Updated.LookupErr(schema.TaskStatus); err == nil {
			newS = v
		}
		for _, r := range ev.Removed {
			switch r {
			case schema.TaskQueue:
				newQ = bson.RawValue{}
			case schema.TaskStatus:
				newS = bson.RawValue{}
			}
		}
		if oldQ.Equal(newQ) && counted(oldS) == counted(newS) {
			return
		}
		add(oldQ, oldS, -1)
		add(newQ, newS, +1)
	}
}

// covers reports whether queue q's counters already hold ev (at its
// cluster time at): an earlier term applied it.
func (p *projector) covers(q bson.ObjectID, at bson.Timestamp, ev store.ChangeEvent) bool {
	pos := p.applied[q]
	return pos != nil && !at.After(pos.Time) && pos.Covers(at, ev.Place())
}

// readAgain reports whether ev is a task event that the counters of the
// queue it leaves its task in already hold: a term resuming from an older
// checkpoint reads it again, and the stats do not count it as applied a
// second time.
func (p *projector) readAgain(ev store.ChangeEvent, at bson.Timestamp) bool {
	if ev.Coll != schema.CollTasks {
		return false
	}
	var queue bson.RawValue
	for _, d := range []bson.Raw{ev.Updated, ev.Doc, ev.Before} {
		if v, err := d.LookupErr(schema.TaskQueue); err == nil {
			queue = v
			break
		}
	}
	q, ok := queue.ObjectIDOK()
	return ok && p.covers(q, at, ev)
}

// countReason counts a reason the event wrote on a task: an update that
// set it (a start removes it, so each attempt's is written afresh), or an
// insert or replace whose document has one its pre-image did not; unless
// its queue's counters already hold ev (applied: an earlier term, this
// node's or another's, counted it then; a term resumes from the last
// checkpoint and reads again what came after it).
func countReason(ev store.ChangeEvent, reasons map[ReasonKey]int64, applied func(bson.ObjectID) bool) {
	if ev.Coll != schema.CollTasks {
		return
	}
	var reason, queue bson.RawValue
	switch ev.Op {
	case "update":
		reason = ev.Updated.Lookup(schema.TaskReason)
		queue = ev.Updated.Lookup(schema.TaskQueue)
		if queue.Type == 0 {
			queue = ev.Before.Lookup(schema.TaskQueue)
		}
	case "insert", "replace":
		reason, queue = ev.Doc.Lookup(schema.TaskReason), ev.Doc.Lookup(schema.TaskQueue)
		if ev.Before != nil && ev.Before.Lookup(schema.TaskReason).Equal(reason) {
			return
		}
	default:
		return
	}
	r, ok := reason.StringValueOK()
	q, qok := queue.ObjectIDOK()
	if ok && r != "" && qok && !applied(q) {
		reasons[ReasonKey{Queue: q, Reason: r}]++
	}
}

// counted is what one task whose status is s counts for in its queue.
func counted(s bson.RawValue) store.QueueCounts {
	var c store.QueueCounts
	c.Add(s, 1)
	return c
}

// recountRetry spaces the tries of a failing recount: 1 s, then twice as
// long each time up to a minute, with a fifth of jitter. Each try is an
// aggregation (over every task, for a recount of every queue), and each
// failure a warning; meanwhile the checkpoint waits (no checkpoint passes
// queues still to recount), and the batches go on.
func recountRetry() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.Multiplier, b.MaxInterval = time.Second, 2, time.Minute
	b.RandomizationFactor = 0.2
	b.MaxElapsedTime = 0 // never gives up: the term's end does
	b.Reset()
	return b
}

// errReposition asks run to restart the stream at the checkpoint.
var errReposition = errors.New("recounted at a later moment than the stream: repositioning")

// reconcile recounts (all queues, or those marked) as a snapshot at the
// cluster time of the last applied event and repairs what differs. When
// that moment is no longer readable it clears the position instead, so the
// stream reopens with a full recount at the present.
func (p *projector) reconcile(ctx context.Context) error {
	if p.at.IsZero() {
		p.token = nil
		return errReposition
	}
	at := p.at
	params := store.QueueRecountParams{At: &at}
	if !p.full {
		// Those marked alone: a new queue's recount reads its tasks'
		// index entries, not every task's (0.6 s at 1,000,000 tasks, which
		// the batches wait for).
		params.Queues = slices.Collect(maps.Keys(p.recount))
	}
	rc, err := p.s.cfg.Store.QueueRecount(ctx, params)
	if errors.Is(err, store.ErrSnapshotTooOld) {
		// Behind by more than the server keeps snapshots for, or idle
		// that long (no event has moved the position since).
		p.s.log.Warn("the projector's last event is older than the server's snapshot history (it is far behind, or no task changed since): recounting at the present", "error", err)
		p.token, p.at = nil, bson.Timestamp{}
		return errReposition
	}
	if err != nil {
		return err
	}
	if err := p.repair(ctx, rc, !p.unknown, false); err != nil {
		return err
	}
	if p.full {
		p.bg.spoil() // this one covered every queue
	} else {
		p.bg.skipAll(p.recount) // set at a later moment than its
	}
	p.marksCleared()
	p.lastReconcile = p.s.clock.Now()
	return nil
}

// marksCleared forgets what called for a recount (the queues marked, and
// held, every queue, an event it could not place): every queue that
// needed one was just recounted.
func (p *projector) marksCleared() {
	p.full, p.unknown, p.recount, p.held = false, false, map[bson.ObjectID]bool{}, map[bson.ObjectID]bool{}
}

// repair compares a recount with the stored counters and sets those that
// differ (of the queues the recount holds; with all, every one),
// fenced by the lease, at the current position (p.token / p.at), which
// is the recount's moment. A queue set gets that moment as its position,
// which covers the events the recount holds: the stream goes on after it,
// and the rest of a transaction a batch cut in two shares the moment. One
// left keeps its own (it matched the recount, so that rest adds nothing).
// With exact, any difference is drift and is logged as such.
func (p *projector) repair(ctx context.Context, rc store.Recount, exact, all bool) error {
	stored, err := p.s.cfg.Store.QueueCounters(ctx)
	if err != nil {
		return err
	}
	sets := map[bson.ObjectID]store.QueueCounts{}
	drift := int64(0)
	for q, c := range rc.Counts {
		cur, ok := stored[q]
		if !ok {
			delete(p.applied, q)
			continue // deleted since
		}
		p.applied[q] = cur.Applied // what the counters were compared at; a set moves it below
		if !cur.Complete() {
			// A queue made by a client or by 4.103, or from before
			// count_running or count_failed existed: the missing ones are
			// created, and those already there are not drift if they differ.
			sets[q] = c
			p.logCreated(q, c)
			continue
		}
		if cur.Are(c) {
			if all {
				sets[q] = c
			}
			continue
		}
		sets[q] = c
		// Counters past the recount's moment are another term's progress
		// (a deposed projector's last batch): a difference, not drift.
		isDrift := exact && (cur.Applied == nil || !cur.Applied.Time.After(rc.At))
		attrs := differs(q, cur, c)
		if isDrift {
			drift++
			p.s.log.Error("counter drift repaired", attrs...)
		} else {
			p.s.log.Warn("counters set from a recount", attrs...)
		}
	}
	return p.setRecounted(ctx, sets, nil, drift)
}

// logCreated says that a recount created a queue's counters.
func (p *projector) logCreated(q bson.ObjectID, c store.QueueCounts) {
	p.s.log.Info("queue counters created by a recount", "queue", q.Hex(), "count_todo", c.Todo, "count_total", c.Total, "count_running", c.Running,
		"count_failed", c.Failed)
}

// differs is the log's account of a queue whose complete counters cur
// differ from a recount's c: each stored value beside the recounted one.
func differs(q bson.ObjectID, cur store.StoredCounters, c store.QueueCounts) []any {
	return []any{"queue", q.Hex(), "count_todo", *cur.Todo, "recount_todo", c.Todo, "count_total", *cur.Total, "recount_total", c.Total,
		"count_running", *cur.Running, "recount_running", c.Running, "count_failed", *cur.Failed, "recount_failed", c.Failed}
}

// setRecounted writes a recount's sets, each queue at its position in
// positions or else at the current moment, fenced by the lease in one
// transaction that writes the checkpoint too, and counts the recount and
// its drift in the stats.
func (p *projector) setRecounted(ctx context.Context, sets map[bson.ObjectID]store.QueueCounts, positions map[bson.ObjectID]store.CounterPosition, drift int64) error {
	if len(sets) > 0 {
		// The sets write the checkpoint too: one in flight must land
		// first, or it could take the checkpoint back behind them.
		if err := p.checkpointed(true); err != nil {
			return err
		}
		if err := p.s.commit(ctx, store.CountersSetParams{Lease: p.ref, Session: p.sess, Sets: sets, Positions: positions, Checkpoint: p.token, CheckpointTime: p.at}); err != nil {
			return err
		}
		for q := range sets {
			pos, ok := positions[q]
			if !ok {
				pos = store.CounterPosition{Time: p.at} // as CountersSet set it
			}
			p.applied[q] = &pos
		}
		p.lastCheckpoint = p.s.clock.Now()
	}
	p.s.mu.Lock()
	p.s.stats.Reconciles++
	p.s.stats.DriftQueues += drift
	p.s.mu.Unlock()
	return nil
}
