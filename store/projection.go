package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"

	"github.com/disbatch-go/disbatch/schema"
)

// CollLeases holds leases: {_id: name, owner, epoch, expires, session,
// checkpoint, checkpoint_time}. It is this project's own collection.
const CollLeases = "disbatch_leases"

// ErrLeaseHeld means another owner holds an unexpired lease; ErrLeaseLost
// means this owner's lease (at its epoch) is gone.
var (
	ErrLeaseHeld = errors.New("lease held by another owner")
	ErrLeaseLost = errors.New("lease lost")
)

// Lease is the state of a lease document.
type Lease struct {
	Name    string
	Owner   string
	Epoch   int64
	Expires time.Time
	// Checkpoint is the resume token committed with the last applied batch;
	// CheckpointTime the cluster time of its last event.
	Checkpoint     bson.Raw
	CheckpointTime bson.Timestamp
	// Session is the id of the session the holder runs its transactions in
	// (LeaseSessionStart), if it does.
	Session bson.Raw
}

// LeaseRef names a lease as held by Owner at Epoch: the fence.
type LeaseRef struct {
	Name  string
	Owner string
	Epoch int64
}

// LeaseAcquireParams ask for a lease for TTL.
type LeaseAcquireParams struct {
	Name  string
	Owner string
	TTL   time.Duration
}

// LeaseAcquire takes the lease when it is free, expired, or already
// Owner's, and returns it; the epoch goes up whenever the owner changes. Expiry
// uses the server's clock ($$NOW), so node clocks may disagree. Otherwise
// it returns ErrLeaseHeld.
//
// A transaction a previous holder left open (its process died between the
// transaction's first write and its commit) holds the locks of what it
// wrote, the lease document included, until the server gives up on it
// (transactionLifetimeLimitSeconds, 60 s by default); every write to them
// waits meanwhile. So when the lease is expired, or is Owner's own from an
// earlier term, the session recorded in it (LeaseSessionStart) is killed
// first, which aborts such a transaction at once.
func (s *Store) LeaseAcquire(ctx context.Context, p LeaseAcquireParams) (Lease, error) {
	if err := s.leaseEndAbandoned(ctx, p); err != nil {
		return Lease{}, err
	}
	// One pipeline update: take it when it is ours, expired or new (a
	// missing expires is not after $$NOW), and leave it alone otherwise.
	take := bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: "$eq", Value: bson.A{"$owner", p.Owner}}},
		bson.D{{Key: "$not", Value: bson.A{bson.D{{Key: "$gt", Value: bson.A{"$expires", "$$NOW"}}}}}},
	}}}
	update := mongo.Pipeline{
		{{Key: "$set", Value: bson.D{{Key: "_take", Value: take}}}},
		{{Key: "$set", Value: bson.D{
			{Key: "epoch", Value: bson.D{{Key: "$cond", Value: bson.A{"$_take",
				bson.D{{Key: "$cond", Value: bson.A{
					bson.D{{Key: "$eq", Value: bson.A{"$owner", p.Owner}}},
					"$epoch",
					bson.D{{Key: "$add", Value: bson.A{bson.D{{Key: "$ifNull", Value: bson.A{"$epoch", 0}}}, 1}}},
				}}},
				"$epoch"}}}},
			{Key: "owner", Value: bson.D{{Key: "$cond", Value: bson.A{"$_take", p.Owner, "$owner"}}}},
			{Key: "expires", Value: bson.D{{Key: "$cond", Value: bson.A{"$_take", bson.D{{Key: "$add", Value: bson.A{"$$NOW", p.TTL.Milliseconds()}}}, "$expires"}}}},
		}}},
		{{Key: "$unset", Value: "_take"}},
	}
	raw, err := s.db.Collection(CollLeases).FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: p.Name}}, update,
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Raw()
	if err != nil {
		return Lease{}, fmt.Errorf("acquire lease %s: %w", p.Name, err)
	}
	l := decodeLease(raw)
	if l.Owner != p.Owner {
		return Lease{}, ErrLeaseHeld
	}
	return l, nil
}

