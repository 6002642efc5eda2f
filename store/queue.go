package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

var hexID = regexp.MustCompile(`^[0-9a-fA-F]{24}$`)

// QueueCreateParams are the fields of a new queue.
type QueueCreateParams struct {
	Name        string
	Constructor string
	// MaxThreads nil writes null, which (like 0) runs nothing.
	MaxThreads *int
	Sort       schema.Sort
}

// Validate checks the params as an operator would want them checked.
func (p QueueCreateParams) Validate() error {
	if err := ValidateQueueName(p.Name); err != nil {
		return err
	}
	if strings.TrimSpace(p.Constructor) == "" {
		return errors.New("constructor is required (the plugin name, e.g. Disbatch::Plugin::Demo)")
	}
	if err := validateMaxThreads(p.MaxThreads); err != nil {
		return err
	}
	if !p.Sort.Valid() {
		return fmt.Errorf("sort must be %s, got %q", schema.SortNames, p.Sort)
	}
	return nil
}

// validateMaxThreads accepts what DecodeQueue reads back: null or an
// integer from 0 to schema.MaxThreadsLimit.
func validateMaxThreads(m *int) error {
	if m != nil && (*m < 0 || *m > schema.MaxThreadsLimit) {
		return fmt.Errorf("maxthreads must be a non-negative integer (at most %d) or null, got %d", schema.MaxThreadsLimit, *m)
	}
	return nil
}

// ValidateQueueName rejects names that would be ambiguous or unusable.
func ValidateQueueName(name string) error {
	switch {
	case name == "":
		return errors.New("queue name is required")
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("queue name %q has leading or trailing white space", name)
	case hexID.MatchString(name):
		return fmt.Errorf("queue name %q looks like an ObjectId; queues are referred to by name or id, so pick another name", name)
	}
	return nil
}

// QueueCreate inserts a queue, refusing a name already taken. Both the seed
// 000 names (constructor, maxthreads) and the Disbatch 4.103 ones (plugin,
// threads) are written, so Perl nodes run the queue too. count_todo and
// count_total are left for the node to create.
func (s *Store) QueueCreate(ctx context.Context, p QueueCreateParams) (schema.Queue, error) {
	if err := p.Validate(); err != nil {
		return schema.Queue{}, err
	}
	n, err := s.queues.CountDocuments(ctx, bson.D{{Key: schema.QueueName, Value: p.Name}})
	if err != nil {
		return schema.Queue{}, fmt.Errorf("look up queue %q: %w", p.Name, err)
	}
	if n > 0 {
		return schema.Queue{}, fmt.Errorf("create queue %q: %w", p.Name, ErrQueueExists)
	}
	sort := p.Sort
	if sort == "" {
		sort = schema.SortDefault
	}
	doc := bson.D{
		{Key: "_id", Value: bson.NewObjectID()},
		{Key: schema.QueueName, Value: p.Name},
		{Key: schema.QueueConstructor, Value: p.Constructor},
		{Key: schema.QueuePlugin, Value: p.Constructor},
		{Key: schema.QueueMaxThreads, Value: p.MaxThreads},
		{Key: schema.QueueThreads, Value: p.MaxThreads},
		{Key: schema.QueueSort, Value: string(sort)},
	}
	if _, err := s.queues.InsertOne(ctx, doc); err != nil {
		if isDuplicateKey(err) { // a concurrent create won (the unique index on name)
			return schema.Queue{}, fmt.Errorf("create queue %q: %w", p.Name, ErrQueueExists)
		}
		return schema.Queue{}, fmt.Errorf("create queue %q: %w", p.Name, err)
	}
	raw, err := bson.Marshal(doc)
	if err != nil {
		return schema.Queue{}, err
	}
	return schema.DecodeQueue(raw)
}

// QueueGetParams name a queue by Ref: a name, or an _id as 24 hex digits.
type QueueGetParams struct {
	Ref string
}

