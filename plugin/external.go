package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/plugin/proc"
	"github.com/disbatch-go/disbatch/schema"
)

// externalInput is the JSON object an External plugin reads on stdin.
type externalInput struct {
	ID          string          `json:"id"`       // task _id, hex
	Queue       string          `json:"queue"`    // queue name
	QueueID     string          `json:"queue_id"` // queue _id, hex
	Constructor string          `json:"constructor"`
	Node        string          `json:"node"`
	Attempt     int             `json:"attempt"`    // 1 for the first attempt
	Parameters  json.RawMessage `json:"parameters"` // relaxed extended JSON; {} when the task has none
	Config      json.RawMessage `json:"config"`     // the queue's config, relaxed extended JSON; {} when it has none
}

// externalAnswer is the JSON object an External plugin writes on stdout.
type externalAnswer struct {
	status    int64
	statusOK  bool   // status is an integer that fits 32 bits
	rawStatus string // status as written
	stdout    string
	stderr    string
	output    bson.RawValue // an object or a list of objects
}

// External returns a plugin that runs the executable at path with args, in
// the manner of Disbatch's task runner. The task is written to its stdin as
// one JSON object:
//
//	{"id": "<hex>", "queue": "<name>", "queue_id": "<hex>", "constructor": "...",
//	 "node": "...", "attempt": N, "parameters": <parameters as relaxed extended JSON>,
//	 "config": <the queue's config object, relaxed extended JSON; {} without one>}
//
// attempt is 1 for the task's first attempt and one more for each attempt
// that ended before (a queue's retries, a requeue).
//
// It must answer on stdout with one JSON object (blank space around it is
// allowed, fields other than these are ignored) and exit 0:
//
//	{"status": N, "stdout": "...", "stderr": "...", "output": {...} or [{...}, ...]}
//
// output (optional; extended JSON) is written to a task that succeeds, and
// becomes tasks of the queue's then queue: an object one, a list one each.
//
// N must be a positive integer (1.0 counts as 1) that fits 32 bits; stdout
// and stderr may be absent or null.
//
// Its environment is the node's plus the DISBATCH_* variables described at
// Exec. Its own stderr is kept only on failure.
//
// Failures give status 2 with a reason on the last line of Stderr, after the
// process's own stderr; Stdout is then the process's raw stdout (or, for a
// bad status in an otherwise valid answer, the answer's stdout):
//
//	plugin /path exited with status 3
//	plugin /path was terminated by signal: segmentation fault
//	plugin /path killed after timeout of 5s   (or "killed: <cause>")
//	plugin /path answered garbage: <why>: "<start of stdout>"
//	plugin /path answered an invalid status 0: want a positive integer
//	cannot run plugin /path: <error>
func External(path string, args ...string) Plugin {
	return &external{path: path, args: slices.Clone(args)}
}

type external struct {
	path string
	args []string
}

func (e *external) Run(ctx context.Context, t Task) Result { return runDetachable(ctx, e, t) }

// Prepare is the executable with the task as JSON on its stdin.
func (e *external) Prepare(t Task) (proc.Command, *Result) {
	input, err := encodeInput(t)
	if err != nil {
		return proc.Command{}, &Result{Status: schema.StatusFailed, Stderr: fmt.Sprintf("plugin %s: cannot encode the task: %v\n", e.path, err)}
	}
	return proc.Command{Path: e.path, Args: e.args, Env: taskEnv(t), Stdin: input}, nil
}

// Interpret reads the executable's answer.
func (e *external) Interpret(_ proc.Command, r proc.Result) Result {
	name := "plugin " + e.path
	stdout, stderr := r.StdoutText(), r.StderrText()
	fail := func(stdout, stderr, reason string) Result {
		return Result{Status: schema.StatusFailed, Stdout: stdout, Stderr: appendLine(stderr, reason)}
	}
	switch {
	case r.StartErr != "":
		return fail(stdout, stderr, fmt.Sprintf("cannot run %s: %s", name, r.StartErr))
	case r.Killed != nil:
		return fail(stdout, stderr, name+" "+killPhrase(r.Killed))
	case !r.Success():
		if r.ExitCode >= 0 {
			return fail(stdout, stderr, fmt.Sprintf("%s exited with status %d", name, r.ExitCode))
		}
		return fail(stdout, stderr, fmt.Sprintf("%s was terminated by %s", name, r.State))
	case r.StdoutCut:
		return fail(stdout, stderr, fmt.Sprintf("%s answered garbage: more than 64 MiB", name))
	}

	ans, err := parseExternalAnswer(r.Stdout)
	if err != nil {
		return fail(stdout, stderr, fmt.Sprintf("%s answered garbage: %v: %s", name, err, snippet(r.Stdout)))
	}
	if !ans.statusOK || ans.status <= 0 {
		return fail(ans.stdout, appendBlock(ans.stderr, stderr),
			fmt.Sprintf("%s answered an invalid status %s: want a positive integer", name, ans.rawStatus))
	}
	return Result{Status: schema.Status(ans.status), Stdout: ans.stdout, Stderr: ans.stderr, Output: ans.output}
}

