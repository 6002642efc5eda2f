package main

import (
	"os"
	"testing"

	"github.com/disbatch-go/disbatch/internal/mongotest"
)

// TestMain runs the tests on the shared replica set, or, called as a node
// process of a drain (this binary is os.Executable, which the bench
// starts as itself), runs that node.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == nodeCommand {
		os.Exit(runNodeProcess(os.Args[2:]))
	}
	os.Exit(mongotest.Main(m))
}
