package projections

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// LeaseName is the projector's lease.
const LeaseName = "projector"

// Store is what the projector needs.
type Store interface {
	LeaseAcquire(ctx context.Context, p store.LeaseAcquireParams) (store.Lease, error)
	LeaseRenew(ctx context.Context, ref store.LeaseRef, ttl time.Duration) error
	LeaseRelease(ctx context.Context, ref store.LeaseRef) error
	CountersApply(ctx context.Context, p store.CountersApplyParams) ([]bson.ObjectID, error)
	QueueRecount(ctx context.Context, at *bson.Timestamp) (store.Recount, error)
	QueueCounters(ctx context.Context) (map[bson.ObjectID][2]*int64, error)
	TasksPreImagesEnable(ctx context.Context) error
	Database() *mongo.Database
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
	// MaxBatch and MaxBatchWait bound a batch (default 1000 events, 50 ms).
	MaxBatch     int
	MaxBatchWait time.Duration
	Logger       *slog.Logger
}

// Stats are counters for metrics and tests.
type Stats struct {
	Leader     bool
	Epoch      int64
	Events     int64 // events applied (while leader)
	Batches    int64
	Reconciles int64
	// DriftQueues counts queues whose counters differed from a recount
	// (not counting counters that were missing).
	DriftQueues int64
	LagP50      time.Duration
	LagP99      time.Duration
}

// Service elects a projector among the nodes and, while this node holds
// the lease, applies the projection. Start it, Stop it.
type Service struct {
	cfg    Config
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	mu    sync.Mutex
	stats Stats
	lags  []time.Duration // ring of recent lags
	lagI  int
	// hard makes Stop return without releasing the lease (tests: a crash).
	hard bool
}

// New returns a service; nothing runs until Start.
func New(cfg Config) *Service {
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 10 * time.Second
	}
	if cfg.ReconcileEvery <= 0 {
		cfg.ReconcileEvery = 10 * time.Minute
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 1000
	}
	if cfg.MaxBatchWait <= 0 {
		cfg.MaxBatchWait = 50 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, log: cfg.Logger.With("component", "projector", "node", cfg.Node), lags: make([]time.Duration, 0, 8192)}
}

// Start enables pre-images on tasks and starts competing for the lease.
func (s *Service) Start(ctx context.Context) error {
	if s.done != nil {
		return nil
	}
	if err := s.cfg.Store.TasksPreImagesEnable(ctx); err != nil {
		return err
	}
	ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	s.done = make(chan struct{})
	go s.run(ctx)
	return nil
}

// Stop ends the service, releasing the lease if it holds it so that
// another node takes over at once.
func (s *Service) Stop() {
	if s.done == nil {
		return
	}
	s.once.Do(func() {
		s.cancel()
		<-s.done
	})
}

// Stats returns the counters.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	if n := len(s.lags); n > 0 {
		sorted := slices.Clone(s.lags)
		slices.Sort(sorted)
		st.LagP50 = sorted[n*50/100]
		st.LagP99 = sorted[min(n-1, n*99/100)]
	}
	return st
}

