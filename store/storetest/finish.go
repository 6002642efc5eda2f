package storetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// running claims and starts the next task of q on node n1.
func running(t *testing.T, s *store.Store, q bson.ObjectID) bson.ObjectID {
	t.Helper()
	task, err := s.TaskClaim(ctxT(t), store.TaskClaimParams{Queue: q, Node: "n1", Sort: schema.SortFIFO})
	require.NoError(t, err)
	require.NoError(t, s.TaskStart(ctxT(t), store.TaskTransitionParams{ID: task.ID, Node: "n1"}))
	return task.ID
}

// extra is what the exec and shell plugins record.
func extra(code int32, mixedout string) bson.D {
	return bson.D{{Key: schema.TaskResult, Value: code}, {Key: schema.TaskMixedout, Value: mixedout}}
}

// testTaskFinishExtra: a finish writes result and mixedout beside stdout and
// stderr, only those, on every path (alone, in a bulk write, a retry);
// mixedout is dropped when it would take the output over the threshold,
// and the fields a finish does not write are removed.
func testTaskFinishExtra(t *testing.T, newStore Factory) {
	const threshold = 1000
	s, db := newStore(t, store.Options{OutputThreshold: threshold})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 8)
	doc := func(id bson.ObjectID) bson.Raw { return rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: id}}) }
	absent := func(id bson.ObjectID, fields ...string) {
		t.Helper()
		for _, f := range fields {
			require.Equal(t, bson.Type(0), doc(id).Lookup(f).Type, "%s: %s", f, doc(id))
		}
	}

	// Written with the result; keys other than result and mixedout, and
	// values of the wrong type, are dropped without an error.
	id := running(t, s, q.ID)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusFailed, Stdout: "o\n", Stderr: "e\nexit status 3\n",
		Extra: append(extra(3, "o\ne\n"),
			bson.E{Key: schema.TaskStatus, Value: int32(1)}, bson.E{Key: schema.TaskNode, Value: "evil"}, bson.E{Key: schema.TaskStdout, Value: "forged"},
			bson.E{Key: "_id", Value: 1}, bson.E{Key: schema.TaskAttempts, Value: bson.A{}}, bson.E{Key: "other", Value: 1},
			bson.E{Key: schema.TaskResult, Value: int32(99)}, bson.E{Key: schema.TaskMixedout, Value: "second"})}))
	d := doc(id)
	require.Equal(t, int32(3), d.Lookup(schema.TaskResult).Int32())
	require.Equal(t, "o\ne\n", d.Lookup(schema.TaskMixedout).StringValue())
	require.Equal(t, int32(schema.StatusFailed), d.Lookup(schema.TaskStatus).Int32())
	require.Equal(t, "n1", d.Lookup(schema.TaskNode).StringValue())
	require.Equal(t, "o\n", d.Lookup(schema.TaskStdout).StringValue())
	require.Equal(t, "e\nexit status 3\n", d.Lookup(schema.TaskStderr).StringValue())
	attempts, err := d.Lookup(schema.TaskAttempts).Array().Values()
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	absent(id, "other")

	id = running(t, s, q.ID)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusSucceeded,
		Extra: bson.D{{Key: schema.TaskResult, Value: "0"}, {Key: schema.TaskMixedout, Value: 5}}}))
	absent(id, schema.TaskResult, schema.TaskMixedout)

	// Invalid UTF-8 is replaced, as in stdout and stderr.
	id = running(t, s, q.ID)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusSucceeded, Stdout: "a\xffb", Extra: extra(0, "a\xffb")}))
	require.Equal(t, "a\uFFFDb", doc(id).Lookup(schema.TaskMixedout).StringValue())

	// Over the threshold with stdout and stderr: mixedout is dropped, they
	// stay inline; result stays.
	id = running(t, s, q.ID)
	out, errText := strings.Repeat("o", 400), strings.Repeat("e", 400)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusSucceeded, Stdout: out, Stderr: errText,
		Extra: extra(0, out+errText)}))
	require.Equal(t, out, doc(id).Lookup(schema.TaskStdout).StringValue())
	require.Equal(t, errText, doc(id).Lookup(schema.TaskStderr).StringValue())
	require.Equal(t, int32(0), doc(id).Lookup(schema.TaskResult).Int32())
	absent(id, schema.TaskMixedout)

	// Output in GridFS: mixedout dropped, stdout read back whole.
	id = running(t, s, q.ID)
	big := strings.Repeat("b", threshold+1)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusSucceeded, Stdout: big, Extra: extra(0, big)}))
	got, err := s.TaskGet(ctx, id)
	require.NoError(t, err)
	require.True(t, got.Stdout.InGridFS())
	text, err := s.TaskOutputRead(ctx, got.Stdout)
	require.NoError(t, err)
	require.Equal(t, big, text)
	absent(id, schema.TaskMixedout)

	// A failed attempt sent back for a retry keeps its result and mixedout;
	// a later finish without them removes them.
	id = running(t, s, q.ID)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusFailed, Stdout: "try 1\n",
		Retry: &store.TaskRetryAt{Tries: 1}, Extra: extra(3, "try 1\n")}))
	require.Equal(t, int32(schema.StatusQueued), doc(id).Lookup(schema.TaskStatus).Int32())
	require.Equal(t, int32(3), doc(id).Lookup(schema.TaskResult).Int32())
	require.Equal(t, "try 1\n", doc(id).Lookup(schema.TaskMixedout).StringValue())
	require.Equal(t, id, running(t, s, q.ID), "queued again, first in fifo order")
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusFailed, Stderr: "cannot run\n"}))
	absent(id, schema.TaskResult, schema.TaskMixedout)

	// The bulk path of TaskFinishMany writes them too.
	last, id2 := running(t, s, q.ID), running(t, s, q.ID)
	errs := s.TaskFinishMany(ctx, []store.TaskFinishParams{
		{ID: last, Node: "n1", Status: schema.StatusSucceeded, Stdout: "one", Extra: extra(0, "one")},
		{ID: id2, Node: "n1", Status: schema.StatusFailed, Stderr: "two", Extra: extra(-9, "two")},
	})
	require.Equal(t, []error{nil, nil}, errs)
	require.Equal(t, int32(0), doc(last).Lookup(schema.TaskResult).Int32())
	require.Equal(t, "one", doc(last).Lookup(schema.TaskMixedout).StringValue())
	require.Equal(t, int32(-9), doc(id2).Lookup(schema.TaskResult).Int32())
	require.Equal(t, "two", doc(id2).Lookup(schema.TaskMixedout).StringValue())

	// Listings without output leave mixedout out too.
	list, err := s.TaskList(ctx, store.TaskListParams{Queue: q.ID, WithoutOutput: true})
	require.NoError(t, err)
	require.NotEmpty(t, list.Tasks)
	for _, task := range list.Tasks {
		require.Equal(t, bson.Type(0), task.Raw.Lookup(schema.TaskMixedout).Type)
	}
}

