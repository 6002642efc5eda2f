// Package finish writes the finish of a supervised task whose node was
// away when it ended (`disbatchd supervise-finish DIR ID`, run by the
// task's supervisor): the same guarded write as the node's, from the
// spec and the result in the state directory. It lives apart from package
// supervisor so that the supervisor process, which runs once per task,
// does not link the MongoDB driver.
package finish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/supervisor"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Main writes the finish of task ID from DIR and returns the exit code:
// 0 written, supervisor.FinishLost when the task is no longer the node's,
// 1 on failure.
func Main(args []string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if len(args) != 2 {
		log.Error("usage: disbatchd supervise-finish DIR TASK_ID (run by a task's supervisor, not by hand)")
		return 2
	}
	err := Write(context.Background(), args[0], args[1], log)
	switch {
	case errors.Is(err, store.ErrLostTask):
		return supervisor.FinishLost
	case err != nil:
		log.Error("finish not written", "task_id", args[1], "error", err)
		return 1
	}
	return 0
}

// Write writes the finish and marks the outcome written.
func Write(ctx context.Context, dir, id string, log *slog.Logger) error {
	spec, err := supervisor.ReadSpec(dir, id)
	if err != nil {
		return err
	}
	o, err := supervisor.ReadOutcome(dir, id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := store.Connect(ctx, store.ConnectParams{URI: spec.Mongo.URI, Database: spec.Mongo.Database,
		Options: store.Options{OutputThreshold: spec.Mongo.OutputThreshold}, Retry: true, Logger: log})
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	res, err := Result(spec, o)
	if err != nil {
		return err
	}
	taskID, err := bson.ObjectIDFromHex(spec.TaskID)
	if err != nil {
		return fmt.Errorf("spec of %s: task id: %w", id, err)
	}
	f := spec.Finish
	fp := store.TaskFinishParams{ID: taskID, Node: spec.Node, Status: res.Status, Stdout: res.Stdout, Stderr: res.Stderr,
		Reason: o.Reason, Claimed: f.Claimed, Started: f.Started, Extra: res.Extra, Output: res.Output, Then: f.Then,
		Attempt: f.Attempt}
	if res.Status >= schema.StatusFailed && o.Reason != schema.ReasonKilled && f.RetryTries > 0 {
		fp.Retry = &store.TaskRetryAt{Delay: f.RetryDelay, Tries: f.RetryTries}
	}
	for attempt := 1; ; attempt++ {
		err = conn.Store.TaskFinish(ctx, fp)
		if err == nil || errors.Is(err, store.ErrLostTask) || ctx.Err() != nil {
			break
		}
		log.Warn("finish write failed; retrying", "task_id", id, "error", err, "attempt", attempt)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		return err
	}
	o.Written = true
	return supervisor.WriteOutcome(dir, id, o)
}

// Result is the task's result from a supervisor's outcome: the plugin's
// Interpret of how its process ended, as the plugin's own Run would have
// said it; or the supervisor's failure when it never started the process.
// The node reads adopted and supervised tasks' outcomes with it too.
func Result(spec supervisor.Spec, o supervisor.Outcome) (plugin.Result, error) {
	if o.Failure != "" {
		return plugin.Result{Status: schema.StatusFailed, Stderr: o.Failure}, nil
	}
	var d plugin.DetachedSpec
	if err := json.Unmarshal(spec.Plugin, &d); err != nil {
		return plugin.Result{}, fmt.Errorf("the spec's plugin: %w", err)
	}
	p, err := plugin.FromDetached(d)
	if err != nil {
		return plugin.Result{}, err
	}
	return p.Interpret(spec.Command, o.Proc), nil
}
