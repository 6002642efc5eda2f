package mongod

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testLogger sends a ReplicaSet's debug log to the test's output.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// testContext is a context that ends with the test or after d.
func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// processAlive reports whether pid is a live process. A zombie (exited but
// not yet reaped by its new parent) counts as gone.
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err == nil {
		// pid (comm) STATE ...; comm may contain spaces and parentheses.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
			state := b[i+2]
			return state != 'Z' && state != 'X'
		}
		return true
	}
	// No /proc: ask the kernel.
	return syscall.Kill(pid, 0) == nil
}

func TestProcessAlive(t *testing.T) {
	require.True(t, processAlive(os.Getpid()))
	require.False(t, processAlive(1<<22+1)) // above the default pid_max
}
