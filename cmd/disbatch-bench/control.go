package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/disbatch-go/disbatch/control"
	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// ControlReport is the control group: task control's latencies, each
// beside the pickup floor of the same run.
type ControlReport struct {
	// Floor is the pickup floor of this run (bare driver loop: insert ->
	// change event -> claim -> running): the pickup group's when it ran,
	// else measured here the same way.
	Floor       Latency      `json:"floor"`
	FloorSource string       `json:"floor_source"`
	Kill        KillFigures  `json:"kill"`
	Delay       DelayFigures `json:"delay"`
	Wait        WaitFigures  `json:"wait"`
}

// KillFigures: operators' kills of running shell tasks.
type KillFigures struct {
	Kills   int `json:"kills"`   // kills measured
	Running int `json:"running"` // shell tasks running on the node at the first kill of a round
	// From the acknowledgement of TaskKill's kill-request write (the
	// commit the node hears; seen by a command monitor on the operator's
	// client): the process seen dead (/proc state Z or gone), and the
	// task's finish seen (change event: status 2, reason killed).
	Dead     Latency `json:"process_dead"`
	Finished Latency `json:"finished"`
	// The same from store.TaskKill's return (it makes more round trips
	// after the request write, so these may be smaller, even negative).
	DeadFromReturn     Latency `json:"process_dead_from_return"`
	FinishedFromReturn Latency `json:"finished_from_return"`
	// Call is store.TaskKill's duration (by ids: a read, three guarded
	// updates, a read).
	Call Latency `json:"taskkill_call"`
	// Failures are kills the node did not carry out as it should (not
	// delivered, process alive, wrong status or reason); none on a good run.
	Failures []string `json:"failures,omitempty"`
	Ratio    Ratio    `json:"ratio"` // finished / floor
	Goal     Goal     `json:"goal"`
}

// DelayFigures: delayed tasks started at their not_before.
type DelayFigures struct {
	Held           int     `json:"held"` // tasks with not_before +1 h in the probes' queue
	HeldInsertRate float64 `json:"held_insert_per_s"`
	Probes         int     `json:"probes"`
	// Late is not_before -> the plugin started (after the node's status 0
	// write was acknowledged), per probe; LateAttempt is not_before -> the
	// attempt's "started" the node records at finish (its clock, ms).
	Late        Latency `json:"late"`
	LateAttempt Latency `json:"late_attempt"`
	// Settling: probes (one at a time, due now+300 ms, not counted in
	// Late) inserted after the held tasks until one started within the
	// goal (Settled) or 15 s passed, SettleSeconds after the held insert
	// ended; FirstLate is the first one's not_before -> plugin start, in ms.
	Settling      int     `json:"settling_probes"`
	Settled       bool    `json:"settled"`
	SettleSeconds float64 `json:"settle_seconds"`
	FirstLate     float64 `json:"first_late_ms"`
	// LateQueued is not_before -> the leader's release (status -4 -> -2)
	// seen on a change stream of the bench's own: the timer's share.
	LateQueued Latency `json:"late_queued"`
	// Early: probes started before their not_before; Missing: not started
	// in time; HeldReleased: held tasks not held any more when the probes
	// were done. All 0 on a good run.
	Early        int   `json:"early"`
	Missing      int   `json:"missing"`
	HeldReleased int64 `json:"held_released"`
	// The held tasks are deleted afterwards: how long it took, and how
	// many were left (0).
	DeleteSeconds float64  `json:"delete_seconds"`
	HeldLeft      int64    `json:"held_left"`
	Failures      []string `json:"failures,omitempty"`
	Ratio         Ratio    `json:"ratio"` // late / floor
	Goal          Goal     `json:"goal"`
}

// WaitFigures: control.Wait on tasks finished by direct writes.
type WaitFigures struct {
	Rounds int `json:"rounds"`
	Tasks  int `json:"tasks_per_round"`
	// Latency: the last task's finish write acknowledged -> Wait returned.
	Latency  Latency  `json:"latency"`
	Failures []string `json:"failures,omitempty"`
	Ratio    Ratio    `json:"ratio"` // latency / floor
}

const (
	killRunning   = 10 // shell tasks per round, all running: the queue's and node's maxthreads
	killPoll      = 200 * time.Microsecond
	killTimeout   = 10 * time.Second // a kill not carried out by then is a failure
	killGap       = 20 * time.Millisecond
	killStartWait = 30 * time.Second
	killBy        = "disbatch-bench"

	delayHeldFor   = time.Hour
	delayMin       = 300 * time.Millisecond
	delaySpread    = 500 * time.Millisecond // not_before = insert + delayMin + [0, delaySpread)
	delayGap       = 25 * time.Millisecond  // between probe inserts
	delaySettleMax = 15 * time.Second       // settling probes stop after this, settled or not
	delayWait      = 30 * time.Second       // after a probe's not_before, before it counts as missing
	delayGoalP99   = 50.0
	killGoalRatio  = 2.0

	waitTasks  = 10 // tasks per Wait
	waitGap    = 20 * time.Millisecond
	waitWriter = "bench-wait-writer"

	maxFailures = 10 // failures kept in a report
)

