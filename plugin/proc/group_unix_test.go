//go:build unix

package proc

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWhatATaskLeftRunningDiesWithIt: a command that exits on its own
// (not killed) leaves nothing of its process group running: a child it
// put in the background would otherwise outlive its task, beside a retry
// of it. Both ways out: an exit with the child's output closed, and one
// whose child holds the output (Run's wait for the pipes ends).
func TestWhatATaskLeftRunningDiesWithIt(t *testing.T) {
	t.Parallel()
	for name, script := range map[string]string{
		"output closed": `sleep 30 >/dev/null 2>&1 & echo $! > "$0"; exit 1`,
		"output held":   `sleep 30 & echo $! > "$0"; echo done`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pidFile := filepath.Join(t.TempDir(), "pid")
			r := Command{Path: "bash", Args: []string{"-c", script, pidFile}}.Run(context.Background())
			require.True(t, r.Ended, "%+v", r)
			b, err := os.ReadFile(pidFile)
			require.NoError(t, err)
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			require.NoError(t, err)
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
			// Killed, it is a zombie until its parent's parent (init, or
			// the test binary as a subreaper) reaps it: gone or dead.
			require.Eventually(t, func() bool { return gone(pid) }, 5*time.Second, 10*time.Millisecond,
				"the task's background process outlived it")
		})
	}
}

// gone reports whether pid has ended: no such process, or a zombie.
func gone(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] == "Z"
}
