package supervisor

import (
	"bytes"
	"encoding/gob"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/plugin"
	"github.com/disbatch-go/disbatch/schema"
)

// Spec is everything a supervisor needs to run a task and, without its
// node, to finish it: written by the node to <dir>/<id>.spec (mode 0600:
// it holds the connection string).
type Spec struct {
	Node   string
	Task   plugin.Task
	Plugin plugin.DetachedSpec
	// PluginTimeout is the node's --plugin-timeout (0: none).
	PluginTimeout time.Duration
	// Deadline is the task's time limit from task control (zero: none),
	// TimeoutText why ("timeout of 5s (the task's timeout)").
	Deadline    time.Time
	TimeoutText string
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
	// RetryTries is the try a failure becomes (0: no retry left), after
	// RetryDelay.
	RetryTries int
	RetryDelay time.Duration
}

// Outcome is how a supervised run ended, as the supervisor writes it to
// <dir>/<id>.result.
type Outcome struct {
	Status schema.Status
	Stdout string
	Stderr string
	// Extra is plugin.Result.Extra as a BSON document; Output its Output.
	Extra      []byte
	OutputType byte
	Output     []byte
	// Reason is the task-control reason of a kill the supervisor carried
	// out (schema.ReasonKilled, schema.ReasonTimeout), or "".
	Reason string
	// Fenced: the supervisor killed the plugin because the node was
	// silent for FenceAfter.
	Fenced bool
	// Written: the supervisor wrote the finish itself.
	Written bool
}

// Result is the plugin's result.
func (o Outcome) Result() plugin.Result {
	r := plugin.Result{Status: o.Status, Stdout: o.Stdout, Stderr: o.Stderr}
	if len(o.Extra) > 0 {
		_ = bson.Unmarshal(o.Extra, &r.Extra)
	}
	if o.OutputType != 0 {
		r.Output = bson.RawValue{Type: bson.Type(o.OutputType), Value: o.Output}
	}
	return r
}

func outcomeOf(r plugin.Result) Outcome {
	o := Outcome{Status: r.Status, Stdout: r.Stdout, Stderr: r.Stderr}
	if len(r.Extra) > 0 {
		o.Extra, _ = bson.Marshal(r.Extra)
	}
	if r.Output.Type != 0 {
		o.OutputType, o.Output = byte(r.Output.Type), r.Output.Value
	}
	return o
}

func specPath(dir, id string) string   { return filepath.Join(dir, id+".spec") }
func sockPath(dir, id string) string   { return filepath.Join(dir, id+".sock") }
func resultPath(dir, id string) string { return filepath.Join(dir, id+".result") }
func logPath(dir, id string) string    { return filepath.Join(dir, id+".log") }

// writeGob writes v to path atomically (a temporary file renamed), mode 0600.
func writeGob(path string, v any) error {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(v); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readGob(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// ReadSpec reads the spec of task id in dir.
func ReadSpec(dir, id string) (Spec, error) {
	var s Spec
	return s, readGob(specPath(dir, id), &s)
}

// ReadOutcome reads the outcome of task id in dir.
func ReadOutcome(dir, id string) (Outcome, error) {
	var o Outcome
	return o, readGob(resultPath(dir, id), &o)
}

// WriteOutcome replaces the outcome of task id in dir.
func WriteOutcome(dir, id string, o Outcome) error { return writeGob(resultPath(dir, id), o) }
