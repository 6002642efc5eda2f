package plugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// MaxOutput is how much of a process's stdout, and of its stderr, process
// plugins keep: the start is kept and TruncatedNote appended.
const MaxOutput = 64 << 20

// TruncatedNote ends output cut at MaxOutput.
const TruncatedNote = "\n[output truncated at 64 MiB]"

// waitDelay bounds how long Wait waits for the output pipes to close once
// the process has exited or been killed: a descendant that left the process
// group could otherwise keep them open for ever.
const waitDelay = 2 * time.Second

// The constructor names of the Exec and Shell plugins.
const (
	ExecConstructor  = "exec"
	ShellConstructor = "shell"
)

// Exec returns the exec plugin: it runs parameters.command (a string,
// required; looked up in PATH when it has no slash) with parameters.args (an
// array of strings, optional), without a shell. parameters.dir (optional)
// sets the working directory and parameters.env (an optional object of
// strings) adds variables to the node's environment, after
// DISBATCH_TASK_ID, DISBATCH_QUEUE_ID, DISBATCH_QUEUE, DISBATCH_CONSTRUCTOR,
// DISBATCH_NODE, DISBATCH_ATTEMPT (1 for a task's first attempt) and
// DISBATCH_CONFIG (the queue's config object as relaxed extended JSON, {}
// without one), which every process plugin gets. stdin is /dev/null.
//
// Exit status 0 gives status 1; anything else gives status 2 with "exit
// status N" (or "signal: ...") appended to stderr on a line of its own. Bad
// parameters, or a command that cannot be run, give status 2 with the
// reason.
//
// A command that ran also leaves, in Result.Extra, schema.TaskResult: its
// exit code as an int32, or -N when signal N ended it (-9 when it was
// killed for a timeout or a kill request); and schema.TaskMixedout: its
// stdout and stderr interleaved, chunk by chunk, in the order the node read
// them from the two pipes. That order is the order of the writes for writes
// apart in time, and best-effort for writes that race each other.
// Mixedout holds only what the command wrote (none of the notes appended to
// stderr) and is left out when the output passes MaxMixedout. Neither is
// set when the command could not be started or the parameters were bad.
func Exec() Plugin { return execPlugin{} }

// Shell returns the shell plugin: bash -c parameters.command (a string,
// required), with parameters.dir and parameters.env as for Exec, and the
// same exit status mapping.
func Shell() Plugin { return shellPlugin{} }

func runExec(ctx context.Context, t Task) Result {
	params, err := parameters(t)
	if err != nil {
		return badParameters(err)
	}
	command, err := stringParam(params, "command", true)
	if err != nil {
		return badParameters(err)
	}
	args, err := stringsParam(params, "args")
	if err != nil {
		return badParameters(err)
	}
	return runCommand(ctx, t, params, command, args)
}

func runShell(ctx context.Context, t Task) Result {
	params, err := parameters(t)
	if err != nil {
		return badParameters(err)
	}
	command, err := stringParam(params, "command", true)
	if err != nil {
		return badParameters(err)
	}
	return runCommand(ctx, t, params, "bash", []string{"-c", command})
}

func runCommand(ctx context.Context, t Task, params bson.Raw, path string, args []string) Result {
	dir, err := stringParam(params, "dir", false)
	if err != nil {
		return badParameters(err)
	}
	env, err := envParam(params, "env")
	if err != nil {
		return badParameters(err)
	}
	p := process{path: path, args: args, dir: dir, env: append(taskEnv(t), env...), interleave: true}
	r := p.run(ctx)
	res := Result{Status: schema.StatusFailed, Stdout: r.stdout, Stderr: r.stderr, Extra: r.extra()}
	switch {
	case r.err != nil:
		res.Stderr = appendLine(res.Stderr, fmt.Sprintf("cannot run %s: %v", path, r.err))
	case r.killed != nil:
		res.Stderr = appendLine(res.Stderr, "command "+killPhrase(r.killed))
	case r.state.Success():
		res.Status = schema.StatusSucceeded
	default:
		res.Stderr = appendLine(res.Stderr, r.state.String())
	}
	if r.pipesHeld {
		res.Stderr = appendLine(res.Stderr, pipesHeldNote)
	}
	return res
}

const pipesHeldNote = "note: the command exited but a background process kept its output open; output after 2s was dropped"

func badParameters(err error) Result {
	return Result{Status: schema.StatusFailed, Stderr: err.Error() + "\n"}
}

