package events

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/internal/lifecycle"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// Streams opens change streams (the store does).
type Streams interface {
	StreamOpen(ctx context.Context, p store.StreamParams) (*store.StreamReader, error)
	StreamTokenForget(ctx context.Context, name string) error
}

// Config configures a Stream.
type Config struct {
	Store     Streams
	Publisher message.Publisher
	// Name keys the saved position; one per node.
	Name   string
	Logger *slog.Logger
	// SaveEvery bounds how often the position is written (default 1 s).
	SaveEvery time.Duration
	// MaxAwait is how long the server holds an empty getMore (default 1 s);
	// it bounds how stale the saved post-batch position may be.
	MaxAwait time.Duration
	Clock    clock.Clock
}

// Stats are counters for metrics.
type Stats struct {
	Events  int64 // events published
	Resumes int64 // times the stream was reopened after an error
	Rescans int64 // rescans published for lost history
	Quiets  int64 // quiet spells (Quiet): times the stream was let go (each ends with a rescan)
}

// Stream follows the node's wake-up change stream (store.StreamWakeups)
// and publishes its events. Start it, Stop it.
type Stream struct {
	lifecycle.Base
	cfg Config
	log *slog.Logger

	reader atomic.Pointer[store.StreamReader]
	// resumesMu makes a retired reader's resumes move to pastResumes at
	// once for Stats (a scrape between the two counted them twice, and
	// the next one less: a counter going back).
	resumesMu   sync.Mutex
	pastResumes atomic.Int64 // of readers of earlier runs
	events      atomic.Int64
	rescans     atomic.Int64
	quiets      atomic.Int64

	// quiet: the node needs no wake-ups (Quiet); quietChanged is
	// signalled when it changes.
	quiet        atomic.Bool
	quietChanged chan struct{}

	warnMu    sync.Mutex
	warnedIDs map[string]bool
}

// New returns a stream; nothing runs until Start.
func New(cfg Config) *Stream {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Stream{cfg: cfg, log: cfg.Logger.With("component", "events"), warnedIDs: map[string]bool{}, quietChanged: make(chan struct{}, 1)}
}

// IsQuiet reports whether the stream is told its node needs no wake-ups.
func (s *Stream) IsQuiet() bool { return s.quiet.Load() }

// Quiet tells the stream whether its node needs wake-ups (the claimer's
// Config.Quiet; it does not block). While it does not (on), the stream
// closes its server cursor: a held getMore is woken by every write to the
// database, matching or not, and a node draining a backlog in every queue
// it serves claims as its slots free up, so what it would hear is worth
// nothing to it (nor to one that is none of its queues' listeners, with
// claimer.Config.Listeners: it finds work by its tick). When wake-ups
// are needed again the stream reopens at the present and publishes a
// Rescan (Quiet: true): its subscribers re-read
// the database for what it did not hear. Kill requests made meanwhile
// reach the node by its kill sweep.
func (s *Stream) Quiet(on bool) {
	if s.quiet.Swap(on) != on {
		select {
		case s.quietChanged <- struct{}{}:
		default:
		}
	}
}

// Stats returns the counters.
func (s *Stream) Stats() Stats {
	s.resumesMu.Lock()
	resumes := s.pastResumes.Load()
	if r := s.reader.Load(); r != nil {
		resumes += r.Stats().Resumes
	}
	s.resumesMu.Unlock()
	return Stats{Events: s.events.Load(), Resumes: resumes, Rescans: s.rescans.Load(), Quiets: s.quiets.Load()}
}

// Start opens the change stream before returning, so that every change
// after Start is seen, and follows it until Stop, which saves its position
// and closes its server cursor. It fails when the deployment has no change
// streams (a standalone mongod).
func (s *Stream) Start(ctx context.Context) error {
	return s.Base.Start(ctx, func(ctx context.Context, run *lifecycle.Run) error {
		s.quiet.Store(false) // a new run follows until told otherwise
		r, err := s.open(ctx, false)
		if err != nil {
			return err
		}
		if why := r.TakeLost(); why != "" {
			s.lost(ctx, why)
		}
		s.reader.Store(r)
		run.Go(func(ctx context.Context) { s.follow(ctx, r) })
		return nil
	})
}

