package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/internal/mongotest"
)

// TestInvariantChecker feeds the fault suite's checker synthetic outcomes,
// so that the suite is known to fail when an invariant breaks. No MongoDB.
func TestInvariantChecker(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms int) int64 { return base.Add(time.Duration(ms) * time.Millisecond).UnixNano() }
	attemptRun := func(task, node, id string, attempt int, ms int64, start int, end int) []execRecord {
		recs := []execRecord{{Ev: "start", Task: task, Node: node, Run: id, Attempt: attempt, MS: ms, T: at(start)}}
		if end >= 0 {
			recs = append(recs, execRecord{Ev: "end", Task: task, Node: node, Run: id, Attempt: attempt, MS: ms, T: at(end)})
		}
		return recs
	}
	run := func(task, node, id string, ms int64, start int, end int) []execRecord {
		return attemptRun(task, node, id, 1, ms, start, end)
	}
	// A clean outcome: a succeeded on n1; b orphaned (its node was killed
	// mid-run, no end record); c failed; d requeued from a dead node before
	// it started there and run once on n2.
	clean := func() checkInput {
		var recs []execRecord
		recs = append(recs, run("a", "n1", "r1", 50, 0, 50)...)
		recs = append(recs, run("b", "n2", "r2", 100, 10, -1)...)
		recs = append(recs, run("d", "n2", "r4", 30, 5000, 5030)...)
		return checkInput{
			Submitted: []string{"a", "b", "c", "d"},
			Tasks: []finalTask{
				{ID: "a", Status: 1, Node: "n1", Stdout: "run=r1\n", Attempt: 1},
				{ID: "b", Status: -6, Node: "n2", Attempt: 1},
				{ID: "c", Status: 2, Node: "n3", Attempt: 1},
				{ID: "d", Status: 1, Node: "n2", Stdout: "run=r4\n", Attempt: 1},
			},
			Records:  recs,
			Counters: []queueCounts{{Queue: "q", Todo: 1, Total: 4, RecountTodo: 1, RecountTotal: 4}},
		}
	}
	problems := func(r checkReport) string { return strings.Join(r.Problems(), "\n") }

	t.Run("clean", func(t *testing.T) {
		r := checkInvariants(clean())
		require.Empty(t, r.Problems())
		require.Equal(t, 4, r.Submitted)
		require.Equal(t, 3, r.Runs)
		require.Equal(t, 2, r.Ended)
		require.Zero(t, r.Lost())
		require.Equal(t, map[int]int{1: 2, 2: 1, -6: 1}, r.ByStatus)
		require.Contains(t, r.Summary(), "tasks=4 runs=3 ended=2 succeeded=2 failed=1 orphaned=1")
	})

	t.Run("overlap on two nodes", func(t *testing.T) {
		in := clean()
		// b's run on n2 has no end record: it may have lasted until
		// 10+100+margin ms, so a run on n3 from 150 ms overlaps.
		in.Records = append(in.Records, run("b", "n3", "r5", 20, 150, 170)...)
		r := checkInvariants(in)
		require.Len(t, r.Overlaps, 1, problems(r))
		require.Contains(t, r.Overlaps[0], "run r2 (attempt 1) on n2")
		require.Contains(t, r.Overlaps[0], "run r5 (attempt 1) on n3")
		require.Contains(t, problems(r), "overlapping times")
		// Later than that, it is a second run but no overlap.
		in = clean()
		in.Records = append(in.Records, run("b", "n3", "r5", 20, 400, 420)...)
		r = checkInvariants(in)
		require.Empty(t, r.Overlaps)
		require.Empty(t, r.RunTwice, "one ended run only")
	})

	t.Run("succeeded task run twice", func(t *testing.T) {
		in := clean()
		in.Records = append(in.Records, run("a", "n3", "r6", 50, 1000, 1050)...)
		r := checkInvariants(in)
		require.Len(t, r.RunTwiceSucceeded, 1, problems(r))
		require.Len(t, r.RunTwice, 1)
		require.Contains(t, problems(r), "run to the end more than once")
		require.Contains(t, r.Summary(), "run_twice=1")
	})

	// e failed its first attempt on n1 and succeeded on its second on n2,
	// with the queue's retries at 2.
	retried := func() checkInput {
		in := clean()
		in.Retries = 2
		in.Tasks[2].Attempt = 3 // c failed all three attempts
		in.Submitted = append(in.Submitted, "e")
		in.Tasks = append(in.Tasks, finalTask{ID: "e", Status: 1, Node: "n2", Stdout: "run=r7\n", Attempt: 2, FailUntil: 1})
		in.Records = append(in.Records, attemptRun("e", "n1", "r6", 1, 20, 100, 120)...)
		in.Records = append(in.Records, attemptRun("e", "n2", "r7", 2, 20, 300, 320)...)
		return in
	}

	t.Run("retries are not runs twice", func(t *testing.T) {
		r := checkInvariants(retried())
		require.Empty(t, r.Problems())
		require.Empty(t, r.RunTwice)
		require.Equal(t, 1, r.Retried)
		require.Contains(t, r.Summary(), "retried=1")
	})

	t.Run("one attempt run twice", func(t *testing.T) {
		in := retried()
		in.Records = append(in.Records, attemptRun("e", "n3", "r8", 2, 20, 500, 520)...)
		r := checkInvariants(in)
		require.Len(t, r.RunTwiceSucceeded, 1, problems(r))
		require.Contains(t, r.RunTwiceSucceeded[0], "run r8 (attempt 2) on n3")
	})

	t.Run("more attempts than retries", func(t *testing.T) {
		in := retried()
		in.Retries = 0
		r := checkInvariants(in)
		require.Len(t, r.TooManyAttempts, 1, problems(r))
		require.Contains(t, problems(r), "task e ran attempt 2, retries 0")
	})

	t.Run("result of an earlier attempt", func(t *testing.T) {
		in := retried()
		in.Tasks[len(in.Tasks)-1].Stdout = "run=r6\n"
		in.Tasks[len(in.Tasks)-1].Node = "n1"
		r := checkInvariants(in)
		require.Len(t, r.BadResult, 1, problems(r))
		require.Contains(t, r.BadResult[0], "run r6 was attempt 1, the task records 2 attempts")
	})

	t.Run("failed with retries left", func(t *testing.T) {
		in := retried()
		in.Tasks[2].Attempt = 2 // c failed on its second attempt of three
		r := checkInvariants(in)
		require.Len(t, r.NotRetried, 1, problems(r))
		require.Contains(t, problems(r), "task c on n3 failed on attempt 2 of 3")
		in.Tasks[2].Reason = "killed" // a kill is never retried
		require.Empty(t, checkInvariants(in).NotRetried)
		in.Tasks[2].Reason, in.Tasks[2].Attempt = "", 3 // its retries spent
		require.Empty(t, checkInvariants(in).NotRetried)
	})

	t.Run("lost tasks", func(t *testing.T) {
		in := clean()
		in.Submitted = append(in.Submitted, "e", "f")
		in.Tasks = append(in.Tasks, finalTask{ID: "f", Status: 0, Node: "n1"}, finalTask{ID: "g", Status: 1, Node: "n1", Stdout: "run=r1\n"})
		r := checkInvariants(in)
		require.Equal(t, []string{"e"}, r.Missing, problems(r))
		require.Len(t, r.Stuck, 1)
		require.Contains(t, r.Stuck[0], "f status=0")
		require.Equal(t, []string{"g"}, r.Extra)
		require.Equal(t, 2, r.Lost())
		require.Contains(t, r.BadResult[0], "run r1 was not a run of this task")
		require.Contains(t, problems(r), "vanished")
	})

	t.Run("overwritten result", func(t *testing.T) {
		in := clean()
		in.Overwrites = []overwrite{{Task: "a", Before: 1, Change: "update status=2"}}
		r := checkInvariants(in)
		require.Len(t, r.Overwrite, 1)
		require.Contains(t, problems(r), "finished tasks changed afterwards")
		require.Contains(t, problems(r), "task a (status 1): update status=2")
	})

	t.Run("result of another run", func(t *testing.T) {
		in := clean()
		in.Tasks[0].Stdout = "run=nope\n"
		in.Tasks[3].Node = "n1" // d's run was on n2
		r := checkInvariants(in)
		require.Len(t, r.BadResult, 2, problems(r))
		in = clean()
		in.Records = in.Records[:len(in.Records)-1] // r4 never ended
		r = checkInvariants(in)
		require.Len(t, r.BadResult, 1, problems(r))
		require.Contains(t, r.BadResult[0], "never ended")
	})

	t.Run("counter drift", func(t *testing.T) {
		in := clean()
		in.Counters[0].Todo = 3
		r := checkInvariants(in)
		require.Equal(t, int64(2), r.DriftSum)
		require.Contains(t, problems(r), "count_todo 3 (recount 1)")
	})

	t.Run("broken records", func(t *testing.T) {
		in := clean()
		in.Records = append(in.Records, execRecord{Ev: "end", Task: "c", Node: "n3", Run: "zz", T: at(5)})
		r := checkInvariants(in)
		require.Len(t, r.Records, 1)
		require.Contains(t, problems(r), "ended without starting")
	})
}

