package cmdline

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/store"
)

// TestAnEmptyDatabaseIsAUsageError: --database "" is the operator's
// mistake, said as such (exit 2), not a MongoDB that cannot be reached.
func TestAnEmptyDatabaseIsAUsageError(t *testing.T) {
	t.Parallel()
	_, err := Connect(context.Background(), store.ConnectParams{URI: "mongodb://127.0.0.1:1/", Database: ""})
	require.ErrorContains(t, err, "--database is empty")
	require.Equal(t, ExitUsage, ExitCode(err))
}
