package store

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/schema"
)

// CollStreams holds change-stream resume tokens, one document per stream
// ({_id: name, token, saved}). It is this project's own collection; Disbatch
// 4 tools ignore it.
const CollStreams = "disbatch_streams"

// Position is a place in the change history: just after the event of a
// resume token, or (without a token) just after a cluster time. The zero
// Position is the present.
type Position struct {
	Token bson.Raw
	Time  bson.Timestamp
}

// IsZero reports whether p is the present.
func (p Position) IsZero() bool { return p.Token == nil && p.Time.IsZero() }

// StreamParams configure a StreamReader.
type StreamParams struct {
	Profile StreamProfile
	// Tasks are the tasks whose states StreamTaskStates carries (at most
	// MaxControlIDs).
	Tasks []bson.ObjectID
	// GraphEnds: StreamLeader carries the tasks' ends (EndsTask) too.
	// Every finish is one, so a leader that knows no task waits on its
	// parents reads without them, and with them again from the event of
	// a task that starts waiting (WaitsOnParents).
	GraphEnds bool
	// Leader: StreamCounters carries StreamLeader's events too, with
	// their fields (the ends it carries anyway), for a projector whose
	// node's leader duties follow its stream instead of a stream of
	// their own: every stream reads every oplog entry, and the leader's
	// cost a drain about a tenth of mongod's CPU (docs/scaling.md).
	// Readers tell the two apart with CountersMatch and LeaderMatch.
	Leader bool
	// NoPreImages: a profile that carries pre-images does not ask for
	// them (fullDocumentBeforeChange), for a reader that knows they are
	// off: the server looks one up for every update otherwise, found or
	// not. Events of our writes still carry Before (schema.TaskPrior).
	NoPreImages bool
	// Name names the stream in logs and, with Checkpoint, its saved
	// position in disbatch_streams.
	Name string
	// Checkpoint: start from the position saved under Name (From when
	// none is saved), and save the position reached at most every
	// SaveEvery and at Close. Without it the caller keeps positions
	// itself (e.g. in a transaction with what it derived from the events).
	Checkpoint bool
	SaveEvery  time.Duration // default 1 s
	// Present starts at the present even when a position is saved under
	// Name (with Checkpoint, positions are saved from there): for a
	// caller that re-reads the database for what it skipped.
	Present bool
	// From is where to start without a saved checkpoint; zero: now.
	From Position
	// MaxAwait is how long the server holds a getMore with nothing new
	// (default 1 s): how often an idle reader's position advances.
	MaxAwait time.Duration
	// MaxBatch bounds the events of one batch (default 1000).
	MaxBatch int
	// BatchWait: 0 delivers what the server sent at once; longer keeps
	// adding the server's next replies to a batch until BatchWait has
	// passed since its first event (fewer, larger batches).
	BatchWait time.Duration
	// Pace, when set, is the least time between two getMores. A getMore
	// the server holds (0: ask again at once, the server holding the ask
	// for MaxAwait) is woken by the database's writes, matching or not:
	// one held stream, even one that matched nothing, cost a one-node
	// drain 30-80 µs of mongod CPU per task, as much as the raw loop's
	// own writes. A paced reader holds none: it asks at most every Pace,
	// with the server's shortest hold, so events come up to Pace later;
	// after a full reply it asks again at once. An idle paced reader
	// still delivers its advance only every MaxAwait. For readers that
	// can wait (projections, the leader's duties). Not for many readers
	// of a modest write rate: fifty paced node wake-up streams drained
	// 10-20% slower than held ones, whose wakes coalesce under load.
	Pace   time.Duration
	Clock  clock.Clock
	Logger *slog.Logger
}

// ChangeEvent is one change, as far as the profile keeps it.
type ChangeEvent struct {
	// Op is MongoDB's operationType: insert, update, replace, delete,
	// drop, rename, dropDatabase or invalidate.
	Op   string
	Coll string
	// ID is the changed document's _id (a zero RawValue for drops).
	ID          bson.RawValue
	ClusterTime bson.Timestamp
	WallTime    time.Time
	// Doc is the document after the change (inserts and replaces; every
	// event of a profile that looks documents up), Before the document before it (profiles
	// with pre-images, when MongoDB still had it), Updated and Removed
	// what an update set and removed. Each holds only what the profile
	// keeps; nil when absent.
	Doc     bson.Raw
	Before  bson.Raw
	Updated bson.Raw
	Removed []string
	// Prior: an update of ours that says where its task stood
	// (schema.TaskPrior, parsed); Before is made from it when the event
	// has no pre-image. An update without it needs a pre-image.
	Prior bool
	// AdmissionsOnly (StreamWakeups): a queue update that set only its
	// admitted count (and projected counters): room under max_running
	// moved, none of its settings did.
	AdmissionsOnly bool
	// Token is the position just after this event: its own resume token,
	// or, for the last event of a reply, the server's post-batch token.
	Token bson.Raw
	// Self is the event's own resume token (its _id): its place in the
	// stream (see Place).
	Self bson.RawValue
}

