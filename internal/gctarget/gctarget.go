// Package gctarget sets the Go garbage collector's target (GOGC) for the
// programs that run a node: disbatchd, and the benchmark's node processes.
//
// A node's live heap is small (about 1.5 MB after a collection) and it
// allocates about 27 KB per task, so under Go's default (GOGC=100: collect
// when the heap has doubled, and at 4 MB at the least) a node draining a
// backlog collects many times a second, each collection scanning its
// goroutines afresh. At 200 it collects half as often. Alternating runs of
// the benchmark built both ways (`--only throughput --tasks 20000
// --ceiling-tasks 5000`, four pairs; stop 34, docs/scaling.md): three
// node processes spent 108-116 µs of their own CPU per task against
// 150-154 in the pairs run at one machine speed, 170 against 224 in the
// slower pair, and drained 7-16% more tasks per second. The cost is
// memory: a node with 1,000,000 tasks queued peaked at 41.9 MiB of RSS
// instead of 37.9 (54.2-54.6 at 400).
package gctarget

import (
	"runtime/debug"
	"strconv"
)

// Percent is the node programs' GOGC unless the environment sets one.
const Percent = 200

// EnvGOGC is Go's own variable; when set, it wins.
const EnvGOGC = "GOGC"

// Apply sets the collector's target to Percent unless GOGC is set in the
// environment (getenv), in which case the Go runtime has applied it
// already. It returns the target in force (-1: off) and whether it came
// from the environment.
func Apply(getenv func(string) string) (percent int, fromEnv bool) {
	// Read as the runtime reads it: "off", or a whole number; anything
	// else leaves the runtime at 100, as if GOGC were unset.
	if v := getenv(EnvGOGC); v == "off" {
		return -1, true
	} else if n, err := strconv.Atoi(v); err == nil {
		return n, true
	}
	debug.SetGCPercent(Percent)
	return Percent, false
}