// open opens the stream at its saved position, or at the present.
func (s *Stream) open(ctx context.Context, present bool) (*store.StreamReader, error) {
	return s.cfg.Store.StreamOpen(ctx, store.StreamParams{
		Profile: store.StreamWakeups, Name: s.cfg.Name, Checkpoint: true, Present: present, SaveEvery: s.cfg.SaveEvery,
		MaxAwait: s.cfg.MaxAwait, Clock: s.cfg.Clock, Logger: s.log,
	})
}

// retire closes r (saving its position and killing its server cursor).
func (s *Stream) retire(r *store.StreamReader) {
	r.Close()
	s.resumesMu.Lock()
	s.pastResumes.Add(r.Stats().Resumes)
	s.reader.Store(nil)
	s.resumesMu.Unlock()
}

func (s *Stream) follow(ctx context.Context, r *store.StreamReader) {
	defer func() {
		if r != nil {
			s.retire(r)
		}
	}()
	for {
		if s.quiet.Load() {
			s.retire(r)
			s.forget()
			if r = s.quietSpell(ctx); r == nil {
				return // stopped
			}
			continue
		}
		b, err := r.Next(ctx)
		if err != nil {
			return // stopped
		}
		if b.Lost != "" {
			s.lost(ctx, b.Lost)
		}
		for _, ev := range b.Events {
			s.handle(ctx, ev)
		}
	}
}

// forget drops the stream's saved position as a quiet spell begins: the
// spell ends with a reopening at the present and a Rescan, and so must a
// next Start (a restart, a crash) that comes first, not a replay of the
// whole spell (hours, for a node that listens to no queue), with the kill
// requests an operator withdrew since among its events.
func (s *Stream) forget() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.cfg.Store.StreamTokenForget(ctx, s.cfg.Name); err != nil {
		s.log.Warn("forgetting the change stream's position for a quiet spell failed; a restart meanwhile replays the spell", "error", err)
	}
}

// quietSpell waits, the stream closed, until its node needs wake-ups
// again, and reopens it at the present with a Rescan; nil when stopped
// first.
func (s *Stream) quietSpell(ctx context.Context) *store.StreamReader {
	s.quiets.Add(1)
	s.log.Debug("the node needs no wake-ups: change stream closed until it does")
	for s.quiet.Load() {
		select {
		case <-ctx.Done():
			return nil
		case <-s.quietChanged:
		}
	}
	clk := clock.Or(s.cfg.Clock)
	for {
		r, err := s.open(ctx, true)
		if err == nil {
			s.reader.Store(r)
			s.publish(ctx, TopicRescan, Rescan{Reason: "wake-ups needed again after a quiet spell", Quiet: true})
			s.log.Debug("wake-ups needed again: change stream reopened at the present")
			return r
		}
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("reopening the change stream failed; retrying in 1s (the claimer's tick finds work meanwhile)", "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-clk.After(time.Second):
		}
	}
}

// lost publishes a Rescan for a lost position. The reader follows the
// present again by then: a subscriber that re-reads the database on the
// Rescan cannot miss a change made before the stream was back.
func (s *Stream) lost(ctx context.Context, why string) {
	s.publish(ctx, TopicRescan, Rescan{Reason: "change stream history lost: " + why})
	s.rescans.Add(1)
}

