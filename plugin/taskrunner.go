package plugin

import (
	"context"
	"errors"
	"fmt"
	"os/exec"

	"github.com/disbatch-go/disbatch/plugin/proc"
	"github.com/disbatch-go/disbatch/schema"
)

// TaskRunner runs a queue's tasks through Disbatch 4.103's task_runner, so a
// site's Disbatch::Plugin::* Perl plugins run under this node. The contract
// is 4.103's: the node claims the task (node: this host's name, status
// -1), then runs `task_runner --config FILE --task ID [--gfs MODE]
// [--quiet]`; task_runner marks the task running (-1 → 0, guarded by this
// host's name), runs the plugin, and writes the status, stdout, stderr
// (GridFS as 4.103 writes it) and complete: true itself. The node only
// waits for it, kills its process group when the task is killed or times
// out, and writes a result when task_runner did not (see node's runner).
type TaskRunner struct {
	Path   string // the task_runner executable
	Config string // the 4.103 config file it reads (--config)
	GFS    string // --gfs: auto, or a mode; "" leaves the flag out (GridFS off)
	Quiet  bool   // --quiet
}

// ResultWriter is a plugin that writes its task's result itself (the node
// writes neither the start nor the finish of its tasks).
type ResultWriter interface {
	Plugin
	// RunWritingResult runs the task and returns what the program said
	// on its stderr when it failed (the tail), and why.
	RunWritingResult(ctx context.Context, t Task) (stderrTail string, err error)
}

// Run is never called by a node (it uses RunWritingResult); it answers a
// failure so that a misuse is visible.
func (r TaskRunner) Run(context.Context, Task) Result {
	return Result{Status: schema.StatusFailed, Stderr: "task_runner writes its own result: run it through RunWritingResult\n"}
}

// RunWritingResult runs task_runner for the task and waits for it.
func (r TaskRunner) RunWritingResult(ctx context.Context, t Task) (string, error) {
	args := []string{"--config", r.Config, "--task", t.ID.Hex()}
	if r.GFS != "" {
		args = append(args, "--gfs", r.GFS)
	}
	if r.Quiet {
		args = append(args, "--quiet")
	}
	cmd := exec.CommandContext(ctx, r.Path, args...)
	proc.KillGroupOnCancel(cmd)
	cmd.WaitDelay = proc.WaitDelay // a child left holding its output must not hold the task
	out := &proc.Capped{Limit: 64 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	proc.KillGroup(cmd)
	if err == nil {
		return "", nil
	}
	tail := out.String()
	if len(tail) > 4096 {
		tail = tail[len(tail)-4096:]
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return tail, fmt.Errorf("task_runner %s: %w", t.ID.Hex(), err)
	}
	return tail, fmt.Errorf("run task_runner %s: %w", r.Path, err)
}