// control measures the control group. pickup is this run's pickup group
// (nil when it did not run), whose floor is reused.
func (e *env) control(ctx context.Context, pickup *PickupReport) (*ControlReport, error) {
	rep := &ControlReport{}
	var err error
	if rep.Floor, rep.FloorSource, err = e.controlFloor(ctx, pickup); err != nil {
		return rep, fmt.Errorf("control, pickup floor: %w", err)
	}
	e.log.Info("control: kill latency", "kills", e.cfg.KillSamples, "running", killRunning)
	if err := e.controlKill(ctx, &rep.Kill); err != nil {
		return rep, fmt.Errorf("control, kill latency: %w", err)
	}
	e.log.Info("control: delayed tasks", "held", e.cfg.DelayHeld, "probes", e.cfg.DelayProbes)
	if err := e.controlDelay(ctx, &rep.Delay); err != nil {
		return rep, fmt.Errorf("control, delayed tasks: %w", err)
	}
	e.log.Info("control: wait latency", "rounds", e.cfg.WaitRounds, "tasks_each", waitTasks)
	if err := e.controlWait(ctx, &rep.Wait); err != nil {
		return rep, fmt.Errorf("control, wait latency: %w", err)
	}
	rep.ratios()
	return rep, nil
}

// ratios compares each figure with the floor and judges the goals.
func (r *ControlReport) ratios() {
	f := r.Floor
	k := &r.Kill
	k.Ratio = Ratio{What: "kill: request -> task finished / pickup floor", P50: ratio(k.Finished.P50, f.P50), P99: ratio(k.Finished.P99, f.P99)}
	k.Goal = Goal{Goal: fmt.Sprintf("kill -> finished p50 <= %gx the pickup floor p50 (%s <= %s ms)", killGoalRatio, fms(k.Finished.P50), fms(killGoalRatio*f.P50)),
		Met: k.Finished.N > 0 && f.N > 0 && k.Finished.P50 <= killGoalRatio*f.P50}
	d := &r.Delay
	d.Ratio = Ratio{What: "delayed: not_before -> running / pickup floor", P50: ratio(d.Late.P50, f.P50), P99: ratio(d.Late.P99, f.P99)}
	d.Goal = Goal{Goal: fmt.Sprintf("not_before -> running p99 <= %g ms (%s)", delayGoalP99, fms(d.Late.P99)),
		Met: d.Late.N > 0 && d.Late.P99 <= delayGoalP99 && d.Early == 0 && d.Missing == 0}
	w := &r.Wait
	w.Ratio = Ratio{What: "wait: last finish -> Wait returns / pickup floor", P50: ratio(w.Latency.P50, f.P50), P99: ratio(w.Latency.P99, f.P99)}
}

// controlFloor returns the pickup group's floor, or measures it the same
// way (floorTarget, one task at a time at --pickup-rate for
// --pickup-duration).
func (e *env) controlFloor(ctx context.Context, pickup *PickupReport) (Latency, string, error) {
	if pickup != nil {
		for _, row := range pickup.Rows {
			if row.Mode == modeFloor && row.Pickup.N > 0 {
				return row.Pickup, "the pickup group of this run", nil
			}
		}
	}
	e.log.Info("control: pickup floor", "rate", e.cfg.PickupRate, "duration", e.cfg.PickupDuration)
	sub, err := e.connect()
	if err != nil {
		return Latency{}, "", err
	}
	defer disconnect(sub)
	floor, stop, err := e.floorTarget(ctx, sub)
	if err != nil {
		return Latency{}, "", err
	}
	err = e.submit(ctx, floor)
	if serr := stop(); err == nil {
		err = serr
	}
	row := floor.row(e.cfg.PickupRate)
	return row.Pickup, fmt.Sprintf("measured in this group as the pickup group does (%d tasks at %d/s, majority)", row.Pickup.N, row.Rate), err
}

// ---- kill latency ----