// leaseEndAbandoned kills the session recorded in an expired lease, or in
// Owner's own: no holder's term can still be using it. Reading the lease
// never waits for a lock.
func (s *Store) leaseEndAbandoned(ctx context.Context, p LeaseAcquireParams) error {
	cur, err := s.db.Collection(CollLeases).Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "_id", Value: p.Name}, {Key: "session", Value: bson.D{{Key: "$type", Value: "object"}}}}}},
		{{Key: "$project", Value: bson.D{{Key: "session", Value: 1}, {Key: "free", Value: bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: "$eq", Value: bson.A{"$owner", p.Owner}}},
			bson.D{{Key: "$not", Value: bson.A{bson.D{{Key: "$gt", Value: bson.A{"$expires", "$$NOW"}}}}}},
		}}}}}}},
	})
	if err != nil {
		return fmt.Errorf("read lease %s: %w", p.Name, err)
	}
	var docs []struct {
		Session bson.Raw `bson:"session"`
		Free    bool     `bson:"free"`
	}
	if err := readAllInto(ctx, cur, &docs); err != nil {
		return fmt.Errorf("read lease %s: %w", p.Name, err)
	}
	if len(docs) == 0 || !docs[0].Free {
		return nil
	}
	// Killing a session that no longer exists is not an error. One this
	// user may not kill (another user's, without killAnySession) is left
	// to the server's transaction timeout, as before sessions were recorded.
	_ = s.db.Client().Database("admin").RunCommand(ctx, bson.D{{Key: "killSessions", Value: bson.A{docs[0].Session}}}).Err()
	// Killed once: its id must not be killed again once its holder's
	// driver hands it to another operation.
	return s.leaseSessionForget(ctx, p.Name, docs[0].Session)
}

// leaseSessionForget removes a session id from the lease, if it is still
// the one recorded.
func (s *Store) leaseSessionForget(ctx context.Context, lease string, id bson.Raw) error {
	_, err := s.db.Collection(CollLeases).UpdateOne(ctx, bson.D{{Key: "_id", Value: lease}, {Key: "session", Value: id}},
		bson.D{{Key: "$unset", Value: bson.D{{Key: "session", Value: ""}}}})
	if err != nil {
		return fmt.Errorf("lease %s: forget a session: %w", lease, err)
	}
	return nil
}

// LeaseSession is the session a lease holder runs its transactions in, for
// one term. Its id is recorded in the lease, so that a successor can end a
// transaction the holder left open (see LeaseAcquire). It is for one
// goroutine at a time.
type LeaseSession struct {
	s     *Store
	lease string
	sess  *mongo.Session
}

// LeaseSessionStart starts the session of ref's term and records its id in
// the lease (ErrLeaseLost when ref no longer holds it).
func (s *Store) LeaseSessionStart(ctx context.Context, ref LeaseRef) (*LeaseSession, error) {
	sess, err := s.db.Client().StartSession()
	if err != nil {
		return nil, fmt.Errorf("lease %s: start a session: %w", ref.Name, err)
	}
	res, err := s.db.Collection(CollLeases).UpdateOne(ctx, leaseFilter(ref), bson.D{{Key: "$set", Value: bson.D{{Key: "session", Value: sess.ID()}}}})
	if err == nil && res.MatchedCount == 0 {
		err = fmt.Errorf("lease %s at epoch %d: %w", ref.Name, ref.Epoch, ErrLeaseLost)
	}
	if err != nil {
		// Perhaps recorded all the same (the answer was lost): dropped,
		// never given back to the driver, whose next operations a
		// successor's kill would reach.
		return nil, err
	}
	return &LeaseSession{s: s, lease: ref.Name, sess: sess}, nil
}

// End retires the session (retireSessions), which aborts a transaction
// left open in it, and takes its id off the lease. The id never goes back
// to the driver: a successor may have read it from the lease before it
// left, and kill it after. A nil session does nothing.
func (ls *LeaseSession) End(ctx context.Context) {
	if ls == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	ls.s.retireSessions(ctx, ls.sess) // first: it may hold the lease's lock
	_ = ls.s.leaseSessionForget(ctx, ls.lease, ls.sess.ID())
}

