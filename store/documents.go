package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/disbatch-go/disbatch/schema"
)

// This file is the store's side of the Disbatch 4.103 HTTP routes
// (web/dci): they hand documents back as stored, with every field, and
// address queues and nodes the way 4.103 does (Ref).

// CollBalance is the collection of Disbatch 4.103's QueueBalance settings
// (one document).
const CollBalance = "balance"

// WriteCounts are what MongoDB reported of an update or a delete.
type WriteCounts struct {
	Matched  int64
	Modified int64
	Deleted  int64
}

// refFilter is Disbatch 4.103's reading of a :queue or :node URL segment:
// 24 hex digits name an _id, anything else the name field. There is no
// fallback from an id that matches nothing to a name.
func refFilter(ref, nameField string) bson.D {
	if hexID.MatchString(ref) {
		if id, err := bson.ObjectIDFromHex(ref); err == nil {
			return bson.D{{Key: "_id", Value: id}}
		}
	}
	return bson.D{{Key: nameField, Value: ref}}
}

func readAll(ctx context.Context, cur *mongo.Cursor) ([]bson.Raw, error) {
	r := readCursor(ctx, cur)
	defer r.Close()
	var out []bson.Raw
	for r.Next() {
		out = append(out, append(bson.Raw(nil), cur.Current...))
	}
	return out, r.Err()
}

// NodeDocs returns every node document as stored, sorted by node name.
func (s *Store) NodeDocs(ctx context.Context) ([]bson.Raw, error) {
	cur, err := s.nodes.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: schema.NodeNode, Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	docs, err := readAll(ctx, cur)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return docs, nil
}

// NodeDoc returns the node document Ref names (an _id in hex, else a node
// name) as stored, or ErrNotFound.
func (s *Store) NodeDoc(ctx context.Context, ref string) (bson.Raw, error) {
	raw, err := s.nodes.FindOne(ctx, refFilter(ref, schema.NodeNode)).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("node %q: %w", ref, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read node %q: %w", ref, err)
	}
	return raw, nil
}

// NodeMaxThreadsSetParams set the operator's cap of one node (Ref as for
// NodeDoc); nil MaxThreads writes null (no cap).
type NodeMaxThreadsSetParams struct {
	Ref        string
	MaxThreads *int
}

// NodeMaxThreadsSet sets a node's maxthreads without upserting.
func (s *Store) NodeMaxThreadsSet(ctx context.Context, p NodeMaxThreadsSetParams) (WriteCounts, error) {
	if err := validateMaxThreads(p.MaxThreads); err != nil {
		return WriteCounts{}, err
	}
	res, err := s.nodes.UpdateOne(ctx, refFilter(p.Ref, schema.NodeNode),
		bson.D{{Key: "$set", Value: bson.D{{Key: schema.NodeMaxThreads, Value: p.MaxThreads}}}})
	if err != nil {
		return WriteCounts{}, fmt.Errorf("set maxthreads of node %q: %w", p.Ref, err)
	}
	return WriteCounts{Matched: res.MatchedCount, Modified: res.ModifiedCount}, nil
}

// QueueDocs returns every queue document as stored, in natural order.
func (s *Store) QueueDocs(ctx context.Context) ([]bson.Raw, error) {
	cur, err := s.queues.Find(ctx, bson.D{}, options.Find().SetBatchSize(10000))
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	docs, err := readAll(ctx, cur)
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	return docs, nil
}

// QueueResolve returns the _id of the queue Ref names, the 4.103 way (an
// _id in hex, else a name), or ErrNotFound.
func (s *Store) QueueResolve(ctx context.Context, ref string) (bson.ObjectID, error) {
	raw, err := s.queues.FindOne(ctx, refFilter(ref, schema.QueueName), options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return bson.ObjectID{}, fmt.Errorf("queue %q: %w", ref, ErrNotFound)
	}
	if err != nil {
		return bson.ObjectID{}, fmt.Errorf("read queue %q: %w", ref, err)
	}
	id, _ := raw.Lookup("_id").ObjectIDOK()
	return id, nil
}

