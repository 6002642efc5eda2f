package events

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v4"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// TokenStore keeps resume tokens (the store implements it).
type TokenStore interface {
	StreamTokenGet(ctx context.Context, name string) (bson.Raw, error)
	StreamTokenSave(ctx context.Context, name string, token bson.Raw) error
}

// Config configures a Stream.
type Config struct {
	DB        *mongo.Database
	Publisher message.Publisher
	Tokens    TokenStore
	// Name keys the saved resume token; one per node.
	Name   string
	Logger *slog.Logger
	// SaveEvery bounds how often the resume token is written (default 1 s).
	SaveEvery time.Duration
	// MaxAwait is how long the server holds an empty getMore (default 1 s);
	// it bounds how stale the saved post-batch token may be.
	MaxAwait time.Duration
}

// Stats are counters for metrics.
type Stats struct {
	Events  int64 // events published
	Resumes int64 // times the stream was reopened after an error
	Rescans int64 // rescans published
}

// Stream follows the change stream and publishes events. Start it, Stop it.
type Stream struct {
	cfg    Config
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	token     bson.Raw // last token seen (owned by the loop goroutine)
	savedTok  bson.Raw
	savedAt   time.Time
	events    atomic.Int64
	resumes   atomic.Int64
	rescans   atomic.Int64
	warnedIDs map[string]bool
}

// New returns a stream; nothing runs until Start.
func New(cfg Config) *Stream {
	if cfg.SaveEvery <= 0 {
		cfg.SaveEvery = time.Second
	}
	if cfg.MaxAwait <= 0 {
		cfg.MaxAwait = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Stream{cfg: cfg, log: cfg.Logger.With("component", "events"), warnedIDs: map[string]bool{}}
}

// Stats returns the counters.
func (s *Stream) Stats() Stats {
	return Stats{Events: s.events.Load(), Resumes: s.resumes.Load(), Rescans: s.rescans.Load()}
}

// pipeline filters on the server to what the node needs and keeps the
// events small (a task's parameters never travel). Of task updates only
// those that make a task queued (-2, a requeue) or move it to another queue
// are work for the claimer: the claim, start and finish updates, two thirds
// of all task events, never leave the server.
func pipeline() mongo.Pipeline {
	return mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: "ns.coll", Value: schema.CollQueues}},
			bson.D{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"insert", "replace", "delete", "drop", "rename"}}}}},
			bson.D{{Key: "ns.coll", Value: schema.CollTasks}, {Key: "operationType", Value: "update"}, {Key: "$or", Value: bson.A{
				bson.D{{Key: "updateDescription.updatedFields.status", Value: int32(schema.StatusQueued)}},
				bson.D{{Key: "updateDescription.updatedFields.queue", Value: bson.D{{Key: "$exists", Value: true}}}},
			}}},
			bson.D{{Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"dropDatabase", "invalidate"}}}}},
		}}}}},
		{{Key: "$project", Value: bson.D{
			{Key: "operationType", Value: 1},
			{Key: "ns", Value: 1},
			{Key: "documentKey", Value: 1},
			{Key: "wallTime", Value: 1},
			{Key: "fullDocument.queue", Value: 1},
			{Key: "fullDocument.status", Value: 1},
			{Key: "fullDocument.node", Value: 1},
			{Key: "updateDescription.updatedFields.status", Value: 1},
			{Key: "updateDescription.updatedFields.queue", Value: 1},
		}}},
	}
}

// Start opens the change stream before returning, so that every change
// after Start is seen, and follows it in a goroutine until Stop. It fails
// when the deployment has no change streams (a standalone mongod).
func (s *Stream) Start(ctx context.Context) error {
	if s.done != nil {
		return nil
	}
	if tok, err := s.cfg.Tokens.StreamTokenGet(ctx, s.cfg.Name); err == nil {
		s.token, s.savedTok = tok, tok
	}
	cs, err := s.open(ctx)
	if err != nil {
		return err
	}
	ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	s.done = make(chan struct{})
	go s.run(ctx, cs)
	return nil
}

// Stop ends the stream and saves its last resume token.
func (s *Stream) Stop() {
	if s.done == nil {
		return
	}
	s.once.Do(func() {
		s.cancel()
		<-s.done
	})
}