// txnSession is the session a transaction runs in: the lease term's when
// given, else a new one that end ends.
func (s *Store) txnSession(ctx context.Context, ls *LeaseSession) (sess *mongo.Session, end func(err error), err error) {
	if ls != nil {
		return ls.sess, func(error) {}, nil
	}
	if s.pool != nil {
		sess, giveBack, err := s.pooledTxnSession(ctx)
		if err != nil {
			return nil, nil, err
		}
		return sess, func(err error) { giveBack(err != nil) }, nil
	}
	if sess, err = s.db.Client().StartSession(); err != nil {
		return nil, nil, err
	}
	return sess, func(error) { sess.EndSession(context.WithoutCancel(ctx)) }, nil
}

func decodeLease(raw bson.Raw) Lease {
	l := Lease{}
	l.Name, _ = raw.Lookup("_id").StringValueOK()
	l.Owner, _ = raw.Lookup("owner").StringValueOK()
	l.Epoch, _ = raw.Lookup("epoch").AsInt64OK()
	l.Expires, _ = raw.Lookup("expires").TimeOK()
	l.Checkpoint, _ = raw.Lookup("checkpoint").DocumentOK()
	if t, i, ok := raw.Lookup("checkpoint_time").TimestampOK(); ok {
		l.CheckpointTime = bson.Timestamp{T: t, I: i}
	}
	l.Session, _ = raw.Lookup("session").DocumentOK()
	return l
}

// LeaseRenew extends a held lease by ttl; ErrLeaseLost if it is no longer
// held at that epoch.
func (s *Store) LeaseRenew(ctx context.Context, ref LeaseRef, ttl time.Duration) error {
	return s.leaseSetExpiry(ctx, ref, ttl.Milliseconds())
}

// LeaseRelease lets the lease expire now, so a successor need not wait.
func (s *Store) LeaseRelease(ctx context.Context, ref LeaseRef) error {
	return s.leaseSetExpiry(ctx, ref, -1)
}

func (s *Store) leaseSetExpiry(ctx context.Context, ref LeaseRef, addMS int64) error {
	res, err := s.db.Collection(CollLeases).UpdateOne(ctx, leaseFilter(ref),
		mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "expires", Value: bson.D{{Key: "$add", Value: bson.A{"$$NOW", addMS}}}}}}}})
	if err != nil {
		return fmt.Errorf("lease %s: %w", ref.Name, err)
	}
	if res.MatchedCount == 0 {
		return fmt.Errorf("lease %s at epoch %d: %w", ref.Name, ref.Epoch, ErrLeaseLost)
	}
	return nil
}

func leaseFilter(ref LeaseRef) bson.D {
	return bson.D{{Key: "_id", Value: ref.Name}, {Key: "owner", Value: ref.Owner}, {Key: "epoch", Value: ref.Epoch}}
}