// QueueGet returns one queue. A Ref that is a hex id is tried as an id first,
// then as a name.
func (s *Store) QueueGet(ctx context.Context, p QueueGetParams) (schema.Queue, error) {
	filters := []bson.D{{{Key: schema.QueueName, Value: p.Ref}}}
	if id, err := bson.ObjectIDFromHex(p.Ref); err == nil {
		filters = append([]bson.D{{{Key: "_id", Value: id}}}, filters...)
	}
	for _, f := range filters {
		raw, err := s.queues.FindOne(ctx, f).Raw()
		if errors.Is(err, mongo.ErrNoDocuments) {
			continue
		}
		if err != nil {
			return schema.Queue{}, fmt.Errorf("read queue %q: %w", p.Ref, err)
		}
		return schema.DecodeQueue(raw)
	}
	return schema.Queue{}, fmt.Errorf("queue %q: %w", p.Ref, ErrNotFound)
}

// QueueListResult holds the queues that decoded and one error per document
// that did not, so that one bad document never hides the others.
type QueueListResult struct {
	Queues    []schema.Queue
	Malformed []error
}

// QueueList returns every queue, ordered by name.
func (s *Store) QueueList(ctx context.Context) (QueueListResult, error) {
	cur, err := s.queues.Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: schema.QueueName, Value: 1}}))
	if err != nil {
		return QueueListResult{}, fmt.Errorf("list queues: %w", err)
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	var res QueueListResult
	for r.Next() {
		q, err := schema.DecodeQueue(append(bson.Raw(nil), cur.Current...))
		if err != nil {
			res.Malformed = append(res.Malformed, err)
			continue
		}
		res.Queues = append(res.Queues, q)
	}
	if err := r.Err(); err != nil {
		return QueueListResult{}, fmt.Errorf("list queues: %w", err)
	}
	return res, nil
}

// QueueUpdateParams change some fields of a queue; nil pointers leave a
// field alone.
type QueueUpdateParams struct {
	ID          bson.ObjectID
	Name        *string
	Constructor *string
	// SetMaxThreads says whether to write MaxThreads (nil writes null).
	SetMaxThreads bool
	MaxThreads    *int
	Sort          *schema.Sort
	NodesPin      *[]string // an empty slice removes the field
	NodesIgnore   *[]string // an empty slice removes the field
	// Control: a time limit for its tasks (0 removes it), retries of
	// failed attempts, their backoff, and whether a dead node's running
	// tasks are rerun.
	Timeout      *time.Duration
	Retries      *int
	RetryBackoff *schema.Backoff
	RerunOrphans *bool
	// Scheduling (docs/scheduling.md): priority, weight (nice is removed
	// when weight is set), max_getwork (0 removes it), paused.
	Priority   *float64
	Weight     *float64
	MaxGetwork *int
	Paused     *bool
	// MaxRunning sets max_running, the cluster-wide cap (0: none), and
	// threads, its Disbatch 4.103 name, to the same cap.
	MaxRunning *int
	// Continuous and Interval make the queue continuous (one task per
	// interval while it has none to do); Interval from 0 to a year.
	Continuous *bool
	Interval   *time.Duration
	// Then names the queue a succeeded task's output becomes tasks of; it
	// must exist; "" removes it.
	Then *string
	// Config sets the object handed to the plugin with each task; an
	// empty one removes it.
	Config bson.Raw
}

// QueueUpdate applies p with $set/$unset, keeping both dialects in step.
// A new name another queue has is ErrQueueExists; a queue that is gone is
// ErrNotFound.
func (s *Store) QueueUpdate(ctx context.Context, p QueueUpdateParams) error {
	update, err := s.queueUpdateDoc(ctx, p)
	if err != nil {
		return err
	}
	counts, err := s.queueWrite(ctx, bson.D{{Key: "_id", Value: p.ID}}, update, p.Name, p.ID.Hex())
	if err != nil {
		return err
	}
	if counts.Matched == 0 {
		return fmt.Errorf("queue %s: %w", p.ID.Hex(), ErrNotFound)
	}
	if p.Interval != nil {
		return s.continuousSooner(ctx, p.ID, *p.Interval)
	}
	return nil
}