// Place is the event's own resume token's _data, which sorts in the
// stream's order ("" without one).
func (ev ChangeEvent) Place() string {
	d, _ := ev.Self.DocumentOK()
	s, _ := d.Lookup("_data").StringValueOK()
	return s
}

// StreamBatch is what one Next delivers.
type StreamBatch struct {
	Events []ChangeEvent
	// Token is the position after the batch: its last event's, or the
	// server's post-batch token when it had nothing new.
	Token bson.Raw
	// CaughtUp: the server had nothing newer when the batch ended.
	CaughtUp bool
	// Lost, when not empty, says why the reader could not go on from
	// where it was (the history is gone, or the position is not of this
	// deployment): it now follows the present, and whatever happened in
	// between is unknown. Re-read the database.
	Lost string
}

// StreamStats are a reader's counters.
type StreamStats struct {
	Resumes int64 // reopened after an interruption
	Lost    int64 // positions lost
}

// StreamReader follows the change stream of a profile, resuming across
// failovers and network errors by itself. It is used by one goroutine:
// Next, then Close once the last Next returned.
type StreamReader struct {
	s     *Store
	p     StreamParams
	shape streamShape
	log   *slog.Logger
	clock clock.Clock

	cs      *mongo.ChangeStream
	cursors []int64  // server cursors this reader opened and has not killed
	pos     Position // after the last batch delivered: where to resume
	lost    string   // a Lost to deliver
	broken  bool     // the stream failed after delivering a batch: reopen first
	closed  bool

	saved   bson.Raw
	savedAt time.Time

	asked     time.Time // the last getMore (paced readers)
	replied   int       // events of the last getMore's reply
	delivered time.Time // the last batch delivered

	resumes, losts atomic.Int64
}

// StreamOpen opens a reader on the database's change stream, filtered by
// the profile, before it returns: every change committed after it returns
// is delivered. A position the server cannot resume from (or that cannot be
// this deployment's) is not an error: the reader starts from the present
// and its first batch says Lost. It fails when the deployment has no change
// streams (a standalone mongod).
func (s *Store) StreamOpen(ctx context.Context, p StreamParams) (*StreamReader, error) {
	shape, err := p.Profile.shape(p)
	if err != nil {
		return nil, err
	}
	if p.NoPreImages {
		shape.preImages = false
	}
	if p.Name == "" {
		p.Name = p.Profile.String()
	}
	if p.SaveEvery <= 0 {
		p.SaveEvery = time.Second
	}
	if p.MaxAwait <= 0 {
		p.MaxAwait = time.Second
	}
	if p.MaxBatch <= 0 {
		p.MaxBatch = 1000
	}
	if p.Logger == nil {
		p.Logger = slog.New(slog.DiscardHandler)
	}
	r := &StreamReader{s: s, p: p, shape: shape, clock: clock.Or(p.Clock),
		log: p.Logger.With("stream", p.Name, "profile", p.Profile.String())}
	from := p.From
	if p.Checkpoint && !p.Present {
		tok, err := s.StreamTokenGet(ctx, p.Name)
		switch {
		case err == nil:
			from, r.saved = Position{Token: tok}, tok
		case !errors.Is(err, ErrNotFound):
			return nil, err
		}
	}
	if why := s.implausible(ctx, from); why != "" {
		r.positionLost(errors.New(why))
		from = Position{}
	}
	if err := r.open(ctx, from); err != nil {
		return nil, err
	}
	return r, nil
}

// Stats returns the reader's counters; safe from any goroutine.
func (r *StreamReader) Stats() StreamStats {
	return StreamStats{Resumes: r.resumes.Load(), Lost: r.losts.Load()}
}

