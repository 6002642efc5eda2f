package plugin

import (
	"fmt"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/plugin/proc"
	"github.com/disbatch-go/disbatch/schema"
)

// MaxOutput is how much of a process's stdout, and of its stderr, process
// plugins keep: the start is kept and TruncatedNote appended.
const MaxOutput = proc.MaxOutput

// TruncatedNote ends output cut at MaxOutput.
const TruncatedNote = proc.TruncatedNote

// MaxMixedout bounds the interleaved output exec and shell keep: more than
// fits in a BSON document could never be written, so past it mixedout is
// left out altogether rather than cut.
const MaxMixedout = proc.MaxMixedout

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

// prepareExec is the process an exec task runs, or its failure.
func prepareExec(t Task) (proc.Command, *Result) {
	params, err := parameters(t)
	if err != nil {
		return proc.Command{}, badParameters(err)
	}
	command, err := stringParam(params, "command", true)
	if err != nil {
		return proc.Command{}, badParameters(err)
	}
	args, err := stringsParam(params, "args")
	if err != nil {
		return proc.Command{}, badParameters(err)
	}
	return prepareCommand(t, params, command, args)
}

// prepareShell is the process a shell task runs, or its failure.
func prepareShell(t Task) (proc.Command, *Result) {
	params, err := parameters(t)
	if err != nil {
		return proc.Command{}, badParameters(err)
	}
	command, err := stringParam(params, "command", true)
	if err != nil {
		return proc.Command{}, badParameters(err)
	}
	return prepareCommand(t, params, "bash", []string{"-c", command})
}

func prepareCommand(t Task, params bson.Raw, path string, args []string) (proc.Command, *Result) {
	dir, err := stringParam(params, "dir", false)
	if err != nil {
		return proc.Command{}, badParameters(err)
	}
	env, err := envParam(params, "env")
	if err != nil {
		return proc.Command{}, badParameters(err)
	}
	return proc.Command{Path: path, Args: args, Dir: dir, Env: append(taskEnv(t), env...), Interleave: true}, nil
}

// commandResult is the result of an exec or shell task whose process c
// ended with r.
func commandResult(c proc.Command, r proc.Result) Result {
	res := Result{Status: schema.StatusFailed, Stdout: r.StdoutText(), Stderr: r.StderrText(), Extra: commandExtra(r)}
	switch {
	case r.StartErr != "":
		res.Stderr = appendLine(res.Stderr, fmt.Sprintf("cannot run %s: %s", c.Path, r.StartErr))
	case r.Killed != nil:
		res.Stderr = appendLine(res.Stderr, "command "+killPhrase(r.Killed))
	case r.Success():
		res.Status = schema.StatusSucceeded
	default:
		res.Stderr = appendLine(res.Stderr, r.State)
	}
	if r.PipesHeld {
		res.Stderr = appendLine(res.Stderr, pipesHeldNote)
	}
	return res
}

const pipesHeldNote = "note: the command exited but a background process kept its output open; output after 2s was dropped"

func badParameters(err error) *Result {
	return &Result{Status: schema.StatusFailed, Stderr: err.Error() + "\n"}
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

// commandExtra is what exec and shell add to the task document: the exit
// code and the interleaved output, when the process ran.
func commandExtra(r proc.Result) bson.D {
	if !r.Ended {
		return nil
	}
	var d bson.D
	switch {
	case r.Signal != 0:
		d = append(d, bson.E{Key: schema.TaskResult, Value: -int32(r.Signal)})
	case r.ExitCode >= 0:
		d = append(d, bson.E{Key: schema.TaskResult, Value: int32(r.ExitCode)})
	}
	if !r.MixedCut {
		d = append(d, bson.E{Key: schema.TaskMixedout, Value: string(r.Mixed)})
	}
	return d
}
