package schema

import (
	"fmt"
	"math"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Task control fields: this project's own, ignored by Disbatch 4 tools,
// which see only the status they set (README, "Task control").
const (
	// TaskReason says, machine-readably, why a task ended or is held
	// (Reason*); null or absent when it ended as its plugin said.
	TaskReason = "reason"
	// TaskAttempts is the task's history: one entry per attempt
	// ({node, claimed, started, finished, status, reason}), the newest
	// last, at most MaxAttemptsKept.
	TaskAttempts = "attempts"
	// TaskAttempt counts the attempts that ended (never capped).
	TaskAttempt = "attempt"
	// TaskTries counts the failed attempts since the task was submitted or
	// last requeued by an operator: its queue's retries are spent on it.
	TaskTries = "tries"
	// TaskTimeout is the task's own time limit in seconds (overrides the
	// queue's timeout; 0: none).
	TaskTimeout = "timeout"
	// TaskExpiresAt: a task not started by then finishes unrun (ReasonExpired).
	TaskExpiresAt = "expires_at"
	// TaskNotBefore: a task held (StatusBlocked) until then, then queued.
	TaskNotBefore = "not_before"
	// TaskCancel records who cancelled a task ({by, at, reason}).
	TaskCancel = "cancel"
	// TaskRequeued records the last requeue by an operator ({by, at}).
	TaskRequeued = "requeued"
	// TaskPriority orders a queue's tasks when its sort is SortPriority:
	// higher first. An integer from 1 to MaxTaskPriority; absent means 0,
	// and 0 is never written, so the tasks without one come after all
	// the others, oldest first.
	TaskPriority = "priority"
)

// MaxTaskPriority bounds a task's priority.
const MaxTaskPriority = math.MaxInt32

// The reasons a task ends or is held for. A task that ends as its plugin
// said has no reason.
const (
	ReasonKilled       = "killed"        // an operator killed it (running or claimed)
	ReasonCancelled    = "cancelled"     // an operator cancelled it before it ran
	ReasonTimeout      = "timeout"       // its node killed it at its deadline
	ReasonExpired      = "expired"       // not started by its expires_at
	ReasonParentFailed = "parent_failed" // a task it waited on failed
	ReasonOrphaned     = "orphaned"      // its node went away while running it
	ReasonRetrying     = "retrying"      // held (StatusBlocked) until its retry
	ReasonRequeued     = "requeued"      // an operator requeued it
	ReasonRerun        = "rerun"         // requeued after its node died (rerun_orphans)
	ReasonFenced       = "fenced"        // its node fenced itself (no heartbeat acknowledged) and killed it
)

// Reasons lists the reasons a task can carry, for validating filters.
var Reasons = []string{ReasonKilled, ReasonCancelled, ReasonTimeout, ReasonExpired, ReasonParentFailed,
	ReasonOrphaned, ReasonRetrying, ReasonRequeued, ReasonRerun, ReasonFenced}

// MaxAttemptsKept bounds a task's attempts history.
const MaxAttemptsKept = 20

// Attempt is one entry of a task's attempts history.
type Attempt struct {
	Node     string    `bson:"node"`
	Claimed  time.Time `bson:"claimed,omitempty"`
	Started  time.Time `bson:"started,omitempty"`
	Finished time.Time `bson:"finished"`
	Status   Status    `bson:"status"`
	Reason   string    `bson:"reason,omitempty"`
}

// KillRequest is an operator's request to kill a task (the kill field):
// the node that held it when asked, who asked, when, and why.
type KillRequest struct {
	Node   string
	By     string
	At     time.Time
	Reason string
}

// Kill request field names.
const (
	KillNode   = "node"
	KillBy     = "by"
	KillAt     = "at"
	KillReason = "reason"
)

// TaskControl is what a task says about its control: limits, holds, the
// kill request, and its history.
type TaskControl struct {
	Reason    string
	Attempt   int
	Tries     int
	Timeout   time.Duration // 0: none of its own
	ExpiresAt time.Time     // zero: never
	NotBefore time.Time     // zero: none
	Priority  int64         // 0: none (TaskPriority)
	Kill      *KillRequest
	Attempts  []Attempt
}

// decodeControl reads the control fields of a task.
func decodeControl(r *reader) TaskControl {
	c := TaskControl{
		ExpiresAt: r.dateOnly(TaskExpiresAt),
		NotBefore: r.dateOnly(TaskNotBefore),
		Timeout:   r.seconds(TaskTimeout),
	}
	if _, v, ok := r.lookup(TaskReason); ok {
		c.Reason, _ = v.StringValueOK()
	}
	if n := r.count(TaskAttempt); n != nil {
		c.Attempt = int(*n)
	}
	if n := r.count(TaskTries); n != nil {
		c.Tries = int(*n)
	}
	if _, v, ok := r.lookup(TaskPriority); ok {
		// Only an order: a priority some other writer mistyped is shown
		// as none rather than failing the task.
		c.Priority, _ = v.AsInt64OK()
	}
	if _, v, ok := r.lookup(TaskKill); ok {
		doc, isDoc := v.DocumentOK()
		if !isDoc {
			r.fail(TaskKill, wantGot("an object", v))
			return c
		}
		k := DecodeKillRequest(doc)
		c.Kill = &k
	}
	if _, v, ok := r.lookup(TaskAttempts); ok {
		// The history is informative: an unreadable one is ignored.
		_ = v.Unmarshal(&c.Attempts)
	}
	return c
}

// DecodeKillRequest reads a kill field's object; missing or mistyped
// members stay empty.
func DecodeKillRequest(doc bson.Raw) KillRequest {
	var k KillRequest
	k.Node, _ = doc.Lookup(KillNode).StringValueOK()
	k.By, _ = doc.Lookup(KillBy).StringValueOK()
	k.Reason, _ = doc.Lookup(KillReason).StringValueOK()
	if at, ok := doc.Lookup(KillAt).TimeOK(); ok {
		k.At = at.UTC()
	}
	return k
}

// dateOnly reads a BSON date (nothing else: a time limit must be exact).
func (r *reader) dateOnly(name string) time.Time {
	_, v, ok := r.lookup(name)
	if !ok {
		return time.Time{}
	}
	t, ok := v.TimeOK()
	if !ok {
		r.fail(name, wantGot("a date", v))
		return time.Time{}
	}
	return t.UTC()
}

// seconds reads a non-negative number of seconds.
func (r *reader) seconds(name string) time.Duration {
	_, v, ok := r.lookup(name)
	if !ok {
		return 0
	}
	d, err := Seconds(v)
	if err != nil {
		r.fail(name, err)
	}
	return d
}

// Seconds reads a non-negative number of seconds (an integer or a double)
// as a duration.
func Seconds(v bson.RawValue) (time.Duration, error) {
	var f float64
	switch v.Type {
	case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble:
		f = v.AsFloat64()
	default:
		return 0, wantGot("a number of seconds", v)
	}
	if math.IsNaN(f) || f < 0 || f > MaxSeconds {
		return 0, fmt.Errorf("%v seconds is out of range: want 0 to %d", f, MaxSeconds)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// MaxSeconds bounds the time limits and backoffs documents may hold (a
// year).
const MaxSeconds = 365 * 24 * 3600

// Backoff is a queue's retry_backoff: the delay before retry n is
// min(Max, Base × 2^(n-1)), spread by ±Jitter (a fraction, 0..1).
type Backoff struct {
	Base   time.Duration
	Max    time.Duration
	Jitter float64
}

// Retry backoff field names.
const (
	BackoffBase   = "base"
	BackoffMax    = "max"
	BackoffJitter = "jitter"
)

// DefaultBackoff is used for a queue with retries and no retry_backoff.
var DefaultBackoff = Backoff{Base: time.Second, Max: 5 * time.Minute, Jitter: 0.2}

// QueueControl is what a queue says about its tasks' control.
type QueueControl struct {
	Timeout      time.Duration // 0: none
	Retries      int           // failed attempts retried (0: none)
	Backoff      Backoff
	RerunOrphans bool
}

// Queue control field names.
const (
	QueueTimeout      = "timeout"
	QueueRetries      = "retries"
	QueueRetryBackoff = "retry_backoff"
	QueueRerunOrphans = "rerun_orphans"
)

// MaxRetries bounds a queue's retries.
const MaxRetries = 1000

func decodeQueueControl(r *reader) QueueControl {
	c := QueueControl{Timeout: r.seconds(QueueTimeout), RerunOrphans: r.flag(QueueRerunOrphans), Backoff: DefaultBackoff}
	if n := r.count(QueueRetries); n != nil {
		if *n > MaxRetries {
			r.fail(QueueRetries, fmt.Errorf("%d is out of range: want 0 to %d", *n, MaxRetries))
		}
		c.Retries = int(*n)
	}
	if _, v, ok := r.lookup(QueueRetryBackoff); ok {
		doc, isDoc := v.DocumentOK()
		if !isDoc {
			r.fail(QueueRetryBackoff, wantGot("an object {base, max, jitter}", v))
			return c
		}
		b, err := DecodeBackoff(doc)
		if err != nil {
			r.fail(QueueRetryBackoff, err)
		}
		c.Backoff = b
	}
	return c
}

// DecodeBackoff reads a retry_backoff object: base and max in seconds,
// jitter a fraction; missing fields take DefaultBackoff's values.
func DecodeBackoff(doc bson.Raw) (Backoff, error) {
	b := DefaultBackoff
	for _, f := range []struct {
		name string
		to   *time.Duration
	}{{BackoffBase, &b.Base}, {BackoffMax, &b.Max}} {
		v, err := doc.LookupErr(f.name)
		if err != nil || v.Type == bson.TypeNull {
			continue
		}
		d, err := Seconds(v)
		if err != nil {
			return b, fmt.Errorf("%s: %w", f.name, err)
		}
		*f.to = d
	}
	if v, err := doc.LookupErr(BackoffJitter); err == nil && v.Type != bson.TypeNull {
		f, ok := v.AsFloat64OK()
		if !ok || math.IsNaN(f) || f < 0 || f > 1 {
			return b, fmt.Errorf("%s: want a fraction from 0 to 1, got %s", BackoffJitter, describe(v))
		}
		b.Jitter = f
	}
	if b.Max < b.Base {
		return b, fmt.Errorf("max (%s) is below base (%s)", b.Max, b.Base)
	}
	return b, nil
}