// continuousSooner brings a continuous queue's next task forward to one
// interval from now when its interval was shortened: next_continuous
// still held the old interval's moment (a day, where the new interval is
// a minute), as seed 001's reloaded work spec does not.
func (s *Store) continuousSooner(ctx context.Context, queue bson.ObjectID, interval time.Duration) error {
	now, err := s.dueClock(ctx, true)
	if err != nil {
		return fmt.Errorf("queue %s: interval: %w", queue.Hex(), err)
	}
	next := now.Add(interval)
	_, err = s.queues.UpdateOne(ctx, bson.D{{Key: "_id", Value: queue}, {Key: schema.QueueNextContinuous, Value: bson.D{{Key: "$gt", Value: next}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: schema.QueueNextContinuous, Value: next}}}})
	if err != nil {
		return fmt.Errorf("queue %s: bring its next continuous task forward: %w", queue.Hex(), err)
	}
	return nil
}

// queueWrite applies update to the queue filter matches (ref names it in
// errors; a new name another queue has is ErrQueueExists). A rename (name
// set) is one transaction with what follows it (thenRenamed): a rename
// whose follow failed could not be made again (it would read the new name
// as the old).
func (s *Store) queueWrite(ctx context.Context, filter, update bson.D, name *string, ref string) (WriteCounts, error) {
	var counts WriteCounts
	write := func(ctx context.Context) error {
		var old string
		if name != nil {
			var err error
			if old, err = s.queueName(ctx, filter); err != nil {
				return err
			}
		}
		res, err := s.queues.UpdateOne(ctx, filter, update)
		if isDuplicateKey(err) {
			return fmt.Errorf("rename queue %s: %w", ref, ErrQueueExists)
		}
		if err != nil {
			return fmt.Errorf("update queue %s: %w", ref, err)
		}
		counts = WriteCounts{Matched: res.MatchedCount, Modified: res.ModifiedCount}
		if name != nil && res.MatchedCount > 0 {
			return s.thenRenamed(ctx, old, *name)
		}
		return nil
	}
	if name == nil {
		return counts, write(ctx)
	}
	return counts, s.inTxn(ctx, write)
}

// queueName is the name of the queue filter matches ("" for none).
func (s *Store) queueName(ctx context.Context, filter bson.D) (string, error) {
	var q struct {
		Name string `bson:"name"`
	}
	err := s.queues.FindOne(ctx, filter, options.FindOne().SetProjection(bson.D{{Key: schema.QueueName, Value: 1}})).Decode(&q)
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return "", fmt.Errorf("read queue: %w", err)
	}
	return q.Name, nil
}

// thenRenamed follows a queue's rename in what names it: other queues'
// then, and the then_pending marks of outputs still to become its tasks
// (a then names its queue by name; a rename would otherwise leave every
// later output, and the pending ones, with then_error and no task).
func (s *Store) thenRenamed(ctx context.Context, old, name string) error {
	if old == "" || old == name {
		return nil
	}
	if _, err := s.queues.UpdateMany(ctx, bson.D{{Key: schema.QueueThen, Value: old}}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.QueueThen, Value: name}}}}); err != nil {
		return fmt.Errorf("queue %q renamed %q: the queues whose then names it: %w", old, name, err)
	}
	if _, err := s.tasks.UpdateMany(ctx, bson.D{{Key: schema.TaskThenPending, Value: old}}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskThenPending, Value: name}}}}); err != nil {
		return fmt.Errorf("queue %q renamed %q: outputs still to become its tasks: %w", old, name, err)
	}
	return nil
}

// QueueDeleteParams name the queue to delete. Without Force a queue with
// unfinished tasks (status <= 0) is refused.
type QueueDeleteParams struct {
	ID    bson.ObjectID
	Force bool
}

// QueueDeleteResult says what went with the queue.
type QueueDeleteResult struct {
	TasksDeleted int64
	FilesDeleted int64
}

