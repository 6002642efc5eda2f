package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/mongotest"
)

// testEnv is a bench environment on the tests' replica set, draining
// tasks a drain.
func testEnv(t *testing.T, tasks int) *env {
	t.Helper()
	cfg := quickConfig(t)
	cfg.Tasks, cfg.DrainTimeout = tasks, time.Minute
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return &env{cfg: cfg, log: log, nodeLog: log, uri: mongotest.URI(t), client: mongotest.Client(t), prefix: "disbatch_bench_test_" + randHex(3)}
}

// testWriter logs to t.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// TestDrainsStartOnceAProjectorIsSteady: a drain's queue stays paused until
// a node's projector leads with its stream as it stays (pre-images off),
// as in a cluster that has run a while. So the projector applies every
// event of the drain (a claim straight into running and a finish, two a
// task) and none before, and its lag figures are over all of them: the
// first claims are not lost to its start, nor left out of its window.
func TestDrainsStartOnceAProjectorIsSteady(t *testing.T) {
	t.Parallel()
	const tasks = 400
	e := testEnv(t, tasks)
	require.True(t, e.cfg.ClaimRunning, "the quick run claims straight into running: two events a task")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	row, lag, err := e.nodeDrain(ctx, 1)
	require.NoError(t, err)
	require.True(t, row.Complete)
	require.Equal(t, int64(2*tasks), lag.Events, "one node: the projector applied the whole drain")

	row, lag, err = e.nodeProcDrain(ctx, 3)
	require.NoError(t, err)
	require.True(t, row.Complete)
	require.Equal(t, int64(2*tasks), lag.Events, "three processes: the leader's projector applied the whole drain")
	require.Positive(t, lag.P99)
}

// TestNodeProcessesWriteCPUProfiles: with --node-cpuprofile, each node
// process of a drain writes its CPU profile to the prefix and its name.
// It checks that each wrote a gzipped file, as pprof writes them, not
// what the profile holds (a 200-task drain may leave few samples).
func TestNodeProcessesWriteCPUProfiles(t *testing.T) {
	t.Parallel()
	e := testEnv(t, 200)
	e.cfg.NodeCPUProf = filepath.Join(t.TempDir(), "cpu")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	row, _, err := e.nodeProcDrain(ctx, 2)
	require.NoError(t, err)
	require.True(t, row.Complete)
	for _, name := range []string{"bench-proc-1", "bench-proc-2"} {
		b, err := os.ReadFile(e.cfg.NodeCPUProf + "-" + name)
		require.NoError(t, err, "node process %s wrote no profile", name)
		require.Greater(t, len(b), 2, name)
		require.Equal(t, []byte{0x1f, 0x8b}, b[:2], "%s: a gzipped pprof profile", name)
	}
}
