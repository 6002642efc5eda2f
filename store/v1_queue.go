package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/schema"
)

// QueueModify is QueueUpdate in one round trip that also returns the queue
// as it is after the change: a findOneAndUpdate with $set/$unset, both
// dialects kept in step (constructor and plugin, maxthreads and threads).
// A new name already taken is ErrQueueExists, also when a concurrent
// rename wins the unique index; a queue that is gone is ErrNotFound.
func (s *Store) QueueModify(ctx context.Context, p QueueUpdateParams) (schema.Queue, error) {
	update, err := s.queueUpdateDoc(ctx, p)
	if err != nil {
		return schema.Queue{}, err
	}
	raw, err := s.queues.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: p.ID}}, update,
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Raw()
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return schema.Queue{}, fmt.Errorf("queue %s: %w", p.ID.Hex(), ErrNotFound)
	case isDuplicateKey(err):
		return schema.Queue{}, fmt.Errorf("rename queue %s: %w", p.ID.Hex(), ErrQueueExists)
	case err != nil:
		return schema.Queue{}, fmt.Errorf("update queue %s: %w", p.ID.Hex(), err)
	}
	return schema.DecodeQueue(raw)
}

// queueUpdateDoc checks p and returns its update: $set and $unset of the
// fields given, both dialects kept in step (constructor and plugin,
// maxthreads and threads). A new name another queue has is ErrQueueExists.
func (s *Store) queueUpdateDoc(ctx context.Context, p QueueUpdateParams) (bson.D, error) {
	set, unset := bson.D{}, bson.D{}
	if p.Name != nil {
		if err := ValidateQueueName(*p.Name); err != nil {
			return nil, err
		}
		err := s.queueNameFree(ctx, *p.Name, bson.D{{Key: "_id", Value: p.ID}})
		if errors.Is(err, ErrQueueExists) {
			return nil, fmt.Errorf("rename to %q: %w", *p.Name, ErrQueueExists)
		}
		if err != nil {
			return nil, err
		}
		set = append(set, bson.E{Key: schema.QueueName, Value: *p.Name})
	}
	if p.Constructor != nil {
		if strings.TrimSpace(*p.Constructor) == "" {
			return nil, errors.New("constructor must not be empty")
		}
		set = append(set, bson.E{Key: schema.QueueConstructor, Value: *p.Constructor}, bson.E{Key: schema.QueuePlugin, Value: *p.Constructor})
	}
	if p.SetMaxThreads {
		if err := validateMaxThreads(p.MaxThreads); err != nil {
			return nil, err
		}
		set = append(set, bson.E{Key: schema.QueueMaxThreads, Value: p.MaxThreads})
	}
	if p.SetMaxThreads || p.MaxRunning != nil {
		threads, err := s.threadsAfter(ctx, bson.D{{Key: "_id", Value: p.ID}}, p.MaxRunning, p.SetMaxThreads, p.MaxThreads)
		if err != nil {
			return nil, err
		}
		set = append(set, bson.E{Key: schema.QueueThreads, Value: threads})
		// An operator's cap replaces QueueBalance's hold, as setting
		// threads did in 4.103 (whose hold was threads 0); a balance
		// still listing the queue holds it again at its next pass.
		unset = append(unset, bson.E{Key: schema.QueueBalanceHold, Value: ""})
	}
	if p.Sort != nil {
		if !p.Sort.Valid() {
			return nil, fmt.Errorf("sort must be %s, got %q", schema.SortNames, *p.Sort)
		}
		sort := *p.Sort
		if sort == "" {
			sort = schema.SortDefault
		}
		set = append(set, bson.E{Key: schema.QueueSort, Value: string(sort)})
	}
	for _, l := range []struct {
		key  string
		vals *[]string
	}{{schema.QueueNodesPin, p.NodesPin}, {schema.QueueNodesIgnore, p.NodesIgnore}} {
		switch {
		case l.vals == nil:
		case len(*l.vals) == 0:
			unset = append(unset, bson.E{Key: l.key, Value: ""})
		default:
			set = append(set, bson.E{Key: l.key, Value: *l.vals})
		}
	}
	if p.Timeout != nil {
		if *p.Timeout < 0 || *p.Timeout > schema.MaxSeconds*time.Second {
			return nil, fmt.Errorf("timeout must be from 0 to %d seconds, got %s", schema.MaxSeconds, *p.Timeout)
		}
		if *p.Timeout == 0 {
			unset = append(unset, bson.E{Key: schema.QueueTimeout, Value: ""})
		} else {
			set = append(set, bson.E{Key: schema.QueueTimeout, Value: p.Timeout.Seconds()})
		}
	}
	if p.Retries != nil {
		if *p.Retries < 0 || *p.Retries > schema.MaxRetries {
			return nil, fmt.Errorf("retries must be from 0 to %d, got %d", schema.MaxRetries, *p.Retries)
		}
		set = append(set, bson.E{Key: schema.QueueRetries, Value: *p.Retries})
	}
	if b := p.RetryBackoff; b != nil {
		if err := ValidateBackoff(*b); err != nil {
			return nil, err
		}
		set = append(set, bson.E{Key: schema.QueueRetryBackoff, Value: bson.D{
			{Key: schema.BackoffBase, Value: b.Base.Seconds()}, {Key: schema.BackoffMax, Value: b.Max.Seconds()}, {Key: schema.BackoffJitter, Value: b.Jitter}}})
	}
	if p.RerunOrphans != nil {
		set = append(set, bson.E{Key: schema.QueueRerunOrphans, Value: *p.RerunOrphans})
	}
	if p.Then != nil && *p.Then != "" {
		ok, err := s.QueueNamed(ctx, *p.Then)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("then: no queue is named %q: %w", *p.Then, ErrNotFound)
		}
	}
	if err := schedUpdate(p, &set, &unset); err != nil {
		return nil, err
	}
	update := bson.D{}
	if len(set) > 0 {
		update = append(update, bson.E{Key: "$set", Value: set})
	}
	if len(unset) > 0 {
		update = append(update, bson.E{Key: "$unset", Value: unset})
	}
	if len(update) == 0 {
		return nil, errors.New("nothing to update")
	}
	return update, nil
}