// testTaskFinishExtraTooLarge: with a threshold above what a document
// holds, output and mixedout within it but together too large for the
// document: the finish still lands, with the output in GridFS and no
// mixedout.
func testTaskFinishExtraTooLarge(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{OutputThreshold: 64 << 20})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 1)
	id := running(t, s, q.ID)
	out := strings.Repeat("y", 6<<20)
	mixed := strings.Repeat("y", 11<<20)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusSucceeded, Stdout: out, Stderr: "e", Extra: extra(0, mixed)}))
	got, err := s.TaskGet(ctx, id)
	require.NoError(t, err)
	require.Equal(t, schema.StatusSucceeded, got.Status)
	require.True(t, got.Stdout.InGridFS())
	text, err := s.TaskOutputRead(ctx, got.Stdout)
	require.NoError(t, err)
	require.Equal(t, len(out), len(text))
	d := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: id}})
	require.Equal(t, bson.Type(0), d.Lookup(schema.TaskMixedout).Type)
	require.Equal(t, int32(0), d.Lookup(schema.TaskResult).Int32())
}

// testTaskFinishManyAsOne: finishes written together (one update of them
// all) leave every task as a finish of its own would, field for field and
// in the same order: status, output, reason, extra fields set or removed,
// output and then_pending, the attempt counted and recorded (the history
// capped), a retry queued or held; output that looks like an expression
// stays text; so do batches whose finishes write alike but for the
// attempts' records (what they share written once). A task the batch's
// update cannot write (attempts not a list) gets its error, and the
// others are finished.
func testTaskFinishManyAsOne(t *testing.T, newStore Factory) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	s, db := newStore(t, store.Options{OutputThreshold: 1 << 20, Now: func() time.Time { return now }})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	tasks := db.Collection("tasks")
	output := bson.RawValue{Type: bson.TypeEmbeddedDocument, Value: mustMarshal(t, bson.D{{Key: "k", Value: "v"}})}
	claimed, started := now.Add(-2*time.Second), now.Add(-time.Second)
	history := make(bson.A, schema.MaxAttemptsKept)
	for i := range history {
		history[i] = bson.D{{Key: "node", Value: "old"}, {Key: "status", Value: int32(2)}}
	}
	cases := []finishCase{
		{"succeeded, no output", nil, store.TaskFinishParams{Status: schema.StatusSucceeded}},
		{"output and extra", nil, store.TaskFinishParams{Status: schema.StatusSucceeded, Stdout: "out\n", Stderr: "err\n",
			Extra: extra(0, "out\nerr\n"), Claimed: claimed, Started: started}},
		{"failed with a reason", nil, store.TaskFinishParams{Status: schema.StatusFailed, Reason: schema.ReasonTimeout, Extra: extra(-9, "")}},
		{"output to chain", bson.D{{Key: schema.TaskThenPending, Value: "older"}},
			store.TaskFinishParams{Status: schema.StatusSucceeded, Output: output, Then: "next"}},
		{"failed with output", nil, store.TaskFinishParams{Status: schema.StatusFailed, Output: output, Then: "next"}},
		{"earlier attempts' fields", bson.D{{Key: schema.TaskResult, Value: int32(3)}, {Key: schema.TaskMixedout, Value: "old"},
			{Key: schema.TaskOutput, Value: "old"}, {Key: schema.TaskThenPending, Value: "kept"}, {Key: schema.TaskAttempt, Value: int32(20)},
			{Key: schema.TaskAttempts, Value: history}, {Key: schema.TaskReason, Value: "retrying"}},
			store.TaskFinishParams{Status: schema.StatusSucceeded, Stdout: "again"}},
		{"text like expressions", nil, store.TaskFinishParams{Status: schema.StatusSucceeded, Stdout: "$status", Stderr: "bad \xff utf-8",
			Extra: extra(1, "$$REMOVE")}},
		{"retried now", bson.D{{Key: schema.TaskComplete, Value: true}, {Key: schema.TaskOutput, Value: "old"}},
			store.TaskFinishParams{Status: schema.StatusFailed, Stderr: "try 1", Extra: extra(2, "try 1"),
				Retry: &store.TaskRetryAt{Tries: 1}}},
		{"retried later", nil, store.TaskFinishParams{Status: schema.StatusFailed, Reason: schema.ReasonTimeout,
			Retry: &store.TaskRetryAt{Delay: time.Hour, Tries: 2}}},
	}
	// Each case twice: one finished alone, one among the others at once.
	asOne := func(what string, cases []finishCase) (together []bson.ObjectID) {
		t.Helper()
		var alone []bson.ObjectID
		var batch []store.TaskFinishParams
		for range cases {
			insertTasks(t, s, q.ID, 2)
		}
		// Every task is running before any finishes: a retried one is queued
		// again, and the next claim would take it.
		for _, c := range cases {
			for k := range 2 {
				id := running(t, s, q.ID)
				if c.before != nil {
					_, err := tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: c.before}})
					require.NoError(t, err)
				}
				p := c.p
				p.ID, p.Node = id, "n1"
				if k == 0 {
					alone = append(alone, id)
					continue
				}
				batch, together = append(batch, p), append(together, id)
			}
		}
		for i, c := range cases {
			p := c.p
			p.ID, p.Node = alone[i], "n1"
			require.NoError(t, s.TaskFinish(ctx, p), "%s: %s", what, c.name)
		}
		for i, err := range s.TaskFinishMany(ctx, batch) {
			require.NoError(t, err, "%s: %s", what, cases[i].name)
		}
		for i, c := range cases {
			a, b := rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: alone[i]}}), rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: together[i]}})
			// Both say where each task stood (schema.TaskPrior), each with
			// an id of its own.
			for _, doc := range []bson.Raw{a, b} {
				prior, err := schema.ParsePrior(doc.Lookup(schema.TaskPrior).StringValue())
				require.NoError(t, err, "%s: %s", what, c.name)
				require.Equal(t, schema.Prior{Queue: q.ID, Status: schema.StatusRunning, Node: "n1"}, prior, "%s: %s", what, c.name)
			}
			notPrior := func(k string) bool { return k == schema.TaskPrior }
			// A retry's not_before is by the server's clock, read by each
			// write: the two are a few milliseconds apart.
			if c.p.Retry != nil {
				require.WithinDuration(t, a.Lookup(schema.TaskNotBefore).Time(), b.Lookup(schema.TaskNotBefore).Time(), 5*time.Second, "%s: %s", what, c.name)
			}
			require.Equal(t, fieldsOf(t, a, "_id", schema.TaskParameters, schema.TaskPrior, schema.TaskNotBefore), fieldsOf(t, b, "_id", schema.TaskParameters, schema.TaskPrior, schema.TaskNotBefore), "%s: %s", what, c.name)
			require.Equal(t, slices.DeleteFunc(keysOf(t, a), notPrior), slices.DeleteFunc(keysOf(t, b), notPrior), "%s, %s: the fields' order", what, c.name)
		}
		return together
	}
	together := asOne("every kind", cases)
	require.Equal(t, "$status", rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: together[6]}}).Lookup(schema.TaskStdout).StringValue())
	// A batch whose finishes write alike but for the attempts' records
	// (written once, as literals), one task with fields to remove, one
	// whose attempt is not counted yet.
	alike := store.TaskFinishParams{Status: schema.StatusSucceeded, Stdout: "same", Extra: extra(0, "same")}
	var same []finishCase
	for i, before := range []bson.D{nil, cases[5].before, {{Key: schema.TaskAttempt, Value: nil}}, nil} {
		p := alike
		p.Claimed, p.Started = claimed.Add(time.Duration(i)*time.Millisecond), started.Add(time.Duration(i)*time.Second)
		same = append(same, finishCase{fmt.Sprintf("alike %d", i), before, p})
	}
	asOne("alike", same)
	// Alike with nothing to set but the common fields, every extra field
	// removed.
	same = nil
	for i := range 3 {
		same = append(same, finishCase{fmt.Sprintf("bare %d", i), cases[5].before, store.TaskFinishParams{Status: schema.StatusFailed, Reason: schema.ReasonTimeout}})
	}
	asOne("bare", same)

	// A task the update cannot write fails alone.
	insertTasks(t, s, q.ID, 3)
	ids := []bson.ObjectID{running(t, s, q.ID), running(t, s, q.ID), running(t, s, q.ID)}
	_, err := tasks.UpdateOne(ctx, bson.D{{Key: "_id", Value: ids[1]}}, bson.D{{Key: "$set", Value: bson.D{{Key: schema.TaskAttempts, Value: "not a list"}}}})
	require.NoError(t, err)
	var ps []store.TaskFinishParams
	for _, id := range ids {
		ps = append(ps, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusSucceeded})
	}
	errs := s.TaskFinishMany(ctx, ps)
	require.NoError(t, errs[0])
	require.Error(t, errs[1])
	require.NoError(t, errs[2])
	for i, want := range []int32{1, 0, 1} {
		require.Equal(t, want, rawDoc(t, db, "tasks", bson.D{{Key: "_id", Value: ids[i]}}).Lookup(schema.TaskStatus).Int32(), "task %d", i)
	}
}

