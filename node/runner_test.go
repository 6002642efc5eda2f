package node

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/internal/clock"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/supervisor"
)

// orderStore is a runner's store that only records the order of what the
// runner does: the runner's logic alone, no database.
type orderStore struct {
	runnerStore // the methods not overridden are never called here
	mu          sync.Mutex
	steps       []string
	finishes    []store.TaskFinishParams
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
	s.mu.Lock()
	s.finishes = append(s.finishes, ps...)
	s.mu.Unlock()
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

func (s *orderStore) AdmissionsRelease(context.Context, bson.ObjectID, []bson.ObjectID) (int64, error) {
	s.step("release")
	return 0, nil
}

func (s *orderStore) ThenCreate(context.Context, bson.ObjectID) (store.ThenResult, error) {
	s.step("then")
	return store.ThenResult{}, nil
}

// TestTheSlotIsFreeOnceThePluginIsDone: a task's slot goes back to the
// claimer as soon as its plugin is done, before its finish is written, so
// that the next claim does not wait for that write; the children's settle
// and the output's chaining come after the finish. A capped queue's slot
// waits for its admission's release, after the finish.
func TestTheSlotIsFreeOnceThePluginIsDone(t *testing.T) {
	for _, capped := range []bool{false, true} {
		st := &orderStore{}
		reg := plugin.NewRegistry()
		reg.Register("P", plugin.Func(func(context.Context, plugin.Task) plugin.Result {
			return plugin.Result{Status: schema.StatusSucceeded, Output: bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: []byte{5, 0, 0, 0, 0}}}
		}))
		r := newRunner(runnerConfig{Name: "n1", Store: st, Plugins: reg, Observer: noObserver{}}, func(bson.ObjectID) { st.step("slot") }, nil, slog.New(slog.DiscardHandler))
		q := claimer.Queue{ID: bson.NewObjectID(), Name: "q", Constructor: "P", MaxThreads: 1}
		q.Sched.Then = "next"
		want := []string{"start", "slot", "finish", "then", "settle"}
		if capped {
			q.Sched.MaxRunning = 1
			want = []string{"start", "finish", "release", "slot", "then", "settle"}
		}
		task := schema.Task{ID: bson.NewObjectID(), Queue: q.ID, Node: "n1", Status: schema.StatusClaimed}
		task.Graph.HasChildren = true
		r.dispatch(q, task, claimer.Timing{End: time.Now()})
		r.wg.Wait()
		require.Equal(t, want, st.steps, "capped %v", capped)
	}
}

// TestTheFinishIsGuardedByTheAttemptRun: a task claimed with two attempts
// ended runs as attempt 3, and its finish says so, so that it cannot land
// on a later claim of the task by this node (store.TaskFinishParams.Attempt).
func TestTheFinishIsGuardedByTheAttemptRun(t *testing.T) {
	st := &orderStore{}
	reg := plugin.NewRegistry()
	var ran atomic.Int64
	reg.Register("P", plugin.Func(func(_ context.Context, pt plugin.Task) plugin.Result {
		ran.Store(int64(pt.Attempt))
		return plugin.Result{Status: schema.StatusSucceeded}
	}))
	r := newRunner(runnerConfig{Name: "n1", Store: st, Plugins: reg, Observer: noObserver{}}, func(bson.ObjectID) {}, nil, slog.New(slog.DiscardHandler))
	q := claimer.Queue{ID: bson.NewObjectID(), Name: "q", Constructor: "P", MaxThreads: 1}
	task := schema.Task{ID: bson.NewObjectID(), Queue: q.ID, Node: "n1", Status: schema.StatusClaimed}
	task.Control.Attempt = 2
	r.dispatch(q, task, claimer.Timing{End: time.Now()})
	r.wg.Wait()
	require.Equal(t, int64(3), ran.Load(), "the plugin's attempt")
	require.Len(t, st.finishes, 1)
	require.Equal(t, 3, st.finishes[0].Attempt, "the finish's guard")
}

// TestAdoptionNeedsTheSupervisedAttempt: a restarted node adopts a
// supervised task only while the task's attempt is the one its supervisor
// runs (a spec without one counts as the same); a later attempt is a new
// claim, not the supervisor's.
func TestAdoptionNeedsTheSupervisedAttempt(t *testing.T) {
	dir := t.TempDir()
	r := newRunner(runnerConfig{Name: "n1", Store: &orderStore{}, Observer: noObserver{}, Supervise: &supervisor.Launcher{Dir: dir}},
		func(bson.ObjectID) {}, nil, slog.New(slog.DiscardHandler))
	task := schema.Task{ID: bson.NewObjectID(), Node: "n1", Status: schema.StatusRunning}
	task.Control.Attempt = 1
	spec := func(attempt int) {
		b, err := json.Marshal(supervisor.Spec{Node: "n1", TaskID: task.ID.Hex(), Finish: supervisor.Finish{Attempt: attempt}})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, task.ID.Hex()+".spec"), b, 0o600))
	}
	for _, c := range []struct {
		attempt int
		want    bool
	}{{2, true}, {0, true}, {1, false}, {3, false}} {
		spec(c.attempt)
		require.Equal(t, c.want, r.sameAttempt(r.log, task), "supervised attempt %d, the task's 2", c.attempt)
	}
}