func (r *StreamReader) positionLost(cause error) {
	r.log.Warn("change stream position lost: following from now; what happened meanwhile must be re-read", "error", cause)
	r.lost = cause.Error()
	r.losts.Add(1)
}

// openTimeout bounds the aggregate that opens a stream.
const openTimeout = 10 * time.Second

// open opens the stream at from; a lost position opens it at the present.
func (r *StreamReader) open(ctx context.Context, from Position) error {
	o := r.shape.options(r.maxAwait(), r.p.MaxBatch)
	switch {
	case from.Token != nil:
		o.SetStartAfter(from.Token)
	case !from.Time.IsZero():
		next := bson.Timestamp{T: from.Time.T, I: from.Time.I + 1}
		o.SetStartAtOperationTime(&next)
	}
	// The aggregate runs to its answer even when ctx ends meanwhile: one
	// cut off after the server made its cursor leaves that cursor open
	// for ten minutes, unknown to anyone who could kill it (a node
	// stopped while its leader stream reopened did). If ctx ended, the
	// stream is closed at once below.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), openTimeout)
	defer cancel()
	cs, err := r.s.db.Watch(wctx, r.shape.pipeline, o)
	if err != nil && !from.IsZero() && StreamPositionLost(err) {
		r.positionLost(err)
		from = Position{}
		cs, err = r.s.db.Watch(wctx, r.shape.pipeline, r.shape.options(r.maxAwait(), r.p.MaxBatch))
	}
	if err != nil {
		return fmt.Errorf("open change stream (%s) on %s: %w", r.p.Profile, r.s.db.Name(), err)
	}
	r.cs = cs
	r.track()
	if err := ctx.Err(); err != nil {
		r.closeStream()
		return fmt.Errorf("open change stream (%s) on %s: %w", r.p.Profile, r.s.db.Name(), err)
	}
	r.pos = from
	if t := cs.ResumeToken(); t != nil {
		r.pos = Position{Token: t}
	}
	return nil
}

// Patient is the pace of readers that can wait that long for what they
// hear: the leader's duties (the counter projector paces at its batch
// window). Paced, they cost the server a fraction of what held getMores
// cost while tasks are drained (see StreamParams.Pace).
const Patient = 20 * time.Millisecond

// pacedAwait is how long the server holds a paced reader's getMore: as
// short as it allows, so that no write wakes it.
const pacedAwait = time.Millisecond

// maxAwait is the server's hold of a getMore.
func (r *StreamReader) maxAwait() time.Duration {
	if r.p.Pace > 0 {
		return pacedAwait
	}
	return r.p.MaxAwait
}

// wait waits until the next getMore is due (paced readers). It returns
// false, without waiting, when what was collected so far should be
// delivered first: its BatchWait passes before the next ask.
func (r *StreamReader) wait(ctx context.Context, collected int, first time.Time) (bool, error) {
	if r.p.Pace <= 0 || r.replied >= r.p.MaxBatch {
		return true, nil // unpaced, or a full reply: more is waiting
	}
	due := r.asked.Add(r.p.Pace)
	if collected > 0 && !first.Add(r.p.BatchWait).After(due) {
		return false, nil
	}
	if d := due.Sub(r.clock.Now()); d > 0 {
		t := r.clock.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C():
		}
	}
	return true, nil
}

// track notes the server cursor in use, so that Close can kill it even when
// the driver lost track of it (a getMore interrupted by a cancelled context
// leaves it open on the server for ten minutes).
func (r *StreamReader) track() {
	if id := r.cs.ID(); id != 0 && !slices.Contains(r.cursors, id) {
		r.cursors = append(r.cursors, id)
	}
}

