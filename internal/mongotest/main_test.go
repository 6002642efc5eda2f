package mongotest

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// testContext is a context that ends with the test or after d.
func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestDatabaseName(t *testing.T) {
	long := "TestSomething/with spaces, ünïcödé & punctuation: " + string(bytes.Repeat([]byte("x"), 100))
	seen := map[string]bool{}
	for range 100 {
		n := databaseName(long)
		require.LessOrEqual(t, len(n), maxDatabaseName)
		require.Regexp(t, `^t_TestSomething_with_spaces__[A-Za-z0-9_]+$`, n)
		require.False(t, seen[n], "duplicate name %s", n)
		seen[n] = true
	}
	require.Regexp(t, `^t_TestA_b_c_\d+_[0-9a-f]{6}$`, databaseName("TestA/b.c"))
}
