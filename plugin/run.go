package plugin

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/disbatch-go/disbatch/plugin/proc"
	"github.com/disbatch-go/disbatch/schema"
)

// ErrTimeout is (wrapped in) the cause, as context.Cause reports it, of the
// context Run gives a plugin when Run's timeout expires. Its message reads
// "timeout of 1m30s".
var ErrTimeout = proc.ErrTimeout

// AbandonGrace is how long Run waits, once the plugin's context is done, for
// the plugin to return before abandoning it. It lets a process plugin, whose
// process group has just been killed, hand back its partial output: 100 ms
// was too short on a loaded machine (a killed plugin's stderr lost its own
// lines for "abandoned"); only a plugin that ignores its context waits it
// out in full.
const AbandonGrace = time.Second

// Run runs p for t under a timeout (0: none) and never lets a plugin take the
// node down: a panic, a status that is not > 0, or the timeout expiring give
// Status 2 (failed) with the reason in Stderr, on a line of its own after
// what the plugin wrote, if anything.
//
// The plugin's context is cancelled when the timeout expires, when ctx is
// cancelled (the node shutting down and killing its tasks) and when Run
// returns; process plugins then kill their process group. In the first two
// cases Run fails the task with a reason naming the cause: "task killed
// after timeout of 5s", or "task killed: " followed by context.Cause(ctx)
// (context.Canceled when the canceller gave no cause). Run waits at most
// AbandonGrace (a second) for the plugin to return after that, so that a process
// plugin's partial output is kept; a plugin that still has not returned (a Go
// plugin that ignores ctx) is abandoned: Run returns the failure and leaves
// the plugin's goroutine running until the plugin returns on its own, which
// may be never. Its eventual result is dropped. A plugin that returns a
// result after its context was done is failed the same way, whatever its
// status.
//
// A panic is recovered only in the goroutine Run starts for the plugin; a
// panic in a goroutine the plugin starts itself still crashes the process.
func Run(ctx context.Context, p Plugin, t Task, timeout time.Duration) Result {
	if p == nil {
		return Result{Status: schema.StatusFailed, Stderr: "no plugin to run the task\n"}
	}
	if ctx.Err() != nil {
		return interrupted(ctx, Result{}, "")
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if timeout > 0 {
		var cancelTimeout context.CancelFunc
		runCtx, cancelTimeout = proc.WithTimeout(runCtx, timeout)
		defer cancelTimeout()
	}

	done := make(chan outcome, 1) // buffered: an abandoned plugin's goroutine still ends
	go call(runCtx, p, t, done)

	select {
	case o := <-done:
		return o.result(runCtx)
	case <-runCtx.Done():
	}
	grace := time.NewTimer(AbandonGrace)
	defer grace.Stop()
	select {
	case o := <-done:
		return o.result(runCtx)
	case <-grace.C:
		return interrupted(runCtx, Result{}, " (the plugin did not return and was abandoned)")
	}
}

// outcome is what the plugin goroutine hands back.
type outcome struct {
	res  Result
	late bool // the context was done when the plugin returned
}

func call(ctx context.Context, p Plugin, t Task, done chan<- outcome) {
	returned := false
	defer func() {
		if returned {
			return
		}
		msg := "plugin ended its goroutine without returning (runtime.Goexit)"
		if r := recover(); r != nil {
			msg = fmt.Sprintf("plugin panicked: %v\n\n%s", r, debug.Stack())
		}
		done <- outcome{Result{Status: schema.StatusFailed, Stderr: msg}, ctx.Err() != nil}
	}()
	res := p.Run(ctx, t)
	returned = true
	done <- outcome{res, ctx.Err() != nil}
}

func (o outcome) result(ctx context.Context) Result {
	if o.late {
		return interrupted(ctx, o.res, "")
	}
	res := o.res
	if !res.Status.Finished() {
		bad := res.Status
		res.Status = schema.StatusFailed
		res.Stderr = appendLine(res.Stderr, fmt.Sprintf("plugin returned status %s, which is not a finished status: want > 0", describeStatus(bad)))
	}
	return res
}

// interrupted fails res because ctx is done, appending the reason unless the
// plugin already named the cause itself (process plugins do).
func interrupted(ctx context.Context, res Result, note string) Result {
	cause := context.Cause(ctx)
	res.Status = schema.StatusFailed
	if !strings.Contains(res.Stderr, cause.Error()) {
		res.Stderr = appendLine(res.Stderr, "task "+killPhrase(cause)+note)
	}
	return res
}

// killPhrase says why a context ended: "killed after timeout of 5s" or
// "killed: <cause>".
func killPhrase(cause error) string {
	if errors.Is(cause, ErrTimeout) {
		return "killed after " + cause.Error()
	}
	return "killed: " + cause.Error()
}

// appendLine appends line to s on a line of its own.
func appendLine(s, line string) string {
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s + line + "\n"
}

// describeStatus gives "0 (running)", or just the number for unnamed codes.
func describeStatus(s schema.Status) string {
	n := strconv.Itoa(int(s))
	if name := s.String(); name != n {
		return n + " (" + name + ")"
	}
	return n
}

// appendBlock appends text to s, starting it on a new line.
func appendBlock(s, text string) string {
	if text == "" {
		return s
	}
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s + text
}