// Next returns the next batch: events, an advance of the position alone
// (the server had nothing new for MaxAwait), or a Lost. Interruptions are
// resumed within, with backoff, from the position after the last batch
// delivered. It returns an error only when ctx ends; the batch being
// collected then is not delivered.
func (r *StreamReader) Next(ctx context.Context) (StreamBatch, error) {
	if r.closed {
		return StreamBatch{}, errors.New("change stream reader closed")
	}
	r.save(false)
	if r.broken || r.cs == nil {
		var cause error
		if r.cs != nil {
			cause = r.cs.Err()
		}
		r.broken = false
		if err := r.reopen(ctx, cause); err != nil {
			return StreamBatch{}, err
		}
	}
	if r.lost != "" {
		return r.lostBatch(), nil
	}
	var batch []ChangeEvent
	var first time.Time
	for {
		if r.cs.RemainingBatchLength() == 0 {
			// The next TryNext asks the server.
			ask, err := r.wait(ctx, len(batch), first)
			if err != nil {
				return StreamBatch{}, err
			}
			if !ask {
				b := r.advance(batch)
				b.CaughtUp = true // the last reply was short: all there was
				return b, nil
			}
			r.asked, r.replied = r.clock.Now(), 0
		}
		next := r.cs.TryNext(ctx)
		// Even a failed or cancelled getMore may leave the driver on a new
		// server cursor (it resumes), which Close must kill too.
		r.track()
		if next {
			ev := decodeEvent(r.cs.Current, r.cs.ResumeToken())
			if batch == nil {
				// Room for the reply's events: grown from nothing, a
				// projector's batch of 200 copied its 232-byte events
				// eight times, 590 bytes an event.
				batch = make([]ChangeEvent, 0, min(r.p.MaxBatch, r.cs.RemainingBatchLength()+1))
			}
			batch = append(batch, ev)
			r.replied++
			if first.IsZero() {
				first = r.clock.Now()
				if r.p.Pace > 0 {
					first = r.asked // it was there when asked for
				}
			}
			if ev.Op == "invalidate" || len(batch) >= r.p.MaxBatch {
				return r.deliver(batch, ev.Token), nil
			}
			if r.cs.RemainingBatchLength() == 0 && (r.p.BatchWait <= 0 || r.clock.Since(first) >= r.p.BatchWait) {
				b := r.deliver(batch, ev.Token)
				// A paced reply short of a full one was all there was.
				b.CaughtUp = r.p.Pace > 0 && r.replied < r.p.MaxBatch
				return b, nil
			}
			continue
		}
		if ctx.Err() != nil {
			return StreamBatch{}, ctx.Err()
		}
		if err := r.cs.Err(); err != nil || r.cs.ID() == 0 {
			if len(batch) > 0 {
				r.broken = true
				return r.deliver(batch, batch[len(batch)-1].Token), nil
			}
			if err := r.reopen(ctx, err); err != nil {
				return StreamBatch{}, err
			}
			if r.lost != "" {
				return r.lostBatch(), nil
			}
			continue
		}
		if len(batch) == 0 && r.p.Pace > 0 && r.clock.Since(r.delivered) < r.p.MaxAwait {
			continue // an idle paced reader advances every MaxAwait, as an unpaced one
		}
		// An empty getMore: the server's post-batch token moved on.
		b := r.advance(batch)
		b.CaughtUp = true
		return b, nil
	}
}

// advance delivers batch (collected until the BatchWait), or the
// server's post-batch position when it is empty.
func (r *StreamReader) advance(batch []ChangeEvent) StreamBatch {
	if len(batch) > 0 {
		return r.deliver(batch, batch[len(batch)-1].Token)
	}
	tok := r.cs.ResumeToken()
	if tok == nil {
		tok = r.pos.Token
	}
	return r.deliver(nil, tok)
}

// lostBatch delivers the pending Lost.
func (r *StreamReader) lostBatch() StreamBatch {
	return StreamBatch{Token: r.pos.Token, Lost: r.TakeLost()}
}

func (r *StreamReader) deliver(events []ChangeEvent, tok bson.Raw) StreamBatch {
	r.delivered = r.clock.Now()
	if tok != nil {
		r.pos = Position{Token: tok}
	}
	return StreamBatch{Events: events, Token: tok}
}

