// Command disbatchd is a Disbatch 4 execution node: it claims tasks from
// the queues in MongoDB, runs them through plugins and records their
// results. See `disbatchd --help`.
package main

import (
	"github.com/disbatch-go/disbatch/supervisor/finish"

	"github.com/disbatch-go/disbatch/supervisor"

	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// "disbatchd supervise DIR ID" is a task's supervisor, started by the
	// node (package supervisor), not an operator's command.
	if len(os.Args) > 1 && os.Args[1] == "supervise" {
		os.Exit(supervisor.Main(os.Args[2:]))
	}
	// "disbatchd supervise-finish DIR ID" writes a supervised task's
	// finish for its supervisor while the node is away.
	if len(os.Args) > 1 && os.Args[1] == "supervise-finish" {
		os.Exit(finish.Main(os.Args[2:]))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	os.Exit(run(ctx, os.Args[1:], env{getenv: os.Getenv, stdout: os.Stdout, stderr: os.Stderr, signals: sigs}))
}