// QueueSetParams are Disbatch 4.103's queue changes: nil leaves a field
// alone. Plugin sets constructor too, Threads maxthreads too, so that both
// kinds of node read the change.
type QueueSetParams struct {
	Ref     string
	Name    *string
	Plugin  *string
	Threads *int
}

// QueueSet updates the queue Ref names (as QueueResolve reads it) and says
// what matched. A new name already taken is ErrQueueExists.
func (s *Store) QueueSet(ctx context.Context, p QueueSetParams) (WriteCounts, error) {
	set, unset := bson.D{}, bson.D{}
	if p.Name != nil {
		if err := ValidateQueueName(*p.Name); err != nil {
			return WriteCounts{}, err
		}
		if err := s.queueNameFree(ctx, *p.Name, refFilter(p.Ref, schema.QueueName)); err != nil {
			return WriteCounts{}, err
		}
		set = append(set, bson.E{Key: schema.QueueName, Value: *p.Name})
	}
	if p.Plugin != nil {
		set = append(set, bson.E{Key: schema.QueuePlugin, Value: *p.Plugin}, bson.E{Key: schema.QueueConstructor, Value: *p.Plugin})
	}
	if p.Threads != nil {
		if err := validateMaxThreads(p.Threads); err != nil {
			return WriteCounts{}, err
		}
		// threads is 4.103's name of the cap across all nodes: on a queue
		// with max_running it sets that cap, elsewhere the per-node limit.
		// 0 runs nothing in 4.103; max_running 0 would mean no cap to
		// these nodes, so a capped queue is held instead (balance_hold,
		// as QueueBalanceSet holds one), its max_running kept; a cap
		// above 0 lifts a hold, as setting threads did in 4.103.
		_, capped, err := s.queueCap(ctx, refFilter(p.Ref, schema.QueueName))
		if err != nil {
			return WriteCounts{}, err
		}
		switch {
		case capped && *p.Threads == 0:
			set = append(set, bson.E{Key: schema.QueueThreads, Value: 0}, bson.E{Key: schema.QueueBalanceHold, Value: true})
		case capped:
			set = append(set, bson.E{Key: schema.QueueThreads, Value: *p.Threads}, bson.E{Key: schema.QueueMaxRunning, Value: *p.Threads})
			unset = append(unset, bson.E{Key: schema.QueueBalanceHold, Value: ""})
		default:
			set = append(set, bson.E{Key: schema.QueueThreads, Value: *p.Threads}, bson.E{Key: schema.QueueMaxThreads, Value: *p.Threads})
		}
	}
	if len(set) == 0 {
		return WriteCounts{}, errors.New("nothing to update")
	}
	update := bson.D{{Key: "$set", Value: set}}
	if len(unset) > 0 {
		update = append(update, bson.E{Key: "$unset", Value: unset})
	}
	counts, err := s.queueWrite(ctx, refFilter(p.Ref, schema.QueueName), update, p.Name, fmt.Sprintf("%q", p.Ref))
	if err != nil {
		return WriteCounts{}, err
	}
	return counts, nil
}

// queueNameFree refuses name when a queue other than the one self
// matches already has it (databases without the unique index).
func (s *Store) queueNameFree(ctx context.Context, name string, self bson.D) error {
	var ids []bson.ObjectID
	if err := s.queues.Distinct(ctx, "_id", self).Decode(&ids); err != nil {
		return fmt.Errorf("look up queue: %w", err)
	}
	f := bson.D{{Key: schema.QueueName, Value: name}}
	if len(ids) > 0 {
		f = append(f, bson.E{Key: "_id", Value: bson.D{{Key: "$nin", Value: ids}}})
	}
	n, err := s.queues.CountDocuments(ctx, f)
	if err != nil {
		return fmt.Errorf("look up queue %q: %w", name, err)
	}
	if n > 0 {
		return fmt.Errorf("queue name %q: %w", name, ErrQueueExists)
	}
	return nil
}