// finishCase is a finish of TaskFinishManyAsOne: before is set on the
// task before it is claimed.
type finishCase struct {
	name   string
	before bson.D
	p      store.TaskFinishParams
}

// fieldsOf is doc's fields but those named in leave out, each as raw bytes
// of its type and value (nested documents compare in their order).
func fieldsOf(t *testing.T, doc bson.Raw, leaveOut ...string) map[string]string {
	t.Helper()
	els, err := doc.Elements()
	require.NoError(t, err)
	out := map[string]string{}
	for _, e := range els {
		if k := e.Key(); !slices.Contains(leaveOut, k) {
			out[k] = e.Value().String()
		}
	}
	return out
}

// keysOf is doc's field names, in order.
func keysOf(t *testing.T, doc bson.Raw) []string {
	t.Helper()
	els, err := doc.Elements()
	require.NoError(t, err)
	out := make([]string, len(els))
	for i, e := range els {
		out[i] = e.Key()
	}
	return out
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := bson.Marshal(v)
	require.NoError(t, err)
	return b
}

// testTaskRetryDelayByServerClock: a retry's not_before is its delay from
// the server's clock when the finish is written, not from the writer's
// (here an hour behind), alone and in a batch; a retry without a delay is
// queued at once.
func testTaskRetryDelayByServerClock(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{Now: func() time.Time { return time.Now().Add(-time.Hour) }})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	insertTasks(t, s, q.ID, 3)
	alone, batch, now := running(t, s, q.ID), running(t, s, q.ID), running(t, s, q.ID)
	server, err := s.ServerNow(ctx)
	require.NoError(t, err)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: alone, Node: "n1", Status: schema.StatusFailed,
		Retry: &store.TaskRetryAt{Delay: 10 * time.Minute, Tries: 1}}))
	for i, err := range s.TaskFinishMany(ctx, []store.TaskFinishParams{
		{ID: batch, Node: "n1", Status: schema.StatusFailed, Retry: &store.TaskRetryAt{Delay: 10 * time.Minute, Tries: 1}},
		{ID: now, Node: "n1", Status: schema.StatusFailed, Retry: &store.TaskRetryAt{Tries: 1}},
	}) {
		require.NoError(t, err, i)
	}
	for _, c := range []struct {
		what   string
		id     bson.ObjectID
		status schema.Status
		delay  time.Duration
	}{{"alone", alone, schema.StatusBlocked, 10 * time.Minute}, {"in a batch", batch, schema.StatusBlocked, 10 * time.Minute},
		{"no delay", now, schema.StatusQueued, 0}} {
		d := rawDoc(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: c.id}})
		require.Equal(t, int32(c.status), d.Lookup(schema.TaskStatus).Int32(), c.what)
		nb := d.Lookup(schema.TaskNotBefore).Time()
		require.WithinDuration(t, server.Add(c.delay), nb, 30*time.Second, "%s: not_before by the server's clock", c.what)
	}
}

