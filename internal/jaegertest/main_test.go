package jaegertest

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that a Jaeger's cleanup leaves no goroutines behind (its
// HTTP client's idle connections, the process waiter), so that packages
// that check for leaks can use this one.
//
// Not in the child processes of TestEnv and TestDiesWithTestBinary: there
// the OTLP/HTTP exporter's keep-alive connection to a Jaeger that is still
// running outlives the exporter's Shutdown, which is the exporter's doing.
func TestMain(m *testing.M) {
	if os.Getenv("JAEGERTEST_CHILD") != "" || os.Getenv("JAEGERTEST_ORPHAN") != "" {
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}