// TestTaskWatcherSeesOverwrites checks the fault suite's change-stream
// watcher on the shared replica set: changes to unfinished tasks pass,
// any change to a finished one (1, 2, -6) is reported.
func TestTaskWatcherSeesOverwrites(t *testing.T) {
	t.Parallel()
	db := mongotest.Database(t)
	w := startWatcher(t, db)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	coll := db.Collection("tasks")
	q := bson.NewObjectID()
	var ids []bson.ObjectID
	for range 3 {
		id, doc := newTask(q, 10)
		_, err := coll.InsertOne(ctx, doc)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	set := func(id bson.ObjectID, status int) {
		t.Helper()
		_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: status}}}})
		require.NoError(t, err)
	}
	// A normal life: -2, -1, 0, 1; and an orphan: -2, -1, 0, -6.
	for _, s := range []int{-1, 0, 1} {
		set(ids[0], s)
	}
	for _, s := range []int{-1, 0, -6} {
		set(ids[1], s)
	}
	w.sync(t)
	require.Empty(t, w.overwritten())

	// Finished, then changed: reported, with what changed.
	set(ids[0], 2)
	set(ids[1], 1)
	_, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: ids[1]}})
	require.NoError(t, err)
	set(ids[2], -1) // still unfinished: fine
	w.sync(t)
	got := w.overwritten()
	require.Len(t, got, 3, "%v", got)
	require.Equal(t, overwrite{Task: ids[0].Hex(), Before: 1, Change: "update status=2"}, got[0])
	require.Equal(t, overwrite{Task: ids[1].Hex(), Before: -6, Change: "update status=1"}, got[1])
	require.Equal(t, overwrite{Task: ids[1].Hex(), Before: 1, Change: "deleted"}, got[2])
	_, problems := w.stats()
	require.Empty(t, problems)
}

