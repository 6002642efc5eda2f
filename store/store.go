// Package store is the one seam between this project and MongoDB. Every read
// and write of the Disbatch collections goes through a *Store method named
// Entity+Verb (QueueCreate, TaskClaim, NodeUpsert, ...), each taking a params
// struct. Consumers declare the small interface they need on their side.
//
// Writes use write concern majority: a write acknowledged by one member can be
// rolled back by a failover, and change streams only see majority-committed
// writes anyway. Writes are always $set/$inc of fields this project owns,
// never whole-document replacements, so fields written by other tools are
// never dropped. Every write after a claim is guarded by the state it expects
// ({_id, node, status}); a guard that no longer holds gives ErrLostTask.
//
// The conformance suite in store/storetest runs against a real replica set.
package store

import (
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/disbatch-go/disbatch/schema"
)

// Errors the store returns; test with errors.Is.
var (
	ErrNotFound    = errors.New("not found")
	ErrQueueExists = errors.New("a queue with this name already exists")
	ErrNoTask      = errors.New("no task to claim")
	// ErrLostTask means a guarded write found the task no longer in the
	// state this node left it in: another node or an operator took it.
	ErrLostTask = errors.New("task is no longer held by this node in the expected status")
	// ErrThenQueue is returned by QueueDelete for a queue another
	// queue's then names.
	ErrThenQueue = errors.New("is the then queue of")
	// ErrUnfinishedTasks is returned by QueueDelete without Force.
	ErrUnfinishedTasks = errors.New("queue has unfinished tasks")
)

// DefaultOutputThreshold is the stdout+stderr size above which output goes to
// GridFS instead of the task document (as in Disbatch 4).
const DefaultOutputThreshold = 15 << 20

// OutputAlways as Options.OutputThreshold: every output goes to GridFS
// (an empty one as a file without chunks).
const OutputAlways = -1

// Options configure a Store. The zero value is usable.
type Options struct {
	// Now is the clock for ctime, mtime and timestamps (default time.Now).
	Now func() time.Time
	// OutputThreshold: see DefaultOutputThreshold; 0 is the default;
	// OutputAlways (negative) puts every output in GridFS, as Disbatch
	// 4.103 does with gfs set to anything but "auto" or false.
	OutputThreshold int
}

// Store reads and writes the Disbatch collections of one database.
type Store struct {
	db        *mongo.Database
	queues    *mongo.Collection
	tasks     *mongo.Collection
	nodes     *mongo.Collection
	config    *mongo.Collection
	files     *mongo.Collection
	chunks    *mongo.Collection
	now       func() time.Time
	threshold int
	pool      *sessionPool // ForNode's: recorded transaction sessions
}

// New returns a Store over db.
func New(db *mongo.Database, opts Options) *Store {
	wc := options.Collection().SetWriteConcern(writeconcern.Majority())
	s := &Store{
		db:        db,
		queues:    db.Collection(schema.CollQueues, wc),
		tasks:     db.Collection(schema.CollTasks, wc),
		nodes:     db.Collection(schema.CollNodes, wc),
		config:    db.Collection(schema.CollConfig, wc),
		files:     db.Collection(schema.CollTasksFiles, wc),
		chunks:    db.Collection(schema.CollTasksChunks, wc),
		now:       opts.Now,
		threshold: opts.OutputThreshold,
	}
	if s.now == nil {
		s.now = time.Now
	}
	switch {
	case s.threshold == 0:
		s.threshold = DefaultOutputThreshold
	case s.threshold < 0:
		s.threshold = OutputAlways
	}
	return s
}

// nowMS is the current time at BSON's millisecond precision, so that values
// handed back equal what a later read returns.
func (s *Store) nowMS() time.Time { return s.now().UTC().Truncate(time.Millisecond) }
