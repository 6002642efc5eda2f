// Command disbatch-bench measures a disbatch node against real MongoDB:
// pickup latency against the bare-driver floor, drain throughput against
// raw-loop ceilings, claim latency and memory with large backlogs, and the
// counter projector's lag. It prints a table (stdout) of every figure with
// the conditions it was measured under, and optionally writes the same as
// JSON. Progress goes to stderr. See `disbatch-bench --help`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/disbatch-go/disbatch/internal/gctarget"
	"github.com/disbatch-go/disbatch/supervisor/finish"
)

// describeGC says which collector target is in force and where it came
// from, as gctarget.Apply returns them.
func describeGC(percent int, fromEnv bool) string {
	from := "disbatchd's default, internal/gctarget"
	if fromEnv {
		from = "GOGC in the environment"
	}
	if percent < 0 {
		return "GOGC off (" + from + ")"
	}
	return fmt.Sprintf("GOGC %d (%s)", percent, from)
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == nodeCommand {
		os.Exit(runNodeProcess(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == superviseFinishCommand {
		os.Exit(finish.Main(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole program but for the hidden node subcommand; it returns
// the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	cfg, help, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, help)
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "disbatch-bench:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	// The in-process nodes (and the raw loops beside them) run under the
	// collector target disbatchd sets; so do the node processes.
	cfg.gc = describeGC(gctarget.Apply(os.Getenv))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// After the first signal, a second one kills the process at once;
		// the mongod children die with it (Pdeathsig and watchdog).
		<-ctx.Done()
		stop()
	}()

	stopCPU, err := startCPUProfile(cfg.CPUProf)
	if err != nil {
		fmt.Fprintln(stderr, "disbatch-bench: cpu profile:", err)
		return 1
	}
	defer stopCPU()

	rep, runErr := measure(ctx, cfg, log)
	if rep != nil {
		rep.Problems = sanity(rep, cfg)
		if _, err := io.WriteString(stdout, renderTable(rep)); err != nil {
			log.Error("write table", "error", err)
		}
		if cfg.JSONFile != "" {
			if err := writeJSON(cfg.JSONFile, rep); err != nil {
				log.Error("write JSON", "file", cfg.JSONFile, "error", err)
				return 1
			}
			log.Info("JSON written", "file", cfg.JSONFile)
		}
	}
	switch {
	case runErr != nil && ctx.Err() != nil:
		log.Error("interrupted", "error", runErr)
		return 130
	case runErr != nil:
		log.Error("benchmark failed", "error", runErr)
		return 1
	case len(rep.Problems) > 0:
		log.Error("figures failed the sanity check", "problems", len(rep.Problems))
		return 1
	}
	return 0
}