// open opens the stream after the known token, or from now. A token the
// server no longer has means lost history: start from now and Rescan.
func (s *Stream) open(ctx context.Context) (*mongo.ChangeStream, error) {
	o := options.ChangeStream().SetMaxAwaitTime(s.cfg.MaxAwait)
	if s.token != nil {
		o.SetStartAfter(s.token)
	}
	cs, err := s.cfg.DB.Watch(ctx, pipeline(), o)
	if err != nil && s.token != nil && store.StreamPositionLost(err) {
		s.log.Warn("change stream history lost; starting from now and rescanning", "stream", s.cfg.Name, "error", err)
		s.token = nil
		cs, err = s.cfg.DB.Watch(ctx, pipeline(), options.ChangeStream().SetMaxAwaitTime(s.cfg.MaxAwait))
		if err == nil {
			s.publish(ctx, TopicRescan, Rescan{Reason: "change stream history lost"})
			s.rescans.Add(1)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open change stream on %s: %w", s.cfg.DB.Name(), err)
	}
	return cs, nil
}

func (s *Stream) run(ctx context.Context, cs *mongo.ChangeStream) {
	defer close(s.done)
	defer func() {
		s.saveToken(true)
		if cs != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = cs.Close(cctx)
			cancel()
		}
	}()
	for {
		for cs.TryNext(ctx) {
			s.token = cs.ResumeToken()
			if s.handle(ctx, cs.Current) {
				// invalidate: the cursor is closed; reopen after it.
				break
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err := cs.Err(); err != nil || cs.ID() == 0 {
			_ = cs.Close(context.Background())
			cs = s.reopen(ctx, err)
			if cs == nil {
				return
			}
			continue
		}
		if t := cs.ResumeToken(); t != nil {
			s.token = t // the post-batch token of an empty batch
		}
		s.saveToken(false)
	}
}

// reopen retries with backoff until the stream is open again or ctx ends.
func (s *Stream) reopen(ctx context.Context, cause error) *mongo.ChangeStream {
	lost := false
	if cause != nil {
		s.log.Warn("change stream interrupted; resuming", "stream", s.cfg.Name, "error", cause)
		if store.StreamPositionLost(cause) {
			s.token = nil
			lost = true
		}
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 50 * time.Millisecond
	b.MaxInterval = 5 * time.Second
	b.MaxElapsedTime = 0
	for {
		cs, err := s.open(ctx)
		if err == nil {
			s.resumes.Add(1)
			if lost {
				// Only once the stream is open again, as in open: a
				// subscriber that re-reads the database on the Rescan must
				// not miss a change made before the stream was back.
				s.publish(ctx, TopicRescan, Rescan{Reason: "change stream history lost: " + cause.Error()})
				s.rescans.Add(1)
			}
			s.log.Info("change stream resumed", "stream", s.cfg.Name)
			return cs
		}
		if ctx.Err() != nil {
			return nil
		}
		wait := b.NextBackOff()
		s.log.Warn("change stream: cannot reopen; retrying", "stream", s.cfg.Name, "in", wait, "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// handle publishes one change event. It reports whether the stream was
// invalidated.
func (s *Stream) handle(ctx context.Context, ev bson.Raw) (invalidated bool) {
	op, _ := ev.Lookup("operationType").StringValueOK()
	coll, _ := ev.Lookup("ns", "coll").StringValueOK()
	switch op {
	case "invalidate", "dropDatabase", "drop", "rename":
		s.publish(ctx, TopicRescan, Rescan{Reason: fmt.Sprintf("change stream: %s of %s", op, coll)})
		s.rescans.Add(1)
		return op == "invalidate"
	}
	idVal := ev.Lookup("documentKey", "_id")
	id, ok := idVal.ObjectIDOK()
	if !ok {
		s.warnOnce(coll, idVal.String(), "_id", "want an ObjectId, got "+idVal.Type.String())
		return false
	}
	switch coll {
	case schema.CollQueues:
		s.publish(ctx, TopicQueues, QueueChanged{Op: Op(op), ID: id})
	case schema.CollTasks:
		tc := TaskChanged{Op: Op(op), ID: id}
		if wt, ok := ev.Lookup("wallTime").TimeOK(); ok {
			tc.At = wt
		}
		fields := ev.Lookup("fullDocument")
		if op == "update" {
			fields = ev.Lookup("updateDescription", "updatedFields")
		}
		if doc, ok := fields.DocumentOK(); ok {
			// An insert or a replace carries the whole task (as projected):
			// a field missing there is missing from the task.
			whole := op != "update"
			if q, err := doc.LookupErr(schema.TaskQueue); err == nil {
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
			if nd, err := doc.LookupErr(schema.TaskNode); err == nil && whole {
				if n, isInt := integer(nd); nd.Type != bson.TypeString && nd.Type != bson.TypeNull && (!isInt || n != schema.Unclaimed) {
					s.warnOnce(coll, id.Hex(), schema.TaskNode, "want a node name, -1 or null, got "+schema.Describe(nd)+"; no node will claim the task")
				}
			}
		}
		s.publish(ctx, TopicTasks, tc)
	}
	return false
}

func (s *Stream) warnOnce(coll, id, field, msg string) {
	key := coll + "/" + id + "/" + field
	if s.warnedIDs[key] {
		return
	}
	if len(s.warnedIDs) > 100000 {
		s.warnedIDs = map[string]bool{}
	}
	s.warnedIDs[key] = true
	s.log.Warn("malformed document", "collection", coll, "_id", id, "field", field, "problem", msg)
}

func (s *Stream) publish(ctx context.Context, topic string, ev any) {
	msg, err := Encode(ev)
	if err == nil {
		err = s.cfg.Publisher.Publish(topic, msg)
	}
	if err != nil && ctx.Err() == nil {
		s.log.Error("publish event", "topic", topic, "error", err)
		return
	}
	s.events.Add(1)
}

// saveToken writes the last token when it changed and SaveEvery has passed
// (or always, with force).
func (s *Stream) saveToken(force bool) {
	if s.token == nil || string(s.token) == string(s.savedTok) {
		return
	}
	if !force && time.Since(s.savedAt) < s.cfg.SaveEvery {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.cfg.Tokens.StreamTokenSave(ctx, s.cfg.Name, s.token); err != nil {
		s.log.Warn("save resume token", "stream", s.cfg.Name, "error", err)
		return
	}
	s.savedTok = append(bson.Raw(nil), s.token...)
	s.savedAt = time.Now()
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