// controlKill kills running `sleep 60` shell tasks one at a time and
// times the process's death and the task's finish.
func (e *env) controlKill(ctx context.Context, rep *KillFigures) error {
	if _, err := pidGone(os.Getpid()); err != nil {
		return err
	}
	db, drop := e.database("kill")
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return err
	}
	threads := killRunning
	q, err := s.QueueCreate(ctx, store.QueueCreateParams{Name: "kill", Constructor: plugin.ShellConstructor, MaxThreads: &threads, Sort: schema.SortFIFO})
	if err != nil {
		return fmt.Errorf("create the shell queue: %w", err)
	}
	dir, err := os.MkdirTemp("", "disbatch-bench-kill-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if strings.ContainsAny(dir, `'`) {
		return fmt.Errorf("temporary directory %q has a quote", dir)
	}
	// The shell writes its PID, then becomes sleep: the process group
	// is that one process.
	params, err := bson.Marshal(bson.D{{Key: "command", Value: fmt.Sprintf(`echo $$ > '%s'/"$DISBATCH_TASK_ID".pid && exec sleep 60`, dir)}})
	if err != nil {
		return err
	}

	w, err := e.watchStatus(ctx, db.Name(), bson.D{{Key: "$gt", Value: 0}})
	if err != nil {
		return err
	}
	defer w.close()
	op, err := e.newOperator(db.Name())
	if err != nil {
		return err
	}
	defer op.close()
	reg := plugin.NewRegistry()
	reg.Register(plugin.ShellConstructor, plugin.Shell())
	ns, err := e.startNodes(ctx, nodeSpec{DB: db.Name(), Count: 1, Name: "bench-kill", MaxThreads: killRunning, Plugins: reg})
	if err != nil {
		return err
	}
	defer ns.stop()

	var dead, finished, deadRet, finishedRet, calls []time.Duration
	fail := func(format string, args ...any) {
		if len(rep.Failures) < maxFailures {
			rep.Failures = append(rep.Failures, fmt.Sprintf(format, args...))
		}
	}
	var survivors []int // processes left alive by a failed kill
	defer func() {
		for _, pid := range survivors {
			_ = killGroup(pid)
		}
	}()
rounds:
	for rep.Kills < e.cfg.KillSamples {
		k := min(killRunning, e.cfg.KillSamples-rep.Kills)
		ps := make([]bson.Raw, k)
		for i := range ps {
			ps[i] = params
		}
		ids, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: ps})
		if err != nil {
			return err
		}
		pids, err := waitPIDs(ctx, dir, ids, killStartWait)
		if err != nil {
			return err
		}
		running, err := countStatus(ctx, db, q.ID, schema.StatusRunning)
		if err != nil {
			return err
		}
		if running != int64(k) {
			return fmt.Errorf("%d tasks running once the %d processes were up, want %d", running, k, k)
		}
		rep.Running = max(rep.Running, k)
		for i, id := range ids {
			time.Sleep(killGap)
			ks, failure, err := killOne(ctx, op, w, id, pids[i])
			if err != nil {
				return err
			}
			if failure != "" {
				fail("task %s (pid %d): %s", id.Hex(), pids[i], failure)
				survivors = append(survivors, pids[i+1:]...)
				if gone, _ := pidGone(pids[i]); !gone {
					survivors = append(survivors, pids[i])
				}
				e.log.Error("control: a kill was not carried out; stopping the kill measurement", "task_id", id.Hex(), "failure", failure)
				break rounds
			}
			rep.Kills++
			dead = append(dead, ks.dead.Sub(ks.ack))
			finished = append(finished, ks.finished.Sub(ks.ack))
			deadRet = append(deadRet, ks.dead.Sub(ks.ret))
			finishedRet = append(finishedRet, ks.finished.Sub(ks.ret))
			calls = append(calls, ks.ret.Sub(ks.call))
		}
		// What the node wrote, read back.
		states, err := s.TaskStates(ctx, ids)
		if err != nil {
			return err
		}
		for _, st := range states {
			if st.Status != schema.StatusFailed || st.Reason != schema.ReasonKilled {
				fail("task %s: status %d reason %q after its kill, want 2 %q", st.ID.Hex(), st.Status, st.Reason, schema.ReasonKilled)
			}
		}
	}
	rep.Dead, rep.Finished = summarize(dead), summarize(finished)
	rep.DeadFromReturn, rep.FinishedFromReturn = summarize(deadRet), summarize(finishedRet)
	rep.Call = summarize(calls)
	return nil
}

// killSample is one kill's moments.
type killSample struct {
	call, ack, ret time.Time // TaskKill called, its request write acknowledged, returned
	dead, finished time.Time // process seen dead, finish event received
}

// killOne asks to kill task id, whose process is pid, and waits for the
// process to die and the task to finish. A failure is what the node did
// wrong; err is the benchmark's own trouble.
func killOne(ctx context.Context, op *operator, w *statusWatch, id bson.ObjectID, pid int) (ks killSample, failure string, err error) {
	if gone, err := pidGone(pid); err != nil || gone {
		return ks, "", fmt.Errorf("the process (pid %d) of running task %s is gone before its kill (%v)", pid, id.Hex(), err)
	}
	fin := w.expect(id)
	pctx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	deadc := make(chan time.Time, 1)
	go func() {
		for pctx.Err() == nil {
			if gone, _ := pidGone(pid); gone {
				deadc <- time.Now()
				return
			}
			time.Sleep(killPoll)
		}
	}()

	op.arm()
	ks.call = time.Now()
	res, err := op.store.TaskKill(ctx, store.TaskKillParams{Target: store.TaskTarget{IDs: []bson.ObjectID{id}}, By: killBy, Reason: "kill latency"})
	ks.ret = time.Now()
	ks.ack = op.disarm()
	if err != nil {
		return ks, "", err
	}
	if res.Requested != 1 {
		return ks, fmt.Sprintf("TaskKill recorded %d kill requests (cancelled %d, settled %d, skipped %v), want 1", res.Requested, res.Cancelled, res.Settled, res.Skipped), nil
	}
	if ks.ack.IsZero() {
		return ks, "", errors.New("the command monitor saw no update acknowledged during TaskKill")
	}
	timeout := time.NewTimer(killTimeout)
	defer timeout.Stop()
	finDone := fin.done
	for deadc != nil || finDone != nil {
		select {
		case ks.dead = <-deadc:
			deadc = nil
		case <-finDone:
			finDone = nil
			ks.finished = fin.at
			if fin.status != int32(schema.StatusFailed) || fin.reason != schema.ReasonKilled {
				return ks, fmt.Sprintf("finished with status %d reason %q, want 2 %q", fin.status, fin.reason, schema.ReasonKilled), nil
			}
		case <-timeout.C:
			var missing []string
			if deadc != nil {
				missing = append(missing, "the process is still alive")
			}
			if finDone != nil {
				missing = append(missing, "no finish seen")
			}
			return ks, fmt.Sprintf("%s %s after the kill request was acknowledged", strings.Join(missing, " and "), killTimeout), nil
		case <-ctx.Done():
			return ks, "", ctx.Err()
		}
	}
	return ks, "", nil
}