// taskEnv describes the task to a process.
func taskEnv(t Task) []string {
	cj, err := configJSON(t)
	if err != nil {
		cj = []byte("{}") // a config the node read decodes; never here
	}
	return []string{
		"DISBATCH_TASK_ID=" + t.ID.Hex(),
		"DISBATCH_QUEUE_ID=" + t.QueueID.Hex(),
		"DISBATCH_QUEUE=" + t.Queue,
		"DISBATCH_CONSTRUCTOR=" + t.Constructor,
		"DISBATCH_NODE=" + t.Node,
		"DISBATCH_ATTEMPT=" + strconv.Itoa(max(t.Attempt, 1)),
		"DISBATCH_CONFIG=" + string(cj),
	}
}

// MaxMixedout bounds the interleaved output exec and shell keep: more than
// fits in a BSON document could never be written, so past it mixedout is
// left out altogether rather than cut.
const MaxMixedout = 16 << 20

// process is one run of an executable.
type process struct {
	path  string
	args  []string
	dir   string
	env   []string // added to the node's environment; later entries win
	stdin []byte   // nil: /dev/null
	// interleave also keeps stdout and stderr together, in the order they
	// were read (processResult.mixed).
	interleave bool
}

type processResult struct {
	stdout, stderr string
	err            error            // the process could not be started (or waited for)
	killed         error            // the context's cause, when it ended the process
	state          *os.ProcessState // how it exited, when started
	pipesHeld      bool             // exited, but the output stayed open past waitDelay
	rawStdout      []byte           // stdout before any truncation note
	stdoutCut      bool
	mixed          []byte // with interleave: stdout and stderr as read
	mixedCut       bool   // mixed passed MaxMixedout
}

// extra is what exec and shell add to the task document: the exit code
// and the interleaved output, when the process ran.
func (r processResult) extra() bson.D {
	if r.state == nil {
		return nil
	}
	var d bson.D
	if code, ok := exitCode(r.state); ok {
		d = append(d, bson.E{Key: schema.TaskResult, Value: code})
	}
	if !r.mixedCut {
		d = append(d, bson.E{Key: schema.TaskMixedout, Value: string(r.mixed)})
	}
	return d
}

// exitCode is how the process ended: its exit code, or -N when signal N
// ended it; false when neither is known.
func exitCode(st *os.ProcessState) (int32, bool) {
	if sig, ok := signalled(st); ok {
		return -int32(sig), true
	}
	if c := st.ExitCode(); c >= 0 {
		return int32(c), true
	}
	return 0, false
}

// run starts the process in its own process group, kills the group when
// ctx is done, and waits for it.
func (p process) run(ctx context.Context) processResult {
	cmd := exec.CommandContext(ctx, p.path, p.args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), p.env...)
	if p.stdin != nil {
		cmd.Stdin = bytes.NewReader(p.stdin)
	}
	var stdout, stderr capped
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Each pipe has its own copier goroutine; with interleave both also
	// append what they read to one buffer, under its lock.
	mixed := capped{limit: MaxMixedout}
	if p.interleave {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, &mixed), io.MultiWriter(&stderr, &mixed)
	}
	killGroupOnCancel(cmd)
	cmd.WaitDelay = waitDelay

	err := cmd.Run()
	r := processResult{stdout: stdout.String(), stderr: stderr.String(), state: cmd.ProcessState}
	r.rawStdout, r.stdoutCut = stdout.Bytes()
	r.mixed, r.mixedCut = mixed.Bytes()
	switch {
	case ctx.Err() != nil && cmd.Process != nil:
		r.killed = context.Cause(ctx)
	case r.state == nil: // not started, or (cannot happen) not waited for
		r.err = err
		if r.err == nil {
			r.err = errors.New("no exit status")
		}
	case errors.Is(err, exec.ErrWaitDelay):
		r.pipesHeld = true
	}
	return r
}

// capped keeps the first limit bytes written to it (0: MaxOutput) and
// counts the rest. It never fails a write, so the process is not stopped by
// a broken pipe.
type capped struct {
	mu      sync.Mutex
	limit   int
	buf     bytes.Buffer
	dropped int64
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := c.limit
	if limit == 0 {
		limit = MaxOutput
	}
	keep := min(len(p), limit-c.buf.Len())
	c.buf.Write(p[:keep])
	c.dropped += int64(len(p) - keep)
	return len(p), nil
}

// Bytes returns what was kept and whether anything was dropped.
func (c *capped) Bytes() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Bytes(), c.dropped > 0
}

// String returns what was kept, with TruncatedNote when something was dropped.
func (c *capped) String() string {
	b, cut := c.Bytes()
	if cut {
		return string(b) + TruncatedNote
	}
	return string(b)
}