// schedUpdate adds the scheduling fields of p to the update.
func schedUpdate(p QueueUpdateParams, set, unset *bson.D) error {
	for _, f := range []struct {
		name string
		v    *float64
	}{{schema.QueuePriority, p.Priority}, {schema.QueueWeight, p.Weight}} {
		if f.v == nil {
			continue
		}
		if math.IsNaN(*f.v) || math.IsInf(*f.v, 0) {
			return fmt.Errorf("%s must be a finite number, got %v", f.name, *f.v)
		}
		*set = append(*set, bson.E{Key: f.name, Value: *f.v})
	}
	if p.Weight != nil {
		*unset = append(*unset, bson.E{Key: schema.QueueNice, Value: ""}) // weight wins; no stale nice
	}
	if p.MaxGetwork != nil {
		switch n := *p.MaxGetwork; {
		case n < 0 || n > schema.MaxGetworkLimit:
			return fmt.Errorf("max_getwork must be from 0 to %d, got %d", schema.MaxGetworkLimit, n)
		case n == 0:
			*unset = append(*unset, bson.E{Key: schema.QueueMaxGetwork, Value: ""})
		default:
			*set = append(*set, bson.E{Key: schema.QueueMaxGetwork, Value: n})
		}
	}
	if p.MaxRunning != nil {
		n := *p.MaxRunning
		if n < 0 || n > schema.MaxRunningLimit {
			return fmt.Errorf("max_running must be from 0 (no cap) to %d, got %d", schema.MaxRunningLimit, n)
		}
		*set = append(*set, bson.E{Key: schema.QueueMaxRunning, Value: n})
	}
	if p.Then != nil {
		if *p.Then == "" {
			*unset = append(*unset, bson.E{Key: schema.QueueThen, Value: ""})
		} else {
			*set = append(*set, bson.E{Key: schema.QueueThen, Value: *p.Then})
		}
	}
	if p.Continuous != nil {
		*set = append(*set, bson.E{Key: schema.QueueContinuous, Value: *p.Continuous})
	}
	if p.Interval != nil {
		if *p.Interval < 0 || *p.Interval > schema.MaxSeconds*time.Second {
			return fmt.Errorf("interval must be from 0 to %d seconds, got %s", schema.MaxSeconds, *p.Interval)
		}
		*set = append(*set, bson.E{Key: schema.QueueInterval, Value: p.Interval.Seconds()})
	}
	if p.Config != nil {
		if err := p.Config.Validate(); err != nil {
			return fmt.Errorf("config must be an object: %w", err)
		}
		if len(p.Config) <= 5 {
			*unset = append(*unset, bson.E{Key: schema.QueueConfig, Value: ""})
		} else {
			*set = append(*set, bson.E{Key: schema.QueueConfig, Value: p.Config})
		}
	}
	if p.Paused != nil {
		*set = append(*set, bson.E{Key: schema.QueuePaused, Value: *p.Paused})
		*unset = append(*unset, bson.E{Key: schema.QueueDisabled, Value: ""}) // paused says it now
	}
	return nil
}

