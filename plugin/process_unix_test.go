//go:build unix

package plugin

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/plugin/proc"
	"github.com/disbatch-go/disbatch/schema"
)

func execTask(t *testing.T, d bson.D) Task {
	return Task{
		ID:          bson.NewObjectID(),
		QueueID:     bson.NewObjectID(),
		Queue:       "q1",
		Constructor: ExecConstructor,
		Node:        "node-a",
		Parameters:  params(t, d),
	}
}

func sh(script string) bson.D {
	return bson.D{{Key: "command", Value: "/bin/sh"}, {Key: "args", Value: bson.A{"-c", script}}}
}

// extra is what exec and shell record for a command that ran.
func extra(code int32, mixedout string) bson.D {
	return bson.D{{Key: schema.TaskResult, Value: code}, {Key: schema.TaskMixedout, Value: mixedout}}
}

// racing checks the exit code recorded in res and that its mixedout is one
// of orders (writes to stdout and stderr close together may be read in
// either order), and returns res without Extra.
func racing(t *testing.T, res Result, code int32, orders ...string) Result {
	t.Helper()
	require.Len(t, res.Extra, 2, "%v", res.Extra)
	require.Equal(t, bson.E{Key: schema.TaskResult, Value: code}, res.Extra[0])
	require.Equal(t, schema.TaskMixedout, res.Extra[1].Key)
	require.Contains(t, orders, res.Extra[1].Value)
	res.Extra = nil
	return res
}

func TestExecEcho(t *testing.T) {
	t.Parallel()
	res := Exec().Run(t.Context(), execTask(t, bson.D{
		{Key: "command", Value: "/bin/echo"},
		{Key: "args", Value: bson.A{"hello", "two words", "$HOME", "*"}},
	}))
	require.Equal(t, Result{Status: schema.StatusSucceeded, Stdout: "hello two words $HOME *\n", Extra: extra(0, "hello two words $HOME *\n")}, res)

	// No args; found in PATH.
	res = Exec().Run(t.Context(), execTask(t, bson.D{{Key: "command", Value: "echo"}}))
	require.Equal(t, Result{Status: schema.StatusSucceeded, Stdout: "\n", Extra: extra(0, "\n")}, res)
}

func TestExecExitStatus(t *testing.T) {
	t.Parallel()
	res := Exec().Run(t.Context(), execTask(t, sh("echo out; echo err >&2; exit 3")))
	require.Equal(t, Result{Status: schema.StatusFailed, Stdout: "out\n", Stderr: "err\nexit status 3\n"},
		racing(t, res, 3, "out\nerr\n", "err\nout\n"))

	res = Exec().Run(t.Context(), execTask(t, sh("printf 'no newline' >&2; exit 1")))
	require.Equal(t, Result{Status: schema.StatusFailed, Stderr: "no newline\nexit status 1\n", Extra: extra(1, "no newline")}, res,
		"the note on stderr is not in mixedout")

	res = Exec().Run(t.Context(), execTask(t, sh("kill -TERM $$")))
	require.Equal(t, Result{Status: schema.StatusFailed, Stderr: "signal: terminated\n", Extra: extra(-15, "")}, res)
}