// LeaseGet reads a lease (ErrNotFound when it was never taken).
func (s *Store) LeaseGet(ctx context.Context, name string) (Lease, error) {
	raw, err := s.db.Collection(CollLeases).FindOne(ctx, bson.D{{Key: "_id", Value: name}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return Lease{}, fmt.Errorf("lease %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return Lease{}, fmt.Errorf("read lease %s: %w", name, err)
	}
	return decodeLease(raw), nil
}

// CounterDelta is a change to a queue's counters.
type CounterDelta struct {
	Queue   bson.ObjectID
	Todo    int64
	Total   int64
	Running int64
	Failed  int64
}

// CountersSetParams are a recount's counts to set, and the stream
// position they bring the counters to: Checkpoint (a resume token), or
// when it is nil, the position just after CheckpointTime.
type CountersSetParams struct {
	Lease LeaseRef
	// Session, when set, is the lease term's session the transaction runs
	// in (see LeaseSessionStart); otherwise a session of its own.
	Session        *LeaseSession
	Sets           map[bson.ObjectID]QueueCounts
	Checkpoint     bson.Raw
	CheckpointTime bson.Timestamp
	// Positions, for the queues of Sets it names, is the position set
	// instead of CheckpointTime: a recount taken in the background holds
	// the events up to its moment, and the batches since added theirs up
	// to each queue's own position.
	Positions map[bson.ObjectID]CounterPosition
}

// CountersSet sets queues' counters from a recount in one transaction,
// fenced by the lease (a batch of deltas goes by CountersAdvance): the
// lease document must still be held at Lease.Epoch (the checkpoint is
// written there), so a deposed projector's recount can never commit. A
// queue set gets the position CheckpointTime (its counters count every
// event at or before it), or its own in Positions, which fences off any
// other term's CountersAdvance from an earlier position.
func (s *Store) CountersSet(ctx context.Context, p CountersSetParams) (err error) {
	sess, end, err := s.txnSession(ctx, p.Session)
	if err != nil {
		return fmt.Errorf("set counters: %w", err)
	}
	defer func() { end(err) }()
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		// The checkpoint is the token, or (without one) "just after
		// CheckpointTime": never a stale token from an earlier term.
		var checkpoint any = p.Checkpoint
		if p.Checkpoint == nil {
			checkpoint = nil
		}
		set := bson.D{{Key: "checkpoint", Value: checkpoint}, {Key: "checkpoint_time", Value: p.CheckpointTime}, {Key: "applied", Value: s.nowMS()}}
		res, err := s.db.Collection(CollLeases).UpdateOne(ctx, leaseFilter(p.Lease), bson.D{{Key: "$set", Value: set}})
		if err != nil {
			return nil, err
		}
		if res.MatchedCount == 0 {
			return nil, fmt.Errorf("set counters at epoch %d: %w", p.Lease.Epoch, ErrLeaseLost)
		}
		for _, id := range sortedIDs(p.Sets) {
			c := p.Sets[id]
			pos, ok := p.Positions[id]
			if !ok {
				pos = CounterPosition{Time: p.CheckpointTime}
			}
			if _, err := s.queues.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}},
				bson.D{{Key: "$set", Value: bson.D{{Key: schema.QueueCountTodo, Value: c.Todo}, {Key: schema.QueueCountTotal, Value: c.Total}, {Key: schema.QueueCountRunning, Value: c.Running},
					{Key: schema.QueueCountFailed, Value: c.Failed}, {Key: schema.QueueCountsApplied, Value: pos.doc()}}}}); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	return err
}

// CounterPosition is how far in the counter projector's stream a queue's
// counters go: every event at or before Token (an event's resume token's
// _data, which sorts in the stream's order), or, without a Token, every
// event at or before Time (a recount's moment: a snapshot holds all of a
// transaction's events or none).
type CounterPosition struct {
	Time  bson.Timestamp
	Token string
}

// Covers reports whether an event (its clusterTime and ChangeEvent.Place)
// is within p, so already in the counters.
func (p CounterPosition) Covers(at bson.Timestamp, token string) bool {
	if p.Token != "" && token != "" {
		return token <= p.Token
	}
	return !at.After(p.Time)
}

func (p CounterPosition) doc() bson.D {
	return bson.D{{Key: "t", Value: p.Time}, {Key: "token", Value: p.Token}}
}

func decodePosition(v bson.RawValue) *CounterPosition {
	d, ok := v.DocumentOK()
	if !ok {
		return nil
	}
	p := &CounterPosition{}
	t, i, ok := d.Lookup("t").TimestampOK()
	if !ok {
		return nil
	}
	p.Time = bson.Timestamp{T: t, I: i}
	p.Token, _ = d.Lookup("token").StringValueOK()
	return p
}

// CounterAdvance is one queue's part of a batch: its deltas, and the
// position its counters are at before them (From, nil: none kept yet).
type CounterAdvance struct {
	Delta CounterDelta
	From  *CounterPosition
}

// CountersAdvanced says what CountersAdvance did not apply: Moved, the
// queues whose position was no longer From (another projector's term moved
// it; the position it found, nil for none), and Missing, those gone or
// whose counters are not all integers (a recount's to make).
type CountersAdvanced struct {
	Moved   map[bson.ObjectID]*CounterPosition
	Missing []bson.ObjectID
}