// handle publishes one change event.
func (s *Stream) handle(ctx context.Context, ev store.ChangeEvent) {
	switch ev.Op {
	case "invalidate", "dropDatabase", "drop", "rename":
		s.publish(ctx, TopicRescan, Rescan{Reason: fmt.Sprintf("change stream: %s of %s", ev.Op, ev.Coll)})
		s.rescans.Add(1)
		return
	}
	id, ok := ev.ID.ObjectIDOK()
	if !ok {
		s.warnOnce(ev.Coll, ev.ID.String(), "_id", "want an ObjectId, got "+ev.ID.Type.String())
		return
	}
	switch ev.Coll {
	case schema.CollQueues:
		s.publish(ctx, TopicQueues, QueueChanged{Op: Op(ev.Op), ID: id, AdmissionsOnly: ev.AdmissionsOnly})
	case schema.CollTasks:
		if kd, ok := ev.Updated.Lookup(schema.TaskKill).DocumentOK(); ok && ev.Op == "update" {
			s.publish(ctx, TopicKills, KillRequested{ID: id, Request: schema.DecodeKillRequest(kd)})
			if !has(ev.Updated, schema.TaskStatus) && !has(ev.Updated, schema.TaskQueue) {
				return // a kill request alone is no work for a claimer
			}
		}
		s.publish(ctx, TopicTasks, s.taskChanged(ev, id))
	}
}

// taskChanged reads what a task event says, warning (once per task and
// field) about a task no node can run.
func (s *Stream) taskChanged(ev store.ChangeEvent, id bson.ObjectID) TaskChanged {
	tc := TaskChanged{Op: Op(ev.Op), ID: id, At: ev.WallTime}
	doc := ev.Doc
	if ev.Op == "update" {
		doc = ev.Updated
	}
	if doc == nil {
		return tc
	}
	coll := ev.Coll
	// An insert or a replace carries the whole task (as projected): a field
	// missing there is missing from the task.
	whole := ev.Op != "update"
	if q, err := doc.LookupErr(schema.TaskQueue); err == nil {
		var ok bool
		if tc.Queue, ok = q.ObjectIDOK(); !ok {
			s.warnOnce(coll, id.Hex(), schema.TaskQueue, "want an ObjectId, got "+schema.Describe(q)+"; the task belongs to no queue and will never run")
		}
	} else if whole {
		s.warnOnce(coll, id.Hex(), schema.TaskQueue, "missing; the task belongs to no queue and will never run")
	}
	if st, err := doc.LookupErr(schema.TaskStatus); err == nil {
		if n, ok := integer(st); ok && n == int64(int32(n)) {
			status := schema.Status(n)
			tc.Status = &status
		} else {
			s.warnOnce(coll, id.Hex(), schema.TaskStatus, "want a 32-bit integer status, got "+schema.Describe(st)+"; no node will claim the task")
		}
	} else if whole {
		s.warnOnce(coll, id.Hex(), schema.TaskStatus, "missing; no node will claim the task")
	}
	if nd, err := doc.LookupErr(schema.TaskNode); err == nil {
		n, isInt := integer(nd)
		tc.NodeMinusOne = isInt && n == schema.Unclaimed
		if whole && nd.Type != bson.TypeString && nd.Type != bson.TypeNull && !tc.NodeMinusOne {
			s.warnOnce(coll, id.Hex(), schema.TaskNode, "want a node name, -1 or null, got "+schema.Describe(nd)+"; no node will claim the task")
		}
	}
	return tc
}

func (s *Stream) warnOnce(coll, id, field, msg string) {
	key := coll + "/" + id + "/" + field
	s.warnMu.Lock()
	if s.warnedIDs[key] {
		s.warnMu.Unlock()
		return
	}
	if len(s.warnedIDs) > 100000 {
		s.warnedIDs = map[string]bool{}
	}
	s.warnedIDs[key] = true
	s.warnMu.Unlock()
	s.log.Warn("malformed document", "collection", coll, "_id", id, "field", field, "problem", msg)
}

func (s *Stream) publish(ctx context.Context, topic string, ev any) {
	msg, err := Encode(ev)
	if err == nil {
		err = s.cfg.Publisher.Publish(topic, msg)
	}
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("publish event", "topic", topic, "error", err)
		}
		return
	}
	s.events.Add(1)
}

func has(doc bson.Raw, key string) bool {
	_, err := doc.LookupErr(key)
	return err == nil
}

// integer reads an int32, int64 or integral double.
func integer(v bson.RawValue) (int64, bool) {
	switch v.Type {
	case bson.TypeInt32, bson.TypeInt64:
		return v.AsInt64(), true
	case bson.TypeDouble:
		f := v.Double()
		return int64(f), f == float64(int64(f))
	}
	return 0, false
}
