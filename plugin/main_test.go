package plugin

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run when goroutines outlive the tests. Tests that make
// Run abandon a hanging Go plugin release it in t.Cleanup, so nothing may be
// left once every test has finished.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
