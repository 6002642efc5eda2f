package schema

import (
	"math"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Status is a task status code. Seed 000 defines the named ones; any other
// integer is allowed: a positive value means finished, a negative one means
// not yet runnable and still counts in count_todo.
type Status int

// The Disbatch 4 status codes.
const (
	StatusOrphaned   Status = -6
	StatusCancelled  Status = -5 // formerly defined; free for other uses
	StatusBlocked    Status = -4 // formerly defined; free for other uses
	StatusTerminated Status = -3 // formerly defined; free for other uses
	StatusQueued     Status = -2
	StatusClaimed    Status = -1
	StatusRunning    Status = 0
	StatusSucceeded  Status = 1
	StatusFailed     Status = 2
)

var statusNames = map[Status]string{
	StatusOrphaned:   "orphaned",
	StatusCancelled:  "cancelled",
	StatusBlocked:    "blocked",
	StatusTerminated: "terminated",
	StatusQueued:     "queued",
	StatusClaimed:    "claimed",
	StatusRunning:    "running",
	StatusSucceeded:  "succeeded",
	StatusFailed:     "failed",
}

// String returns the status name, or the number for codes without a name.
func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return strconv.Itoa(int(s))
}

// Todo reports whether a task with this status counts in count_todo
// (status <= 0).
func (s Status) Todo() bool { return s <= 0 }

// Finished reports whether the status is a finished one (> 0).
func (s Status) Finished() bool { return s > 0 }

// ParseStatus accepts a status name ("queued", "failed", ...) or an integer.
func ParseStatus(s string) (Status, error) {
	for code, name := range statusNames {
		if name == s {
			return code, nil
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, &statusError{s}
	}
	return Status(n), nil
}

type statusError struct{ s string }

func (e *statusError) Error() string {
	return "unknown status " + strconv.Quote(e.s) +
		": want an integer or one of orphaned, cancelled, blocked, terminated, queued, claimed, running, succeeded, failed"
}

// Number is v's value when it is a BSON number (int32, int64, double or
// decimal), as MongoDB compares numbers across their types: a status
// stored as 1.0 or a decimal 2 is the status 1 or 2 to a query. ok is
// false for any other type (missing, null, a string...).
func Number(v bson.RawValue) (f float64, ok bool) {
	switch v.Type {
	case bson.TypeInt32, bson.TypeInt64:
		return float64(v.AsInt64()), true
	case bson.TypeDouble:
		return v.Double(), true
	case bson.TypeDecimal128:
		f, err := strconv.ParseFloat(v.Decimal128().String(), 64)
		return f, err == nil
	}
	return 0, false
}

// TodoValue reports whether a task whose stored status is v counts in
// count_todo: {$lte: [status, 0]} in MongoDB's comparison order. Missing,
// null, MinKey and numbers <= 0 of any type sort at or below 0 (NaN below
// every number); strings, objects, arrays and the rest above.
func TodoValue(v bson.RawValue) bool {
	switch v.Type {
	case 0, bson.TypeNull, bson.TypeUndefined, bson.TypeMinKey:
		return true
	}
	f, ok := Number(v)
	return ok && (f <= 0 || math.IsNaN(f))
}

// RunningValue reports whether a task whose stored status is v counts in
// count_running: {$or: [{$eq: [status, -1]}, {$eq: [status, 0]}]} as
// MongoDB compares, a number equal to -1 or 0 whatever its type (-1.0, a
// decimal 0); a missing, null or non-numeric status is not running.
func RunningValue(v bson.RawValue) bool {
	f, ok := Number(v)
	return ok && (f == float64(StatusClaimed) || f == float64(StatusRunning))
}

// FailedValue reports whether a task whose stored status is v counts in
// count_failed: {$eq: [status, 2]} as MongoDB compares, a number equal to
// 2 whatever its type (2.0, a decimal 2); a non-numeric status is not.
func FailedValue(v bson.RawValue) bool {
	f, ok := Number(v)
	return ok && f == float64(StatusFailed)
}