// fakeTaskRunner writes as 4.103's task_runner would, per task parameter
// "do": "finish" (running, then status 1 and output), "nothing" (fails
// without starting it), "die" (running, then gone).
type fakeTaskRunner struct {
	db   *mongo.Database
	node string
}

func (f fakeTaskRunner) Run(context.Context, plugin.Task) plugin.Result {
	return plugin.Result{Status: schema.StatusFailed}
}

func (f fakeTaskRunner) RunWritingResult(ctx context.Context, t plugin.Task) (string, error) {
	do, _ := t.Parameters.Lookup("do").StringValueOK()
	tasks := f.db.Collection(schema.CollTasks)
	if do == "nothing" {
		return "No task found\n", errors.New("exit status 255")
	}
	if _, err := tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: t.ID}, {Key: "status", Value: -1}, {Key: "node", Value: f.node}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 0}}}}); err != nil {
		return "", err
	}
	if do == "die" {
		return "killed\n", errors.New("signal: killed")
	}
	_, err := tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: t.ID}, {Key: "status", Value: 0}, {Key: "node", Value: f.node}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: 1}, {Key: "stdout", Value: "perl says hi\n"}, {Key: "stderr", Value: nil}, {Key: "complete", Value: true}}}})
	return "", err
}

// TestTaskRunnerWritesItsOwnResult: with a plugin that writes its result
// (4.103's task_runner), the node writes neither start nor finish when it
// did, fails a task it never started, and finishes one it left running.
func TestTaskRunnerWritesItsOwnResult(t *testing.T) {
	b := setup(t)
	b.reg.Register("Perl::Plugin", fakeTaskRunner{db: b.db, node: "n1"})
	q := b.queue("perl", "Perl::Plugin", 3, schema.SortFIFO)
	ids := b.tasks(q, 3, func(i int) bson.D { return bson.D{{Key: "do", Value: []string{"finish", "nothing", "die"}[i]}} })
	b.start(b.config("n1"))
	b.waitStatus(ids[0], schema.StatusSucceeded, 10*time.Second)
	doc := b.task(ids[0])
	require.Equal(t, "perl says hi\n", doc.Lookup("stdout").StringValue())
	_, err := doc.LookupErr("attempts")
	require.Error(t, err, "the node wrote no finish of its own")
	b.waitStatus(ids[1], schema.StatusFailed, 10*time.Second)
	require.Contains(t, b.task(ids[1]).Lookup("stderr").StringValue(), "task_runner did not start the task")
	b.waitStatus(ids[2], schema.StatusFailed, 10*time.Second)
	require.Contains(t, b.task(ids[2]).Lookup("stderr").StringValue(), "task_runner ended without writing a result")
}

// heldStore is a runner's store whose first finish write waits until
// released, and whose TaskStates answers state.
type heldStore struct {
	runnerStore
	release  chan struct{}
	finishes atomic.Int64
	state    store.TaskState
}

func (s *heldStore) TaskStartMany(_ context.Context, ps []store.TaskTransitionParams) []error {
	return make([]error, len(ps))
}

func (s *heldStore) TaskFinishMany(_ context.Context, ps []store.TaskFinishParams) []error {
	if s.finishes.Add(1) == 1 {
		<-s.release
	}
	return make([]error, len(ps))
}

func (s *heldStore) TaskStates(context.Context, []bson.ObjectID) ([]store.TaskState, error) {
	return []store.TaskState{s.state}, nil
}