func TestExecBadParameters(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		params bson.D
		reason string
	}{
		{nil, "parameters.command is missing"},
		{bson.D{{Key: "args", Value: bson.A{"x"}}}, "parameters.command is missing"},
		{bson.D{{Key: "command", Value: ""}}, "parameters.command is empty"},
		{bson.D{{Key: "command", Value: 5}}, "parameters.command must be a string, got a number"},
		{bson.D{{Key: "command", Value: "/bin/echo"}, {Key: "args", Value: "x"}}, "parameters.args must be an array of strings"},
		{bson.D{{Key: "command", Value: "/bin/echo"}, {Key: "args", Value: bson.A{"x", 2}}}, "parameters.args.1 must be a string, got a number"},
		{bson.D{{Key: "command", Value: "/bin/echo"}, {Key: "dir", Value: true}}, "parameters.dir must be a string"},
		{bson.D{{Key: "command", Value: "/bin/echo"}, {Key: "env", Value: bson.A{"A=b"}}}, "parameters.env must be an object of strings"},
		{bson.D{{Key: "command", Value: "/bin/echo"}, {Key: "env", Value: bson.D{{Key: "A", Value: 1}}}}, "parameters.env.A must be a string"},
		{bson.D{{Key: "command", Value: "/bin/echo"}, {Key: "env", Value: bson.D{{Key: "A=B", Value: "c"}}}}, `"A=B" is not a valid environment variable name`},
		{bson.D{{Key: "command", Value: "/no/such/command"}}, "cannot run /no/such/command"},
		{bson.D{{Key: "command", Value: "no-such-command-in-path"}}, "cannot run no-such-command-in-path"},
		{bson.D{{Key: "command", Value: "/bin/echo"}, {Key: "dir", Value: "/no/such/dir"}}, "cannot run /bin/echo"},
	} {
		res := Exec().Run(t.Context(), execTask(t, tc.params))
		require.Equal(t, schema.StatusFailed, res.Status, "%v", tc.params)
		require.Contains(t, res.Stderr, tc.reason, "%v", tc.params)
		require.Empty(t, res.Stdout)
		require.Nil(t, res.Extra, "nothing ran: no result, no mixedout")
	}
	res := Exec().Run(t.Context(), Task{Parameters: bson.Raw{9, 0, 0}})
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "not a valid BSON document")
}

func TestExecEnvAndDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tk := execTask(t, append(sh(`pwd; echo "$FOO|$BAR|$DISBATCH_TASK_ID|$DISBATCH_QUEUE_ID|$DISBATCH_QUEUE|$DISBATCH_CONSTRUCTOR|$DISBATCH_NODE|$DISBATCH_ATTEMPT|$DISBATCH_NODE_X|$DISBATCH_CONFIG"`),
		bson.E{Key: "dir", Value: dir},
		bson.E{Key: "env", Value: bson.D{{Key: "FOO", Value: "foo value"}, {Key: "BAR", Value: ""}, {Key: "DISBATCH_NODE_X", Value: "x"}}},
	))
	res := Exec().Run(t.Context(), tk)
	require.Equal(t, schema.StatusSucceeded, res.Status, res.Stderr)
	lines := strings.Split(res.Stdout, "\n")
	require.Len(t, lines, 3)
	want, err := filepath.EvalSymlinks(dir)
	require.NoError(t, err)
	got, err := filepath.EvalSymlinks(lines[0])
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, "foo value||"+tk.ID.Hex()+"|"+tk.QueueID.Hex()+"|q1|exec|node-a|1|x|{}", lines[1])
	tk.Config = params(t, bson.D{{Key: "k", Value: "v"}})
	res = Exec().Run(t.Context(), tk)
	require.True(t, strings.HasSuffix(strings.Split(res.Stdout, "\n")[1], `|{"k":"v"}`), res.Stdout)

	// The task's env overrides the node's (PATH here).
	res = Exec().Run(t.Context(), execTask(t, append(sh(`echo "$PATH"`), bson.E{Key: "env", Value: bson.D{{Key: "PATH", Value: "/nowhere"}}})))
	require.Equal(t, Result{Status: schema.StatusSucceeded, Stdout: "/nowhere\n", Extra: extra(0, "/nowhere\n")}, res)
}

func TestExecStdinIsEmpty(t *testing.T) {
	t.Parallel()
	res := Exec().Run(t.Context(), execTask(t, bson.D{{Key: "command", Value: "cat"}}))
	require.Equal(t, Result{Status: schema.StatusSucceeded, Extra: extra(0, "")}, res)
}

func TestExecOutputCap(t *testing.T) {
	t.Parallel()
	res := Exec().Run(t.Context(), execTask(t, sh(`head -c 67108964 /dev/zero | tr '\0' x; head -c 100 /dev/zero | tr '\0' y >&2`)))
	require.Equal(t, schema.StatusSucceeded, res.Status)
	require.Len(t, res.Stdout, MaxOutput+len(TruncatedNote))
	require.Equal(t, "\n[output truncated at 64 MiB]", TruncatedNote)
	require.True(t, strings.HasSuffix(res.Stdout, "x"+TruncatedNote))
	require.Equal(t, strings.Repeat("x", MaxOutput), res.Stdout[:MaxOutput])
	require.Equal(t, strings.Repeat("y", 100), res.Stderr)
	require.Equal(t, bson.D{{Key: schema.TaskResult, Value: int32(0)}}, res.Extra, "mixedout past MaxMixedout is left out")
}