// waitPIDs waits for the PID file of each task (written by its shell) and
// returns the PIDs in the order of ids.
func waitPIDs(ctx context.Context, dir string, ids []bson.ObjectID, timeout time.Duration) ([]int, error) {
	pids := make([]int, len(ids))
	deadline := time.Now().Add(timeout)
	for {
		up := 0
		for i, id := range ids {
			if pids[i] != 0 {
				up++
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, id.Hex()+".pid"))
			if err != nil || !strings.HasSuffix(string(b), "\n") { // not yet, or half written
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid <= 0 {
				return nil, fmt.Errorf("task %s wrote PID %q", id.Hex(), b)
			}
			pids[i] = pid
			up++
		}
		if up == len(ids) {
			return pids, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d shell tasks started their process within %s", up, len(ids), timeout)
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// operator is the client that asks for kills, with a command monitor that
// times the acknowledgement of the first update of each TaskKill: the
// kill-request write.
type operator struct {
	client *mongo.Client
	store  *store.Store
	mu     sync.Mutex
	armed  bool
	ack    time.Time
}

func (e *env) newOperator(db string) (*operator, error) {
	o := &operator{}
	c, err := mongo.Connect(options.Client().ApplyURI(e.uri).SetMonitor(&event.CommandMonitor{Succeeded: o.succeeded}))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact(e.uri), err)
	}
	o.client, o.store = c, store.New(c.Database(db), store.Options{})
	return o, nil
}

func (o *operator) succeeded(_ context.Context, ev *event.CommandSucceededEvent) {
	if ev.CommandName != "update" {
		return
	}
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.armed && o.ack.IsZero() {
		o.ack = now
	}
}

// arm starts watching for the next update's acknowledgement.
func (o *operator) arm() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.armed, o.ack = true, time.Time{}
}

// disarm returns when the first update since arm was acknowledged.
func (o *operator) disarm() time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.armed = false
	return o.ack
}

func (o *operator) close() { disconnect(o.client) }

// statusWatch follows a database's tasks with a change stream of its own
// and notes when each task's first update to a matching status (a finish:
// > 0; a release: -2) arrives.
type statusWatch struct {
	client *mongo.Client
	cs     *mongo.ChangeStream
	cancel context.CancelFunc
	ended  chan struct{}
	mu     sync.Mutex
	slots  map[bson.ObjectID]*statusSlot
}

type statusSlot struct {
	at     time.Time
	status int32
	reason string
	done   chan struct{} // closed once the fields are set
}

