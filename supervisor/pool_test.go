package supervisor

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// asSupervisor makes this test binary a supervisor when the pool tests
// start it (their Launcher's Command).
const asSupervisor = "DISBATCH_SUPERVISOR_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asSupervisor) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func poolLauncher(t *testing.T, size int) *Launcher {
	t.Helper()
	t.Setenv(asSupervisor, "1")
	l := &Launcher{Dir: t.TempDir(), Command: []string{os.Args[0]}, Pool: size}
	require.NoError(t, l.Check())
	t.Cleanup(l.Close)
	return l
}

// idle returns the pool's idle supervisors once there are n.
func idle(t *testing.T, l *Launcher, n int) []*Pending {
	t.Helper()
	var ps []*Pending
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		ps = append([]*Pending(nil), l.idle...)
		return len(ps) == n
	}, 10*time.Second, 5*time.Millisecond)
	return ps
}

func gone(pid int) bool { return syscall.Kill(pid, 0) != nil }

func TestThePoolHandsATaskToAnIdleSupervisor(t *testing.T) {
	l := poolLauncher(t, 1)
	l.Warm()
	ready := idle(t, l, 1)[0]
	id := bson.NewObjectID().Hex()
	p, err := l.Launch(id)
	require.NoError(t, err)
	require.Same(t, ready, p, "the idle supervisor, not a new fork")
	require.True(t, p.pooled)
	_, err = os.Stat(sockPath(l.Dir, id))
	require.NoError(t, err, "its socket is the task's now")

	h, err := p.Run(shellSpec("echo pooled", time.Minute))
	require.NoError(t, err)
	require.Equal(t, p.cmd.Process.Pid, h.PID)
	o, err := h.Outcome()
	require.NoError(t, err)
	require.True(t, o.Proc.Success())
	require.Equal(t, "pooled\n", string(o.Proc.Stdout))
	h.Ack()
	require.Eventually(t, func() bool { return p.exited.Load() }, 10*time.Second, 5*time.Millisecond)
	_, err = os.Stat(logPath(l.Dir, id))
	require.True(t, os.IsNotExist(err), "a run that went well leaves no log")

	// The pool is topped up, and Close stops the idle ones.
	next := idle(t, l, 1)[0]
	require.NotSame(t, ready, next)
	l.Close()
	require.Eventually(t, func() bool { return gone(next.cmd.Process.Pid) || next.exited.Load() }, 10*time.Second, 5*time.Millisecond)
	left, _ := filepath.Glob(filepath.Join(l.Dir, "*"))
	require.Empty(t, left)
	p, err = l.Launch(bson.NewObjectID().Hex())
	require.NoError(t, err, "after Close, a supervisor is forked for its task")
	require.False(t, p.pooled)
	p.Cancel()
}

// TestAnIdleSupervisorExitsWhenItsNodeGoes: the node's end of the pipe
// closes (as when the node is killed) and the idle supervisor, given no
// task, exits by itself and removes its files.
func TestAnIdleSupervisorExitsWhenItsNodeGoes(t *testing.T) {
	l := poolLauncher(t, 2)
	l.Warm()
	ready := idle(t, l, 2)
	l.mu.Lock()
	require.NoError(t, l.nodeW.Close())
	l.mu.Unlock()
	for _, p := range ready {
		require.Eventually(t, func() bool { return p.exited.Load() }, 10*time.Second, 5*time.Millisecond)
		_, err := os.Stat(sockPath(l.Dir, p.id))
		require.True(t, os.IsNotExist(err), "an idle supervisor that exits removes its socket")
		_, err = os.Stat(logPath(l.Dir, p.id))
		require.True(t, os.IsNotExist(err), "and its log")
		require.Zero(t, p.cmd.ProcessState.ExitCode(), "it exits, it is not killed")
	}
}

// A node started again after a stop warms its pool again; a take that is
// cancelled unrun still has the pool topped up.
func TestThePoolReopensAndRefillsAfterACancelledTake(t *testing.T) {
	l := poolLauncher(t, 1)
	l.Warm()
	first := idle(t, l, 1)[0]
	l.Close()
	require.Eventually(t, func() bool { return gone(first.cmd.Process.Pid) }, 10*time.Second, 5*time.Millisecond)
	l.Warm()
	p, err := l.Launch(bson.NewObjectID().Hex())
	require.NoError(t, err)
	if !p.pooled { // the refill had not finished: wait for it
		p.Cancel()
		idle(t, l, 1)
		p, err = l.Launch(bson.NewObjectID().Hex())
		require.NoError(t, err)
	}
	require.True(t, p.pooled, "reopened by Warm")
	p.Cancel()
	idle(t, l, 1) // refilled though the one taken never ran
}

// TestAnAckedSupervisorLeavesTheNextAttemptsFilesAlone: a task retried at
// once and claimed again by the same node is given an idle supervisor,
// renamed to the task's socket, as soon as the first run's supervisor is
// acknowledged. Ack returns only once that supervisor has removed its
// files (named by the task too), so its removals never reach the new
// supervisor's socket, log or spec.
func TestAnAckedSupervisorLeavesTheNextAttemptsFilesAlone(t *testing.T) {
	l := poolLauncher(t, 1)
	l.Warm()
	idle(t, l, 1)
	id, h, done := runInProcess(t, l.Dir, shellSpec("exit 1", time.Minute))
	_, err := h.Outcome()
	require.NoError(t, err)

	h.Ack()                // the finish (a retry) is written
	p, err := l.Launch(id) // the retry, claimed again here
	require.NoError(t, err)
	require.True(t, p.pooled)
	require.NoError(t, <-done)
	_, err = os.Stat(sockPath(l.Dir, id))
	require.NoError(t, err, "the next attempt's socket was removed by the last attempt's supervisor")
	_, err = os.Stat(logPath(l.Dir, id))
	require.NoError(t, err, "the next attempt's log was removed by the last attempt's supervisor")
	h2, err := p.Run(shellSpec("echo second", time.Minute))
	require.NoError(t, err, "the next attempt's supervisor given its task")
	o, err := h2.Outcome()
	require.NoError(t, err)
	require.Equal(t, "second\n", string(o.Proc.Stdout))
	h2.Ack()
}