func encodeInput(t Task) ([]byte, error) {
	params, err := parameters(t)
	if err != nil {
		return nil, err
	}
	pj, err := bson.MarshalExtJSON(params, false, false)
	if err != nil {
		return nil, fmt.Errorf("parameters: %w", err)
	}
	cj, err := configJSON(t)
	if err != nil {
		return nil, err
	}
	in := externalInput{
		Config:      cj,
		ID:          t.ID.Hex(),
		Queue:       t.Queue,
		QueueID:     t.QueueID.Hex(),
		Constructor: t.Constructor,
		Node:        t.Node,
		Attempt:     max(t.Attempt, 1),
		Parameters:  pj,
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(in); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// parseExternalAnswer reads the answer: exactly one JSON object with a
// numeric status and string or null stdout and stderr. Other fields are
// ignored. A status that is not an integer is reported in statusOK, not as
// an error.
func parseExternalAnswer(out []byte) (externalAnswer, error) {
	var a externalAnswer
	trimmed := bytes.TrimSpace(out)
	if len(trimmed) == 0 {
		return a, fmt.Errorf(`no output, want one JSON object {"status": N, "stdout": "...", "stderr": "..."}`)
	}
	if trimmed[0] != '{' {
		return a, fmt.Errorf("not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	var fields map[string]json.RawMessage
	if err := dec.Decode(&fields); err != nil {
		return a, fmt.Errorf("not a JSON object: %v", err)
	}
	if dec.InputOffset() != int64(len(trimmed)) {
		return a, fmt.Errorf("more than one JSON value")
	}

	raw, ok := fields["status"]
	if !ok || string(raw) == "null" {
		return a, fmt.Errorf("no status")
	}
	a.rawStatus = string(raw)
	if c := raw[0]; c != '-' && (c < '0' || c > '9') {
		return a, fmt.Errorf("status %s is not a number", raw)
	}
	a.status, a.statusOK = integer(a.rawStatus)
	for _, f := range []struct {
		key string
		dst *string
	}{{"stdout", &a.stdout}, {"stderr", &a.stderr}} {
		raw, ok := fields[f.key]
		if !ok || string(raw) == "null" {
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil {
			return a, fmt.Errorf("%s is not a string", f.key)
		}
	}
	if raw, ok := fields["output"]; ok && string(raw) != "null" {
		var wrap bson.Raw
		if err := bson.UnmarshalExtJSON(append(append([]byte(`{"output":`), raw...), '}'), false, &wrap); err != nil {
			return a, fmt.Errorf("output is not JSON MongoDB can store: %v", err)
		}
		a.output = wrap.Lookup("output")
		if len(a.output.Value) > schema.MaxOutputBytes {
			return a, fmt.Errorf("output of %d bytes is over the %d MiB an output may be (it is kept in the task's document)", len(a.output.Value), schema.MaxOutputBytes>>20)
		}
		if _, err := schema.OutputParams(a.output); err != nil {
			return a, err
		}
	}
	return a, nil
}

// integer parses a JSON number with an integral value that fits a status
// (32 bits): 1, 1.0 and 1e0 are all 1.
func integer(s string) (int64, bool) {
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i, i >= math.MinInt32 && i <= math.MaxInt32
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || f < math.MinInt32 || f > math.MaxInt32 {
		return 0, false
	}
	return int64(f), true
}

// snippet quotes the start of b for a reason line.
func snippet(b []byte) string {
	const max = 200
	if len(b) > max {
		return strconv.Quote(string(b[:max])) + "..."
	}
	return strconv.Quote(string(b))
}

// configJSON is the queue's config as relaxed extended JSON ({} for none).
func configJSON(t Task) ([]byte, error) {
	if len(t.Config) == 0 {
		return []byte("{}"), nil
	}
	cj, err := bson.MarshalExtJSON(t.Config, false, false)
	if err != nil {
		return nil, fmt.Errorf("queue config: %w", err)
	}
	return cj, nil
}