// CountersAdvance adds each queue's deltas to its counters and moves its
// position from From to To, in one unordered bulk write with write
// concern majority: one round trip, no transaction. Each queue's update is
// atomic and applies only where the position is still From and the four
// counters are integers (int32 or int64), so its counters move only with its position, and a
// stream's events count once in each queue however two projectors' terms
// overlap: that compare-and-set is the fence, queue by queue (the lease
// fences the checkpoint, LeaseCheckpoint). A queue found at To already
// (another term applied the same batch) counts as applied.
func (s *Store) CountersAdvance(ctx context.Context, to CounterPosition, adv []CounterAdvance) (CountersAdvanced, error) {
	var out CountersAdvanced
	if len(adv) == 0 {
		return out, nil
	}
	integer := bson.D{{Key: "$type", Value: bson.A{"int", "long"}}}
	models := make([]mongo.WriteModel, 0, len(adv))
	ids := make(bson.A, 0, len(adv))
	for _, a := range adv {
		var from any // null matches a queue with no position yet
		if a.From != nil {
			from = a.From.doc()
		}
		d := a.Delta
		models = append(models, mongo.NewUpdateOneModel().
			SetFilter(bson.D{{Key: "_id", Value: d.Queue}, {Key: schema.QueueCountsApplied, Value: from}, {Key: schema.QueueCountTodo, Value: integer},
				{Key: schema.QueueCountTotal, Value: integer}, {Key: schema.QueueCountRunning, Value: integer}, {Key: schema.QueueCountFailed, Value: integer}}).
			SetUpdate(bson.D{
				{Key: "$inc", Value: bson.D{{Key: schema.QueueCountTodo, Value: d.Todo}, {Key: schema.QueueCountTotal, Value: d.Total},
					{Key: schema.QueueCountRunning, Value: d.Running}, {Key: schema.QueueCountFailed, Value: d.Failed}}},
				{Key: "$set", Value: bson.D{{Key: schema.QueueCountsApplied, Value: to.doc()}}},
			}))
		ids = append(ids, d.Queue)
	}
	res, err := s.queues.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	if err != nil {
		return out, fmt.Errorf("advance counters: %w", err)
	}
	if res.MatchedCount == int64(len(adv)) {
		return out, nil
	}
	found, err := s.readCounters(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
	if err != nil {
		return out, fmt.Errorf("advance counters: read back: %w", err)
	}
	for _, a := range adv {
		q := a.Delta.Queue
		c, ok := found[q]
		if !ok || !c.Complete() {
			out.Missing = append(out.Missing, q)
			continue
		}
		if c.Applied != nil && *c.Applied == to {
			continue // applied (by this call, or another term's of the same batch)
		}
		if out.Moved == nil {
			out.Moved = map[bson.ObjectID]*CounterPosition{}
		}
		out.Moved[q] = c.Applied
	}
	return out, nil
}

// LeaseCheckpoint records the stream position a held lease's next term
// resumes from: Checkpoint (a resume token), or just after CheckpointTime
// without one. ErrLeaseLost if the lease is no longer held at that epoch.
func (s *Store) LeaseCheckpoint(ctx context.Context, ref LeaseRef, checkpoint bson.Raw, at bson.Timestamp) error {
	var cp any = checkpoint
	if checkpoint == nil {
		cp = nil
	}
	res, err := s.db.Collection(CollLeases).UpdateOne(ctx, leaseFilter(ref), bson.D{{Key: "$set", Value: bson.D{
		{Key: "checkpoint", Value: cp}, {Key: "checkpoint_time", Value: at}, {Key: "applied", Value: s.nowMS()}}}})
	if err != nil {
		return fmt.Errorf("lease %s checkpoint: %w", ref.Name, err)
	}
	if res.MatchedCount == 0 {
		return fmt.Errorf("lease %s checkpoint at epoch %d: %w", ref.Name, ref.Epoch, ErrLeaseLost)
	}
	return nil
}

func sortedIDs(m map[bson.ObjectID]QueueCounts) []bson.ObjectID {
	ids := make([]bson.ObjectID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b bson.ObjectID) int { return bytes.Compare(a[:], b[:]) })
	return ids
}

// ErrSnapshotTooOld means a recount asked for a moment the server no longer
// keeps a snapshot of (SnapshotTooOld, or earlier than its history).
var ErrSnapshotTooOld = errors.New("the snapshot asked for is no longer available")

// Recount is the exact task counts of every queue at one cluster time.
type Recount struct {
	At     bson.Timestamp
	Counts map[bson.ObjectID]QueueCounts // every queue that existed then, with zeros for empty ones
}