// TestAClaimWaitsForTheEarlierHandlingOfItsTask: a task claimed again
// while this node still writes the end of its earlier attempt (a write
// whose answer was lost, retried, that may land on the new claim) starts
// only once that write is done, and only if the task is still the new
// claim's.
func TestAClaimWaitsForTheEarlierHandlingOfItsTask(t *testing.T) {
	for _, landed := range []bool{true, false} {
		st := &heldStore{release: make(chan struct{})}
		var runs atomic.Int64
		reg := plugin.NewRegistry()
		reg.Register("P", plugin.Func(func(context.Context, plugin.Task) plugin.Result {
			runs.Add(1)
			return plugin.Result{Status: schema.StatusSucceeded}
		}))
		r := newRunner(runnerConfig{Name: "n1", Store: st, Plugins: reg, Observer: noObserver{}}, func(bson.ObjectID) {}, nil, slog.New(slog.DiscardHandler))
		q := claimer.Queue{ID: bson.NewObjectID(), Name: "q", Constructor: "P", MaxThreads: 2}
		task := schema.Task{ID: bson.NewObjectID(), Queue: q.ID, Node: "n1", Status: schema.StatusClaimed}
		r.dispatch(q, task, claimer.Timing{End: time.Now()})
		require.Eventually(t, func() bool { return st.finishes.Load() == 1 }, 10*time.Second, time.Millisecond, "the first attempt's finish")
		r.dispatch(q, task, claimer.Timing{End: time.Now()})
		time.Sleep(100 * time.Millisecond)
		require.EqualValues(t, 1, runs.Load(), "landed %v: the second claim ran while the first attempt's finish was being written", landed)
		st.state = store.TaskState{ID: task.ID, Found: true, Node: "n1", Status: schema.StatusClaimed}
		if landed { // the retried write sent the task back to the queue
			st.state.Node, st.state.Status = "", schema.StatusQueued
		}
		close(st.release)
		r.wg.Wait()
		want := int64(2)
		if landed {
			want = 1
		}
		require.Equal(t, want, runs.Load(), "landed %v", landed)
	}
}

// downStore is a runner's store whose finishes fail while down, counting
// them.
type downStore struct {
	orderStore
	down   atomic.Bool
	failed atomic.Int64
}

func (s *downStore) TaskFinishMany(ctx context.Context, ps []store.TaskFinishParams) []error {
	if s.down.Load() {
		s.failed.Add(1)
		errs := make([]error, len(ps))
		for i := range errs {
			errs[i] = errors.New("test: no primary")
		}
		return errs
	}
	return s.orderStore.TaskFinishMany(ctx, ps)
}

// TestAFinishNotWrittenKeepsItsTaskFromTheStraySweep: a task whose plugin
// ran and whose finish cannot be written (no primary for longer than a
// write is retried) is still this node's: the finish goes on being retried
// while the node runs, and lands once it can; the stray sweep, which hands
// back the node's running tasks it does not hold, never hands it back to
// run again. A finish still unwritten when the node stops leaves its task
// unsettled, which the sweep leaves alone too (the next start orphans it).
func TestAFinishNotWrittenKeepsItsTaskFromTheStraySweep(t *testing.T) {
	st := &downStore{}
	st.down.Store(true)
	reg := plugin.NewRegistry()
	reg.Register("P", plugin.Func(func(context.Context, plugin.Task) plugin.Result {
		return plugin.Result{Status: schema.StatusSucceeded}
	}))
	r := newRunner(runnerConfig{Name: "n1", Store: st, Plugins: reg, Observer: noObserver{}, writeFor: 150 * time.Millisecond},
		func(bson.ObjectID) {}, nil, slog.New(slog.DiscardHandler))
	q := claimer.Queue{ID: bson.NewObjectID(), Name: "q", Constructor: "P", MaxThreads: 2}
	claimed := func() schema.Task {
		return schema.Task{ID: bson.NewObjectID(), Queue: q.ID, Node: "n1", Status: schema.StatusRunning} // claimed into running
	}
	sweep := func(ids ...bson.ObjectID) []bson.ObjectID {
		sf := &pagedClaims{ids: ids}
		s := &strays{node: "n1", store: sf, holds: r.keeps, claimRunning: true, fenced: func() bool { return false }, clock: clock.Or(nil), log: slog.New(slog.DiscardHandler)}
		s.release(context.Background())
		return sf.unstarted
	}

	first := claimed()
	r.dispatch(q, first, claimer.Timing{End: time.Now()})
	require.Eventually(t, func() bool { return st.failed.Load() >= 1 }, 10*time.Second, 10*time.Millisecond, "no finish tried")
	time.Sleep(500 * time.Millisecond) // more than three of a write's rounds (writeFor)
	require.Empty(t, sweep(first.ID), "a task whose finish is being retried was handed back to run again")
	require.GreaterOrEqual(t, st.failed.Load(), int64(5), "the finish was not retried past a write's round")
	st.down.Store(false)
	r.wg.Wait()
	require.Len(t, st.finishes, 1, "the finish never landed")
	require.Equal(t, first.ID, st.finishes[0].ID)

	st.down.Store(true)
	second, before := claimed(), st.failed.Load()
	r.dispatch(q, second, claimer.Timing{End: time.Now()})
	require.Eventually(t, func() bool { return st.failed.Load() >= before+2 }, 10*time.Second, 10*time.Millisecond, "the finish was not retried")
	r.drain(time.Second)
	require.Empty(t, sweep(second.ID), "a task left unsettled at the stop was handed back to run again")
	require.Len(t, st.finishes, 1, "a finish landed while the store was down")
}

