// Package gctarget sets the Go garbage collector's target (GOGC) for the
// programs that run a node: disbatchd, and the benchmark's node processes.
//
// A node's live heap is small (about 1.5 MB after a collection) and it
// allocates about 27 KB per task. Go's collector starts a cycle when the
// heap reaches the larger of live x (1 + GOGC/100) and 4 MB x GOGC/100, so
// for a node the minimum decides: at the default (100) a cycle about every
// 2.5 MB allocated, many a second while it drains a backlog, each scanning
// its goroutines afresh; at 200 about every 6.5 MB. Alternating runs of
// the benchmark built both ways (`--only throughput --tasks 20000
// --ceiling-tasks 5000`, four pairs; stop 34, docs/scaling.md): in the
// three pairs run at one machine speed, three node processes spent 24-28%
// less of their own CPU per task (one node 14-26%) and drained 8-16% more
// tasks per second; the fourth pair, during which the machine slowed by
// half, went the other way. The cost is memory: a node with 1,000,000
// tasks queued peaked at 41.9 MiB of RSS instead of 37.5-37.9 (51.2-54.6
// at 400, too near the node's 64 MB goal).
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
	// Read as the runtime reads it (readGOGC): "off", or a 32-bit whole
	// number, any negative one meaning off; anything else leaves the
	// runtime at 100, as if GOGC were unset.
	if v := getenv(EnvGOGC); v == "off" {
		return -1, true
	} else if n, err := strconv.ParseInt(v, 10, 32); err == nil {
		return max(int(n), -1), true
	}
	debug.SetGCPercent(Percent)
	return Percent, false
}