// watchStatus watches for updates whose new status matches match (a
// value or a query on it).
func (e *env) watchStatus(ctx context.Context, db string, match any) (*statusWatch, error) {
	c, err := e.connect()
	if err != nil {
		return nil, err
	}
	cs, err := c.Database(db).Collection(schema.CollTasks).Watch(ctx, mongo.Pipeline{{{Key: "$match", Value: bson.D{
		{Key: "operationType", Value: "update"},
		{Key: "updateDescription.updatedFields." + schema.TaskStatus, Value: match},
	}}}})
	if err != nil {
		disconnect(c)
		return nil, fmt.Errorf("watch the tasks' status changes: %w", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &statusWatch{client: c, cs: cs, cancel: cancel, ended: make(chan struct{}), slots: map[bson.ObjectID]*statusSlot{}}
	go func() {
		defer close(w.ended)
		for cs.Next(wctx) {
			at := time.Now()
			id, ok := cs.Current.Lookup("documentKey", "_id").ObjectIDOK()
			if !ok {
				continue
			}
			up, _ := cs.Current.Lookup("updateDescription", "updatedFields").DocumentOK()
			st, _ := up.Lookup(schema.TaskStatus).AsInt64OK()
			reason, _ := up.Lookup(schema.TaskReason).StringValueOK()
			w.record(id, at, int32(st), reason)
		}
	}()
	return w, nil
}

// expect returns the slot task id's status change will fill.
func (w *statusWatch) expect(id bson.ObjectID) *statusSlot {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.slots[id]
	if !ok {
		s = &statusSlot{done: make(chan struct{})}
		w.slots[id] = s
	}
	return s
}

// arrived waits (until expired) for task id's status change and says when
// it arrived; read only after it is recorded, without a race.
func (w *statusWatch) arrived(ctx context.Context, id bson.ObjectID, expired <-chan time.Time) (time.Time, bool) {
	s := w.expect(id)
	if !waitSlot(ctx, s, expired) {
		return time.Time{}, false
	}
	return s.at, true
}

func (w *statusWatch) record(id bson.ObjectID, at time.Time, status int32, reason string) {
	s := w.expect(id)
	select {
	case <-s.done: // the first finish counts
		return
	default:
	}
	s.at, s.status, s.reason = at, status, reason
	close(s.done)
}

func (w *statusWatch) close() {
	w.cancel()
	<-w.ended
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.cs.Close(ctx)
	disconnect(w.client)
}

// ---- delayed tasks ----

// controlDelay holds --delay-held tasks for an hour in a queue, then
// inserts --delay-probes tasks due 300-800 ms later, one every delayGap,
// and times not_before -> plugin start.
func (e *env) controlDelay(ctx context.Context, rep *DelayFigures) error {
	db, drop := e.database("delay")
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return err
	}
	q, err := newQueue(ctx, s, "delay", e.cfg.MaxThreads)
	if err != nil {
		return err
	}
	rep.Held, rep.Probes = e.cfg.DelayHeld, e.cfg.DelayProbes
	fail := func(format string, args ...any) {
		if len(rep.Failures) < maxFailures {
			rep.Failures = append(rep.Failures, fmt.Sprintf(format, args...))
		}
	}

	var mu sync.Mutex
	started := map[bson.ObjectID]time.Time{}
	startedOne := make(chan struct{}, 1)
	ns, err := e.startNodes(ctx, nodeSpec{DB: db.Name(), Count: 1, Name: "bench-delay", MaxThreads: e.cfg.MaxThreads,
		Plugins: noopRegistry(func(id bson.ObjectID) {
			now := time.Now()
			mu.Lock()
			if _, ok := started[id]; !ok {
				started[id] = now
			}
			mu.Unlock()
			select {
			case startedOne <- struct{}{}:
			default:
			}
		})})
	if err != nil {
		return err
	}
	nodesUp := true
	defer func() {
		if nodesUp {
			ns.stop()
		}
	}()

	begin := time.Now()
	if err := insertTasksControl(ctx, e.log, s, q.ID, rep.Held, &store.TaskInsertControl{NotBefore: begin.Add(delayHeldFor)}); err != nil {
		return err
	}
	rep.HeldInsertRate = rate(rep.Held, time.Since(begin))
	e.log.Info("control: held tasks inserted", "tasks", rep.Held, "per_s", round(rep.HeldInsertRate))

	// probe inserts one task due at now+delay; it returns its id and
	// not_before (ms, as stored).
	probe := func(delay time.Duration) (bson.ObjectID, time.Time, error) {
		nb := time.Now().Add(delay).Truncate(time.Millisecond)
		ids, err := s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{nil}, Control: &store.TaskInsertControl{NotBefore: nb}})
		if err != nil {
			return bson.ObjectID{}, time.Time{}, err
		}
		return ids[0], nb, nil
	}
	// waitStarted waits until every id started or the deadline passed; it
	// returns how many did not.
	waitStarted := func(ids []bson.ObjectID, deadline time.Time) (int, error) {
		for {
			mu.Lock()
			left := 0
			for _, id := range ids {
				if _, ok := started[id]; !ok {
					left++
				}
			}
			mu.Unlock()
			if left == 0 || time.Now().After(deadline) {
				return left, nil
			}
			select {
			case <-startedOne:
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return left, ctx.Err()
			}
		}
	}

	// Settling: the node follows the held tasks' inserts on its change
	// streams (the timers' and the claimer's) before it hears of a probe.
	// One probe at a time, due now+delayMin, until one starts within the
	// goal (or delaySettleMax passed); the first one's lateness is the
	// figure for a probe right after the burst.
	inserted := time.Now()
	for {
		id, nb, err := probe(delayMin)
		if err != nil {
			return err
		}
		if left, err := waitStarted([]bson.ObjectID{id}, nb.Add(delayWait)); err != nil {
			return err
		} else if left > 0 {
			fail("a settling probe (not_before now+%s) not started within %s of its not_before", delayMin, delayWait)
			break
		}
		mu.Lock()
		late := started[id].Sub(nb)
		mu.Unlock()
		rep.Settling++
		if rep.Settling == 1 {
			rep.FirstLate = ms(late)
		}
		if ms(late) <= delayGoalP99 {
			rep.Settled = true
			break
		}
		if time.Since(inserted) > delaySettleMax {
			break
		}
	}
	rep.SettleSeconds = time.Since(inserted).Seconds()
	e.log.Info("control: settled after the held tasks' insert", "probes", rep.Settling, "seconds", round(rep.SettleSeconds), "first_late_ms", round(rep.FirstLate), "settled", rep.Settled)

	rw, err := e.watchStatus(ctx, db.Name(), int32(schema.StatusQueued))
	if err != nil {
		return err
	}
	defer rw.close()
	ids := make([]bson.ObjectID, 0, rep.Probes)
	due := map[bson.ObjectID]time.Time{}
	var last time.Time
	tick := time.NewTicker(delayGap)
	for range rep.Probes {
		select {
		case <-tick.C:
		case <-ctx.Done():
			tick.Stop()
			return ctx.Err()
		}
		id, nb, err := probe(delayMin + rand.N(delaySpread))
		if err != nil {
			tick.Stop()
			return err
		}
		ids = append(ids, id)
		due[id] = nb
		if nb.After(last) {
			last = nb
		}
	}
	tick.Stop()
	left, err := waitStarted(ids, last.Add(delayWait))
	if err != nil {
		return err
	}
	if left > 0 {
		rep.Missing = left
		fail("%d of %d probes not started within %s of the last not_before", left, len(ids), delayWait)
	}

	var late, queued []time.Duration
	for _, id := range ids {
		sl := rw.expect(id)
		select {
		case <-sl.done:
			queued = append(queued, sl.at.Sub(due[id]))
		default:
		}
	}
	rep.LateQueued = summarize(queued)
	mu.Lock()
	for _, id := range ids {
		at, ok := started[id]
		if !ok {
			continue
		}
		d := at.Sub(due[id])
		if d < 0 {
			rep.Early++
			fail("probe %s started %s before its not_before", id.Hex(), -d)
		}
		late = append(late, d)
	}
	mu.Unlock()
	rep.Late = summarize(late)

	// The node's own record: the attempt's started, once finished.
	if left, err := e.waitFinished(ctx, db, ids, 10*time.Second); err != nil {
		return err
	} else if left > 0 {
		fail("%d probes not finished 10 s after they started", left)
	}
	lateAttempt, err := attemptLate(ctx, db, ids, due)
	if err != nil {
		return err
	}
	rep.LateAttempt = summarize(lateAttempt)

	held, err := countStatus(ctx, db, q.ID, schema.StatusBlocked)
	if err != nil {
		return err
	}
	if rep.HeldReleased = int64(rep.Held) - held; rep.HeldReleased != 0 {
		fail("%d of the %d tasks held until +%s are not held any more", rep.HeldReleased, rep.Held, delayHeldFor)
	}

	ns.stop()
	nodesUp = false
	t0 := time.Now()
	if _, err := db.Collection(schema.CollTasks).DeleteMany(ctx, bson.D{{Key: schema.TaskQueue, Value: q.ID}, {Key: schema.TaskStatus, Value: int32(schema.StatusBlocked)}}); err != nil {
		return fmt.Errorf("delete the held tasks: %w", err)
	}
	rep.DeleteSeconds = time.Since(t0).Seconds()
	if rep.HeldLeft, err = countStatus(ctx, db, q.ID, schema.StatusBlocked); err != nil {
		return err
	}
	return nil
}