func (s *Service) run(ctx context.Context) {
	defer close(s.done)
	every := s.cfg.LeaseTTL / 4
	for {
		lease, err := s.cfg.Store.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: LeaseName, Owner: s.cfg.Node, TTL: s.cfg.LeaseTTL})
		switch {
		case err == nil:
			s.log.Info("projector lease acquired: applying counter projections", "epoch", lease.Epoch)
			s.setLeader(true, lease.Epoch)
			err = s.lead(ctx, lease)
			s.setLeader(false, lease.Epoch)
			if ctx.Err() != nil {
				s.release(lease)
				return
			}
			s.log.Warn("projector lease lost", "epoch", lease.Epoch, "error", err)
		case errors.Is(err, store.ErrLeaseHeld):
		case ctx.Err() == nil:
			s.log.Warn("projector lease: cannot acquire", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func (s *Service) release(lease store.Lease) {
	s.mu.Lock()
	hard := s.hard
	s.mu.Unlock()
	if hard {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.cfg.Store.LeaseRelease(ctx, store.LeaseRef{Name: LeaseName, Owner: s.cfg.Node, Epoch: lease.Epoch}); err != nil {
		s.log.Warn("release projector lease", "error", err)
	}
}

func (s *Service) setLeader(on bool, epoch int64) {
	s.mu.Lock()
	s.stats.Leader, s.stats.Epoch = on, epoch
	s.mu.Unlock()
}

// lead renews the lease in the background and applies the projection until
// the lease is lost or ctx ends.
func (s *Service) lead(ctx context.Context, lease store.Lease) error {
	ref := store.LeaseRef{Name: LeaseName, Owner: s.cfg.Node, Epoch: lease.Epoch}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		last := time.Now()
		t := time.NewTicker(s.cfg.LeaseTTL / 4)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, s.cfg.LeaseTTL/4)
			err := s.cfg.Store.LeaseRenew(rctx, ref, s.cfg.LeaseTTL)
			rcancel()
			switch {
			case err == nil:
				last = time.Now()
			case errors.Is(err, store.ErrLeaseLost):
				cancel(err)
				return
			case time.Since(last) > s.cfg.LeaseTTL*3/4:
				// The lease may expire before a renewal lands: step back.
				cancel(fmt.Errorf("cannot renew the lease: %w", err))
				return
			}
		}
	}()
	p := &projector{s: s, ref: ref, token: lease.Checkpoint, at: lease.CheckpointTime, skip: map[bson.ObjectID]bson.Timestamp{}, recount: map[bson.ObjectID]bool{}}
	err := p.run(ctx)
	cancel(nil)
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// commit runs one counter transaction. It is never interrupted by Stop:
// a transaction cancelled while one of its operations still runs on the
// server may fail to abort and then holds its locks (the lease, the queues)
// until the server's transaction lifetime limit. Stop waits for it instead;
// the fence makes a late commit harmless.
func (s *Service) commit(ctx context.Context, p store.CountersApplyParams) ([]bson.ObjectID, error) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return s.cfg.Store.CountersApply(tctx, p)
}

func (s *Service) recordLags(lags []time.Duration, events int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Events += int64(events)
	s.stats.Batches++
	for _, l := range lags {
		if len(s.lags) < cap(s.lags) {
			s.lags = append(s.lags, l)
		} else {
			s.lags[s.lagI] = l
			s.lagI = (s.lagI + 1) % len(s.lags)
		}
	}
}

// projector is one term of leadership.
type projector struct {
	s   *Service
	ref store.LeaseRef

	token bson.Raw       // resume token of the last applied position
	at    bson.Timestamp // cluster time of the last applied event
	// skip: events for a queue at or before this time are in its recount.
	skip map[bson.ObjectID]bson.Timestamp
	// recount: queues to recount at the next boundary; full: all of them.
	recount map[bson.ObjectID]bool
	full    bool
	// unknown: an event could not be applied (no pre-image), so the next
	// reconcile's differences are expected, not drift.
	unknown       bool
	lastReconcile time.Time
	lastCommit    time.Time
}

func tsAfter(a, b bson.Timestamp) bool { return a.T > b.T || (a.T == b.T && a.I > b.I) }