// testTaskFinishNearlyFullDocument: a task whose document nearly fills
// MongoDB's 16 MiB (its parameters) is finished, alone and in a batch,
// its output put in GridFS when it does not fit beside them.
func testTaskFinishNearlyFullDocument(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	big, err := bson.Marshal(bson.D{{Key: "blob", Value: strings.Repeat("p", 16<<20-24<<10)}})
	require.NoError(t, err)
	_, err = s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{big, big}})
	require.NoError(t, err)
	out := strings.Repeat("o", 40<<10)
	alone, batched := running(t, s, q.ID), running(t, s, q.ID)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: alone, Node: "n1", Status: schema.StatusSucceeded, Stdout: out}))
	for _, err := range s.TaskFinishMany(ctx, []store.TaskFinishParams{{ID: batched, Node: "n1", Status: schema.StatusSucceeded, Stdout: out}}) {
		require.NoError(t, err)
	}
	for _, id := range []bson.ObjectID{alone, batched} {
		got, err := s.TaskGet(ctx, id)
		require.NoError(t, err)
		require.Equal(t, schema.StatusSucceeded, got.Status)
		text, err := s.TaskOutputRead(ctx, got.Stdout)
		require.NoError(t, err)
		require.Equal(t, out, text)
	}
	_ = db
}