// waitFinished waits until every id has status > 0; it returns how many
// have not by the timeout.
func (e *env) waitFinished(ctx context.Context, db *mongo.Database, ids []bson.ObjectID, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		n, err := db.Collection(schema.CollTasks).CountDocuments(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}},
			{Key: schema.TaskStatus, Value: bson.D{{Key: "$gt", Value: 0}}}})
		if err != nil {
			return 0, fmt.Errorf("count finished probes: %w", err)
		}
		if left := len(ids) - int(n); left == 0 || time.Now().After(deadline) {
			return left, nil
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// attemptLate reads each task's last attempt's started and returns
// started - not_before.
func attemptLate(ctx context.Context, db *mongo.Database, ids []bson.ObjectID, due map[bson.ObjectID]time.Time) ([]time.Duration, error) {
	cur, err := db.Collection(schema.CollTasks).Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}},
		options.Find().SetProjection(bson.D{{Key: schema.TaskAttempts, Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("read the probes' attempts: %w", err)
	}
	var docs []struct {
		ID       bson.ObjectID    `bson:"_id"`
		Attempts []schema.Attempt `bson:"attempts"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("read the probes' attempts: %w", err)
	}
	var out []time.Duration
	for _, d := range docs {
		if n := len(d.Attempts); n > 0 && !d.Attempts[n-1].Started.IsZero() {
			out = append(out, d.Attempts[n-1].Started.Sub(due[d.ID]))
		}
	}
	return out, nil
}

// ---- wait latency ----

// controlWait runs control.Wait on waitTasks running tasks, finishes them
// with direct writes (all but one, then the last), and times the last
// write's acknowledgement -> Wait's return.
func (e *env) controlWait(ctx context.Context, rep *WaitFigures) error {
	db, drop := e.database("wait")
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return err
	}
	q, err := newQueue(ctx, s, "wait", e.cfg.MaxThreads)
	if err != nil {
		return err
	}
	wc, err := e.connect() // the writer's
	if err != nil {
		return err
	}
	defer disconnect(wc)
	tasks := wc.Database(db.Name()).Collection(schema.CollTasks, options.Collection().SetWriteConcern(writeconcern.Majority()))
	rc, err := e.connect() // the waiter's
	if err != nil {
		return err
	}
	defer disconnect(rc)
	ws := store.New(rc.Database(db.Name()), store.Options{})
	rep.Tasks = waitTasks
	fail := func(format string, args ...any) {
		if len(rep.Failures) < maxFailures {
			rep.Failures = append(rep.Failures, fmt.Sprintf(format, args...))
		}
	}
	finish := func(ids []bson.ObjectID) error {
		r, err := tasks.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}, {Key: schema.TaskStatus, Value: int32(schema.StatusRunning)}},
			bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusSucceeded)}, {Key: schema.TaskMTime, Value: time.Now()}}}})
		if err != nil {
			return fmt.Errorf("finish tasks: %w", err)
		}
		if r.ModifiedCount != int64(len(ids)) {
			return fmt.Errorf("finished %d tasks, want %d", r.ModifiedCount, len(ids))
		}
		return nil
	}

	var lat []time.Duration
	for i := range e.cfg.WaitRounds {
		ids := make([]bson.ObjectID, waitTasks)
		docs := make([]any, waitTasks)
		now := time.Now()
		for j := range ids {
			ids[j] = bson.NewObjectID()
			docs[j] = runningDoc(ids[j], q.ID, now)
		}
		if _, err := tasks.InsertMany(ctx, docs); err != nil {
			return fmt.Errorf("insert running tasks: %w", err)
		}
		fr := &firstRead{WaitStore: ws, read: make(chan struct{})}
		type waited struct {
			at     time.Time
			states []store.TaskState
			err    error
		}
		out := make(chan waited, 1)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		go func() {
			states, err := control.Wait(wctx, fr, ids)
			out <- waited{time.Now(), states, err}
		}()
		abort := func(err error) error {
			cancel()
			<-out
			return err
		}
		select {
		case <-fr.read:
		case r := <-out:
			cancel()
			return fmt.Errorf("round %d: control.Wait returned before any task finished (%v)", i, r.err)
		case <-ctx.Done():
			return abort(ctx.Err())
		}
		if err := finish(ids[:waitTasks-1]); err != nil {
			return abort(err)
		}
		time.Sleep(waitGap)
		if err := finish(ids[waitTasks-1:]); err != nil {
			return abort(err)
		}
		ack := time.Now()
		r := <-out
		cancel()
		switch {
		case r.err != nil:
			fail("round %d: control.Wait: %v", i, r.err)
		case !control.Succeeded(r.states):
			fail("round %d: control.Wait returned states %v, want all succeeded", i, r.states)
		default:
			lat = append(lat, r.at.Sub(ack))
		}
		rep.Rounds++
		time.Sleep(waitGap)
	}
	rep.Latency = summarize(lat)
	return nil
}

// runningDoc is a task running on the wait writer, as a node leaves it.
func runningDoc(id, queue bson.ObjectID, now time.Time) bson.D {
	d := taskDoc(id, queue, now)
	for i := range d {
		switch d[i].Key {
		case schema.TaskNode:
			d[i].Value = waitWriter
		case schema.TaskStatus:
			d[i].Value = int32(schema.StatusRunning)
		}
	}
	return d
}

// firstRead is Wait's store, closing read once Wait's first read of the
// states returned (its change stream is open by then).
type firstRead struct {
	control.WaitStore
	once sync.Once
	read chan struct{}
}

func (f *firstRead) TaskStates(ctx context.Context, ids []bson.ObjectID) ([]store.TaskState, error) {
	st, err := f.WaitStore.TaskStates(ctx, ids)
	f.once.Do(func() { close(f.read) })
	return st, err
}

// ---- report ----

// renderControl renders the control group's tables.
func renderControl(b *strings.Builder, r *Report) {
	c := r.Control
	if c == nil {
		return
	}
	row := func(t *table, what string, l Latency) {
		t.add(what, strconv.Itoa(l.N), fms(l.P50), fms(l.P95), fms(l.P99), fms(l.Max))
	}
	header := []string{"what", "n", "p50", "p95", "p99", "max"}
	floorRow := "pickup floor of this run: insert -> running, bare driver loop (" + c.FloorSource + ")"

	k := c.Kill
	t := table{title: fmt.Sprintf("TASK CONTROL: KILL, ms: store.TaskKill of one running shell task `exec sleep 60` at a time (%d running per round), node with change streams", k.Running),
		header: header}
	row(&t, "request write acknowledged -> process dead (/proc/PID/stat Z or gone, polled every 200 µs)", k.Dead)
	row(&t, "request write acknowledged -> task finished (change event: status 2, reason killed)", k.Finished)
	row(&t, "TaskKill returned -> process dead", k.DeadFromReturn)
	row(&t, "TaskKill returned -> task finished", k.FinishedFromReturn)
	row(&t, "TaskKill call (by id: read, 3 guarded updates, read)", k.Call)
	row(&t, floorRow, c.Floor)
	t.render(b)

	d := c.Delay
	t = table{title: fmt.Sprintf("TASK CONTROL: DELAYED TASKS, ms: %d probes due now+%s..%s (one inserted every %s) among %d tasks held until +%s in the same queue",
		d.Probes, delayMin, delayMin+delaySpread, delayGap, d.Held, delayHeldFor), header: header}
	row(&t, "not_before -> queued by the leader's timer (change event received: status -4 -> -2)", d.LateQueued)
	row(&t, "not_before -> plugin start (after the status 0 write)", d.Late)
	row(&t, "not_before -> the attempt's started (node clock, ms)", d.LateAttempt)
	row(&t, floorRow, c.Floor)
	t.render(b)
	settled := "started within the goal"
	if !d.Settled {
		settled = "none started within the goal"
	}
	fmt.Fprintf(b, "  held tasks inserted at %s/s; after the insert, settling probes one at a time (due now+%s, not counted above): the first started %s ms late; %d in %.1f s until one %s\n",
		frate(d.HeldInsertRate), delayMin, fms(d.FirstLate), d.Settling, d.SettleSeconds, settled)
	fmt.Fprintf(b, "  early starts %d, probes missing %d, held tasks released %d; held tasks deleted afterwards in %.1f s (%d left)\n\n",
		d.Early, d.Missing, d.HeldReleased, d.DeleteSeconds, d.HeldLeft)

	w := c.Wait
	t = table{title: fmt.Sprintf("TASK CONTROL: WAIT, ms: control.Wait on %d running tasks, %d rounds; %d finished by one direct write, then the last %s later",
		w.Tasks, w.Rounds, w.Tasks-1, waitGap), header: header}
	row(&t, "last finish write acknowledged (majority) -> control.Wait returned", w.Latency)
	row(&t, floorRow, c.Floor)
	t.render(b)

	t = table{title: "TASK CONTROL RATIOS AND GOALS", header: []string{"ratio", "p50", "p99", "goal"}}
	t.add(k.Ratio.What, fx(k.Ratio.P50), fx(k.Ratio.P99), k.Goal.String())
	t.add(d.Ratio.What, fx(d.Ratio.P50), fx(d.Ratio.P99), d.Goal.String())
	t.add(w.Ratio.What, fx(w.Ratio.P50), fx(w.Ratio.P99), "")
	t.render(b)

	var failures []string
	for _, f := range [][]string{k.Failures, d.Failures, w.Failures} {
		failures = append(failures, f...)
	}
	if len(failures) > 0 {
		b.WriteString("  TASK CONTROL FAILURES (what the node or control.Wait did wrong):\n")
		for _, f := range failures {
			b.WriteString("  - " + f + "\n")
		}
		b.WriteString("\n")
	}
}

// control checks the control group's figures and answers.
func (k *checker) control(c *ControlReport, cfg config) {
	if c == nil {
		k.bad("control: missing")
		return
	}
	k.latency("control, pickup floor", c.Floor)
	kf := c.Kill
	for _, f := range kf.Failures {
		k.bad("control, kill: %s", f)
	}
	if kf.Kills != cfg.KillSamples {
		k.bad("control, kill: %d kills measured, want %d", kf.Kills, cfg.KillSamples)
	}
	k.latency("control, kill -> process dead", kf.Dead)
	k.latency("control, kill -> task finished", kf.Finished)
	k.latency("control, TaskKill call", kf.Call)
	d := c.Delay
	for _, f := range d.Failures {
		k.bad("control, delayed: %s", f)
	}
	if d.Late.N != cfg.DelayProbes {
		k.bad("control, delayed: %d probes timed, want %d", d.Late.N, cfg.DelayProbes)
	}
	// Early starts are failures (above); the latency may be 0 ms at p50.
	if d.Late.N > 0 && !(d.Late.P50 <= d.Late.P95 && d.Late.P95 <= d.Late.P99 && d.Late.P99 <= d.Late.Max) {
		k.bad("control, delayed: percentiles out of order (%+v)", d.Late)
	}
	if d.LateAttempt.N != d.Late.N || d.LateQueued.N != d.Late.N {
		k.bad("control, delayed: %d attempts with a start and %d releases seen, want %d", d.LateAttempt.N, d.LateQueued.N, d.Late.N)
	}
	k.positive("control, delayed: held insert rate", d.HeldInsertRate)
	if d.HeldLeft != 0 {
		k.bad("control, delayed: %d held tasks left after the delete", d.HeldLeft)
	}
	w := c.Wait
	for _, f := range w.Failures {
		k.bad("control, wait: %s", f)
	}
	if w.Latency.N != cfg.WaitRounds {
		k.bad("control, wait: %d rounds timed, want %d", w.Latency.N, cfg.WaitRounds)
	}
	k.latency("control, wait", w.Latency)
	for _, x := range []Ratio{kf.Ratio, d.Ratio, w.Ratio} {
		k.positive("control ratio "+x.What+" p50", x.P50)
		k.positive("control ratio "+x.What+" p99", x.P99)
	}
}
