package schema

import (
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
