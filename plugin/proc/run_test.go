package proc

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAKillBeforeTheStartIsAKill: a context ended before the process
// could start (a kill that came first) is reported as the kill, with its
// cause, not as a failure to start; a kill's reason rides on it.
func TestAKillBeforeTheStartIsAKill(t *testing.T) {
	t.Parallel()
	ctx, kill := context.WithCancelCause(context.Background())
	kill(errors.New("kill requested by ops"))
	r := Command{Path: "sleep", Args: []string{"60"}}.Run(ctx)
	require.NotNil(t, r.Killed)
	require.Equal(t, "kill requested by ops", r.Killed.Text)
	require.Empty(t, r.StartErr)
	require.False(t, r.Success())

	// A command that cannot start is still a start error.
	r = Command{Path: "/nonexistent/disbatch-no-such-program"}.Run(context.Background())
	require.Nil(t, r.Killed)
	require.NotEmpty(t, r.StartErr)
}