// run opens the stream at the checkpoint (or recounts and starts now) and
// applies batches until ctx ends.
func (p *projector) run(ctx context.Context) error {
	caughtUp := false
	reconcileOnCatchUp := true
	cs, err := p.open(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cs.Close(context.Background()) }()
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 50*time.Millisecond, 5*time.Second, 0
	for ctx.Err() == nil {
		batch, token, exhausted := p.collect(ctx, cs)
		if len(batch) > 0 || (token != nil && time.Since(p.lastCommit) > 10*time.Second && string(token) != string(p.token)) {
			if err := p.apply(ctx, batch, token); err != nil {
				if errors.Is(err, store.ErrLeaseLost) || ctx.Err() != nil {
					return err
				}
				return fmt.Errorf("apply a batch: %w", err) // the next term resumes from the checkpoint
			}
		}
		if err := cs.Err(); err != nil || cs.ID() == 0 {
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				p.s.log.Warn("projector stream interrupted; resuming", "error", err)
				if store.StreamPositionLost(err) {
					p.token, p.full = nil, true
				}
			} else {
				p.full = true // invalidated
			}
			_ = cs.Close(context.Background())
			for {
				cs, err = p.open(ctx)
				if err == nil || ctx.Err() != nil {
					break
				}
				wait := b.NextBackOff()
				p.s.log.Warn("projector stream: cannot reopen; retrying", "in", wait, "error", err)
				select {
				case <-ctx.Done():
				case <-time.After(wait):
				}
			}
			if ctx.Err() != nil {
				return nil
			}
			b.Reset()
			continue
		}
		if exhausted {
			caughtUp = true
		}
		onCatchUp := caughtUp && reconcileOnCatchUp
		if onCatchUp || p.full || len(p.recount) > 0 || time.Since(p.lastReconcile) > p.s.cfg.ReconcileEvery {
			if onCatchUp {
				p.full, reconcileOnCatchUp = true, false
			}
			err := p.reconcile(ctx)
			switch {
			case errors.Is(err, errReposition):
				// Counters now describe a later moment than the stream:
				// restart the stream just after it.
				_ = cs.Close(context.Background())
				if cs, err = p.open(ctx); err != nil {
					return err
				}
			case errors.Is(err, store.ErrLeaseLost) || ctx.Err() != nil:
				return err
			case err != nil:
				p.s.log.Warn("reconcile failed; retrying later", "error", err)
				p.lastReconcile = time.Now()
			}
		}
	}
	return nil
}

// open starts the stream at the checkpoint: after its token, or just after
// its time. Without either, or when the server no longer has that part of
// the oplog, it recounts every queue at the present, sets the counters, and
// starts just after that moment.
func (p *projector) open(ctx context.Context) (*mongo.ChangeStream, error) {
	db := p.s.cfg.Store.Database()
	o := func() *options.ChangeStreamOptionsBuilder {
		return options.ChangeStream().SetFullDocumentBeforeChange(options.WhenAvailable).SetMaxAwaitTime(500 * time.Millisecond)
	}
	if p.token != nil {
		if why := p.implausible(ctx, p.token); why != "" {
			p.s.log.Warn("projector checkpoint cannot be from this deployment's history: recounting", "why", why)
			p.token, p.at = nil, bson.Timestamp{}
		}
	}
	if p.token != nil || !p.at.IsZero() {
		opts := o()
		if p.token != nil {
			opts.SetStartAfter(p.token)
		} else {
			next := bson.Timestamp{T: p.at.T, I: p.at.I + 1}
			opts.SetStartAtOperationTime(&next)
		}
		cs, err := db.Watch(ctx, pipeline(), opts)
		if err == nil {
			return cs, nil
		}
		if !store.StreamPositionLost(err) {
			return nil, err
		}
		p.s.log.Warn("projector checkpoint is no longer in the oplog: recounting", "error", err)
	}
	rc, err := p.s.cfg.Store.QueueRecount(ctx, nil)
	if err != nil {
		return nil, err
	}
	p.token, p.at = nil, rc.At
	if err := p.repair(ctx, rc, nil, false); err != nil {
		return nil, err
	}
	next := bson.Timestamp{T: rc.At.T, I: rc.At.I + 1}
	cs, err := db.Watch(ctx, pipeline(), o().SetStartAtOperationTime(&next))
	if err != nil {
		return nil, err
	}
	p.full, p.unknown, p.recount = false, false, map[bson.ObjectID]bool{}
	return cs, nil
}

