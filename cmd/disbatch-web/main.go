// Command disbatch-web serves the Disbatch HTTP API: the Disbatch 4.103
// routes its CLI and web page use, the v1 JSON API with its OpenAPI
// document, live task events, and Prometheus metrics. See
// `disbatch-web --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	os.Exit(run(ctx, os.Args[1:], env{getenv: os.Getenv, stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, signals: sigs}))
}