// TestRecoveryTime checks how the suite measures recovery from the start
// records.
func TestRecoveryTime(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := func(ms ...int) []execRecord {
		var out []execRecord
		for _, m := range ms {
			out = append(out, execRecord{Ev: "start", T: base.Add(time.Duration(m) * time.Millisecond).UnixNano()})
		}
		return out
	}
	fault, until := base.Add(time.Second), base.Add(time.Minute)
	// Starts at 900 ms, the fault at 1 s, one straggler at 1.01 s, nothing
	// until 4 s: a 2.99 s outage, flowing again 3 s after the fault.
	first, outage, recovered := recovery(rec(100, 900, 1010, 4000, 4050), fault, until)
	require.Equal(t, 10*time.Millisecond, first)
	require.Equal(t, 2990*time.Millisecond, outage)
	require.Equal(t, 3*time.Second, recovered)
	// No pause worth the name: recovered at the first start.
	_, outage, recovered = recovery(rec(900, 1100, 1300, 1500), fault, until)
	require.Equal(t, 200*time.Millisecond, outage)
	require.Equal(t, 100*time.Millisecond, recovered)
	// Nothing after the fault.
	first, _, recovered = recovery(rec(900), fault, until)
	require.Equal(t, time.Duration(-1), first)
	require.Equal(t, time.Duration(-1), recovered)
}