// implausible says why a checkpoint token cannot be a position in this
// deployment's history, or "". The server rejects a token it cannot find
// in its oplog, but one whose time lies after everything it has (from
// another deployment) it would wait for, skipping what happened meanwhile.
// A resume token's _data starts with 0x82 and the 8-byte cluster time.
func (p *projector) implausible(ctx context.Context, token bson.Raw) string {
	tt, ok := tokenTime(token)
	if !ok {
		return ""
	}
	if !p.at.IsZero() && tsAfter(p.at, tt) {
		return "its time is before the checkpoint's own time"
	}
	var hello bson.Raw
	hello, err := p.s.cfg.Store.Database().RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Raw()
	if err != nil {
		return ""
	}
	t, i, ok := hello.Lookup("operationTime").TimestampOK()
	if ok && tsAfter(tt, bson.Timestamp{T: t, I: i}) {
		return "its time is after the server's present"
	}
	return ""
}

func tokenTime(token bson.Raw) (bson.Timestamp, bool) {
	data, ok := token.Lookup("_data").StringValueOK()
	if !ok || len(data) < 18 || data[:2] != "82" {
		return bson.Timestamp{}, false
	}
	b, err := hex.DecodeString(data[2:18])
	if err != nil {
		return bson.Timestamp{}, false
	}
	return bson.Timestamp{T: binary.BigEndian.Uint32(b[:4]), I: binary.BigEndian.Uint32(b[4:])}, true
}

func pipeline() mongo.Pipeline {
	return mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"insert", "replace", "delete", "drop", "rename"}}}}},
			bson.D{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "operationType", Value: "update"}, {Key: "$or", Value: bson.A{
				bson.D{{Key: "updateDescription.updatedFields.status", Value: bson.D{{Key: "$exists", Value: true}}}},
				bson.D{{Key: "updateDescription.updatedFields.queue", Value: bson.D{{Key: "$exists", Value: true}}}},
				bson.D{{Key: "updateDescription.removedFields", Value: bson.D{{Key: "$in", Value: bson.A{schema.TaskStatus, schema.TaskQueue}}}}},
			}}},
			bson.D{{Key: "ns.coll", Value: schema.CollQueues}, {Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"insert", "replace", "drop", "rename"}}}}},
			bson.D{{Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"dropDatabase", "invalidate"}}}}},
		}}}}},
		{{Key: "$project", Value: bson.D{
			{Key: "operationType", Value: 1}, {Key: "ns", Value: 1}, {Key: "documentKey", Value: 1},
			{Key: "clusterTime", Value: 1}, {Key: "wallTime", Value: 1},
			{Key: "fullDocument.queue", Value: 1}, {Key: "fullDocument.status", Value: 1},
			{Key: "fullDocumentBeforeChange.queue", Value: 1}, {Key: "fullDocumentBeforeChange.status", Value: 1},
			{Key: "updateDescription.updatedFields.status", Value: 1}, {Key: "updateDescription.updatedFields.queue", Value: 1},
			{Key: "updateDescription.removedFields", Value: 1},
		}}},
	}
}

// collect reads up to MaxBatch events, stopping early when the stream has
// nothing more right now (exhausted) or MaxBatchWait passed since the
// first. token is the position after the batch.
func (p *projector) collect(ctx context.Context, cs *mongo.ChangeStream) (batch []bson.Raw, token bson.Raw, exhausted bool) {
	var first time.Time
	for len(batch) < p.s.cfg.MaxBatch {
		if !cs.TryNext(ctx) {
			exhausted = true
			break
		}
		batch = append(batch, slices.Clone(cs.Current))
		if first.IsZero() {
			first = time.Now()
		} else if time.Since(first) > p.s.cfg.MaxBatchWait {
			break
		}
	}
	return batch, cs.ResumeToken(), exhausted
}

