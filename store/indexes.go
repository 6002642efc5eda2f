package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// Index describes one index the project relies on.
type Index struct {
	Collection string
	Keys       bson.D
	Unique     bool
	Why        string
	// UniqueIfPossible: when existing documents break uniqueness, the
	// index is left out (IndexesEnsure creates the others and returns a
	// *UniquenessError naming it) rather than made without uniqueness
	// under the name another program wants unique.
	UniqueIfPossible bool
	// Partial, when set, is the index's partialFilterExpression: only
	// the documents it matches are indexed.
	Partial bson.D
}

// Indexes lists every index IndexesEnsure creates.
var Indexes = []Index{
	{schema.CollTasks, bson.D{{Key: "node", Value: 1}, {Key: "status", Value: 1}, {Key: "queue", Value: 1}, {Key: "_id", Value: 1}}, false,
		"the claim: {node, status, queue} equality, sorted by _id either way; also a node's own tasks at start-up", false, nil},
	{schema.CollTasks, bson.D{{Key: "queue", Value: 1}, {Key: "status", Value: 1}}, false,
		"per-queue counts, recounts and task listings", false, nil},
	{schema.CollTasks, bson.D{{Key: "status", Value: 1}, {Key: "mtime", Value: 1}, {Key: "queue", Value: 1}}, false,
		"the reaper: claimed tasks whose mtime is too old; the running tasks per queue (GET /queues), read from the index alone", false, nil},
	{schema.CollQueues, bson.D{{Key: "name", Value: 1}}, true,
		"queues by name, unique as Disbatch 4.103 creates it (so concurrent creates of one name cannot both win, and 4.103 nodes start); " +
			"left out on a database that already holds duplicate names (seed 000 allows them): a non-unique name_1 would make every " +
			"4.103 node die at start, where without it they die only as they would without us, on the duplicates", true, nil},
	{schema.CollNodes, bson.D{{Key: "node", Value: 1}}, true,
		"one document per node", false, nil},
	{schema.CollTasksFiles, bson.D{{Key: "metadata.task_id", Value: 1}}, false,
		"a task's GridFS output", false, nil},
	{Collection: schema.CollTasks, Keys: bson.D{{Key: schema.TaskAwaitingParents, Value: 1}, {Key: schema.TaskNotBefore, Value: 1}},
		Why: "the leader's timer for delayed tasks: the earliest not_before of the held (-4) tasks not awaiting their parents " +
			"({awaiting_parents: null} first, so the bounds are tight), and those due; " +
			"an older {not_before} index of the same use, from before task graphs, is left alone (IndexesEnsure never drops)",
		Partial: bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusBlocked)}}},
	{Collection: schema.CollTasks, Keys: bson.D{{Key: schema.TaskQueue, Value: 1}, {Key: schema.TaskPriority, Value: -1}, {Key: "_id", Value: 1}},
		Why: "the claim of a queue sorted by priority: its queued tasks that have a priority, highest first, then oldest " +
			"(those without one are claimed after them, through the claim index); only queued tasks with a priority are indexed, " +
			"so queues that never set one pay nothing for it",
		Partial: bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusQueued)}, {Key: schema.TaskPriority, Value: bson.D{{Key: "$exists", Value: true}}}}},
	{Collection: schema.CollTasks, Keys: bson.D{{Key: schema.TaskExpiresAt, Value: 1}},
		Why:     "the leader's timer for expiring tasks: the earliest expires_at of the waiting tasks, and those due",
		Partial: bson.D{{Key: schema.TaskStatus, Value: bson.D{{Key: "$lte", Value: int32(schema.StatusQueued)}}}, {Key: schema.TaskExpiresAt, Value: bson.D{{Key: "$exists", Value: true}}}}},
	{Collection: schema.CollTasks, Keys: bson.D{{Key: schema.TaskParents, Value: 1}},
		Why: "task graphs: a task's children (the leader settles the waiting ones when a parent ends; a retry blocks the parent_failed ones again; " +
			"`task graph` walks descendants); only tasks with parents are indexed, and a status change never touches the index",
		Partial: bson.D{{Key: schema.TaskParents, Value: bson.D{{Key: "$exists", Value: true}}}}},
	{schema.CollTasksChunks, bson.D{{Key: "files_id", Value: 1}, {Key: "n", Value: 1}}, true,
		"GridFS chunks in order", false, nil},
	{Collection: schema.CollTasks, Keys: bson.D{{Key: schema.TaskQueue, Value: 1}, {Key: schema.TaskAdmitted, Value: 1}},
		Why:     "max_running: the tasks of a queue holding an admission (the leader's sweep, releases)",
		Partial: bson.D{{Key: schema.TaskAdmitted, Value: true}}},
	{Collection: schema.CollTasks, Keys: bson.D{{Key: schema.TaskThenPending, Value: 1}},
		Why:     "then: succeeded tasks whose output has not yet become tasks (the leader's sweep)",
		Partial: bson.D{{Key: schema.TaskThenPending, Value: bson.D{{Key: "$exists", Value: true}}}}},
}

