// Command disbatch-supervisor is a task's supervisor (package supervisor),
// started by disbatchd, not by hand.
package main

import (
	"os"

	"github.com/disbatch-go/disbatch/supervisor"
)

func main() { os.Exit(supervisor.Main(os.Args[1:])) }