// apply folds a batch into per-queue deltas and commits them with the
// checkpoint in one fenced transaction.
func (p *projector) apply(ctx context.Context, batch []bson.Raw, token bson.Raw) error {
	deltas := map[bson.ObjectID]*store.CounterDelta{}
	at := p.at
	var walls []time.Time
	for _, ev := range batch {
		if t, i, ok := ev.Lookup("clusterTime").TimestampOK(); ok {
			at = bson.Timestamp{T: t, I: i}
		}
		if wt, ok := ev.Lookup("wallTime").TimeOK(); ok {
			walls = append(walls, wt)
		}
		p.fold(ev, at, deltas)
	}
	list := make([]store.CounterDelta, 0, len(deltas))
	for _, d := range deltas {
		list = append(list, *d)
	}
	missing, err := p.s.commit(ctx, store.CountersApplyParams{Lease: p.ref, Deltas: list, Checkpoint: token, CheckpointTime: at})
	if err != nil {
		return err
	}
	now := time.Now()
	lags := make([]time.Duration, len(walls))
	for i, w := range walls {
		lags[i] = now.Sub(w)
	}
	p.s.recordLags(lags, len(batch))
	p.token, p.at, p.lastCommit = token, at, now
	for _, q := range missing {
		p.recount[q] = true
	}
	// Skips older than the stream position can no longer match.
	for q, t := range p.skip {
		if tsAfter(at, t) {
			delete(p.skip, q)
		}
	}
	return nil
}

// fold adds one event's effect to deltas.
func (p *projector) fold(ev bson.Raw, at bson.Timestamp, deltas map[bson.ObjectID]*store.CounterDelta) {
	op, _ := ev.Lookup("operationType").StringValueOK()
	coll, _ := ev.Lookup("ns", "coll").StringValueOK()
	if op == "dropDatabase" || op == "invalidate" || op == "drop" || op == "rename" {
		p.full = true
		return
	}
	if coll == schema.CollQueues {
		if id, ok := ev.Lookup("documentKey", "_id").ObjectIDOK(); ok {
			p.recount[id] = true // a new queue gets its counters by a recount
		}
		return
	}
	add := func(q bson.RawValue, todo bool, sign int64) {
		id, ok := q.ObjectIDOK()
		if !ok {
			return // a task with no (valid) queue counts nowhere
		}
		if t, skipped := p.skip[id]; skipped && !tsAfter(at, t) {
			return // already in this queue's recount
		}
		d := deltas[id]
		if d == nil {
			d = &store.CounterDelta{Queue: id}
			deltas[id] = d
		}
		d.Total += sign
		if todo {
			d.Todo += sign
		}
	}
	after := ev.Lookup("fullDocument")
	before := ev.Lookup("fullDocumentBeforeChange")
	if op != "insert" {
		if _, ok := before.DocumentOK(); !ok {
			p.full, p.unknown = true, true // no pre-image: the old state is unknown
			return
		}
	}
	switch op {
	case "insert":
		add(after.Document().Lookup(schema.TaskQueue), isTodo(after.Document().Lookup(schema.TaskStatus)), +1)
	case "replace":
		add(before.Document().Lookup(schema.TaskQueue), isTodo(before.Document().Lookup(schema.TaskStatus)), -1)
		add(after.Document().Lookup(schema.TaskQueue), isTodo(after.Document().Lookup(schema.TaskStatus)), +1)
	case "delete":
		add(before.Document().Lookup(schema.TaskQueue), isTodo(before.Document().Lookup(schema.TaskStatus)), -1)
	case "update":
		old := before.Document()
		oldQ, oldS := old.Lookup(schema.TaskQueue), old.Lookup(schema.TaskStatus)
		newQ, newS := oldQ, oldS
		upd := ev.Lookup("updateDescription")
		if v, err := upd.Document().LookupErr("updatedFields", schema.TaskQueue); err == nil {
			newQ = v
		}
		if v, err := upd.Document().LookupErr("updatedFields", schema.TaskStatus); err == nil {
			newS = v
		}
		if removed, ok := upd.Document().Lookup("removedFields").ArrayOK(); ok {
			vals, _ := removed.Values()
			for _, r := range vals {
				switch r.StringValue() {
				case schema.TaskQueue:
					newQ = bson.RawValue{}
				case schema.TaskStatus:
					newS = bson.RawValue{}
				}
			}
		}
		if oldQ.Equal(newQ) && isTodo(oldS) == isTodo(newS) {
			return
		}
		add(oldQ, isTodo(oldS), -1)
		add(newQ, isTodo(newS), +1)
	}
}