// QueueRecountParams says what QueueRecount counts, and when.
type QueueRecountParams struct {
	// At is the cluster time of the snapshot; nil: a time MongoDB picks
	// (Recount.At says which).
	At *bson.Timestamp
	// Queues, when not nil, are the only queues counted: their tasks are
	// found through the {queue, status} index, so a recount of a few
	// queues costs what their tasks do, not what every task does.
	Queues []bson.ObjectID
}

// QueueRecount counts every queue's tasks (or those of p.Queues) with one
// aggregation, as a snapshot read at cluster time p.At. count_todo counts
// what {$lte: ["$status", 0]} does, so a missing status counts as to do
// and a non-numeric one does not; count_running counts a status equal to
// -1 or 0 (a missing or non-numeric one is not running); count_failed a
// status equal to 2.
func (s *Store) QueueRecount(ctx context.Context, p QueueRecountParams) (Recount, error) {
	so := options.Session().SetSnapshot(true)
	if p.At != nil {
		so.SetSnapshotTime(*p.At)
	}
	sess, err := s.db.Client().StartSession(so)
	if err != nil {
		return Recount{}, fmt.Errorf("recount: %w", err)
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	sctx := mongo.NewSessionContext(ctx, sess)
	snap := options.Collection().SetReadConcern(readconcern.Snapshot())
	out := Recount{Counts: map[bson.ObjectID]QueueCounts{}}
	queues, tasks := bson.D{}, bson.D{}
	if p.Queues != nil {
		queues = bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: p.Queues}}}}
		tasks = bson.D{{Key: schema.TaskQueue, Value: bson.D{{Key: "$in", Value: p.Queues}}}}
	}
	cur, err := s.db.Collection(schema.CollQueues, snap).Find(sctx, queues, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return Recount{}, fmt.Errorf("recount: list queues: %w", snapshotErr(err))
	}
	r := readCursor(sctx, cur)
	defer r.Close()
	for r.Next() {
		if id, ok := cur.Current.Lookup("_id").ObjectIDOK(); ok {
			out.Counts[id] = QueueCounts{}
		}
	}
	if err := r.Err(); err != nil {
		return Recount{}, fmt.Errorf("recount: list queues: %w", snapshotErr(err))
	}
	r.Close()
	counts, err := s.queueCounts(sctx, s.db.Collection(schema.CollTasks, snap), tasks)
	if err != nil {
		return Recount{}, fmt.Errorf("recount: %w", snapshotErr(err))
	}
	for id, c := range counts {
		if _, ok := out.Counts[id]; ok {
			out.Counts[id] = c // tasks of queues that do not exist count nowhere
		}
	}
	out.At = sess.SnapshotTime()
	return out, nil
}

// snapshotErr marks SnapshotTooOld (239) and SnapshotUnavailable (246) as
// ErrSnapshotTooOld.
func snapshotErr(err error) error {
	var se mongo.ServerError
	if errors.As(err, &se) && (se.HasErrorCode(239) || se.HasErrorCode(246)) {
		return fmt.Errorf("%w: %w", ErrSnapshotTooOld, err)
	}
	return err
}

// StoredCounters are a queue's counters as stored: each nil when missing
// or not an integer (readCounters).
type StoredCounters struct {
	Todo, Total, Running, Failed *int64
	// Applied is how far in the projector's stream the counters go (nil:
	// not said, as before positions were kept, or by another program).
	Applied *CounterPosition
}

// Complete reports whether every counter is there.
func (c StoredCounters) Complete() bool {
	return c.Todo != nil && c.Total != nil && c.Running != nil && c.Failed != nil
}

// Are reports whether every counter is there and they are want.
func (c StoredCounters) Are(want QueueCounts) bool {
	return c.Complete() && *c.Todo == want.Todo && *c.Total == want.Total && *c.Running == want.Running && *c.Failed == want.Failed
}

// QueueCounters reads the stored counters of every queue.
func (s *Store) QueueCounters(ctx context.Context) (map[bson.ObjectID]StoredCounters, error) {
	out, err := s.readCounters(ctx, bson.D{})
	if err != nil {
		return nil, fmt.Errorf("read counters: %w", err)
	}
	return out, nil
}