// ValidateBackoff checks a retry backoff: base and max from 0 to a year,
// max not below base, jitter a fraction.
func ValidateBackoff(b schema.Backoff) error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"base", b.Base}, {"max", b.Max}} {
		if d.v < 0 || d.v > schema.MaxSeconds*time.Second {
			return fmt.Errorf("retry backoff %s must be from 0 to %d seconds, got %s", d.name, schema.MaxSeconds, d.v)
		}
	}
	if b.Max < b.Base {
		return fmt.Errorf("retry backoff max (%s) is below its base (%s)", b.Max, b.Base)
	}
	if b.Jitter < 0 || b.Jitter > 1 || b.Jitter != b.Jitter {
		return fmt.Errorf("retry backoff jitter must be a fraction from 0 to 1, got %v", b.Jitter)
	}
	return nil
}

// threadsAfter is what threads must hold once a write of max_running
// and/or maxthreads (nil: unchanged) lands on the queue filter matches.
// Disbatch 4.103 nodes read threads as a cap across all nodes, so it
// mirrors the queue's max_running when it has one and its maxthreads
// otherwise: the one rule every writer of either field follows.
func (s *Store) threadsAfter(ctx context.Context, filter bson.D, maxRunning *int, setMaxThreads bool, maxThreads *int) (*int, error) {
	if maxRunning != nil && *maxRunning > 0 {
		return maxRunning, nil
	}
	q, capped, err := s.queueCap(ctx, filter)
	switch {
	case err != nil:
		return nil, err
	case maxRunning == nil && capped:
		return &q.Sched.MaxRunning, nil
	case setMaxThreads:
		return maxThreads, nil
	}
	return q.MaxThreads, nil
}

// queueCap reads the queue filter matches and whether it has a cap of its
// own (max_running above 0; a zero Queue and false when there is none).
func (s *Store) queueCap(ctx context.Context, filter bson.D) (schema.Queue, bool, error) {
	raw, err := s.queues.FindOne(ctx, filter).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return schema.Queue{}, false, nil // the update matches nothing either
	}
	if err != nil {
		return schema.Queue{}, false, fmt.Errorf("read the queue's limits: %w", err)
	}
	q, err := schema.DecodeQueue(raw)
	if err != nil {
		return schema.Queue{}, false, fmt.Errorf("read the queue's limits: %w", err)
	}
	_, noCap := raw.LookupErr(schema.QueueMaxRunning)
	return q, noCap == nil && q.Sched.Capped(), nil
}

// QueueNamed reports whether a queue has exactly this name.
func (s *Store) QueueNamed(ctx context.Context, name string) (bool, error) {
	n, err := s.queues.CountDocuments(ctx, bson.D{{Key: schema.QueueName, Value: name}}, options.Count().SetLimit(1))
	if err != nil {
		return false, fmt.Errorf("look up queue %q: %w", name, err)
	}
	return n > 0, nil
}
