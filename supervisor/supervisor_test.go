package supervisor

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/plugin/proc"
	"github.com/disbatch-go/disbatch/schema"
)

// runInProcess runs a supervisor for spec in a goroutine (the process is
// the same code: Main calls Run), gives it its task as the node does, and
// returns the node's handle and the supervisor's end.
func runInProcess(t *testing.T, dir string, spec Spec) (string, *Handle, <-chan error) {
	t.Helper()
	spec.TaskID = bson.NewObjectID().Hex()
	id := spec.TaskID
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), dir, id, slog.New(slog.DiscardHandler)) }()
	var h *Handle
	require.Eventually(t, func() bool { // its socket file exists a moment before it accepts
		var err error
		h, err = attach(dir, id, 5*time.Second, &message{Op: opTask, Spec: &spec})
		return err == nil
	}, 5*time.Second, 5*time.Millisecond)
	return id, h, done
}

// attachSoon attaches as a restarted node does: no task, just hello.
func attachSoon(t *testing.T, dir, id string) *Handle {
	t.Helper()
	var h *Handle
	require.Eventually(t, func() bool {
		var err error
		h, err = Attach(dir, id)
		return err == nil
	}, 5*time.Second, 5*time.Millisecond)
	return h
}

func shellSpec(command string, fenceAfter time.Duration) Spec {
	return Spec{Node: "n", Command: proc.Command{Path: "bash", Args: []string{"-c", command}, Interleave: true},
		Alive: time.Now(), FenceAfter: fenceAfter, DeadAfter: 300 * time.Millisecond, Mongo: Mongo{Database: "d"}}
}

func TestTheNodeGetsTheResultAndTheSupervisorExits(t *testing.T) {
	dir := t.TempDir()
	id, h, done := runInProcess(t, dir, shellSpec("echo out; echo err >&2", time.Minute))
	kept, err := ReadSpec(dir, id)
	require.NoError(t, err, "the spec is kept for a restarted node and the finish command before the hello")
	require.Equal(t, id, kept.TaskID)
	require.Equal(t, []string{"-c", "echo out; echo err >&2"}, kept.Command.Args)
	require.Equal(t, "n", h.Node)
	require.Equal(t, "d", h.Database)
	o, err := h.Outcome()
	require.NoError(t, err)
	require.True(t, o.Proc.Success())
	require.Equal(t, "out\n", string(o.Proc.Stdout))
	require.Equal(t, "err\n", string(o.Proc.Stderr))
	require.NotEmpty(t, o.Proc.Mixed, "interleaved, as asked")
	require.False(t, o.Written)
	h.Ack()
	require.NoError(t, <-done)
	left, _ := os.ReadDir(dir)
	require.Empty(t, left, "a supervisor that handed its result over leaves nothing behind")
}

func TestAKillFromTheNodeKillsThePlugin(t *testing.T) {
	dir := t.TempDir()
	id, first, done := runInProcess(t, dir, shellSpec("sleep 60", time.Minute))
	// The node restarts: it lets go, and attaches again (no task this time).
	first.Close()
	h := attachSoon(t, dir, id)
	require.NoError(t, h.Kill(schema.ReasonKilled, "kill requested by ops"))
	select {
	case <-h.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("no result after a kill")
	}
	o, err := h.Outcome()
	require.NoError(t, err)
	require.False(t, o.Proc.Success())
	require.Equal(t, schema.ReasonKilled, o.Reason)
	require.NotNil(t, o.Proc.Killed)
	require.Equal(t, "kill requested by ops", o.Proc.Killed.Text)
	h.Ack()
	require.NoError(t, <-done)
}

func TestWithoutHeartbeatsTheSupervisorFencesAndWritesNothing(t *testing.T) {
	dir := t.TempDir()
	begin := time.Now()
	// A node that keeps saying alive keeps the task running...
	// Fence-after 1 s: the supervisor's start and attach fit in it on a
	// loaded machine (300 ms could be too short). The node says alive for
	// 2.5 s, well past it, so a supervisor that ignored it would fence.
	id, h, done := runInProcess(t, dir, shellSpec("sleep 60", time.Second))
	for range 25 {
		require.NoError(t, h.Alive(time.Now()))
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case <-h.Done():
		t.Fatal("fenced although the node said alive")
	default:
	}
	// ...and when it goes silent (here: gone), the task is killed within
	// fence-after of the last alive, and no finish is written.
	h.Close()
	err := <-done
	require.NoError(t, err, "fenced, not adopted within DeadAfter: exits without writing (no MongoDB here to write to)")
	require.Less(t, time.Since(begin), 8*time.Second)
	_, err = os.Stat(sockPath(dir, id))
	require.True(t, os.IsNotExist(err))
}

func TestAnotherVersionIsRefused(t *testing.T) {
	dir := t.TempDir()
	_, err := Attach(dir, bson.NewObjectID().Hex())
	require.Error(t, err, "no supervisor there")
}

// TestASignalEndsEveryWait: a supervisor told to stop (SIGTERM, SIGINT:
// its context) stops waiting for its node's first connection, and for the
// node's acknowledgement of a result, at once, not only while the task
// runs.
func TestASignalEndsEveryWait(t *testing.T) {
	t.Run("first connection", func(t *testing.T) {
		dir := t.TempDir()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Run(ctx, dir, bson.NewObjectID().Hex(), slog.New(slog.DiscardHandler)) }()
		time.Sleep(100 * time.Millisecond)
		stopped := time.Now()
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
			require.Less(t, time.Since(stopped), time.Second)
		case <-time.After(firstWait / 2):
			t.Fatal("still waiting for its node's first connection")
		}
	})
	t.Run("acknowledgement", func(t *testing.T) {
		dir := t.TempDir()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		spec := shellSpec("echo hi", time.Minute)
		spec.TaskID = bson.NewObjectID().Hex()
		done := make(chan error, 1)
		go func() { done <- Run(ctx, dir, spec.TaskID, slog.New(slog.DiscardHandler)) }()
		var h *Handle
		require.Eventually(t, func() bool {
			var err error
			h, err = attach(dir, spec.TaskID, 5*time.Second, &message{Op: opTask, Spec: &spec})
			return err == nil
		}, 5*time.Second, 5*time.Millisecond)
		defer h.Close()
		o, err := h.Outcome()
		require.NoError(t, err)
		require.Equal(t, "hi\n", string(o.Proc.Stdout))
		cancel() // never acknowledged
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("still waiting for the node's acknowledgement")
		}
	})
}
