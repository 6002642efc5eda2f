package node

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// orderStore is a runner's store that only records the order of what the
// runner does: the runner's logic alone, no database.
type orderStore struct {
	runnerStore // the methods not overridden are never called here
	mu          sync.Mutex
	steps       []string
}

func (s *orderStore) step(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps = append(s.steps, name)
}

func (s *orderStore) TaskStartMany(_ context.Context, ps []store.TaskTransitionParams) []error {
	s.step("start")
	return make([]error, len(ps))
}

func (s *orderStore) TaskFinishMany(_ context.Context, ps []store.TaskFinishParams) []error {
	s.step("finish")
	return make([]error, len(ps))
}

func (s *orderStore) TaskGraphSettle(context.Context, store.TaskGraphSettleParams) (store.TaskGraphResult, error) {
	s.step("settle")
	return store.TaskGraphResult{}, nil
}

// TaskGraphWaiting reads nothing (the settle then reads for itself): its
// place among the steps is not fixed, it runs beside the finish.
func (s *orderStore) TaskGraphWaiting(context.Context, bson.ObjectID) (*store.GraphWaiting, error) {
	return nil, nil
}

func (s *orderStore) ThenCreate(context.Context, bson.ObjectID) (store.ThenResult, error) {
	s.step("then")
	return store.ThenResult{}, nil
}

// TestFollowUpsRunAfterTheSlotIsFree: the children's settle and the
// output's chaining wait for nothing the slot gives, so the slot goes back
// to the claimer first and another task may start meanwhile.
func TestFollowUpsRunAfterTheSlotIsFree(t *testing.T) {
	st := &orderStore{}
	reg := plugin.NewRegistry()
	reg.Register("P", plugin.Func(func(context.Context, plugin.Task) plugin.Result {
		return plugin.Result{Status: schema.StatusSucceeded, Output: bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: []byte{5, 0, 0, 0, 0}}}
	}))
	r := newRunner(runnerConfig{Name: "n1", Store: st, Plugins: reg, Observer: noObserver{}}, func(bson.ObjectID) { st.step("slot") }, nil, slog.New(slog.DiscardHandler))
	q := claimer.Queue{ID: bson.NewObjectID(), Name: "q", Constructor: "P", MaxThreads: 1}
	q.Sched.Then = "next"
	task := schema.Task{ID: bson.NewObjectID(), Queue: q.ID, Node: "n1", Status: schema.StatusClaimed}
	task.Graph.HasChildren = true
	r.dispatch(q, task, claimer.Timing{End: time.Now()})
	r.wg.Wait()
	require.Equal(t, []string{"start", "finish", "slot", "then", "settle"}, st.steps)
}
