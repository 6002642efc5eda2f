package integration

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/disbatch-go/disbatch/store"
)

// killer sends operators' kill requests for running tasks while a fault
// scenario runs, as an operator would: through the store, retrying a
// request the fault interrupted. The nodes must carry each out once or
// see the task finish first; recovery settles those of a dead node. It
// kills only tasks of the scenario's main queue (the cut-node scenario's
// long tasks must be orphaned by the recovery).
type killer struct {
	s    *store.Store
	stop chan struct{}
	done chan struct{}

	mu        sync.Mutex
	requested map[bson.ObjectID]bool // kill recorded on a running or claimed task
	failures  int                    // requests that failed (and were retried)
}

// killEvery is how often the killer picks running tasks to kill.
const killEvery = 300 * time.Millisecond

func (sc *scenario) startKiller() *killer {
	k := &killer{s: store.New(sc.db, store.Options{}), stop: make(chan struct{}), done: make(chan struct{}), requested: map[bson.ObjectID]bool{}}
	go k.run(sc)
	return k
}

func (k *killer) run(sc *scenario) {
	defer close(k.done)
	tick := time.NewTicker(killEvery)
	defer tick.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cur, err := sc.db.Collection("tasks").Find(ctx, bson.D{{Key: "queue", Value: sc.queue}, {Key: "status", Value: 0}, {Key: "kill", Value: bson.D{{Key: "$exists", Value: false}}}},
			options.Find().SetLimit(2).SetProjection(bson.D{{Key: "_id", Value: 1}}))
		var docs []struct {
			ID bson.ObjectID `bson:"_id"`
		}
		if err == nil {
			err = cur.All(ctx, &docs)
		}
		if err != nil || len(docs) == 0 {
			cancel()
			continue
		}
		ids := []bson.ObjectID{}
		for _, d := range docs {
			ids = append(ids, d.ID)
		}
		// Retry through the fault: the request is idempotent.
		for attempt := 0; attempt < 20; attempt++ {
			_, err = k.s.TaskKill(ctx, store.TaskKillParams{Target: store.TaskTarget{IDs: ids}, By: "fault-suite", Reason: "chaos"})
			if err == nil {
				break
			}
			k.mu.Lock()
			k.failures++
			k.mu.Unlock()
			time.Sleep(200 * time.Millisecond)
		}
		cancel()
		if err != nil {
			continue
		}
		// Which of them the request reached (a task may have finished first).
		states, err := k.s.TaskStates(context.Background(), ids)
		if err != nil {
			continue
		}
		k.mu.Lock()
		for _, st := range states {
			if st.Kill {
				k.requested[st.ID] = true
			}
		}
		k.mu.Unlock()
	}
}

// halt stops the killer (at the end of the workload).
func (k *killer) halt() {
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
	<-k.done
}

// check says what became of the tasks the killer asked to kill, once the
// scenario is quiet: each finished (status 2 with reason killed, or as its
// plugin said when it finished first); the fault checker's invariants
// (nothing run twice, nothing overwritten, counters exact) cover the rest.
func (k *killer) check(sc *scenario) {
	k.halt()
	k.mu.Lock()
	defer k.mu.Unlock()
	killed, first := 0, 0
	for id := range k.requested {
		st, err := k.s.TaskStates(context.Background(), []bson.ObjectID{id})
		if err != nil {
			sc.t.Errorf("kill check: read task %s: %v", id.Hex(), err)
			continue
		}
		switch {
		case st[0].Status == 2 && st[0].Reason == "killed":
			killed++
		case st[0].Status == 1 || st[0].Status == 2:
			first++ // it finished before the kill reached it
		default:
			sc.t.Errorf("task %s was asked to be killed but ended %d (reason %q)", id.Hex(), st[0].Status, st[0].Reason)
		}
	}
	if len(k.requested) == 0 {
		sc.t.Errorf("the killer reached no running task")
	}
	sc.extra = append(sc.extra, fmt.Sprintf("kills_requested=%d killed=%d finished_first=%d kill_request_retries=%d", len(k.requested), killed, first, k.failures))
}

// wasAsked reports whether the killer's request reached the task.
func (k *killer) wasAsked(id bson.ObjectID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.requested[id]
}
