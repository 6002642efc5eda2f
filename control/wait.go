package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// WaitStore is what Wait reads.
type WaitStore interface {
	StreamOpen(ctx context.Context, p store.StreamParams) (*store.StreamReader, error)
	TaskStates(ctx context.Context, ids []bson.ObjectID) ([]store.TaskState, error)
}

// Ended reports whether a task will not change by itself any more: it
// finished (status > 0), it was orphaned (-6: an operator must retry or
// kill it), or it does not exist.
func Ended(st store.TaskState) bool {
	return !st.Found || st.Status.Finished() || st.Status == schema.StatusOrphaned
}

// Succeeded reports whether every task ended with status 1.
func Succeeded(states []store.TaskState) bool {
	for _, st := range states {
		if !st.Found || st.Status != schema.StatusSucceeded {
			return false
		}
	}
	return true
}

// ErrWaitTimeout is returned by Wait when its context ended first.
var ErrWaitTimeout = errors.New("tasks still unfinished")

// CheckIDs refuses an empty list or more than store.MaxControlIDs ids, and
// drops repeats (keeping the first).
func CheckIDs(ids []bson.ObjectID) ([]bson.ObjectID, error) {
	if len(ids) == 0 {
		return nil, errors.New("no task ids")
	}
	if len(ids) > store.MaxControlIDs {
		return nil, fmt.Errorf("%d task ids in one request; at most %d", len(ids), store.MaxControlIDs)
	}
	seen := make(map[bson.ObjectID]bool, len(ids))
	out := make([]bson.ObjectID, 0, len(ids))
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out, nil
}

// Wait returns the tasks' states once every one has Ended, in the order
// of ids. It follows a change stream on exactly those tasks (opened before
// the first read, so no change between the two is missed) and re-reads
// their states whenever one changes, and at least once a second. When ctx
// ends first it returns the states as last read (read once even when ctx
// ended before the stream opened) and an error wrapping ErrWaitTimeout
// (and ctx's).
func Wait(ctx context.Context, st WaitStore, ids []bson.ObjectID) ([]store.TaskState, error) {
	return wait(ctx, st, ids, time.Second)
}

// wait is Wait re-reading at least every reread.
func wait(ctx context.Context, st WaitStore, ids []bson.ObjectID, reread time.Duration) ([]store.TaskState, error) {
	ids, err := CheckIDs(ids)
	if err != nil {
		return nil, err
	}
	read := func() ([]store.TaskState, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		return st.TaskStates(rctx, ids)
	}
	r, err := st.StreamOpen(ctx, store.StreamParams{Profile: store.StreamTaskStates, Tasks: ids, Name: "wait", MaxAwait: reread})
	if err != nil {
		if ctx.Err() == nil {
			return nil, fmt.Errorf("wait for tasks: %w", err)
		}
		// Out of time before the stream opened: the states as they are.
		states, rerr := read()
		if rerr != nil {
			return nil, fmt.Errorf("wait for tasks: %w", rerr)
		}
		return states, fmt.Errorf("%w: %w", ErrWaitTimeout, ctx.Err())
	}
	defer r.Close()
	var states []store.TaskState
	for {
		now, err := read()
		if err != nil {
			if ctx.Err() != nil {
				return states, fmt.Errorf("%w: %w", ErrWaitTimeout, ctx.Err())
			}
			return states, fmt.Errorf("wait for tasks: %w", err)
		}
		states = now
		if allEnded(states) {
			return states, nil
		}
		if _, err := r.Next(ctx); err != nil {
			// The reader resumes by itself until ctx ends; anything
			// else (it was closed) is a failure, not the wait's end.
			if ctx.Err() != nil {
				return states, fmt.Errorf("%w: %w", ErrWaitTimeout, err)
			}
			return states, fmt.Errorf("wait for tasks: follow their changes: %w", err)
		}
	}
}

func allEnded(states []store.TaskState) bool {
	for _, st := range states {
		if !Ended(st) {
			return false
		}
	}
	return true
}
