package main

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
	"github.com/disbatch-go/disbatch/store"
)

// PickupRow is one pickup measurement: insert start to plugin start (for
// the floor: to the acknowledged write to status 0).
type PickupRow struct {
	Mode         string  `json:"mode"`
	SubmitWC     string  `json:"submit_write_concern"`
	Rate         int     `json:"rate_per_s"`
	Seconds      float64 `json:"seconds"`
	InsertAckP50 float64 `json:"insert_ack_p50_ms"`
	Pickup       Latency `json:"pickup"`
}

// FloorStep is one step of the floor loop, in ms.
type FloorStep struct {
	Step string  `json:"step"`
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
}

// Ratio compares two latency figures (p50 with p50, p99 with p99).
type Ratio struct {
	What string  `json:"what"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	Goal string  `json:"goal,omitempty"`
}

// PickupReport is the pickup group.
type PickupReport struct {
	Rows       []PickupRow `json:"rows"`
	FloorSteps []FloorStep `json:"floor_steps"`
	Ratios     []Ratio     `json:"ratios"`
}

const (
	modeChangeStream = "node, change streams"
	modePollOnly     = "node, poll only"
	modeFloor        = "floor: bare driver loop"
	wcMajority       = "majority"
	wcW1             = "w:1"
	pickupWarmUp     = 5 // tasks submitted first and not counted
)

// pickup measures the floor and the node in both modes with both
// submitter write concerns. The floor and the node with change streams and
// a majority submitter, whose ratio is the goal, are measured interleaved
// (one second of tasks to each in turn), so that load from elsewhere on the
// machine hits both alike.
func (e *env) pickup(ctx context.Context) (*PickupReport, error) {
	sub, err := e.connect() // the submitter's own client
	if err != nil {
		return nil, err
	}
	defer disconnect(sub)
	rep := &PickupReport{}

	e.log.Info("pickup: floor and node (change streams, majority), interleaved", "rate", e.cfg.PickupRate, "duration_each", e.cfg.PickupDuration)
	floor, stopFloor, err := e.floorTarget(ctx, sub)
	if err != nil {
		return rep, fmt.Errorf("pickup floor: %w", err)
	}
	cs, stopNode, err := e.nodeTarget(ctx, sub, false, wcMajority)
	if err != nil {
		_ = stopFloor()
		return rep, fmt.Errorf("pickup, %s: %w", modeChangeStream, err)
	}
	err = e.submit(ctx, floor, cs)
	stopNode()
	if ferr := stopFloor(); err == nil {
		err = ferr
	}
	if err != nil {
		return rep, fmt.Errorf("pickup, floor and %s: %w", modeChangeStream, err)
	}
	rep.Rows = append(rep.Rows, floor.row(e.cfg.PickupRate), cs.row(e.cfg.PickupRate))
	rep.FloorSteps = floor.clock.floorSteps()

	for _, run := range []struct {
		pollOnly bool
		wc       string
	}{{false, wcW1}, {true, wcMajority}, {true, wcW1}} {
		t, stop, err := e.nodeTarget(ctx, sub, run.pollOnly, run.wc)
		if err == nil {
			e.log.Info("pickup: node", "mode", t.mode, "submit_write_concern", run.wc)
			err = e.submit(ctx, t)
			stop()
		}
		if err != nil {
			return rep, fmt.Errorf("pickup, poll only %v, %s: %w", run.pollOnly, run.wc, err)
		}
		rep.Rows = append(rep.Rows, t.row(e.cfg.PickupRate))
	}
	rep.Ratios = pickupRatios(rep.Rows)
	return rep, nil
}

// pickupRow is the row of rows with mode and submit write concern wc
// (nil: none).
func pickupRow(rows []PickupRow, mode, wc string) *PickupRow {
	for i := range rows {
		if rows[i].Mode == mode && rows[i].SubmitWC == wc {
			return &rows[i]
		}
	}
	return nil
}

// pickupRatios compares poll-only with change streams and the node with
// the floor.
func pickupRatios(rows []PickupRow) []Ratio {
	var out []Ratio
	add := func(what string, a, b *PickupRow, goal string) {
		if a != nil && b != nil {
			out = append(out, Ratio{What: what, P50: ratio(a.Pickup.P50, b.Pickup.P50), P99: ratio(a.Pickup.P99, b.Pickup.P99), Goal: goal})
		}
	}
	cs, floor := pickupRow(rows, modeChangeStream, wcMajority), pickupRow(rows, modeFloor, wcMajority)
	add("node (change streams, majority) / floor", cs, floor, "p50 <= 1.3, p99 <= 2 (PERFORMANCE.md)")
	add("poll only / change streams, majority", pickupRow(rows, modePollOnly, wcMajority), cs, "")
	add("poll only / change streams, w:1", pickupRow(rows, modePollOnly, wcW1), pickupRow(rows, modeChangeStream, wcW1), "")
	add("change streams: w:1 / majority submitter", pickupRow(rows, modeChangeStream, wcW1), cs, "")
	return out
}

// pickupTarget is where a submitter inserts and how pickups are timed.
type pickupTarget struct {
	mode, wc string
	coll     *mongo.Collection // the submitter's, with its write concern
	queue    bson.ObjectID
	clock    *pickupClock
	first    time.Time // first and last insert
	last     time.Time
}

// row summarises what the target measured.
func (t *pickupTarget) row(rate int) PickupRow {
	lat, acks := t.clock.latencies()
	return PickupRow{Mode: t.mode, SubmitWC: t.wc, Rate: rate, Seconds: t.last.Sub(t.first).Seconds(), InsertAckP50: summarize(acks).P50, Pickup: summarize(lat)}
}

func submitColl(sub *mongo.Client, db, wc string) *mongo.Collection {
	w := writeconcern.Majority()
	if wc == wcW1 {
		w = writeconcern.W1()
	}
	return sub.Database(db).Collection(schema.CollTasks, options.Collection().SetWriteConcern(w))
}

// nodeTarget starts one in-process node on a fresh database; stop stops
// it and drops the database.
func (e *env) nodeTarget(ctx context.Context, sub *mongo.Client, pollOnly bool, wc string) (*pickupTarget, func(), error) {
	db, drop := e.database("pickup")
	q, err := newQueue(ctx, store.New(db, store.Options{}), "pickup", e.cfg.MaxThreads)
	if err != nil {
		drop()
		return nil, nil, err
	}
	clock := newPickupClock()
	ns, err := e.startNodes(ctx, nodeSpec{
		DB: db.Name(), Count: 1, Name: "bench-pickup", MaxThreads: e.cfg.MaxThreads, PollOnly: pollOnly,
		Plugins: noopRegistry(func(id bson.ObjectID) { clock.stamp(id, stRunning, time.Now()) }),
	})
	if err != nil {
		drop()
		return nil, nil, err
	}
	mode := modeChangeStream
	if pollOnly {
		mode = modePollOnly
	}
	t := &pickupTarget{mode: mode, wc: wc, coll: submitColl(sub, db.Name(), wc), queue: q.ID, clock: clock}
	return t, func() { ns.stop(); drop() }, nil
}

// floorTarget starts the bare driver loop PERFORMANCE.md measures (change
// event, findOneAndUpdate claim to -1, guarded updateOne to 0, one task at
// a time, on a client of its own) on a fresh database with the node's
// indexes; stop ends it, drops the database and returns the loop's error.
func (e *env) floorTarget(ctx context.Context, sub *mongo.Client) (*pickupTarget, func() error, error) {
	db, drop := e.database("floor")
	fail := func(err error) (*pickupTarget, func() error, error) {
		drop()
		return nil, nil, err
	}
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return fail(err)
	}
	q, err := newQueue(ctx, s, "floor", e.cfg.MaxThreads)
	if err != nil {
		return fail(err)
	}
	wc, err := e.connect()
	if err != nil {
		return fail(err)
	}
	tasks := wc.Database(db.Name()).Collection(schema.CollTasks, options.Collection().SetWriteConcern(writeconcern.Majority()))
	cs, err := tasks.Watch(ctx, mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "insert"}}}}})
	if err != nil {
		disconnect(wc)
		return fail(fmt.Errorf("open change stream: %w", err))
	}
	clock := newPickupClock()
	lctx, cancel := context.WithCancel(ctx)
	loopErr := make(chan error, 1)
	go func() { loopErr <- floorLoop(lctx, cs, tasks, q.ID, clock) }()
	stop := func() error {
		cancel()
		err := <-loopErr
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		closeCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		_ = cs.Close(closeCtx)
		disconnect(wc)
		drop()
		if err != nil {
			return fmt.Errorf("floor loop: %w", err)
		}
		return nil
	}
	t := &pickupTarget{mode: modeFloor, wc: wcMajority, coll: submitColl(sub, db.Name(), wcMajority), queue: q.ID, clock: clock}
	return t, stop, nil
}

// floorLoop claims and starts one task per insert event.
func floorLoop(ctx context.Context, cs *mongo.ChangeStream, tasks *mongo.Collection, queue bson.ObjectID, clock *pickupClock) error {
	const name = "bench-floor"
	claimOpts := options.FindOneAndUpdate().SetSort(bson.D{{Key: "_id", Value: 1}}).SetReturnDocument(options.After)
	for cs.Next(ctx) {
		at := time.Now()
		if id, ok := cs.Current.Lookup("documentKey", "_id").ObjectIDOK(); ok {
			clock.stamp(id, stEvent, at)
		}
		raw, err := tasks.FindOneAndUpdate(ctx,
			bson.D{{Key: schema.TaskNode, Value: schema.Unclaimed}, {Key: schema.TaskStatus, Value: int32(schema.StatusQueued)}, {Key: schema.TaskQueue, Value: queue}},
			bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskNode, Value: name}, {Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)}, {Key: schema.TaskMTime, Value: time.Now()}}}},
			claimOpts).Raw()
		if errors.Is(err, mongo.ErrNoDocuments) {
			continue
		}
		if err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		id := raw.Lookup("_id").ObjectID()
		clock.stamp(id, stClaimed, time.Now())
		res, err := tasks.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: id}, {Key: schema.TaskNode, Value: name}, {Key: schema.TaskStatus, Value: int32(schema.StatusClaimed)}},
			bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskStatus, Value: int32(schema.StatusRunning)}, {Key: schema.TaskMTime, Value: time.Now()}}}})
		if err != nil {
			return fmt.Errorf("start: %w", err)
		}
		if res.MatchedCount != 1 {
			return fmt.Errorf("start task %s: the guard matched %d documents", id.Hex(), res.MatchedCount)
		}
		clock.stamp(id, stRunning, time.Now())
	}
	return cs.Err()
}

// submit inserts tasks one at a time at the configured rate for the
// configured duration into each target, taking turns of one second's worth
// of tasks, then waits until all are running. The first pickupWarmUp tasks
// of each target are not counted.
func (e *env) submit(ctx context.Context, targets ...*pickupTarget) error {
	perTarget := max(1, int(float64(e.cfg.PickupRate)*e.cfg.PickupDuration.Seconds())) + pickupWarmUp
	block := e.cfg.PickupRate // one second
	sent := make([]int, len(targets))
	tick := time.NewTicker(time.Second / time.Duration(e.cfg.PickupRate))
	defer tick.Stop()
	for i := 0; i < perTarget*len(targets); i++ {
		t := (i / block) % len(targets)
		for sent[t] == perTarget { // a target that is done passes its turn
			t = (t + 1) % len(targets)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		tg := targets[t]
		id := bson.NewObjectID()
		t0 := time.Now()
		tg.clock.begin(id, t0, sent[t] < pickupWarmUp)
		if sent[t] == 0 {
			tg.first = t0
		}
		sent[t]++
		if _, err := tg.coll.InsertOne(ctx, taskDoc(id, tg.queue, t0)); err != nil {
			return fmt.Errorf("insert task (%s): %w", tg.mode, err)
		}
		tg.last = time.Now()
		tg.clock.stamp(id, stAck, tg.last)
	}
	for _, tg := range targets {
		if err := tg.clock.wait(ctx, 30*time.Second); err != nil {
			return fmt.Errorf("%s: %w", tg.mode, err)
		}
	}
	return nil
}