// readCounters reads the stored counters of the queues within filter. A
// counter is there when it is an integer (schema.Counter), as
// CountersAdvance's filter asks before it adds: any other value (a double,
// even a whole one, a decimal, a string, null) is missing, and a recount
// sets it (as int64).
func (s *Store) readCounters(ctx context.Context, filter bson.D) (map[bson.ObjectID]StoredCounters, error) {
	cur, err := s.queues.Find(ctx, filter, options.Find().SetProjection(bson.D{
		{Key: schema.QueueCountTodo, Value: 1}, {Key: schema.QueueCountTotal, Value: 1}, {Key: schema.QueueCountRunning, Value: 1}, {Key: schema.QueueCountFailed, Value: 1},
		{Key: schema.QueueCountsApplied, Value: 1}}))
	if err != nil {
		return nil, err
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	out := map[bson.ObjectID]StoredCounters{}
	for r.Next() {
		id, ok := cur.Current.Lookup("_id").ObjectIDOK()
		if !ok {
			continue
		}
		field := func(f string) *int64 {
			if n, ok := schema.Counter(cur.Current.Lookup(f)); ok {
				return &n
			}
			return nil
		}
		out[id] = StoredCounters{Todo: field(schema.QueueCountTodo), Total: field(schema.QueueCountTotal), Running: field(schema.QueueCountRunning),
			Failed: field(schema.QueueCountFailed), Applied: decodePosition(cur.Current.Lookup(schema.QueueCountsApplied))}
	}
	return out, r.Err()
}

// TasksPreImagesEnable turns on changeStreamPreAndPostImages for the tasks
// collection (creating it if needed), so change events carry a task's
// status and queue before an update or delete.
func (s *Store) TasksPreImagesEnable(ctx context.Context) error {
	return s.TasksPreImagesSet(ctx, true)
}

// TasksPreImages says whether the tasks collection keeps pre-images
// (changeStreamPreAndPostImages; false when it does not exist yet).
func (s *Store) TasksPreImages(ctx context.Context) (bool, error) {
	on, _, err := s.tasksPreImages(ctx)
	return on, err
}

func (s *Store) tasksPreImages(ctx context.Context) (on, exists bool, err error) {
	specs, err := s.db.ListCollectionSpecifications(ctx, bson.D{{Key: "name", Value: schema.CollTasks}})
	if err != nil {
		return false, false, fmt.Errorf("read the tasks collection's options: %w", err)
	}
	if len(specs) != 1 {
		return false, false, nil
	}
	on, _ = specs[0].Options.Lookup("changeStreamPreAndPostImages", "enabled").BooleanOK()
	return on, true, nil
}

// TasksPreImagesSet turns changeStreamPreAndPostImages on or off for the
// tasks collection (creating it if needed). Off, an update or delete by a
// program that does not write schema.TaskPrior comes without the task's
// old state (ChangeEvent.Before nil).
func (s *Store) TasksPreImagesSet(ctx context.Context, on bool) error {
	// Read first: a collMod takes the collection's exclusive lock, which
	// waits for the writes under way and holds up those that follow.
	now, exists, err := s.tasksPreImages(ctx)
	if err != nil {
		return err
	}
	if exists && now == on {
		return nil
	}
	opt := bson.D{{Key: "enabled", Value: on}}
	err = s.db.CreateCollection(ctx, schema.CollTasks, options.CreateCollection().SetChangeStreamPreAndPostImages(opt))
	var ce mongo.CommandError
	if errors.As(err, &ce) && ce.Code == 48 { // NamespaceExists
		// Bounded: waiting for the lock, it holds up every write to tasks
		// that comes after it (the caller tries again later). The bound
		// is the context's, which the driver sends as maxTimeMS (one in
		// the command as well is refused as a duplicate).
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err = s.db.RunCommand(cctx, bson.D{{Key: "collMod", Value: schema.CollTasks}, {Key: "changeStreamPreAndPostImages", Value: opt}}).Err()
		cancel()
	}
	if err != nil {
		return fmt.Errorf("turn change stream pre-images %s on tasks: %w", map[bool]string{true: "on", false: "off"}[on], err)
	}
	return nil
}
