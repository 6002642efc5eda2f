package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// commitAgeEvery is how often a commitAge sampler asks the primary.
const commitAgeEvery = 20 * time.Millisecond

// commitAge samples, during a drain, how old the replica set's majority
// commit point is: the primary's time less the wall time of the newest
// write a majority of members hold (replSetGetStatus's date and
// optimes.lastCommittedWallTime). A change stream returns no event
// younger than that, and a batch committed with write concern majority
// waits about as long again: twice it is a rough floor for MongoDB's part
// of the projector's lag, measured in the same drain. While nothing is written
// the commit point stands still and its age only grows, so only the
// samples within the drain (first claim to last finish) are counted.
// Each ask costs the primary about 130 µs of CPU: the raw loops' drains
// are sampled too, so that both sides of a ratio pay it.
type commitAge struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	at     []int64 // when each sample was asked for, Unix ns (this machine's clock)
	ages   []time.Duration
	failed int   // asks that failed
	err    error // the first of them
}

// sampleCommitAge starts sampling through c until stop.
func sampleCommitAge(ctx context.Context, c *mongo.Client) *commitAge {
	ctx, cancel := context.WithCancel(ctx)
	s := &commitAge{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(commitAgeEvery)
		defer t.Stop()
		for {
			asked := time.Now().UnixNano()
			age, err := askCommitAge(ctx, c)
			if ctx.Err() != nil {
				return
			}
			s.mu.Lock()
			if err != nil {
				s.failed++
				if s.err == nil {
					s.err = err
				}
			} else {
				s.at, s.ages = append(s.at, asked), append(s.ages, age)
			}
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// askCommitAge asks the primary once.
func askCommitAge(ctx context.Context, c *mongo.Client) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	raw, err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "replSetGetStatus", Value: 1}}).Raw()
	if err != nil {
		return 0, err
	}
	return commitAgeFrom(raw)
}

// commitAgeFrom reads the commit point's age from a replSetGetStatus
// reply: its date less optimes.lastCommittedWallTime (0 if the clock
// stepped back between them).
func commitAgeFrom(raw bson.Raw) (time.Duration, error) {
	date, ok := raw.Lookup("date").TimeOK()
	if !ok {
		return 0, errors.New("replSetGetStatus: no date")
	}
	wall, ok := raw.Lookup("optimes", "lastCommittedWallTime").TimeOK()
	if !ok {
		return 0, errors.New("replSetGetStatus: no optimes.lastCommittedWallTime")
	}
	return max(date.Sub(wall), 0), nil
}

// stop ends the sampling and returns the samples asked for from from to
// to (Unix ns), with the number of asks that failed and the first
// failure. It may be called again (with any window).
func (s *commitAge) stop(from, to int64) (Latency, int, error) {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return commitAgeWithin(s.at, s.ages, from, to), s.failed, s.err
}

// commitAgeWithin summarises the ages sampled at from to to.
func commitAgeWithin(at []int64, ages []time.Duration, from, to int64) Latency {
	var in []time.Duration
	for i, t := range at {
		if t >= from && t <= to {
			in = append(in, ages[i])
		}
	}
	return summarize(in)
}