// QueueDocDelete deletes the queue document Ref names and nothing else, as
// Disbatch 4.103's DELETE /queues/:queue does: its tasks stay, for the
// record (QueueDelete also removes them).
func (s *Store) QueueDocDelete(ctx context.Context, ref string) (WriteCounts, error) {
	res, err := s.queues.DeleteOne(ctx, refFilter(ref, schema.QueueName))
	if err != nil {
		return WriteCounts{}, fmt.Errorf("delete queue %q: %w", ref, err)
	}
	return WriteCounts{Deleted: res.DeletedCount}, nil
}

// TaskRunningCounts counts, per queue, the tasks claimed or running
// (status -1 or 0) on any node: one aggregation over the {status, mtime,
// queue} index that reads only the index entries of those tasks, never a
// document, nor the queued or finished tasks.
func (s *Store) TaskRunningCounts(ctx context.Context) (map[bson.ObjectID]int64, error) {
	cur, err := s.tasks.Aggregate(ctx, mongo.Pipeline{
		{{Key: "$match", Value: bson.D{{Key: schema.TaskStatus, Value: bson.D{{Key: "$in", Value: bson.A{
			int32(schema.StatusClaimed), int32(schema.StatusRunning)}}}}}}},
		{{Key: "$project", Value: bson.D{{Key: "_id", Value: 0}, {Key: schema.TaskQueue, Value: 1}}}},
		{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$" + schema.TaskQueue}, {Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}}}}},
	})
	if err != nil {
		return nil, fmt.Errorf("count running tasks: %w", err)
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	out := map[bson.ObjectID]int64{}
	for r.Next() {
		if id, ok := cur.Current.Lookup("_id").ObjectIDOK(); ok {
			out[id] = cur.Current.Lookup("n").AsInt64()
		}
	}
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("count running tasks: %w", err)
	}
	return out, nil
}

// TaskQueuedCount counts queue's tasks that may run now (status -2), up
// to limit (0: all), through the {queue, status} index.
func (s *Store) TaskQueuedCount(ctx context.Context, queue bson.ObjectID, limit int64) (int64, error) {
	n, err := s.tasks.CountDocuments(ctx, bson.D{{Key: schema.TaskQueue, Value: queue}, {Key: schema.TaskStatus, Value: int32(schema.StatusQueued)}},
		options.Count().SetLimit(limit))
	if err != nil {
		return 0, fmt.Errorf("count queued tasks of %s: %w", queue.Hex(), err)
	}
	return n, nil
}

// QueueStatusCounts recounts one queue's tasks the way Disbatch 4.103's
// GET /queues does, with three count queries (queued: status <= -2,
// running: -1 or 0, completed: >= 1). For queues whose projected counters
// do not exist yet, and for the benchmark's comparison.
func (s *Store) QueueStatusCounts(ctx context.Context, queue bson.ObjectID) (queued, running, completed int64, err error) {
	count := func(cond bson.D) (int64, error) {
		return s.tasks.CountDocuments(ctx, bson.D{{Key: schema.TaskQueue, Value: queue}, {Key: schema.TaskStatus, Value: cond}})
	}
	if queued, err = count(bson.D{{Key: "$lte", Value: -2}}); err == nil {
		if running, err = count(bson.D{{Key: "$in", Value: bson.A{-1, 0}}}); err == nil {
			completed, err = count(bson.D{{Key: "$gte", Value: 1}})
		}
	}
	if err != nil {
		return 0, 0, 0, fmt.Errorf("count tasks of queue %s: %w", queue.Hex(), err)
	}
	return queued, running, completed, nil
}

// TaskFindParams select task documents with a filter built by the caller
// (the 4.103 query language), returned as stored.
type TaskFindParams struct {
	Filter     bson.D
	Projection bson.D // nil: every field
	Sort       bson.D // nil: natural order
	Skip       int64
	Limit      int64 // 0: no limit
}

// TaskFind returns the matching task documents.
func (s *Store) TaskFind(ctx context.Context, p TaskFindParams) ([]bson.Raw, error) {
	o := options.Find()
	if p.Projection != nil {
		o.SetProjection(p.Projection)
	}
	if p.Sort != nil {
		o.SetSort(p.Sort)
	}
	if p.Skip > 0 {
		o.SetSkip(p.Skip)
	}
	if p.Limit > 0 {
		o.SetLimit(p.Limit)
	}
	filter := p.Filter
	if filter == nil {
		filter = bson.D{}
	}
	cur, err := s.tasks.Find(ctx, filter, o)
	if err != nil {
		return nil, fmt.Errorf("find tasks: %w", err)
	}
	docs, err := readAll(ctx, cur)
	if err != nil {
		return nil, fmt.Errorf("find tasks: %w", err)
	}
	return docs, nil
}

// TaskCount counts the tasks matching filter (skip and limit as for
// TaskFind; 0: none).
func (s *Store) TaskCount(ctx context.Context, filter bson.D, skip, limit int64) (int64, error) {
	if filter == nil {
		filter = bson.D{}
	}
	o := options.Count()
	if skip > 0 {
		o.SetSkip(skip)
	}
	if limit > 0 {
		o.SetLimit(limit)
	}
	n, err := s.tasks.CountDocuments(ctx, filter, o)
	if err != nil {
		return 0, fmt.Errorf("count tasks: %w", err)
	}
	return n, nil
}

// TaskIndex is an index of tasks: its name and its keys' names, in order.
type TaskIndex struct {
	Name string
	Keys []string
}

// TaskIndexKeys returns every index of tasks, as listIndexes gives them.
func (s *Store) TaskIndexKeys(ctx context.Context) ([]TaskIndex, error) {
	cur, err := s.tasks.Indexes().List(ctx)
	if err != nil {
		var ce mongo.CommandError
		if asCommandError(err, &ce) && ce.Code == 26 { // NamespaceNotFound
			return nil, nil
		}
		return nil, fmt.Errorf("list indexes of tasks: %w", err)
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	var out []TaskIndex
	for r.Next() {
		var spec struct {
			Name string `bson:"name"`
			Key  bson.D `bson:"key"`
		}
		if err := cur.Decode(&spec); err != nil {
			return nil, fmt.Errorf("list indexes of tasks: %w", err)
		}
		ix := TaskIndex{Name: spec.Name, Keys: make([]string, len(spec.Key))}
		for i, e := range spec.Key {
			ix.Keys[i] = e.Key
		}
		out = append(out, ix)
	}
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("list indexes of tasks: %w", err)
	}
	return out, nil
}

// DocumentsFindParams read documents of any collection of the database:
// POST /tasks of Disbatch 4.103 makes one task per document of a
// collection the caller names.
type DocumentsFindParams struct {
	Collection string
	Filter     bson.D
	Projection bson.D
	// Limit bounds the answer; more matches give ErrTooMany.
	Limit int64
}

// ErrTooMany is returned when more documents match than asked for.
var ErrTooMany = errors.New("too many documents match")

// DocumentsFind returns the matching documents.
func (s *Store) DocumentsFind(ctx context.Context, p DocumentsFindParams) ([]bson.Raw, error) {
	if p.Collection == "" {
		return nil, errors.New("collection name is required")
	}
	o := options.Find()
	if p.Projection != nil {
		o.SetProjection(p.Projection)
	}
	if p.Limit > 0 {
		o.SetLimit(p.Limit + 1)
	}
	filter := p.Filter
	if filter == nil {
		filter = bson.D{}
	}
	cur, err := s.db.Collection(p.Collection).Find(ctx, filter, o)
	if err != nil {
		return nil, fmt.Errorf("find in %s: %w", p.Collection, err)
	}
	docs, err := readAll(ctx, cur)
	if err != nil {
		return nil, fmt.Errorf("find in %s: %w", p.Collection, err)
	}
	if p.Limit > 0 && int64(len(docs)) > p.Limit {
		return nil, fmt.Errorf("more than %d documents of %s match: %w", p.Limit, p.Collection, ErrTooMany)
	}
	return docs, nil
}

// BalanceGet returns the QueueBalance document, or nil when there is none.
func (s *Store) BalanceGet(ctx context.Context) (bson.Raw, error) {
	raw, err := s.db.Collection(CollBalance).FindOne(ctx, bson.D{}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read balance: %w", err)
	}
	return raw, nil
}

// BalanceCreate makes the QueueBalance document with fields unless there
// is one ($setOnInsert: never over one written meanwhile).
func (s *Store) BalanceCreate(ctx context.Context, fields bson.D) error {
	_, err := s.db.Collection(CollBalance, options.Collection().SetWriteConcern(writeconcern.Majority())).
		UpdateOne(ctx, bson.D{}, bson.D{{Key: "$setOnInsert", Value: fields}}, options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("create the balance document: %w", err)
	}
	return nil
}

// BalanceSet sets fields of the QueueBalance document, creating it.
func (s *Store) BalanceSet(ctx context.Context, set bson.D) error {
	_, err := s.db.Collection(CollBalance, options.Collection().SetWriteConcern(writeconcern.Majority())).
		UpdateOne(ctx, bson.D{}, bson.D{{Key: "$set", Value: set}}, options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("update balance: %w", err)
	}
	return nil
}

// ServerNow returns the server's clock, to judge ages of heartbeats.
func (s *Store) ServerNow(ctx context.Context) (time.Time, error) {
	var out struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := s.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&out); err != nil {
		return time.Time{}, fmt.Errorf("read the server's time: %w", err)
	}
	return out.LocalTime.UTC(), nil
}