// IndexesEnsure creates the indexes in Indexes. It is idempotent, and an
// index with the same keys that already exists under another name or with
// other options (as Disbatch 4.103 creates some) counts as present, so a
// database shared with Perl nodes never gets a conflict. Collections, when
// given, limit it to the indexes of those collections.
func (s *Store) IndexesEnsure(ctx context.Context, collections ...string) error {
	byColl := map[string][]Index{}
	var order []string
	for _, ix := range Indexes {
		if len(collections) > 0 && !slices.Contains(collections, ix.Collection) {
			continue
		}
		if _, ok := byColl[ix.Collection]; !ok {
			order = append(order, ix.Collection)
		}
		byColl[ix.Collection] = append(byColl[ix.Collection], ix)
	}
	var skipped []Index
	for _, coll := range order {
		c := s.db.Collection(coll)
		existing, err := existingKeys(ctx, c)
		if err != nil {
			return fmt.Errorf("list indexes of %s: %w", coll, err)
		}
		var models []mongo.IndexModel
		for _, ix := range byColl[coll] {
			if existing[keyString(ix.Keys)] {
				continue
			}
			o := options.Index()
			if ix.Unique {
				o.SetUnique(true)
			}
			if ix.Partial != nil {
				o.SetPartialFilterExpression(ix.Partial)
			}
			models = append(models, mongo.IndexModel{Keys: ix.Keys, Options: o})
		}
		if len(models) == 0 {
			continue
		}
		err = createIndexes(ctx, c, models)
		if isDuplicateKey(err) {
			var left []Index
			models, left = withoutUniqueIfPossible(models, byColl[coll])
			skipped = append(skipped, left...)
			if len(models) > 0 {
				err = createIndexes(ctx, c, models)
			} else {
				err = nil
			}
		}
		if err != nil {
			return fmt.Errorf("create indexes on %s (%s): %w", coll, describeModels(models), err)
		}
	}
	if len(skipped) > 0 {
		return &UniquenessError{Indexes: skipped}
	}
	return nil
}

// UniquenessError is what IndexesEnsure returns when it created every
// index but these: existing documents repeat their keys, and they are
// unique or nothing (UniqueIfPossible). The store works without them; a
// caller logs it and goes on.
type UniquenessError struct {
	Indexes []Index
}

func (e *UniquenessError) Error() string {
	var parts []string
	for _, ix := range e.Indexes {
		what := ix.Collection + " " + keyString(ix.Keys)
		if ix.Collection == schema.CollQueues {
			what = "duplicate queue names: the unique index {name: 1} (name_1) was not created; Disbatch 4.103 nodes refuse to start " +
				"on this database until the repeated names are renamed or removed (disbatch queue list shows them)"
		}
		parts = append(parts, what)
	}
	return "existing documents repeat the keys of unique indexes, left out: " + strings.Join(parts, "; ")
}

// indexBuildTries bounds how often createIndexes runs for one collection
// when MongoDB interrupts the build.
const indexBuildTries = 5

// createIndexes creates models on c, again when MongoDB interrupted the
// build (an index build yields and can be interrupted on a busy or
// failing-over server). createIndexes is idempotent: an index another
// try already built is left as it is.
func createIndexes(ctx context.Context, c *mongo.Collection, models []mongo.IndexModel) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 100*time.Millisecond, 2*time.Second, 0
	for try := 1; ; try++ {
		_, err := c.Indexes().CreateMany(ctx, models)
		if err == nil || try == indexBuildTries || !isInterrupted(err) {
			return err
		}
		t := time.NewTimer(b.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// isInterrupted reports whether MongoDB interrupted an operation that may
// succeed when run again: Interrupted, InterruptedDueToReplStateChange,
// IndexBuildAborted, or a driver error labelled retryable.
func isInterrupted(err error) bool {
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		switch ce.Code {
		case 11601, 11602, 276:
			return true
		}
		return ce.HasErrorLabel("RetryableWriteError")
	}
	return false
}

// withoutUniqueIfPossible leaves out the models of indexes that are
// unique or nothing, and returns those indexes.
func withoutUniqueIfPossible(models []mongo.IndexModel, ixs []Index) ([]mongo.IndexModel, []Index) {
	drop := map[string]Index{}
	for _, ix := range ixs {
		if ix.UniqueIfPossible {
			drop[keyString(ix.Keys)] = ix
		}
	}
	var out []mongo.IndexModel
	var left []Index
	for _, m := range models {
		if ix, ok := drop[keyString(m.Keys.(bson.D))]; ok {
			left = append(left, ix)
			continue
		}
		out = append(out, m)
	}
	return out, left
}

func existingKeys(ctx context.Context, c *mongo.Collection) (map[string]bool, error) {
	cur, err := c.Indexes().List(ctx)
	if err != nil {
		// A collection that does not exist yet has no indexes.
		var ce mongo.CommandError
		if asCommandError(err, &ce) && ce.Code == 26 { // NamespaceNotFound
			return map[string]bool{}, nil
		}
		return nil, err
	}
	r := readCursor(ctx, cur)
	defer r.Close()
	out := map[string]bool{}
	for r.Next() {
		var spec struct {
			Key bson.D `bson:"key"`
		}
		if err := cur.Decode(&spec); err != nil {
			return nil, err
		}
		out[keyString(spec.Key)] = true
	}
	return out, r.Err()
}

// keyString renders an index key pattern so that {a: 1} and {a: 1.0} or
// {a: NumberLong(1)} compare equal.
func keyString(keys bson.D) string {
	s := ""
	for _, e := range keys {
		dir := fmt.Sprint(e.Value)
		switch v := e.Value.(type) {
		case int32:
			dir = fmt.Sprint(int64(v))
		case int:
			dir = fmt.Sprint(int64(v))
		case float64:
			dir = fmt.Sprint(int64(v))
		}
		s += e.Key + ":" + dir + ","
	}
	return s
}

func describeModels(ms []mongo.IndexModel) string {
	s := ""
	for i, m := range ms {
		if i > 0 {
			s += " "
		}
		s += keyString(m.Keys.(bson.D))
	}
	return s
}