// TestTwoMalformedTasksWithoutObjectIdsGiveBothSlotsBack: tasks whose _id
// is not an ObjectId are failed by the _id they have; two handled at once
// must not share one entry of the runner's slots (the zero ObjectId), or
// one slot is never given back.
func TestTwoMalformedTasksWithoutObjectIdsGiveBothSlotsBack(t *testing.T) {
	var freed atomic.Int64
	r := newRunner(runnerConfig{Name: "n1", Store: &slowFail{}, Plugins: plugin.NewRegistry(), Observer: noObserver{}},
		func(bson.ObjectID) { freed.Add(1) }, nil, slog.New(slog.DiscardHandler))
	q := claimer.Queue{ID: bson.NewObjectID(), Name: "q", MaxThreads: 4}
	for _, id := range []string{"a", "b"} {
		raw, err := bson.Marshal(bson.D{{Key: "_id", Value: id}})
		require.NoError(t, err)
		r.malformed(q, schema.Task{Queue: q.ID, Status: schema.StatusClaimed, Raw: raw}, &schema.DecodeError{Collection: "tasks", Err: errors.New("_id is not an ObjectId")})
	}
	r.wg.Wait()
	require.Equal(t, int64(2), freed.Load(), "slots given back")
}

// slowFail fails tasks slowly enough for two to be handled at once.
type slowFail struct{ orderStore }

func (s *slowFail) TaskFail(context.Context, store.TaskFailParams) error {
	time.Sleep(20 * time.Millisecond)
	return nil
}

// unreadStore fails the reads adoption makes: every TaskStates, or (with
// statesOK) every TaskGet, whose tasks it otherwise says are n1's running.
type unreadStore struct{ statesOK bool }

func (s *unreadStore) TaskStates(_ context.Context, ids []bson.ObjectID) ([]store.TaskState, error) {
	if !s.statesOK {
		return nil, errors.New("test: no primary")
	}
	out := make([]store.TaskState, len(ids))
	for i := range ids {
		out[i] = store.TaskState{Found: true, Node: "n1", Status: schema.StatusRunning}
	}
	return out, nil
}

func (s *unreadStore) TaskGet(context.Context, bson.ObjectID) (schema.Task, error) {
	return schema.Task{}, errors.New("test: no primary")
}

// TestAdoptionThatCannotReadItsTasksFailsTheStart: a restarted node that
// cannot read the tasks still running under their supervisors (after
// retrying, as a task write is retried) fails its start, killing none and
// adopting none: a task killed for a failed read would stay running under
// the node's name, which the start's OrphanOwn has already passed over.
// (The handles here are empty: a kill sent through one would panic.)
func TestAdoptionThatCannotReadItsTasksFailsTheStart(t *testing.T) {
	for _, statesOK := range []bool{false, true} {
		r := newRunner(runnerConfig{Name: "n1", Store: &orderStore{}, Observer: noObserver{}, writeFor: 100 * time.Millisecond},
			func(bson.ObjectID) {}, nil, slog.New(slog.DiscardHandler))
		hs := map[bson.ObjectID]*supervisor.Handle{bson.NewObjectID(): {}, bson.NewObjectID(): {}}
		took := 0
		err := r.adopt(context.Background(), &unreadStore{statesOK: statesOK}, hs, nil, func(bson.ObjectID) { took++ }, noObserver{})
		require.ErrorContains(t, err, "test: no primary", "states read %v", statesOK)
		r.wg.Wait()
		require.Zero(t, took, "adopted a task")
	}
}

// TestASocketNothingListensOnIsRemoved: a supervisor's socket left in the
// state directory with nothing listening on it (the node died handing an
// idle supervisor its task, which then exited under its pool name) is
// removed at the next start, not tried again at every start.
func TestASocketNothingListensOnIsRemoved(t *testing.T) {
	dir, err := os.MkdirTemp("", "sock") // short: a socket's path is bounded
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	id := bson.NewObjectID().Hex()
	path := filepath.Join(dir, id+".sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	_, err = os.Stat(path)
	require.NoError(t, err, "the stale socket is there")

	r := newRunner(runnerConfig{Name: "n1", Store: &orderStore{}, Observer: noObserver{}, Supervise: &supervisor.Launcher{Dir: dir}},
		func(bson.ObjectID) {}, nil, slog.New(slog.DiscardHandler))
	require.Empty(t, r.attachSupervisors())
	_, err = os.Stat(path)
	require.True(t, os.IsNotExist(err), "the stale socket is still there: %v", err)
}