func TestShell(t *testing.T) {
	t.Parallel()
	shell := func(cmd string) Task {
		tk := execTask(t, bson.D{{Key: "command", Value: cmd}})
		tk.Constructor = ShellConstructor
		return tk
	}
	res := Shell().Run(t.Context(), shell("echo hi; echo err >&2"))
	require.Equal(t, Result{Status: schema.StatusSucceeded, Stdout: "hi\n", Stderr: "err\n"}, racing(t, res, 0, "hi\nerr\n", "err\nhi\n"))

	res = Shell().Run(t.Context(), shell("echo before; exit 4"))
	require.Equal(t, Result{Status: schema.StatusFailed, Stdout: "before\n", Stderr: "exit status 4\n", Extra: extra(4, "before\n")}, res)

	// bash, not sh.
	res = Shell().Run(t.Context(), shell(`a=(x y z); echo "${#a[@]} $BASH_VERSION" | cut -c1-2; echo "$DISBATCH_CONSTRUCTOR"`))
	require.Equal(t, Result{Status: schema.StatusSucceeded, Stdout: "3 \nshell\n", Extra: extra(0, "3 \nshell\n")}, res)

	dir := t.TempDir()
	tk := shell(`echo "$X" > out.txt`)
	tk.Parameters = params(t, bson.D{{Key: "command", Value: `echo "$X" > out.txt`}, {Key: "dir", Value: dir}, {Key: "env", Value: bson.D{{Key: "X", Value: "written"}}}})
	res = Shell().Run(t.Context(), tk)
	require.Equal(t, Result{Status: schema.StatusSucceeded, Extra: extra(0, "")}, res)
	b, err := os.ReadFile(filepath.Join(dir, "out.txt"))
	require.NoError(t, err)
	require.Equal(t, "written\n", string(b))

	res = Shell().Run(t.Context(), Task{})
	require.Equal(t, Result{Status: schema.StatusFailed, Stderr: "parameters.command is missing: want a non-empty string\n"}, res)
}

// gone reports whether pid has exited (or is a zombie nobody reaps: the
// container's init may not).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

func requireGone(t *testing.T, pidFile string) {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "no pid in %s", pidFile)
	require.Eventually(t, func() bool { return gone(pid) }, 2*time.Second, 10*time.Millisecond,
		"process %d outlived its task", pid)
}

func TestShellTimeoutKillsTheGroup(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "pid")
	tk := execTask(t, bson.D{{Key: "command", Value: `sleep 30 & echo $! > "$PIDFILE"; echo started; wait`},
		{Key: "env", Value: bson.D{{Key: "PIDFILE", Value: pidFile}}}})

	// Called directly: the plugin returns once the process is reaped and the
	// pipes are closed. If the background sleep survived it would hold
	// stdout open until WaitDelay (2s).
	// A second: the shell has forked the sleep and said "started" by
	// then, even on a loaded machine (300 ms raced it).
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	start := time.Now()
	res := Shell().Run(ctx, tk)
	require.Less(t, time.Since(start), time.Second+1500*time.Millisecond)
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Equal(t, "started\n", res.Stdout)
	require.Equal(t, "command killed: context deadline exceeded\n", res.Stderr)
	require.Equal(t, extra(-9, "started\n"), res.Extra, "the group is killed with SIGKILL")
	requireGone(t, pidFile)

	// Through Run, with a timeout.
	require.NoError(t, os.Remove(pidFile))
	start = time.Now()
	res = Run(t.Context(), Shell(), tk, time.Second)
	require.Less(t, time.Since(start), time.Second+slack)
	require.Equal(t, schema.StatusFailed, res.Status)
	require.Contains(t, res.Stderr, "timeout")
	require.Equal(t, extra(-9, "started\n"), res.Extra)
	requireGone(t, pidFile)
}

func TestShellRunTimeoutKeepsOutputAndSaysSoOnce(t *testing.T) {
	t.Parallel()
	tk := execTask(t, bson.D{{Key: "command", Value: `echo partial; echo oops >&2; exec sleep 30`}})
	start := time.Now()
	res := Run(t.Context(), Shell(), tk, time.Second)
	require.Less(t, time.Since(start), time.Second+slack)
	require.Equal(t, Result{Status: schema.StatusFailed, Stdout: "partial\n", Stderr: "oops\ncommand killed after timeout of 1s\n"},
		racing(t, res, -9, "partial\noops\n", "oops\npartial\n"))
}

func TestExecParentCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(t.Context())
	time.AfterFunc(100*time.Millisecond, func() { cancel(errors.New("node shutdown")) })
	res := Run(ctx, Exec(), execTask(t, bson.D{{Key: "command", Value: "sleep"}, {Key: "args", Value: bson.A{"30"}}}), 0)
	require.Equal(t, Result{Status: schema.StatusFailed, Stderr: "command killed: node shutdown\n", Extra: extra(-9, "")}, res)
}

// TestExecPipesHeld: a background process that leaves the group keeps the
// output open; the plugin still returns after WaitDelay.
func TestExecPipesHeld(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Fatalf("setsid is needed: %v", err)
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	res := Exec().Run(t.Context(), execTask(t, sh(`setsid sh -c 'echo $$ > "$0"; exec sleep 4' "`+pidFile+`" & echo done`)))
	elapsed := time.Since(start)
	require.Equal(t, schema.StatusSucceeded, res.Status)
	require.Equal(t, "done\n", res.Stdout)
	require.Contains(t, res.Stderr, "kept its output open")
	require.Equal(t, extra(0, "done\n"), res.Extra)
	require.GreaterOrEqual(t, elapsed, proc.WaitDelay)
	require.Less(t, elapsed, proc.WaitDelay+slack+time.Second)
	// Leave no process behind.
	b, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// TestCommandResultAndMixedout: exec and shell record the exit code (-N for
// signal N) and stdout and stderr interleaved as they were written, beside
// stdout and stderr unchanged.
func TestCommandResultAndMixedout(t *testing.T) {
	t.Parallel()
	shell := func(cmd string) Task {
		tk := execTask(t, bson.D{{Key: "command", Value: cmd}})
		tk.Constructor = ShellConstructor
		return tk
	}
	for _, tc := range []struct {
		script string
		status schema.Status
		code   int32
	}{
		{"exit 0", schema.StatusSucceeded, 0},
		{"exit 3", schema.StatusFailed, 3},
		{"kill -TERM $$", schema.StatusFailed, -15},
		{"kill -KILL $$", schema.StatusFailed, -9},
	} {
		res := Exec().Run(t.Context(), execTask(t, sh(tc.script)))
		require.Equal(t, tc.status, res.Status, tc.script)
		require.Equal(t, extra(tc.code, ""), res.Extra, tc.script)
	}

	// Writes apart in time are interleaved in order, through Run as the
	// node calls it.
	res := Run(t.Context(), Shell(), shell("echo a; sleep 0.3; echo b >&2; sleep 0.3; echo c; sleep 0.3; printf d >&2; exit 3"), 0)
	require.Equal(t, Result{Status: schema.StatusFailed, Stdout: "a\nc\n", Stderr: "b\nd\nexit status 3\n", Extra: extra(3, "a\nb\nc\nd")}, res)
	require.IsType(t, int32(0), res.Extra[0].Value, "result is an int32")
}

// TestATaskRunnerLeavesNothingRunning: 4.103's task_runner, run as a
// process, whose plugin left a child in the background holding its
// output, neither holds the task past the wait for its pipes nor leaves
// the child running.
func TestATaskRunnerLeavesNothingRunning(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	script := filepath.Join(dir, "task_runner")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/bash\nsleep 30 &\necho $! > "+pidFile+"\nexit 0\n"), 0o700))
	start := time.Now()
	_, err := TaskRunner{Path: script, Config: "/dev/null"}.RunWritingResult(context.Background(), Task{ID: bson.NewObjectID()})
	took := time.Since(start)
	b, rerr := os.ReadFile(pidFile)
	require.NoError(t, rerr)
	pid, rerr := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, rerr)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	require.Less(t, took, proc.WaitDelay+5*time.Second, "the task was held by its background child (%v)", err)
	require.Eventually(t, func() bool {
		if syscall.Kill(pid, 0) != nil {
			return true
		}
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		return err != nil || strings.Contains(string(st), ") Z ")
	}, 5*time.Second, 10*time.Millisecond, "the task's background process outlived it")
}
