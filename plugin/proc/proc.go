// Package proc runs one executable for a process plugin: in a process
// group of its own that is killed whole when its context ends, with its
// stdout and stderr captured up to MaxOutput each (and, on request,
// interleaved in the order they were read). Its Command and Result are
// plain data (JSON), so a task's supervisor process runs them as the node
// would: package proc is all of the plugins a supervisor links, and it
// needs neither BSON nor the task's schema.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"
)

// MaxOutput is how much of a process's stdout, and of its stderr, is kept:
// the start is kept and TruncatedNote appended.
const MaxOutput = 64 << 20

// TruncatedNote ends output cut at MaxOutput.
const TruncatedNote = "\n[output truncated at 64 MiB]"

// MaxMixedout bounds the interleaved output kept: more than fits in a BSON
// document could never be written, so past it the interleaved output is
// dropped altogether rather than cut.
const MaxMixedout = 16 << 20

// WaitDelay bounds how long Run waits for the output pipes to close once
// the process has exited or been killed: a descendant that left the process
// group could otherwise keep them open for ever.
const WaitDelay = 2 * time.Second

// ErrTimeout is (wrapped in) the cause of a context ended by a plugin
// timeout ("timeout of 1m30s"); a Cause made from it reports it to
// errors.Is.
var ErrTimeout = errors.New("timeout")

// WithTimeout is ctx ended after d (a plugin timeout) with the cause
// "timeout of d" (ErrTimeout), which both the node and a supervisor give.
func WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, d, fmt.Errorf("%w of %v", ErrTimeout, d))
}

// Command is one run of an executable.
type Command struct {
	Path string   `json:"path"`
	Args []string `json:"args,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	// Env is added to the environment of the process that runs it; later
	// entries win.
	Env []string `json:"env,omitempty"`
	// Stdin is the process's standard input (nil: /dev/null).
	Stdin []byte `json:"stdin,omitempty"`
	// Interleave also keeps stdout and stderr together, in the order they
	// were read (Result.Mixed).
	Interleave bool `json:"interleave,omitempty"`
}

// Result is how a Command's run ended.
type Result struct {
	// Stdout and Stderr are what was kept of each (the first MaxOutput
	// bytes); the Cut flags say something was dropped.
	Stdout    []byte `json:"stdout,omitempty"`
	Stderr    []byte `json:"stderr,omitempty"`
	StdoutCut bool   `json:"stdout_cut,omitempty"`
	StderrCut bool   `json:"stderr_cut,omitempty"`
	// Mixed is stdout and stderr as read, with Interleave; MixedCut: they
	// passed MaxMixedout and Mixed is incomplete.
	Mixed    []byte `json:"mixed,omitempty"`
	MixedCut bool   `json:"mixed_cut,omitempty"`
	// StartErr: the process could not be started (or waited for).
	StartErr string `json:"start_error,omitempty"`
	// Killed is the context's cause, when it ended the process.
	Killed *Cause `json:"killed,omitempty"`
	// Ended: the process ran and its exit status is known: ExitCode (-1
	// when a signal ended it), Signal (0: none) and State, as Go says it
	// ("exit status 3", "signal: killed").
	Ended    bool   `json:"ended,omitempty"`
	ExitCode int    `json:"exit_code,omitempty"`
	Signal   int    `json:"signal,omitempty"`
	State    string `json:"state,omitempty"`
	// PipesHeld: the process exited but a descendant kept its output open
	// past 2s; what came after was dropped.
	PipesHeld bool `json:"pipes_held,omitempty"`
}

// Success reports an exit status of 0.
func (r Result) Success() bool { return r.Ended && r.ExitCode == 0 && r.Signal == 0 }

// StdoutText is the kept stdout, with TruncatedNote when some was dropped;
// StderrText the same for stderr.
func (r Result) StdoutText() string { return withNote(r.Stdout, r.StdoutCut) }

// StderrText is the kept stderr, with TruncatedNote when some was dropped.
func (r Result) StderrText() string { return withNote(r.Stderr, r.StderrCut) }

func withNote(b []byte, cut bool) string {
	if cut {
		return string(b) + TruncatedNote
	}
	return string(b)
}

// Cause is why a process was killed: an error's text, and whether it was
// a plugin timeout (errors.Is(c, ErrTimeout)).
type Cause struct {
	Text    string `json:"text"`
	Timeout bool   `json:"timeout,omitempty"`
}

func (c *Cause) Error() string { return c.Text }

// Is makes a timeout's Cause match ErrTimeout.
func (c *Cause) Is(target error) bool { return c.Timeout && target == ErrTimeout }

// CauseOf is the Cause of err.
func CauseOf(err error) *Cause {
	if err == nil {
		return nil
	}
	return &Cause{Text: err.Error(), Timeout: errors.Is(err, ErrTimeout)}
}

// Run starts the command as the leader of a new process group, kills the
// whole group when ctx is done, and waits for it; once it has ended, what
// is left of its group is killed too (KillGroup).
func (c Command) Run(ctx context.Context) Result {
	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), c.Env...)
	if c.Stdin != nil {
		cmd.Stdin = bytes.NewReader(c.Stdin)
	}
	var stdout, stderr Capped
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Each pipe has its own copier goroutine; with Interleave both also
	// append what they read to one buffer, under its lock.
	mixed := Capped{Limit: MaxMixedout}
	if c.Interleave {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, &mixed), io.MultiWriter(&stderr, &mixed)
	}
	KillGroupOnCancel(cmd)
	cmd.WaitDelay = WaitDelay

	err := cmd.Run()
	KillGroup(cmd)
	var r Result
	r.Stdout, r.StdoutCut = stdout.Bytes()
	r.Stderr, r.StderrCut = stderr.Bytes()
	if c.Interleave {
		r.Mixed, r.MixedCut = mixed.Bytes()
	}
	if st := cmd.ProcessState; st != nil {
		r.Ended, r.ExitCode, r.State = true, st.ExitCode(), st.String()
		if sig, ok := signalled(st); ok {
			r.Signal = sig
		}
	}
	switch {
	case ctx.Err() != nil && (cmd.Process != nil || errors.Is(err, ctx.Err())):
		// Killed, or killed before it started (the kill came first).
		r.Killed = CauseOf(context.Cause(ctx))
	case cmd.ProcessState == nil: // not started, or (cannot happen) not waited for
		r.StartErr = "no exit status"
		if err != nil {
			r.StartErr = err.Error()
		}
	case errors.Is(err, exec.ErrWaitDelay):
		r.PipesHeld = true
	}
	return r
}

// Capped keeps the first Limit bytes written to it (0: MaxOutput) and
// counts the rest. It never fails a write, so the process is not stopped by
// a broken pipe.
type Capped struct {
	Limit   int
	mu      sync.Mutex
	buf     bytes.Buffer
	dropped int64
}

func (c *Capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := c.Limit
	if limit == 0 {
		limit = MaxOutput
	}
	keep := min(len(p), limit-c.buf.Len())
	c.buf.Write(p[:keep])
	c.dropped += int64(len(p) - keep)
	return len(p), nil
}

// Bytes returns what was kept and whether anything was dropped.
func (c *Capped) Bytes() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Bytes(), c.dropped > 0
}

// String returns what was kept, with TruncatedNote when something was dropped.
func (c *Capped) String() string {
	b, cut := c.Bytes()
	return withNote(b, cut)
}