// reopen closes the broken stream and opens it again after the last
// position delivered, with backoff, until it is open or ctx ends. A cause
// that says the position is gone (or a closed cursor after an invalidate)
// opens at the present with a pending Lost, resp. after the invalidate.
func (r *StreamReader) reopen(ctx context.Context, cause error) error {
	r.closeStream()
	from := r.pos
	if cause != nil {
		r.log.Warn("change stream interrupted; resuming", "error", cause)
		if StreamPositionLost(cause) {
			r.positionLost(cause)
			from = Position{}
		}
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime, b.Clock = 50*time.Millisecond, 5*time.Second, 0, r.clock
	for {
		err := r.open(ctx, from)
		if err == nil {
			r.resumes.Add(1)
			r.log.Info("change stream resumed")
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := b.NextBackOff()
		r.log.Warn("change stream: cannot reopen; retrying", "in", wait, "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.clock.After(wait):
		}
	}
}

// closeStream closes the stream and kills every server cursor it had.
func (r *StreamReader) closeStream() {
	if r.cs == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.cs.Close(ctx)
	r.cs = nil
	if len(r.cursors) == 0 {
		return
	}
	ids := make(bson.A, len(r.cursors))
	for i, id := range r.cursors {
		ids[i] = id
	}
	// A database's change stream lives in the namespace $cmd.aggregate.
	err := r.s.db.RunCommand(ctx, bson.D{{Key: "killCursors", Value: "$cmd.aggregate"}, {Key: "cursors", Value: ids}}).Err()
	if err != nil {
		r.log.Debug("kill change stream cursors", "error", err)
	}
	r.cursors = r.cursors[:0]
}

// Close saves the position (with Checkpoint) and closes the stream,
// killing its server cursors. It may be called more than once.
func (r *StreamReader) Close() {
	r.save(true)
	r.closeStream()
	r.closed = true
}

// TakeLost returns (and clears) why the position was lost, when that is not
// delivered yet, or "": for a consumer that must act on a lost starting
// position before it goes on (before its own Start returns) rather than
// at the first batch.
func (r *StreamReader) TakeLost() string {
	why := r.lost
	r.lost = ""
	return why
}

// save writes the position delivered last, when Checkpoint is on and it
// changed, at most every SaveEvery (or now, with force).
func (r *StreamReader) save(force bool) {
	tok := r.pos.Token
	if !r.p.Checkpoint || tok == nil || string(tok) == string(r.saved) {
		return
	}
	if !force && r.clock.Since(r.savedAt) < r.p.SaveEvery {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.s.StreamTokenSave(ctx, r.p.Name, tok); err != nil {
		r.log.Warn("save change stream position", "error", err)
		return
	}
	r.saved, r.savedAt = slices.Clone(tok), r.clock.Now()
}

func decodeEvent(current, token bson.Raw) ChangeEvent {
	raw := slices.Clone(current)
	ev := ChangeEvent{Token: slices.Clone(token)}
	// One pass over the event's fields: a lookup per field walked the
	// whole event again (5.4 µs a task update, 3.3 since:
	// BenchmarkDecodeEvent).
	eachField(raw, func(key []byte, v bson.RawValue) {
		switch string(key) {
		case "_id":
			ev.Self = v
		case "operationType":
			ev.Op, _ = v.StringValueOK()
		case "ns":
			ns, _ := v.DocumentOK() // nil when not a document: no panic
			ev.Coll, _ = ns.Lookup("coll").StringValueOK()
		case "documentKey":
			key, _ := v.DocumentOK()
			ev.ID = key.Lookup("_id")
		case "clusterTime":
			if t, i, ok := v.TimestampOK(); ok {
				ev.ClusterTime = bson.Timestamp{T: t, I: i}
			}
		case "wallTime":
			ev.WallTime, _ = v.TimeOK()
		case "fullDocument":
			ev.Doc, _ = v.DocumentOK()
		case "fullDocumentBeforeChange":
			ev.Before, _ = v.DocumentOK()
		case "updateDescription":
			ud, _ := v.DocumentOK()
			ev.Updated, _ = ud.Lookup("updatedFields").DocumentOK()
			if removed, ok := ud.Lookup("removedFields").ArrayOK(); ok {
				vals, _ := removed.Values()
				for _, v := range vals {
					if s, ok := v.StringValueOK(); ok {
						ev.Removed = append(ev.Removed, s)
					}
				}
			}
		case admissionsOnly:
			ev.AdmissionsOnly, _ = v.BooleanOK()
		}
	})
	if ev.Op == "update" {
		if before := beforeFromPrior(ev.Updated); before != nil {
			ev.Prior = true
			if ev.Before == nil {
				ev.Before = before
			}
		}
	}
	return ev
}

// eachField calls f with each top-level field of doc, in order, until the
// end or the first malformed element. Names do not repeat in the
// server's change events: the first of repeated ones is not singled out,
// as Raw.Lookup would.
func eachField(doc bson.Raw, f func(key []byte, v bson.RawValue)) {
	if len(doc) < 5 {
		return
	}
	for rest := doc[4 : len(doc)-1]; len(rest) > 0; {
		e, next, ok := bsoncore.ReadElement(rest)
		if !ok {
			return
		}
		rest = next
		f(e.KeyBytes(), bson.RawValue{Type: bson.Type(e[0]), Value: e.Value().Data})
	}
}

// beforeFromPrior is the part of a task's pre-image that an update of
// ours wrote into schema.TaskPrior ({queue, status} and, when known,
// node), or nil when it wrote none.
func beforeFromPrior(updated bson.Raw) bson.Raw {
	v, err := updated.LookupErr(schema.TaskPrior)
	if err != nil {
		return nil
	}
	s, ok := v.StringValueOK()
	if !ok {
		return nil
	}
	p, err := schema.ParsePrior(s)
	if err != nil {
		return nil
	}
	b := bsoncore.NewDocumentBuilder().AppendObjectID(schema.TaskQueue, p.Queue).AppendInt32(schema.TaskStatus, int32(p.Status))
	if p.Node != "" {
		b.AppendString(schema.TaskNode, p.Node)
	}
	return bson.Raw(b.Build())
}

// implausible says why a position cannot be in this deployment's history,
// or "". The server rejects a token it cannot find in its oplog, but one
// whose time lies after everything it has (from another deployment) it
// would wait for, skipping what happened meanwhile; and a token older than
// the time it was saved with is not the one saved.
func (s *Store) implausible(ctx context.Context, p Position) string {
	tt, ok := TokenTime(p.Token)
	if !ok {
		return ""
	}
	if !p.Time.IsZero() && p.Time.After(tt) {
		return "its token's time is before the position's own time"
	}
	hello, err := s.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Raw()
	if err != nil {
		return ""
	}
	// Another deployment's cluster time is comparable to the second only
	// (its increments count other operations): a token of a later second
	// than the server's present cannot be this deployment's; within the
	// same second the server itself tells, at the first event.
	t, _, ok := hello.Lookup("operationTime").TimestampOK()
	if ok && tt.T > t {
		return "its token's time is after the server's present: it cannot be from this deployment"
	}
	return ""
}

// TokenTime is the cluster time of a resume token: its _data starts with
// 0x82 and the 8-byte timestamp.
func TokenTime(token bson.Raw) (bson.Timestamp, bool) {
	if token == nil {
		return bson.Timestamp{}, false
	}
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

// StreamTokenGet returns the saved position of the named stream, or
// ErrNotFound.
func (s *Store) StreamTokenGet(ctx context.Context, name string) (bson.Raw, error) {
	raw, err := s.db.Collection(CollStreams).FindOne(ctx, bson.D{{Key: "_id", Value: name}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("resume token of stream %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read resume token of stream %s: %w", name, err)
	}
	tok, ok := raw.Lookup("token").DocumentOK()
	if !ok {
		return nil, fmt.Errorf("resume token of stream %s: %w", name, ErrNotFound)
	}
	return tok, nil
}

// StreamTokenSave saves the position of the named stream.
func (s *Store) StreamTokenSave(ctx context.Context, name string, token bson.Raw) error {
	_, err := s.db.Collection(CollStreams).UpdateOne(ctx, bson.D{{Key: "_id", Value: name}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "token", Value: token}, {Key: "saved", Value: s.nowMS()}}}},
		options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("save resume token of stream %s: %w", name, err)
	}
	return nil
}

// StreamTokenForget drops the saved position of the named stream: its
// next StreamOpen with Checkpoint starts at the present.
func (s *Store) StreamTokenForget(ctx context.Context, name string) error {
	_, err := s.db.Collection(CollStreams).UpdateOne(ctx, bson.D{{Key: "_id", Value: name}},
		bson.D{{Key: "$unset", Value: bson.D{{Key: "token", Value: ""}}}, {Key: "$set", Value: bson.D{{Key: "saved", Value: s.nowMS()}}}})
	if err != nil {
		return fmt.Errorf("forget resume token of stream %s: %w", name, err)
	}
	return nil
}

// StreamPositionLost reports whether a change stream cannot resume from the
// position it was given, so its reader must start afresh and re-read the
// database: the history is gone (ChangeStreamHistoryLost 286), the token is
// not in this deployment's history (ChangeStreamFatalError 280,
// InvalidResumeToken 260), or the token cannot even be read (40647, 50811,
// FailedToParse 9, as MongoDB 6.0 answers corrupt tokens).
func StreamPositionLost(err error) bool {
	var se mongo.ServerError
	if !errors.As(err, &se) {
		return false
	}
	for _, code := range []int{286, 280, 260, 40647, 50811, 9} {
		if se.HasErrorCode(code) {
			return true
		}
	}
	return false
}