// isTodo is {$lte: [status, 0]} in MongoDB's comparison order: missing,
// null and numbers <= 0 are to do; strings, objects and the rest sort
// above numbers and are not.
func isTodo(v bson.RawValue) bool {
	switch v.Type {
	case 0, bson.TypeNull, bson.TypeUndefined, bson.TypeMinKey:
		return true
	case bson.TypeInt32, bson.TypeInt64:
		return v.AsInt64() <= 0
	case bson.TypeDouble:
		return v.Double() <= 0
	case bson.TypeDecimal128:
		f, err := strconvDecimal(v)
		return err == nil && f <= 0
	}
	return false
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
	rc, err := p.s.cfg.Store.QueueRecount(ctx, &at)
	if err != nil && snapshotTooOld(err) {
		p.s.log.Warn("the projector is too far behind for an exact recount: recounting at the present", "error", err)
		p.token, p.at = nil, bson.Timestamp{}
		return errReposition
	}
	if err != nil {
		return err
	}
	var only map[bson.ObjectID]bool
	if !p.full {
		only = p.recount
	}
	if err := p.repair(ctx, rc, only, !p.unknown); err != nil {
		return err
	}
	p.full, p.unknown, p.recount, p.lastReconcile = false, false, map[bson.ObjectID]bool{}, time.Now()
	return nil
}

func snapshotTooOld(err error) bool {
	var se mongo.ServerError
	return errors.As(err, &se) && (se.HasErrorCode(239) || se.HasErrorCode(246))
}

// repair compares a recount with the stored counters and sets those that
// differ (only the queues in only, when given), fenced like a batch, at the
// current position (p.token / p.at, which must be the recount's moment or
// later events must be skipped: p.skip). With exact, any difference is
// drift and is logged as such.
func (p *projector) repair(ctx context.Context, rc store.Recount, only map[bson.ObjectID]bool, exact bool) error {
	stored, err := p.s.cfg.Store.QueueCounters(ctx)
	if err != nil {
		return err
	}
	sets := map[bson.ObjectID]store.QueueCounts{}
	drift := int64(0)
	for q, c := range rc.Counts {
		if only != nil && !only[q] {
			continue
		}
		p.skip[q] = rc.At // its events up to the recount are in it
		cur, ok := stored[q]
		if !ok {
			continue // deleted since
		}
		if cur[0] == nil || cur[1] == nil {
			sets[q] = c
			p.s.log.Info("queue counters created by a recount", "queue", q.Hex(), "count_todo", c.Todo, "count_total", c.Total)
			continue
		}
		if *cur[0] == c.Todo && *cur[1] == c.Total {
			continue
		}
		sets[q] = c
		if exact {
			drift++
			p.s.log.Error("counter drift repaired", "queue", q.Hex(), "count_todo", *cur[0], "recount_todo", c.Todo, "count_total", *cur[1], "recount_total", c.Total)
		} else {
			p.s.log.Warn("counters set from a recount", "queue", q.Hex(), "count_todo", *cur[0], "recount_todo", c.Todo, "count_total", *cur[1], "recount_total", c.Total)
		}
	}
	if len(sets) > 0 {
		if _, err := p.s.commit(ctx, store.CountersApplyParams{Lease: p.ref, Sets: sets, Checkpoint: p.token, CheckpointTime: p.at}); err != nil {
			return err
		}
	}
	p.s.mu.Lock()
	p.s.stats.Reconciles++
	p.s.stats.DriftQueues += drift
	p.s.mu.Unlock()
	return nil
}