// testTaskFinishOutputThatDoesNotFit: a success whose output does not fit
// beside its parameters in one document fails, saying so, without the
// output (its finish failed for good, and the task stayed running).
func testTaskFinishOutputThatDoesNotFit(t *testing.T, newStore Factory) {
	s, db := newStore(t, store.Options{})
	ctx := ctxT(t)
	q := newQueue(t, s, "q", schema.SortFIFO)
	big, err := bson.Marshal(bson.D{{Key: "blob", Value: strings.Repeat("p", 12<<20)}})
	require.NoError(t, err)
	_, err = s.TaskInsertMany(ctx, store.TaskInsertManyParams{Queue: q.ID, Parameters: []bson.Raw{big}})
	require.NoError(t, err)
	id := running(t, s, q.ID)
	out, err := bson.Marshal(bson.D{{Key: "v", Value: bson.D{{Key: "blob", Value: strings.Repeat("o", 6<<20)}}}})
	require.NoError(t, err)
	require.NoError(t, s.TaskFinish(ctx, store.TaskFinishParams{ID: id, Node: "n1", Status: schema.StatusSucceeded, Stdout: "ok",
		Output: bson.Raw(out).Lookup("v"), Then: "next"}))
	d := rawDoc(t, db, schema.CollTasks, bson.D{{Key: "_id", Value: id}})
	require.Equal(t, int32(schema.StatusFailed), d.Lookup(schema.TaskStatus).Int32())
	require.Equal(t, bson.Type(0), d.Lookup(schema.TaskOutput).Type)
	require.Equal(t, bson.Type(0), d.Lookup(schema.TaskThenPending).Type)
	got, err := s.TaskGet(ctx, id)
	require.NoError(t, err)
	text, err := s.TaskOutputRead(ctx, got.Stderr)
	require.NoError(t, err)
	require.Contains(t, text, "does not fit in the task's document beside its parameters")
}
