package supervisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/disbatch-go/disbatch/plugin/proc"
)

// Spec is everything a supervisor needs to run a task and, without its
// node, to finish it: sent by the node in the task message, and kept by
// the supervisor in <dir>/<id>.spec (mode 0600: it holds the connection
// string) for a restarted node and the finish command.
type Spec struct {
	Node   string
	TaskID string
	// Plugin names the task's plugin (plugin.DetachedSpec), opaque here:
	// the node, or the finish command, reads the Outcome with it.
	Plugin json.RawMessage
	// Command is the plugin's process (plugin.Detachable's Prepare).
	Command proc.Command
	// PluginTimeout is the node's --plugin-timeout (0: none).
	PluginTimeout time.Duration
	// Deadline is the task's time limit from task control (zero: none),
	// TimeoutText why ("timeout of 5s (the task's timeout)") and
	// TimeoutReason the task-control reason the kill carries.
	Deadline      time.Time
	TimeoutText   string
	TimeoutReason string
	// Alive is the send time of the node's last acknowledged heartbeat:
	// the fence clock starts there.
	Alive      time.Time
	FenceAfter time.Duration
	// DeadAfter bounds how long a fenced supervisor waits for a node to
	// adopt it.
	DeadAfter time.Duration
	Mongo     Mongo
	Finish    Finish
	// FinishCommand writes the finish when no node is there to, with DIR
	// and ID appended (package supervisor/finish; `disbatchd
	// supervise-finish`).
	FinishCommand []string
}

// Mongo is how a supervisor reaches MongoDB when it must write the
// finish itself.
type Mongo struct {
	URI             string
	Database        string
	OutputThreshold int
}

// Finish is what the node's finish write would carry besides the result.
type Finish struct {
	Claimed, Started time.Time
	Then             string
	// Attempt is the run's attempt (store.TaskFinishParams.Attempt; 0
	// in a spec written before it, and then not guarded).
	Attempt int
	// RetryTries is the try a failure becomes (0: no retry left), after
	// RetryDelay.
	RetryTries int
	RetryDelay time.Duration
}

// Outcome is how a supervised run ended, as the supervisor writes it to
// <dir>/<id>.result.
type Outcome struct {
	// Proc is how the plugin's process ended.
	Proc proc.Result
	// Failure: the supervisor did not start the process (it fenced
	// first); the task fails with Failure as its stderr.
	Failure string
	// Reason is the task-control reason of a kill the supervisor carried
	// out (the node's, or TimeoutReason), or "".
	Reason string
	// Fenced: the supervisor killed the plugin because the node was
	// silent for FenceAfter.
	Fenced bool
	// Written: the supervisor wrote the finish itself.
	Written bool
}

func specPath(dir, id string) string   { return filepath.Join(dir, id+".spec") }
func sockPath(dir, id string) string   { return filepath.Join(dir, id+".sock") }
func resultPath(dir, id string) string { return filepath.Join(dir, id+".result") }
func logPath(dir, id string) string    { return filepath.Join(dir, id+".log") }

// writeFile writes v as JSON to path atomically (a temporary file
// renamed), mode 0600.
func writeFile(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// ReadSpec reads the spec of task id in dir.
func ReadSpec(dir, id string) (Spec, error) {
	var s Spec
	return s, readFile(specPath(dir, id), &s)
}

// ReadOutcome reads the outcome of task id in dir.
func ReadOutcome(dir, id string) (Outcome, error) {
	var o Outcome
	return o, readFile(resultPath(dir, id), &o)
}

// WriteOutcome replaces the outcome of task id in dir.
func WriteOutcome(dir, id string, o Outcome) error { return writeFile(resultPath(dir, id), o) }