// queueDeletePage is how many task ids QueueDelete reads at a time.
const queueDeletePage = 10000

// QueueDelete removes a queue together with its tasks and their GridFS
// output: tasks whose queue is gone can never run and would only confuse
// listings and counters.
func (s *Store) QueueDelete(ctx context.Context, p QueueDeleteParams) (QueueDeleteResult, error) {
	name, err := s.queueName(ctx, bson.D{{Key: "_id", Value: p.ID}})
	if err != nil {
		return QueueDeleteResult{}, err
	}
	if name != "" {
		other, err := s.queueName(ctx, bson.D{{Key: schema.QueueThen, Value: name}, {Key: "_id", Value: bson.D{{Key: "$ne", Value: p.ID}}}})
		if err != nil {
			return QueueDeleteResult{}, err
		}
		if other != "" {
			return QueueDeleteResult{}, fmt.Errorf("queue %q %w %q (its succeeded tasks' outputs become tasks of it): change that queue's then first", name, ErrThenQueue, other)
		}
	}
	if !p.Force {
		n, err := s.tasks.CountDocuments(ctx, bson.D{{Key: schema.TaskQueue, Value: p.ID}, {Key: schema.TaskStatus, Value: bson.D{{Key: "$lte", Value: 0}}}})
		if err != nil {
			return QueueDeleteResult{}, fmt.Errorf("count unfinished tasks of queue %s: %w", p.ID.Hex(), err)
		}
		if n > 0 {
			return QueueDeleteResult{}, fmt.Errorf("queue %s has %d unfinished tasks: %w", p.ID.Hex(), n, ErrUnfinishedTasks)
		}
	}
	res, err := s.queues.DeleteOne(ctx, bson.D{{Key: "_id", Value: p.ID}})
	if err != nil {
		return QueueDeleteResult{}, fmt.Errorf("delete queue %s: %w", p.ID.Hex(), err)
	}
	if res.DeletedCount == 0 {
		// Gone already; tasks of it left behind (a delete cut short) are
		// still deleted, so that running it again finishes the job.
		err := s.tasks.FindOne(ctx, bson.D{{Key: schema.TaskQueue, Value: p.ID}}, options.FindOne().SetProjection(bson.D{{Key: "_id", Value: 1}})).Err()
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			return QueueDeleteResult{}, fmt.Errorf("queue %s: %w", p.ID.Hex(), ErrNotFound)
		case err != nil:
			return QueueDeleteResult{}, fmt.Errorf("look for tasks of deleted queue %s: %w", p.ID.Hex(), err)
		}
	}
	var out QueueDeleteResult
	// Output files first: they are found through the tasks, read a page of
	// ids at a time (one list of every id stops fitting a reply at about
	// 840,000 tasks).
	var last bson.ObjectID
	for {
		page := bson.D{{Key: schema.TaskQueue, Value: p.ID}}
		if !last.IsZero() {
			page = append(page, bson.E{Key: "_id", Value: bson.D{{Key: "$gt", Value: last}}})
		}
		ids, err := s.findIDs(ctx, s.tasks, page, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(queueDeletePage))
		if err != nil {
			return out, fmt.Errorf("list tasks of deleted queue %s: %w", p.ID.Hex(), err)
		}
		if len(ids) == 0 {
			break
		}
		last = ids[len(ids)-1]
		n, err := s.outputDelete(ctx, bson.D{{Key: "metadata.task_id", Value: bson.D{{Key: "$in", Value: anyIDs(ids)}}}})
		out.FilesDeleted += n
		if err != nil {
			return out, fmt.Errorf("delete output of deleted queue %s: %w", p.ID.Hex(), err)
		}
	}
	dr, err := s.tasks.DeleteMany(ctx, bson.D{{Key: schema.TaskQueue, Value: p.ID}})
	if err != nil {
		return out, fmt.Errorf("delete tasks of deleted queue %s: %w", p.ID.Hex(), err)
	}
	out.TasksDeleted = dr.DeletedCount
	return out, nil
}

