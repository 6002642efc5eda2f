package mongod

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMongodHasAProcessGroupOfItsOwn: a Ctrl-C in a terminal signals the
// foreground process group; mongod, in a group of its own, is stopped by
// the program that started it, after what uses it (make run's node lost
// its database while stopping, fenced itself and took 26 s).
func TestMongodHasAProcessGroupOfItsOwn(t *testing.T) {
	t.Parallel()
	rs, err := StartReplicaSet(testContext(t, 2*time.Minute), Options{ReplSet: "pgroup", Logger: testLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rs.Stop()) })
	pid := rs.Members()[0].PID()
	pgid, err := syscall.Getpgid(pid)
	require.NoError(t, err)
	require.Equal(t, pid, pgid, "mongod leads its own process group")
	require.NotEqual(t, syscall.Getpgrp(), pgid)
}
