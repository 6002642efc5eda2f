package integration

// The fault suite's invariant checker: a pure function of what the suite
// collected (tasks submitted, tasks as they ended, the recorder plugin's
// execution records, the changes seen on finished tasks, the queue
// counters), so that it can be tested on synthetic input
// (fault_check_unit_test.go).

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// execRecord is one line of the recorder plugin (testdata/recorder).
type execRecord struct {
	Ev   string `json:"ev"` // "start" or "end"
	Task string `json:"task"`
	Node string `json:"node"`
	Run  string `json:"run"`
	// Attempt is the task's attempt the run was (1 for the first; a
	// queue's retries run a failed task again as the next attempt).
	Attempt int   `json:"attempt"`
	PID     int   `json:"pid"`
	MS      int64 `json:"ms"`
	T       int64 `json:"t"` // wall time, Unix ns
}

// readRecords reads the recorder's file; a missing file is no records.
func readRecords(path string) ([]execRecord, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []execRecord
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var r execRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return out, fmt.Errorf("%s:%d: %w: %q", path, n, err, sc.Text())
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// execution is one run of the plugin, from its start and end records.
type execution struct {
	Task, Node, Run string
	Attempt         int
	PID             int
	MS              int64
	Start, End      time.Time // End is zero without an end record
}

// ended reports whether the run wrote its end record (it ran to the end).
func (e execution) ended() bool { return !e.End.IsZero() }

// until is when the run ended, or for one without an end record (killed
// with its plugin or its node) the latest it can have ended: it sleeps ms
// and then writes the end record, so start + ms + margin.
func (e execution) until(margin time.Duration) time.Time {
	if e.ended() {
		return e.End
	}
	return e.Start.Add(time.Duration(e.MS)*time.Millisecond + margin)
}

func (e execution) String() string {
	end := "killed"
	if e.ended() {
		end = e.End.Format("15:04:05.000")
	}
	return fmt.Sprintf("run %s (attempt %d) on %s [%s, %s]", e.Run, e.Attempt, e.Node, e.Start.Format("15:04:05.000"), end)
}

// finalTask is a task as it is at the end of a scenario.
type finalTask struct {
	ID     string
	Status int
	Node   string
	Stdout string
	Stderr string
	Detail string // for reports: mtime, claim token
	// Attempt is the task's count of ended attempts (its attempt field),
	// Reason its reason, FailUntil its parameters.fail_until: the recorder
	// fails its attempts up to that one.
	Attempt   int
	Reason    string
	FailUntil int
}

// overwrite is a change the watcher saw to a task that was already
// finished (status 1, 2 or -6).
type overwrite struct {
	Task   string
	Before int    // the status it had
	Change string // what the event did
}

func (o overwrite) String() string {
	return fmt.Sprintf("task %s (status %d): %s", o.Task, o.Before, o.Change)
}

// queueCounts are a queue's stored counters and a recount.
type queueCounts struct {
	Queue                     string
	Todo, Total               int64 // count_todo, count_total on the queue document
	RecountTodo, RecountTotal int64 // countDocuments: status <= 0, all
}

// checkInput is everything the checker judges.
type checkInput struct {
	Submitted  []string // ids of the tasks the suite inserted
	Tasks      []finalTask
	Records    []execRecord
	Overwrites []overwrite
	Counters   []queueCounts
	// Retries is the queue's retries: a failed attempt runs again as the
	// next, up to attempt 1 + Retries.
	Retries int
	// Margin is how long past start + ms a run without end record may have
	// lasted (default 100 ms).
	Margin time.Duration
}

// checkReport is what the checker found. Problems lists the violations.
type checkReport struct {
	Submitted, Found int
	ByStatus         map[int]int
	Runs, Ended      int // executions started, and run to the end
	Retried          int // tasks that ran more than one attempt
	// EndedOrphaned counts tasks orphaned (-6) although a run of theirs
	// ended: the work was done, its result not recorded (allowed: its
	// node died or was cut off before it could write it).
	EndedOrphaned int

	Missing  []string // submitted, not in the database: vanished
	Extra    []string // in the database, never submitted
	Stuck    []string // not finished: status -2, -1, 0 (or another non-final one)
	Overlaps []string // two runs of one task at overlapping times
	// RunTwice are tasks with more than one run of one attempt that ended
	// (any status); the runs of successive attempts are retries, not runs
	// twice.
	RunTwice []string
	// RunTwiceSucceeded are the RunTwice tasks that ended in status 1: a
	// result recorded although the task's work was done twice.
	RunTwiceSucceeded []string
	// BadResult: status 1 whose stdout names no ended run of its node, or
	// a run of another attempt than the task's last.
	BadResult []string
	// TooManyAttempts are tasks run as more attempts than 1 + Retries.
	TooManyAttempts []string
	// NotRetried are tasks that failed as their plugin said (no reason)
	// while the queue's retries were not spent.
	NotRetried []string
	Records    []string // records that do not pair up
	Overwrite  []overwrite
	Drift      []string // counters that differ from a recount
	DriftSum   int64    // sum of |count - recount| over queues and counters
}

// Lost is how many submitted tasks vanished or never finished.
func (r checkReport) Lost() int { return len(r.Missing) + len(r.Stuck) }

// Problems lists every violated invariant, one line each.
func (r checkReport) Problems() []string {
	var p []string
	add := func(what string, items []string) {
		if len(items) == 0 {
			return
		}
		shown := items
		if len(shown) > 20 {
			shown = append(slices.Clone(shown[:20]), fmt.Sprintf("... and %d more", len(items)-20))
		}
		p = append(p, fmt.Sprintf("%s (%d):\n    %s", what, len(items), strings.Join(shown, "\n    ")))
	}
	add("tasks vanished (submitted, not in the database)", r.Missing)
	add("tasks that were never submitted", r.Extra)
	add("tasks not finished (not 1, 2 or -6)", r.Stuck)
	add("runs of one task at overlapping times", r.Overlaps)
	add("succeeded tasks run to the end more than once", r.RunTwiceSucceeded)
	add("succeeded tasks whose stdout names no ended run of their last attempt on their node", r.BadResult)
	add("tasks run as more attempts than the queue's retries allow", r.TooManyAttempts)
	add("tasks failed with retries left, not retried", r.NotRetried)
	add("records that do not pair up", r.Records)
	var ow []string
	for _, o := range r.Overwrite {
		ow = append(ow, o.String())
	}
	add("finished tasks changed afterwards", ow)
	add("queue counters differ from a recount", r.Drift)
	return p
}

// Summary is the one-line account of a scenario's tasks.
func (r checkReport) Summary() string {
	return fmt.Sprintf("tasks=%d runs=%d ended=%d succeeded=%d failed=%d orphaned=%d (ended but orphaned %d) retried=%d lost=%d run_twice=%d overlaps=%d overwrites=%d drift=%d",
		r.Submitted, r.Runs, r.Ended, r.ByStatus[1], r.ByStatus[2], r.ByStatus[-6], r.EndedOrphaned, r.Retried,
		r.Lost(), len(r.RunTwice), len(r.Overlaps), len(r.Overwrite), r.DriftSum)
}

// checkInvariants judges a scenario's outcome:
//
//   - every submitted task is in the database and none other; each ended
//     in 1, 2 or -6;
//   - no task had two runs at overlapping times (a run without end record
//     lasted at most start + ms + margin), and no succeeded task ran one
//     attempt to the end twice (RunTwice also counts the others, which are
//     reported but allowed);
//   - no task ran as more than 1 + Retries attempts, and none failed as
//     its plugin said with retries left;
//   - the stdout of each succeeded task names a run of its last attempt
//     that ended, on the node the task names;
//   - no finished task was changed afterwards;
//   - the queue counters equal a recount.
func checkInvariants(in checkInput) checkReport {
	margin := in.Margin
	if margin <= 0 {
		margin = 100 * time.Millisecond
	}
	r := checkReport{Submitted: len(in.Submitted), Found: len(in.Tasks), ByStatus: map[int]int{}}

	tasks := map[string]finalTask{}
	for _, t := range in.Tasks {
		tasks[t.ID] = t
		r.ByStatus[t.Status]++
	}
	submitted := map[string]bool{}
	for _, id := range in.Submitted {
		submitted[id] = true
		if _, ok := tasks[id]; !ok {
			r.Missing = append(r.Missing, id)
		}
	}
	for _, t := range in.Tasks {
		if !submitted[t.ID] {
			r.Extra = append(r.Extra, t.ID)
		}
		switch t.Status {
		case 1, 2, -6:
		default:
			r.Stuck = append(r.Stuck, strings.TrimSpace(fmt.Sprintf("%s status=%d node=%s %s", t.ID, t.Status, t.Node, t.Detail)))
		}
	}

	// Pair the records into executions, by run id.
	runs := map[string]*execution{}
	var order []string
	for _, rec := range in.Records {
		at := time.Unix(0, rec.T)
		e := runs[rec.Run]
		switch rec.Ev {
		case "start":
			if e != nil {
				r.Records = append(r.Records, fmt.Sprintf("run %s of task %s started twice", rec.Run, rec.Task))
				continue
			}
			runs[rec.Run] = &execution{Task: rec.Task, Node: rec.Node, Run: rec.Run, Attempt: rec.Attempt, PID: rec.PID, MS: rec.MS, Start: at}
			order = append(order, rec.Run)
		case "end":
			switch {
			case e == nil:
				r.Records = append(r.Records, fmt.Sprintf("run %s of task %s ended without starting", rec.Run, rec.Task))
			case e.ended():
				r.Records = append(r.Records, fmt.Sprintf("run %s of task %s ended twice", rec.Run, rec.Task))
			default:
				e.End = at
			}
		default:
			r.Records = append(r.Records, fmt.Sprintf("record of run %s has event %q", rec.Run, rec.Ev))
		}
	}
	byTask := map[string][]execution{}
	for _, id := range order {
		e := *runs[id]
		byTask[e.Task] = append(byTask[e.Task], e)
		r.Runs++
		if e.ended() {
			r.Ended++
		}
		if _, ok := tasks[e.Task]; !ok {
			r.Records = append(r.Records, fmt.Sprintf("run %s is of task %s, which is not in the database", e.Run, e.Task))
		}
	}

	ids := make([]string, 0, len(byTask))
	for id := range byTask {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		es := byTask[id]
		sort.Slice(es, func(i, j int) bool { return es[i].Start.Before(es[j].Start) })
		ended := map[int]int{} // attempt -> runs that ended
		twice, attempts := false, 0
		for i, a := range es {
			if a.ended() {
				ended[a.Attempt]++
				twice = twice || ended[a.Attempt] > 1
			}
			attempts = max(attempts, a.Attempt)
			for _, b := range es[i+1:] {
				if b.Start.Before(a.until(margin)) {
					r.Overlaps = append(r.Overlaps, fmt.Sprintf("task %s: %v overlaps %v", id, a, b))
				}
			}
		}
		if attempts > 1 {
			r.Retried++
		}
		if attempts > 1+in.Retries {
			r.TooManyAttempts = append(r.TooManyAttempts, fmt.Sprintf("task %s ran attempt %d, retries %d", id, attempts, in.Retries))
		}
		if twice {
			var desc []string
			for _, e := range es {
				desc = append(desc, e.String())
			}
			line := fmt.Sprintf("task %s (status %d): %s", id, tasks[id].Status, strings.Join(desc, "; "))
			r.RunTwice = append(r.RunTwice, line)
			if tasks[id].Status == 1 {
				r.RunTwiceSucceeded = append(r.RunTwiceSucceeded, line)
			}
		}
		if len(ended) > 0 && tasks[id].Status == -6 {
			r.EndedOrphaned++
		}
	}

	for _, t := range in.Tasks {
		if t.Status != 1 {
			continue
		}
		run, ok := strings.CutPrefix(strings.TrimSpace(t.Stdout), "run=")
		e := runs[run]
		switch {
		case !ok:
			r.BadResult = append(r.BadResult, fmt.Sprintf("task %s on %s: stdout %q names no run", t.ID, t.Node, t.Stdout))
		case e == nil || e.Task != t.ID:
			r.BadResult = append(r.BadResult, fmt.Sprintf("task %s on %s: run %s was not a run of this task", t.ID, t.Node, run))
		case !e.ended():
			r.BadResult = append(r.BadResult, fmt.Sprintf("task %s on %s: run %s never ended", t.ID, t.Node, run))
		case e.Node != t.Node:
			r.BadResult = append(r.BadResult, fmt.Sprintf("task %s on %s: run %s was on node %s", t.ID, t.Node, run, e.Node))
		case e.Attempt != t.Attempt:
			r.BadResult = append(r.BadResult, fmt.Sprintf("task %s on %s: run %s was attempt %d, the task records %d attempts", t.ID, t.Node, run, e.Attempt, t.Attempt))
		}
	}
	for _, t := range in.Tasks {
		if t.Status == 2 && t.Reason == "" && t.Attempt <= in.Retries {
			r.NotRetried = append(r.NotRetried, fmt.Sprintf("task %s on %s failed on attempt %d of %d", t.ID, t.Node, t.Attempt, 1+in.Retries))
		}
	}

	for i, line := range r.Stuck {
		id, _, _ := strings.Cut(line, " ")
		r.Stuck[i] = fmt.Sprintf("%s runs=%d", line, len(byTask[id]))
	}

	r.Overwrite = in.Overwrites
	for _, c := range in.Counters {
		dTodo, dTotal := c.Todo-c.RecountTodo, c.Total-c.RecountTotal
		if dTodo != 0 || dTotal != 0 {
			r.Drift = append(r.Drift, fmt.Sprintf("queue %s: count_todo %d (recount %d), count_total %d (recount %d)",
				c.Queue, c.Todo, c.RecountTodo, c.Total, c.RecountTotal))
		}
		r.DriftSum += abs64(dTodo) + abs64(dTotal)
	}
	sort.Strings(r.Missing)
	sort.Strings(r.Extra)
	sort.Strings(r.Stuck)
	return r
}

// failureReasons counts the failed (status 2) tasks by the last line of
// their stderr.
func failureReasons(ts []finalTask) map[string]int {
	out := map[string]int{}
	for _, t := range ts {
		if t.Status == 2 {
			out[lastLine(t.Stderr)]++
		}
	}
	return out
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// lastLine is the last non-empty line of s, at most 160 bytes.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}