// QueueCounts are a queue's task counts by a recount.
type QueueCounts struct {
	Todo    int64 // status <= 0
	Total   int64
	Running int64 // status -1 or 0 (claimed or running, on any node)
	Failed  int64 // status 2 (failed, for any reason)
}

// Add counts n tasks (n < 0: takes them off) whose status is status, as
// MongoDB compares it (schema.TodoValue, RunningValue, FailedValue): the
// recount's rule and the projector's.
func (c *QueueCounts) Add(status bson.RawValue, n int64) {
	c.Total += n
	if schema.TodoValue(status) {
		c.Todo += n
	}
	if schema.RunningValue(status) {
		c.Running += n
	}
	if schema.FailedValue(status) {
		c.Failed += n
	}
}

// Plus is c and d added, counter by counter.
func (c QueueCounts) Plus(d QueueCounts) QueueCounts {
	return QueueCounts{Todo: c.Todo + d.Todo, Total: c.Total + d.Total, Running: c.Running + d.Running, Failed: c.Failed + d.Failed}
}

// QueueCountsGet recounts the tasks of every queue in one aggregation.
func (s *Store) QueueCountsGet(ctx context.Context) (map[bson.ObjectID]QueueCounts, error) {
	return s.queueCounts(ctx, s.tasks, bson.D{})
}

// queueCounts counts the tasks (those match selects) of every queue in one
// $group by (queue, status), and counts each group's status here
// (QueueCounts.Add). The server's own $cond of those comparisons took 5
// times as long: 2.1 s against 0.4 s over 1,000,000 tasks (make bench's
// scale group times it).
//
// The tasks are read in the order of the {queue, status} index, which
// lets the planner read both fields from the index alone (a covered
// scan), never the documents. With 111,500 tasks stored, most of them
// padded to 20 KB (parameters and output inline), a whole recount took 70
// ms so, against 703 ms for the collection scan that the $group alone
// was given, which also pulled the whole collection through WiredTiger's
// cache every ten minutes, evicting the tasks and indexes the nodes work
// on (make bench's scale group, --scale-task-bytes 20000). Where the
// documents are as small as the bench's no-op tasks (about 150 bytes) the
// collection scan was quicker: 409 against 621 ms over 1,000,000 tasks.
// The counts are the same either way: the index holds a
// missing status or queue as null, which counts as a missing one does
// (schema.TodoValue; a queue that is not an ObjectID is no queue), and an
// array status makes the index multikey, which the planner then does not
// cover (it reads the documents). Without a usable index (dropped, or
// partial) the planner sorts, on disk if it must: slower, still right.
func (s *Store) queueCounts(ctx context.Context, tasks *mongo.Collection, match bson.D) (map[bson.ObjectID]QueueCounts, error) {
	var pipeline mongo.Pipeline
	if len(match) > 0 {
		pipeline = append(pipeline, bson.D{{Key: "$match", Value: match}})
	}
	pipeline = append(pipeline,
		bson.D{{Key: "$sort", Value: bson.D{{Key: schema.TaskQueue, Value: 1}, {Key: schema.TaskStatus, Value: 1}}}},
		bson.D{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "q", Value: "$" + schema.TaskQueue}, {Key: "s", Value: "$" + schema.TaskStatus}}},
			{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
		}}})
	cur, err := tasks.Aggregate(ctx, pipeline, options.Aggregate().SetAllowDiskUse(true))
	if err != nil {
		return nil, fmt.Errorf("count tasks by queue: %w", err)
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	out := map[bson.ObjectID]QueueCounts{}
	for r.Next() {
		id, ok := cur.Current.Lookup("_id", "q").ObjectIDOK()
		if !ok {
			continue // tasks with a malformed queue field belong to no queue
		}
		// A missing status leaves s out of the group's _id: missing, as
		// the task's own field is.
		status, _ := cur.Current.LookupErr("_id", "s")
		c := out[id]
		c.Add(status, cur.Current.Lookup("n").AsInt64())
		out[id] = c
	}
	return out, r.Err()
}