// dueClock is the moment a not_before is judged by: the server's clock, as
// every time several hosts must agree on is (a host whose clock runs ahead
// would queue a delayed task early), read only when needed (the caller
// has a not_before to judge); otherwise the store's own.
func (s *Store) dueClock(ctx context.Context, needed bool) (time.Time, error) {
	if !needed {
		return s.nowMS(), nil
	}
	now, err := s.ServerNow(ctx)
	if err != nil {
		return time.Time{}, err
	}
	return now.Truncate(time.Millisecond), nil
}

// isDuplicateKey reports MongoDB's E11000.
func isDuplicateKey(err error) bool {
	return err != nil && mongo.IsDuplicateKeyError(err)
}

// QueueBalanceSet applies QueueBalance's cap to a queue: a cap above 0
// becomes max_running (and threads, 4.103's name, which its nodes read);
// 0 holds the queue (balance_hold, and threads 0 for 4.103 nodes), since
// max_running 0 means no cap.
func (s *Store) QueueBalanceSet(ctx context.Context, id bson.ObjectID, cap int) error {
	if cap < 0 {
		return fmt.Errorf("queue %s: a balance cap of %d is negative", id.Hex(), cap)
	}
	if cap > 0 {
		if err := s.QueueUpdate(ctx, QueueUpdateParams{ID: id, MaxRunning: &cap}); err != nil {
			return err
		}
		_, err := s.db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: id}},
			bson.D{{Key: "$unset", Value: bson.D{{Key: schema.QueueBalanceHold, Value: ""}}}})
		return err
	}
	_, err := s.db.Collection(schema.CollQueues).UpdateOne(ctx, bson.D{{Key: "_id", Value: id}},
		bson.D{{Key: "$set", Value: bson.D{{Key: schema.QueueBalanceHold, Value: true}, {Key: schema.QueueThreads, Value: 0}}}})
	if err != nil {
		return fmt.Errorf("hold queue %s for QueueBalance: %w", id.Hex(), err)
	}
	return nil
}

// BalanceStatusSet writes QueueBalance's status into its document, as
// 4.103's queuebalanced does (timestamp in Unix seconds, status, message;
// no document, nothing written), and clears disabled when asked.
func (s *Store) BalanceStatusSet(ctx context.Context, status, message string, now time.Time, clearDisabled bool) error {
	set := bson.D{{Key: "timestamp", Value: now.Unix()}, {Key: "status", Value: status}, {Key: "message", Value: message}}
	if clearDisabled {
		set = append(set, bson.E{Key: "disabled", Value: nil})
	}
	if _, err := s.db.Collection(CollBalance).UpdateOne(ctx, bson.D{}, bson.D{{Key: "$set", Value: set}}); err != nil {
		return fmt.Errorf("write the balance status: %w", err)
	}
	return nil
}
